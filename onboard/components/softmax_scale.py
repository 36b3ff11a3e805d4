"""The softmax scale of grouped-query attention: 1/sqrt(head_dim), Gemma-2/3's
``query_pre_attn_scalar`` (the scale is its -1/2 power) or Granite's
``attention_multiplier`` (the scale itself).

Every GQA layer has one, so the component is present wherever attention is
GQA (MLA's scale follows its qk head dim, the MLA component's); its plan node
says which of the three it is. A config that holds the key although the spec
keeps the default (Granite's class always writes ``attention_multiplier``) is
read all the same, as vLLM's ``granite.py`` reads it. The vLLM attention sets
``self.scaling`` from it, the reference's ``self.scale``. It has no tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from onboard.components.base import (
    Component,
    ConfigProblem,
    PositiveInt,
    Report,
    Section,
    is_int,
)

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.spec.model import ModelSpec


class SoftmaxScaleFields(Section):
    query_pre_attn_scalar: PositiveInt | Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="The softmax scale is query_pre_attn_scalar**-0.5 instead of "
        "head_dim**-0.5 (Gemma-2/3); null: head_dim. Not beside softmax_scale.",
    )
    softmax_scale: float | None = Field(
        None,
        gt=0,
        description="Factor on the q.k scores before the softmax (gqa); null means "
        "1/sqrt(head_dim). Granite's `attention_multiplier`.",
    )


@dataclass(frozen=True)
class SoftmaxScale:
    """One GQA layer's softmax scale (both None: 1/sqrt(head_dim))."""

    scalar: float | None = None  # the scale is scalar**-0.5 (Gemma)
    multiplier: float | None = None  # the scale itself (Granite)
    head_dim: int = 0  # what the default scale and a default-valued key follow


@dataclass(frozen=True)
class SoftmaxScaleKeys:
    """The config key the generated code reads the scale from (None for both:
    it computes head_dim**-0.5)."""

    scalar: str | None
    multiplier: str | None


class _SoftmaxScale(Component):
    name = "softmax_scale"
    # Not listed among the attention's parts: every GQA layer has a scale.
    label = ""
    extends = "attention"
    Fields = SoftmaxScaleFields
    Node = SoftmaxScale
    concept_fields = {
        "query_pre_attn_scalar": ("attention.query_pre_attn_scalar",),
        "attention_multiplier": ("attention.softmax_scale",),
    }
    vllm_slots = ("gqa.scaling",)
    hf_slots = ("gqa.scaling",)

    def present(self, spec: ModelSpec) -> bool:
        return spec.attention.type == "gqa"

    def rules(self, spec: ModelSpec, report: Report) -> None:
        att = spec.attention
        if att.type == "mla":
            if att.query_pre_attn_scalar is not None:
                report(
                    ("attention", "query_pre_attn_scalar"),
                    "query_pre_attn_scalar does not apply to MLA attention",
                )
            if att.softmax_scale is not None:
                report(
                    ("attention", "softmax_scale"),
                    "MLA's softmax scale follows qk_head_dim (and yarn's mscale); "
                    "softmax_scale must stay null",
                )
        elif att.query_pre_attn_scalar is not None and att.softmax_scale is not None:
            # Each sets the same thing: which one wins would be a guess.
            report(
                ("attention", "query_pre_attn_scalar"),
                "and attention.softmax_scale both set the softmax scale: set one",
            )

    def plan(self, spec: ModelSpec, layer: int | None) -> SoftmaxScale:
        att = spec.attention
        return SoftmaxScale(att.query_pre_attn_scalar, att.softmax_scale, spec.head_dim)

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        att = spec.attention
        out: dict[str, Any] = {}
        if att.query_pre_attn_scalar is not None:
            out["query_pre_attn_scalar"] = att.query_pre_attn_scalar
        if att.softmax_scale is not None:
            out["attention_multiplier"] = att.softmax_scale
        return out

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        scalar = get("query_pre_attn_scalar", None)
        multiplier = get("attention_multiplier", None)
        if isinstance(multiplier, bool) or not isinstance(
            multiplier, int | float | type(None)
        ):
            raise ConfigProblem(
                f"attention_multiplier={multiplier!r}: must be a number"
            )
        if multiplier is not None and multiplier == _default_scale(get):
            multiplier = None  # the default scale, stated
        if get("kv_lora_rank", None) is not None:
            # MLA's scale follows its qk head dim.
            if scalar is not None:
                raise ConfigProblem(
                    f"query_pre_attn_scalar={scalar!r}: not expressible for MLA "
                    "attention"
                )
            if multiplier is not None:
                raise ConfigProblem(
                    f"attention_multiplier={multiplier!r}: not expressible for MLA"
                )
        out: dict[str, Any] = {}
        if scalar is not None:
            out["query_pre_attn_scalar"] = scalar
        if multiplier is not None:
            out["softmax_scale"] = multiplier
        return out

    def code_context(self, node: SoftmaxScale, keys: ConfigKeys) -> SoftmaxScaleKeys:
        scalar = None
        if node.scalar is not None:
            scalar = keys.need("query_pre_attn_scalar", node.scalar)
        # Read where the config holds it, even at the default (Granite).
        multiplier = (
            keys.find("attention_multiplier", node.head_dim**-0.5)
            if node.multiplier is None
            else keys.need("attention_multiplier", node.multiplier)
        )
        return SoftmaxScaleKeys(scalar, multiplier)


def _default_scale(get: Callable[[str, Any], Any]) -> float | None:
    """1/sqrt(head_dim) of the config (head_dim, else hidden / heads)."""
    head_dim = get("head_dim", None)
    if not is_int(head_dim) or head_dim <= 0:
        heads, hidden = get("num_attention_heads", None), get("hidden_size", None)
        ok = is_int(heads) and is_int(hidden) and heads > 0
        head_dim = hidden // heads if ok else None
    return head_dim**-0.5 if head_dim else None


COMPONENT = _SoftmaxScale()
