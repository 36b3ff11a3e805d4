"""The residual stream: how a decoder block adds its token mixer's and its MLP's
outputs to the stream, and where its norms sit.

- ``pre`` (Llama): ``x + mixer(norm(x))``, then ``x + mlp(norm(x))``;
- ``post`` (OLMo-2, EXAONE-4): ``x + norm(mixer(x))``, then ``x + norm(mlp(x))``;
- ``parallel`` (Cohere): ``x + mixer(norm(x)) + mlp(norm(x))``, one norm for both;
- ``sandwich`` (Gemma-2/3): ``x + norm(mixer(norm(x)))``, then the same for the MLP.

Granite scales each sublayer's output by ``residual_multiplier`` before its add
(the factor is :mod:`onboard.components.residual_multiplier`'s field).
Where vLLM's RMSNorm can add the residual in its own kernel (pre-norm and
sandwich blocks of RMSNorms, no multiplier), the generated vLLM layer passes
the residual beside the hidden states, as vLLM's ``llama.py`` does.

Every model has one (the component is always present); its fragments print the
block's norms and its ``forward`` at the decoder layer's slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from onboard.components.base import Component, Report, Section

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.spec.model import ModelSpec

Placement = Literal["pre", "post", "parallel", "sandwich"]

# The norm roles of each placement, in the order the block runs them
# (``parallel``: the one attention and the MLP both read).
NORM_ROLES: dict[str, tuple[str, ...]] = {
    "pre": ("input_norm", "post_attention_norm"),
    "post": ("attention_output_norm", "mlp_output_norm"),
    "parallel": ("input_norm",),
    "sandwich": (
        "input_norm",
        "attention_output_norm",
        "mlp_input_norm",
        "mlp_output_norm",
    ),
}
# What each of those roles normalises: the input or the output of the mixer
# (``attention``) or of the MLP.
NORM_SITES: dict[str, str] = {
    "input_norm": "attention_input",
    "post_attention_norm": "mlp_input",
    "attention_output_norm": "attention_output",
    "mlp_input_norm": "mlp_input",
    "mlp_output_norm": "mlp_output",
}


class ResidualStreamFields(Section):
    placement: Placement = Field(
        "pre",
        description="Where a decoder layer normalises: `pre` normalises the input "
        "of attention and of the MLP (Llama); `post` normalises their outputs, "
        "before each residual add, and the layer input is not normalised "
        "(OLMo-2, EXAONE-4); `parallel` normalises the layer input once, and "
        "attention and the MLP both read it, their outputs added to the residual "
        "together (Cohere); `sandwich` normalises both the inputs and the "
        "outputs (Gemma-2/3).",
    )


@dataclass(frozen=True)
class ResidualStream:
    """One decoder block's residual stream."""

    placement: Placement
    # Factor on each sublayer's output before its residual add (Granite).
    multiplier: float = 1.0

    @property
    def roles(self) -> tuple[str, ...]:
        """Its norms' checkpoint roles, in the order the block runs them."""
        return NORM_ROLES[self.placement]

    def at(self, site: str) -> str | None:
        """The role normalising ``site`` (``attention_input``,
        ``attention_output``, ``mlp_input``, ``mlp_output``), or None."""
        return next((r for r in self.roles if NORM_SITES[r] == site), None)


class _ResidualStream(Component):
    name = "residual_stream"
    label = "the residual stream"
    host = "layer"
    extends = "norm"
    Fields = ResidualStreamFields
    Node = ResidualStream
    field = "norm.placement"
    concept = "norm_placement"
    # Which norm tensors a checkpoint has shows it (spec from-hf).
    visible = ("norm_placement",)

    def present(self, spec: ModelSpec) -> bool:
        return True

    def rules(self, spec: ModelSpec, report: Report) -> None:
        where = ("norm", "placement")
        placement = spec.norm.placement
        if placement == "sandwich" and spec.norm.type != "rmsnorm":
            # The generated layer adds the residual in vLLM's RMSNorm (no family
            # has sandwich LayerNorms).
            report(where, "sandwich norms are generated for rmsnorm only")
        if placement == "parallel" and spec.mlp.moe is not None:
            # No family has both; the layer reduces one dense MLP with attention.
            report(where, "parallel blocks are generated for dense MLPs")

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        # Written only where not pre, so the configs of pre-norm specs have none.
        placement = spec.norm.placement
        return {} if placement == "pre" else {"norm_placement": placement}

    def facts(self, spec: ModelSpec) -> dict[str, Any]:
        return {"norm_placement": spec.norm.placement}

    def multiplier_key(self, stream: ResidualStream, keys: ConfigKeys) -> str | None:
        """The config key of the multiplier the block applies (None: none)."""
        return keys.factor("residual_multiplier", stream.multiplier)

    def plan(self, spec: ModelSpec, layer: int | None) -> ResidualStream:
        # An MTP head's block (layer None) adds without a multiplier.
        multiplier = 1.0 if layer is None else spec.residual_multiplier
        return ResidualStream(spec.norm.placement, multiplier)


COMPONENT = _ResidualStream()
