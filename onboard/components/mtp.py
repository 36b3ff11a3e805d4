"""Multi-token-prediction heads (DeepSeek-V3 style): after the last decoder layer,
each head mixes the normalised embedding of the next token with the normalised
hidden state (``eh_proj``), runs one decoder block and predicts one token further
through the shared output head. vLLM serves them as a speculative draft
(``speculative_config={"method": "mtp"}``: :mod:`onboard.spec.mtp`).

config.json states them as DeepSeek-V3's ``num_nextn_predict_layers`` (also read
as ``num_mtp_layers``) and onboard's ``mtp_mlp`` (the MLP of each head's block).

This module owns the section, its rules, its config keys and the heads' own
checkpoint roles; the heads' plan node (``onboard.arch.plan.MTPPlan``), their
tensors and code stay with the decoder layers they repeat.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from onboard.components.base import Component, Report, Role, Section

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec

MAX_MTP_HEADS = 16


class MTP(Section):
    """Multi-token-prediction heads (DeepSeek-V3 style), used as speculative drafts."""

    num_heads: Annotated[int, Field(gt=0, le=MAX_MTP_HEADS)] = Field(
        description="Number of MTP heads (draft depth)."
    )
    mlp: Literal["moe", "dense"] = Field(
        "moe", description="MLP of each head's decoder block."
    )


class MTPFields(Section):
    mtp: MTP | None = Field(None, description="Multi-token-prediction heads.")


_LAYER = "model.layers.{layer}"  # a head's layer: num_hidden_layers + its index


def _role(path: str, slot: tuple[str, ...] = (), **kw: Any) -> Role:
    # MTP heads stay in 16 bits unless quantize is asked to include them
    # (--include-mtp); whole on each tensor-parallel rank.
    return Role(f"{_LAYER}.{path}", slot, group="MTP heads", shard="replicated", **kw)


_NORM = {"linear": False, "dims": ("hidden_size",)}


class _MTP(Component):
    name = "mtp"
    label = "MTP heads"
    host = "model"
    extends = ""
    Fields = MTPFields
    config_aliases = {
        "num_nextn_predict_layers": ("num_nextn_predict_layers", "num_mtp_layers"),
        "mtp_mlp": ("mtp_mlp",),
    }
    concept_fields = {
        "num_nextn_predict_layers": ("mtp.num_heads",),
        "mtp_mlp": ("mtp.mlp",),
    }
    # Each head's own modules beside its decoder block (DeepSeek-V3's names):
    # the norms of the next token's embedding and of the hidden state, their
    # projection to one hidden state, and the shared head's norm and its copy
    # of the output head (vLLM builds it as a ParallelLMHead).
    roles = {
        "mtp_enorm": _role("enorm", **_NORM),
        "mtp_hnorm": _role("hnorm", **_NORM),
        "mtp_eh_proj": _role(
            "eh_proj", kept=True, dims=("hidden_size", "2 × hidden_size")
        ),
        "mtp_head_norm": _role("shared_head.norm", ("shared_head",), **_NORM),
        "mtp_head": _role(
            "shared_head.head",
            ("shared_head",),
            kept=True,
            dims=("vocab_size", "hidden_size"),
        ),
    }

    def present(self, spec: ModelSpec) -> bool:
        return spec.mtp is not None

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        assert spec.mtp is not None
        return {"num_nextn_predict_layers": spec.mtp.num_heads, "mtp_mlp": spec.mtp.mlp}

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        heads = get("num_nextn_predict_layers", 0) or 0
        mlp = get("mtp_mlp", None)  # read (understood) with or without heads
        if not heads:
            return {}
        if mlp is None:  # each head's block has the model's MLP kind
            mlp = "moe" if get("n_routed_experts", None) else "dense"
        return {"mtp": {"num_heads": heads, "mlp": mlp}}

    def rules(self, spec: ModelSpec, report: Report) -> None:
        mtp = spec.mtp
        if mtp is None:
            return
        if mtp.mlp == "moe" and spec.mlp.moe is None:
            report(("mtp", "mlp"), "is moe but the model has no mlp.moe section")
        if spec.norm.placement != "pre":
            # No family has both; an MTP block of post-norm layers is unverified.
            report(("mtp",), "MTP heads need norm.placement pre")
        # No family has MTP heads beside Gemma's parts: a head's embedding, norms
        # and logits would need them too, unverified.
        for path, on in (
            (("norm", "unit_offset"), spec.norm.unit_offset),
            (("scale_embedding",), spec.scale_embedding),
            (("final_logit_softcap",), spec.final_logit_softcap is not None),
            (("rope", "sliding"), spec.rope.sliding is not None),
        ):
            if on:
                report(("mtp",), f"MTP heads are not generated with {'.'.join(path)}")
        if spec.logit_scale != 1.0:
            # No family has both; the MTP draft's logits would need the scale too.
            report(("logit_scale",), "MTP heads need logit_scale 1")
        multiplied = ", ".join(n for n, v in spec.multipliers.items() if v != 1.0)
        if multiplied:
            # No family has both: what an MTP head would scale is unverified.
            report(("mtp",), f"MTP heads need neutral multipliers ({multiplied})")


COMPONENT = _MTP()
