"""The MLPs' activation: the ``act`` of every gated MLP, ``down(act(gate(x)) *
up(x))``, in the dense layers, the routed experts and the shared experts alike.

vLLM fuses it with the product (``SiluAndMul``, ``GeluAndMul``; ``FusedMoE``'s
``activation=``), the reference applies transformers' ``ACT2FN`` where the
config names the activation (``hidden_act``, Gemma's ``hidden_activation``),
else the function the family hard-codes. config.json always states it. Adding an
activation is a row of :data:`KINDS` (and vLLM's layer, where it has one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from onboard.components.base import Component, ConfigProblem, Section

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.spec.model import ModelSpec

Kind = Literal["silu", "gelu", "gelu_pytorch_tanh"]


@dataclass(frozen=True)
class ActivationCode:
    """How each model computes one activation."""

    vllm_layer: str  # vLLM's fused act-and-multiply layer (the dense MLPs)
    fused_moe: str  # FusedMoE's activation= name
    reference: str  # the reference's function of x, where the config names none


KINDS: dict[str, ActivationCode] = {
    "silu": ActivationCode("SiluAndMul()", "silu", "F.silu(x)"),
    "gelu": ActivationCode('GeluAndMul(approximate="none")', "gelu", "F.gelu(x)"),
    "gelu_pytorch_tanh": ActivationCode(
        'GeluAndMul(approximate="tanh")', "gelu_tanh", 'F.gelu(x, approximate="tanh")'
    ),
}


class ActivationFields(Section):
    activation: Kind = Field(
        "silu", description="MLP activation (gated: act(gate) * up)."
    )


@dataclass(frozen=True)
class Activation:
    """The activation every gated MLP of the model applies."""

    kind: str

    @property
    def code(self) -> ActivationCode:
        return KINDS[self.kind]


@dataclass(frozen=True)
class ActivationKeys:
    """What the activation's code prints: the node, and the config key the models
    read it from (None: the family hard-codes it; its class has no key)."""

    node: Activation
    key: str | None


class _Activation(Component):
    name = "activation"
    label = "the MLPs' activation"
    host = "model"
    extends = ""
    Fields = ActivationFields
    Node = Activation
    # Written beside the model's dimensions, before the norms' eps.
    config_place = "dims"
    config_aliases = {"hidden_act": ("hidden_act", "hidden_activation")}
    concept_fields = {"hidden_act": ("activation",)}
    # The reference's activation function, where the config names none.
    hf_slots = ("modeling.activation",)

    def present(self, spec: ModelSpec) -> bool:
        return True

    def plan(self, spec: ModelSpec, layer: int | None) -> Activation:
        return Activation(spec.activation)

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        return {"hidden_act": spec.activation}

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        kind = get("hidden_act", None)
        if kind is None:
            raise ConfigProblem("hidden_act: required, but the config does not set it")
        if kind not in KINDS:
            raise ConfigProblem(
                f"hidden_act={kind!r}: not one of {', '.join(KINDS)}",
                read={"activation": kind},
            )
        return {"activation": kind}

    def code_context(self, node: Activation, keys: ConfigKeys) -> ActivationKeys:
        return ActivationKeys(node, keys.find("hidden_act", node.kind))

    def reference_context(self, node: Activation, keys: ConfigKeys) -> ActivationKeys:
        return ActivationKeys(node, keys.find("hidden_act"))


COMPONENT = _Activation()
