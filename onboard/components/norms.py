"""The norms of a model: their kind (RMSNorm or LayerNorm), eps, a LayerNorm's
bias, and Gemma's RMSNorm by (1 + weight). Every norm of the decoder blocks and
the final norm is of this kind (where each block's norms sit is the residual
stream's, :mod:`onboard.components.residual_stream`).

config.json states the kind by the key that carries the eps: ``rms_norm_eps``
(RMSNorm) or ``layer_norm_eps`` (LayerNorm), exactly one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from onboard.components.base import Component, ConfigProblem, Delta, Report, Section

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec

Kind = Literal["rmsnorm", "layernorm"]

# The checkpoint roles (onboard.spec.layouts) of the norms unit_offset applies to:
# every norm of the residual stream, the q/k norms, the final norm and the MTP
# heads' norms; not the linear-attention layers' gated norms.
OFFSET_ROLES = (
    "input_norm",
    "post_attention_norm",
    "attention_output_norm",
    "mlp_input_norm",
    "mlp_output_norm",
    "q_norm",
    "k_norm",
    "final_norm",
    "mtp_enorm",
    "mtp_hnorm",
    "mtp_head_norm",
)


class NormFields(Section):
    type: Kind = Field("rmsnorm", description="Norm kind: `rmsnorm` or `layernorm`.")
    eps: float = Field(1e-6, gt=0, lt=1, description="Epsilon added to the variance.")
    bias: bool = Field(
        True,
        description="layernorm: a bias beside the weight; `false` for a "
        "weight-only LayerNorm (Cohere). An rmsnorm has none.",
    )
    unit_offset: bool = Field(
        False,
        description="RMSNorm scales by (1 + weight) instead of weight, the product "
        "taken in float32 before the cast back (Gemma, Qwen3-Next). Every "
        "RMSNorm of the model, q/k norms included, but the linear-attention "
        "layers' gated norm, which scales by its weight (Qwen3-Next's).",
    )


@dataclass(frozen=True)
class Norms:
    """A layer's norms, of one kind; where they sit is the residual stream's
    (Layer.stream)."""

    kind: Kind
    eps: float
    bias: bool = True  # layernorm: a bias beside the weight
    unit_offset: bool = False  # RMSNorm by (1 + weight), in float32 (Gemma)

    @property
    def has_bias(self) -> bool:
        """Whether each norm has a bias tensor."""
        return self.kind == "layernorm" and self.bias


class _Norms(Component):
    name = "norms"
    label = "norms"
    host = "layer"
    extends = "norm"
    Fields = NormFields
    Node = Norms
    concept_fields = {
        "rms_norm_eps": ("norm.eps",),
        "layer_norm_eps": ("norm.eps",),
        "norm_unit_offset": ("norm.unit_offset",),  # RMSNorm by (1 + weight)
        "norm_bias": ("norm.bias",),  # layernorm: false for a weight-only norm
    }
    # Whether the norms have bias tensors shows in a checkpoint (spec from-hf).
    visible = ("norm_bias",)

    def present(self, spec: ModelSpec) -> bool:
        return True

    def rules(self, spec: ModelSpec, report: Report) -> None:
        norm = spec.norm
        if not norm.bias and norm.type != "layernorm":
            report(("norm", "bias"), "applies only to norm.type layernorm")
        if norm.unit_offset and norm.type != "rmsnorm":
            report(("norm", "unit_offset"), "applies to rmsnorm only")
        if norm.unit_offset and spec.attention.type == "mla":
            # No family has both: MLA's latent norms would be (1 + weight) norms too.
            report(("norm", "unit_offset"), "is not generated for MLA attention")

    def plan(self, spec: ModelSpec, layer: int | None) -> Norms:
        norm = spec.norm
        return Norms(norm.type, norm.eps, norm.bias, norm.unit_offset)

    def family_delta(self, data: dict[str, Any]) -> Delta | None:
        # A family whose RMSNorms scale by 1 + weight (Qwen3-Next) computes
        # plain RMSNorms from weights loaded less one: exact in bfloat16 for
        # weights in [0.5, 2] (Sterbenz), and the family adds the one back in
        # float32.
        norm = data["norm"]
        if norm["type"] != "rmsnorm" or norm["unit_offset"]:
            return None
        norm["unit_offset"] = True
        return Delta(
            "offset_norms",
            "its RMSNorms scale by weight, where {family}'s scale by 1 + weight",
            OFFSET_ROLES,
            -1.0,
        )

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        norm = spec.norm
        out: dict[str, Any] = {
            f"{'rms' if norm.type == 'rmsnorm' else 'layer'}_norm_eps": norm.eps
        }
        # Written only where set, so the configs of plain norms have neither.
        if norm.unit_offset:
            out["norm_unit_offset"] = True
        if not norm.bias:
            out["norm_bias"] = False
        return out

    def facts(self, spec: ModelSpec) -> dict[str, Any]:
        return {"norm_bias": spec.norm.bias}

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        rms, ln = get("rms_norm_eps", None), get("layer_norm_eps", None)
        if (rms is None) == (ln is None):
            raise ConfigProblem(
                "rms_norm_eps / layer_norm_eps: exactly one must be set"
            )
        return {
            "type": "rmsnorm" if rms is not None else "layernorm",
            "eps": rms if rms is not None else ln,
            "bias": get("norm_bias", True),
            "unit_offset": bool(get("norm_unit_offset", False)),
        }


COMPONENT = _Norms()
