"""Granite's residual multiplier: each attention and MLP output is scaled by
``residual_multiplier`` before its residual add (``x + m * mixer(norm(x))``).

The factor is a top-level spec field and one config.json key (Granite's class
writes it, at 1 too, and vLLM's ``granite.py`` reads it); the residual stream
(:mod:`onboard.components.residual_stream`) applies it, as its plan node's
``multiplier``, in each decoder layer's ``forward`` (an MTP head's block adds
without). This module owns the field, its key and where it may stand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from onboard.components.base import ModelWide, Report, Section

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec


class ResidualMultiplierFields(Section):
    residual_multiplier: float = Field(
        1.0,
        gt=0,
        description="Factor on each attention and MLP output before its residual "
        "add (Granite's `residual_multiplier`).",
    )


class _ResidualMultiplier(ModelWide):
    name = "residual_multiplier"
    label = "the residual multiplier"
    Fields = ResidualMultiplierFields
    # HyperCLOVAX's config uses Granite's key.
    concept_fields = {"residual_multiplier": ("residual_multiplier",)}

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if spec.residual_multiplier == 1.0:
            return
        where = ("residual_multiplier",)
        if spec.norm.placement != "pre":
            # No family has both; where a post-norm block would scale is unverified.
            report(where, "needs norm.placement pre")
        linear = "linear_attention" in spec.layer_attention_types()
        if linear and spec.linear_attention is not None:
            # No family has both; the generated blocks scale only attention layers.
            report(
                where,
                "linear-attention layers with a residual_multiplier are not generated",
            )


COMPONENT = _ResidualMultiplier()
