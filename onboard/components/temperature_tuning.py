"""The NoPE layers' query temperature (Llama-4's ``attn_temperature_tuning``):
on each layer without rope, the queries are multiplied by

    1 + attn_scale * log(1 + floor((position + 1) / floor_scale))

which is 1 up to position floor_scale - 2 and grows after it, so that long
contexts keep the attention of the NoPE layers sharp. It has no tensor.

The generated vLLM model applies it as vLLM's ``llama4.py`` does (after rope and
the q/k norms, before attention), on the layers that do not rotate; the
reference as transformers' ``Llama4TextAttention`` does, its positions counted
from the cache's length.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from onboard.components.base import INT32_MAX, Component, Report, Section

# The tiny copy of a spec (onboard.spec.shrink): the temperature steps every
# this many positions at most.
TINY_FLOOR_SCALE = 4

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.spec.model import ModelSpec


class NopeTemperature(Section):
    """The query temperature of the NoPE layers (Llama-4)."""

    floor_scale: int = Field(
        gt=0,
        le=INT32_MAX,
        description="Positions per step of the temperature (Llama-4's floor_scale).",
    )
    attn_scale: float = Field(
        gt=0, description="Growth of the temperature per log step (attn_scale)."
    )


class NopeTemperatureFields(Section):
    nope_temperature: NopeTemperature | None = Field(
        None,
        description="On the NoPE layers (rope.nope_layers) the queries are "
        "multiplied by 1 + attn_scale * log(1 + floor((position + 1) / "
        "floor_scale)) before attention (Llama-4's attn_temperature_tuning); "
        "null: none.",
    )


@dataclass(frozen=True)
class Temperature:
    """The NoPE layers' query temperature (the model's; a rotating layer has
    none, which the generated code decides by the layer's rope)."""

    floor_scale: int
    attn_scale: float


class _TemperatureTuning(Component):
    name = "temperature_tuning"
    label = "NoPE query temperature"
    extends = "attention"
    Fields = NopeTemperatureFields
    Node = Temperature
    field = "attention.nope_temperature"
    concept_fields = {
        "attn_temperature_tuning": ("attention.nope_temperature",),
        "floor_scale": ("attention.nope_temperature.floor_scale",),
        "attn_scale": ("attention.nope_temperature.attn_scale",),
    }
    attributes = ("floor_scale", "attn_scale", "temperature")
    vllm_slots = ("gqa.init", "gqa.after_rope", "gqa.methods")
    hf_slots = ("gqa.init", "gqa.after_rope")

    def shrink(self, section: dict[str, Any]) -> None:
        # Steps every TINY_FLOOR_SCALE positions, which a proof's 24 reach.
        temp = section["nope_temperature"]
        temp["floor_scale"] = min(temp["floor_scale"], TINY_FLOOR_SCALE)

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if not self.present(spec):
            return
        where = ("attention", "nope_temperature")
        if spec.attention.type != "gqa":
            report(where, "generated for GQA attention only")
        if not spec.rope.nope_layers:
            report(where, "applies to the NoPE layers: set rope.nope_layers")
        if spec.attention.kv_sharing:
            report(where, "not generated beside cross-layer KV sharing")

    def plan(self, spec: ModelSpec, layer: int | None) -> Temperature | None:
        t = spec.attention.nope_temperature
        return None if t is None else Temperature(t.floor_scale, t.attn_scale)

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        t = spec.attention.nope_temperature
        assert t is not None
        return {
            "attn_temperature_tuning": True,
            "floor_scale": t.floor_scale,
            "attn_scale": t.attn_scale,
        }

    def facts(self, spec: ModelSpec) -> dict[str, Any]:
        return {"attn_temperature_tuning": self.present(spec)}

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        tuning = get("attn_temperature_tuning", False)
        floor, scale = get("floor_scale", None), get("attn_scale", None)
        if not tuning:
            return {}
        return {"nope_temperature": {"floor_scale": floor, "attn_scale": scale}}

    def code_context(self, node: Temperature, keys: ConfigKeys) -> Mapping[str, Any]:
        return {
            "tuning": keys.need("attn_temperature_tuning", True),
            "floor_scale": keys.need("floor_scale", node.floor_scale),
            "attn_scale": keys.need("attn_scale", node.attn_scale),
        }

    def describe(self, node: Temperature) -> str:
        return "the NoPE layers' queries scaled by a temperature growing with position"


COMPONENT = _TemperatureTuning()
