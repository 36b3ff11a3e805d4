"""Compare an engine's outputs with a reference's, the way vLLM's own model tests do.

Greedy continuations follow ``check_logprobs_close`` of vLLM's
``tests/models/utils.py``: tokens must agree until the first position where they
differ; there each side's token must be among the other side's top-k logprobs, and
the comparison of that sequence stops (after a justified divergence the two
continuations legitimately go different ways). Prompt logprobs are compared
position by position as an absolute difference in nats. The top-1/top-2 margin is
reported so that a pass on flat logits, where any token would do, cannot hide.

Everything here works on plain data (token ids and ``{token_id: logprob}`` dicts),
so the same code judges the vLLM engine, a second reference, or a quantized model.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# One place for the accuracy thresholds (float32 engine vs float32 reference).
TOP_K = 5
# Float32 kernels differ in summation order; with decisive logits (|logit| ~ 10) the
# differences seen are ~1e-5. 1e-2 nats leaves room for deeper models while still
# catching any real mistake (a wrong rope, norm or routing moves logprobs by >0.1).
PROMPT_LOGPROB_ATOL = 1e-2
# Below this median margin (nats) the greedy check proves little: flag it.
FLAT_MARGIN = 0.1


@dataclass
class GreedyOutput:
    """One greedy continuation: the tokens and, per step, the top-k logprobs."""

    token_ids: list[int]
    top_logprobs: list[dict[int, float]]


@dataclass
class SequenceComparison:
    compared: int
    matched: int
    diverged_at: int | None = None
    engine_token: int | None = None
    reference_token: int | None = None
    accepted: bool = True
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PromptComparison:
    positions: int
    max_abs_diff: float
    mean_abs_diff: float
    top1_agreement: float


def top_k(logprobs: dict[int, float], k: int = TOP_K) -> dict[int, float]:
    """The k most likely entries (vLLM also returns the sampled token beyond k)."""
    best = sorted(logprobs.items(), key=lambda kv: kv[1], reverse=True)[:k]
    return dict(best)


def compare_greedy(
    engine: GreedyOutput, reference: GreedyOutput, k: int = TOP_K
) -> SequenceComparison:
    """Judge one continuation pair by vLLM's ``check_logprobs_close`` rule."""
    n = min(len(engine.token_ids), len(reference.token_ids))
    for i in range(n):
        a, b = engine.token_ids[i], reference.token_ids[i]
        if a == b:
            continue
        in_ref = a in top_k(reference.top_logprobs[i], k)
        in_eng = b in top_k(engine.top_logprobs[i], k)
        result = SequenceComparison(
            compared=n,
            matched=i,
            diverged_at=i,
            engine_token=a,
            reference_token=b,
            accepted=in_ref and in_eng,
        )
        if not in_ref:
            result.reason = f"engine token {a} not in the reference's top-{k}"
        elif not in_eng:
            result.reason = f"reference token {b} not in the engine's top-{k}"
        else:
            result.reason = f"diverged within each other's top-{k}"
        return result
    if len(engine.token_ids) != len(reference.token_ids):
        return SequenceComparison(
            compared=n,
            matched=n,
            accepted=False,
            reason=f"lengths differ: engine {len(engine.token_ids)}, "
            f"reference {len(reference.token_ids)}",
        )
    return SequenceComparison(compared=n, matched=n)


def margins(outputs: Sequence[GreedyOutput]) -> list[float]:
    """Top-1 minus top-2 logprob of every greedy step (nats)."""
    values = []
    for out in outputs:
        for step in out.top_logprobs:
            best = sorted(step.values(), reverse=True)
            if len(best) >= 2:
                values.append(best[0] - best[1])
    return values


def margin_summary(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "median": None}
    return {"min": float(min(values)), "median": float(statistics.median(values))}


def compare_prompt_logprobs(
    engine: Sequence[dict[int, float] | None], reference: np.ndarray
) -> PromptComparison:
    """Compare per-position prompt logprobs.

    ``engine[i]`` holds logprobs of some tokens at prompt position ``i`` (the
    distribution that predicts token ``i``; ``None`` for the first position, which
    nothing predicts). ``reference`` is the full log-softmax, row ``j`` predicting
    token ``j + 1``. Every token the engine reported is compared.
    """
    per_position: list[float] = []
    diffs: list[float] = []
    agree = 0
    for i, entry in enumerate(engine):
        if i == 0 or entry is None:
            continue
        row = reference[i - 1]
        errors = [abs(lp - float(row[tok])) for tok, lp in entry.items()]
        per_position.append(max(errors))
        diffs.extend(errors)
        engine_top = max(entry.items(), key=lambda kv: kv[1])[0]
        agree += int(engine_top == int(np.argmax(row)))
    n = len(per_position)
    return PromptComparison(
        positions=n,
        max_abs_diff=max(per_position, default=0.0),
        mean_abs_diff=float(np.mean(diffs)) if diffs else 0.0,
        top1_agreement=agree / n if n else 1.0,
    )


@dataclass
class AccuracyVerdict:
    passed: bool
    metrics: dict[str, Any]
    details: str


def judge_accuracy(
    prompt_engine: Sequence[Sequence[dict[int, float] | None]],
    prompt_reference: Sequence[np.ndarray],
    greedy_engine: Sequence[GreedyOutput],
    greedy_reference: Sequence[GreedyOutput],
    *,
    atol: float = PROMPT_LOGPROB_ATOL,
    k: int = TOP_K,
) -> AccuracyVerdict:
    """Combine the prompt-logprob and greedy comparisons over a prompt set."""
    prompts = [
        compare_prompt_logprobs(e, r)
        for e, r in zip(prompt_engine, prompt_reference, strict=True)
    ]
    seqs = [
        compare_greedy(e, r, k)
        for e, r in zip(greedy_engine, greedy_reference, strict=True)
    ]
    max_diff = max((p.max_abs_diff for p in prompts), default=0.0)
    positions = sum(p.positions for p in prompts)
    mean_diff = (
        sum(p.mean_abs_diff * p.positions for p in prompts) / positions
        if positions
        else 0.0
    )
    top1 = (
        sum(p.top1_agreement * p.positions for p in prompts) / positions
        if positions
        else 1.0
    )
    eng_margin = margin_summary(margins(greedy_engine))
    ref_margin = margin_summary(margins(greedy_reference))
    failed_seqs = [i for i, s in enumerate(seqs) if not s.accepted]
    metrics: dict[str, Any] = {
        "num_prompts": len(seqs),
        "max_new_tokens": max((s.compared for s in seqs), default=0),
        "top_k": k,
        "prompt_logprob_max_abs_diff": max_diff,
        "prompt_logprob_mean_abs_diff": mean_diff,
        "prompt_logprob_atol": atol,
        "prompt_positions": positions,
        "prompt_top1_agreement": top1,
        "greedy_identical_sequences": sum(s.diverged_at is None for s in seqs),
        "greedy_diverged_accepted": sum(
            s.diverged_at is not None and s.accepted for s in seqs
        ),
        "greedy_failed_sequences": len(failed_seqs),
        "greedy_matched_tokens": sum(s.matched for s in seqs),
        "greedy_compared_tokens": sum(s.compared for s in seqs),
        "top1_top2_margin_min": eng_margin["min"],
        "top1_top2_margin_median": eng_margin["median"],
        "reference_top1_top2_margin_min": ref_margin["min"],
        "reference_top1_top2_margin_median": ref_margin["median"],
        "per_prompt": [
            {"prompt": i, "prompt_logprob_max_abs_diff": p.max_abs_diff, **s.to_dict()}
            for i, (p, s) in enumerate(zip(prompts, seqs, strict=True))
        ],
    }
    problems = []
    if max_diff > atol:
        worst = max(range(len(prompts)), key=lambda i: prompts[i].max_abs_diff)
        problems.append(
            f"prompt logprobs differ by up to {max_diff:.3g} nats (> {atol:g}; "
            f"worst: prompt {worst})"
        )
    for i in failed_seqs:
        s = seqs[i]
        where = "" if s.diverged_at is None else f" at token {s.diverged_at}"
        problems.append(f"prompt {i}: greedy continuation diverged{where}: {s.reason}")
    notes = []
    median = eng_margin["median"]
    if median is not None and median < FLAT_MARGIN:
        notes.append(
            f"warning: median top-1/top-2 margin is {median:.3g} nats; logits are "
            "nearly flat, so agreement on greedy tokens proves little"
        )
    summary = (
        f"{len(seqs)} prompts x {metrics['max_new_tokens']} greedy tokens: "
        f"{metrics['greedy_identical_sequences']} identical, "
        f"{metrics['greedy_diverged_accepted']} diverged within top-{k}, "
        f"{len(failed_seqs)} failed; prompt logprobs max |diff| {max_diff:.3g} "
        f"nats over {positions} positions; top-1/top-2 margin min "
        f"{_fmt(eng_margin['min'])}, median {_fmt(median)} nats"
    )
    details = "\n".join([summary, *problems, *notes])
    return AccuracyVerdict(not problems, metrics, details)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"
