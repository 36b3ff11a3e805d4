"""The output head: whether it is the token embedding (``tie_word_embeddings``),
and what it does to its logits: Cohere's ``logit_scale`` multiplies them,
Granite's ``logits_scaling`` divides them, Gemma-2/3's
``final_logit_softcapping`` soft-caps them (``cap * tanh(logits / cap)``).

A tied head has no weight of its own: vLLM's ``ParallelLMHead.tie_weights``
reuses the embedding (which the last pipeline rank then builds too), the
reference declares ``_tied_weights_keys``. vLLM's ``LogitsProcessor`` applies
each transform (``scale=``, ``soft_cap=``), as vLLM's ``commandr.py``,
``granite.py`` and ``gemma2.py`` do; the reference applies them after its
``lm_head``. Every model has an output head (the component is always present,
its node neutral where the spec sets none of the four); its weight's role
(``lm_head``, absent where tied) stays with the layout's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from onboard.components.base import ConfigProblem, ModelWide, Report, Section

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.spec.model import ModelSpec


class LogitsFields(Section):
    tie_word_embeddings: bool = Field(
        False, description="lm_head shares the embedding."
    )
    logit_scale: float = Field(
        1.0, gt=0, description="Multiplier on the output logits (Cohere)."
    )
    final_logit_softcap: float | None = Field(
        None,
        gt=0,
        description="Soft-cap of the output logits: cap * tanh(logits / cap) "
        "(Gemma-2/3); null: none. Not beside a logit_scale or logits_scaling.",
    )
    logits_scaling: float = Field(
        1.0,
        gt=0,
        description="The output logits are divided by it (Granite's `logits_scaling`).",
    )


@dataclass(frozen=True)
class Logits:
    """The transforms of the output head's logits (neutral: none)."""

    scale: float = 1.0  # multiplier (logit_scale)
    divisor: float = 1.0  # divisor (logits_scaling)
    softcap: float | None = None  # soft-cap (final_logit_softcapping)
    tied: bool = False  # the head is the token embedding (tie_word_embeddings)


@dataclass(frozen=True)
class LogitsKeys:
    """The config keys the generated code reads each transform from (None: the
    model computes without it)."""

    scale: str | None
    divisor: str | None
    softcap: str | None
    tied: bool  # the head is the token embedding


class _Logits(ModelWide):
    name = "logits"
    label = "the logits"
    Fields = LogitsFields
    Node = Logits
    concept_fields = {
        "tie_word_embeddings": ("tie_word_embeddings",),
        "final_logit_softcapping": ("final_logit_softcap",),
        "logit_scale": ("logit_scale",),
        "logits_scaling": ("logits_scaling",),
    }
    vllm_slots = ("causal_lm.logits_processor",)
    hf_slots = ("causal_lm.logits",)

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if spec.final_logit_softcap is None:
            return
        # No family has a soft-cap beside a factor: vLLM would soft-cap, then
        # scale, and which comes first is a guess.
        if spec.logit_scale != 1.0:
            report(("final_logit_softcap",), "is not generated beside a logit_scale")
        if spec.logits_scaling != 1.0:
            report(("final_logit_softcap",), "is not generated beside a logits_scaling")

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        # Always written: a config without the key means its class's default,
        # true for most transformers classes.
        return {"tie_word_embeddings": spec.tie_word_embeddings, **super().config(spec)}

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        tied = get("tie_word_embeddings", None)
        try:
            read = super().read(get)
        except ConfigProblem as exc:
            read, problems = exc.read, list(exc.args)
        else:
            problems = []
        if tied is None:
            problems.insert(
                0, "tie_word_embeddings: required, but the config does not set it"
            )
        if problems:
            raise ConfigProblem(*problems, read=read)
        return read

    def plan(self, spec: ModelSpec, layer: int | None) -> Logits:
        return Logits(
            spec.logit_scale,
            spec.logits_scaling,
            spec.final_logit_softcap,
            tied=spec.tie_word_embeddings,
        )

    def code_context(self, node: Logits, keys: ConfigKeys) -> LogitsKeys:
        return LogitsKeys(
            scale=keys.factor("logit_scale", node.scale),
            divisor=keys.factor("logits_scaling", node.divisor),
            softcap=None
            if node.softcap is None
            else keys.need("final_logit_softcapping", node.softcap),
            tied=node.tied,
        )


COMPONENT = _Logits()
