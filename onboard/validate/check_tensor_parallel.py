"""The `tensor-parallel` check: the model split over two ranks gives the tokens of
the unsplit one.

A second engine with ``tensor_parallel_size=2`` runs the run's prompts greedily
with logprobs; its continuations are judged against the main (TP=1) engine's by the
accuracy check's rule (:func:`onboard.runtime.compare.compare_greedy`: a differing
token must sit in the other side's top-k, after which that sequence stops), and
the logprobs of the tokens both sides report are compared. Where the checkpoint's
head counts or widths do not split over two ranks (the rules vLLM's layers apply,
:func:`onboard.spec.rules.tensor_parallel_rules`) the check is not-run with the
reason; it never passes untested.

On the CPU engine each rank needs its own core (docs/vllm-cpu-notes.md: without
``VLLM_CPU_OMP_THREADS_BIND`` vLLM refuses with "Not enough allowed NUMA nodes").
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from onboard.runtime.compare import (
    PROMPT_LOGPROB_ATOL,
    TOP_K,
    GreedyOutput,
    compare_greedy,
)
from onboard.runtime.engine import EngineLoadError
from onboard.spec.config_aliases import read_keys
from onboard.spec.model import ModelSpec
from onboard.spec.rules import (
    TPDims,
    allowed_tensor_parallel_sizes,
    tensor_parallel_problems,
)
from onboard.validate.results import Check

TP_SIZE = 2
# One core per rank: rank 0 on CPU 0, rank 1 on CPU 1.
THREADS_BIND = "0|1"


def dims_for_checkpoint(spec: ModelSpec, config: dict[str, Any]) -> TPDims:
    """The split sizes of the checkpoint vLLM loads: the generated model reads its
    sizes from config.json (a tiny checkpoint shrinks the spec's), so take them
    from there, falling back to the spec's."""
    dims = TPDims.from_spec(spec)

    def read(concept: str, current: int | None) -> int | None:
        if current is None:  # the spec has no such layer: nothing to split
            return None
        for key in read_keys(concept):
            if isinstance(config.get(key), int):
                return config[key]
        return current

    changes = {
        "num_heads": read("num_attention_heads", dims.num_heads),
        "num_kv_heads": read("num_key_value_heads", dims.num_kv_heads),
        "intermediate_size": read("intermediate_size", dims.intermediate_size),
        "expert_intermediate_size": read(
            "moe_intermediate_size", dims.expert_intermediate_size
        ),
        "num_experts": read("n_routed_experts", dims.num_experts),
        "vocab_size": read("vocab_size", dims.vocab_size),
    }
    if dims.shared_expert_intermediate_size is not None:
        shared = config.get("shared_expert_intermediate_size")
        count = read("n_shared_experts", None if shared else 1)
        changes["shared_expert_intermediate_size"] = shared or (
            (count or 1) * changes["expert_intermediate_size"]
        )
    return dataclasses.replace(dims, **changes)


def run(ctx, name: str) -> Check:
    config = json.loads((ctx.model_dir / "config.json").read_text())
    dims = dims_for_checkpoint(ctx.spec, config)
    allowed = allowed_tensor_parallel_sizes(dims)
    base_metrics = {"tensor_parallel_size": TP_SIZE, "allowed_sizes": allowed}
    problems = tensor_parallel_problems(dims, TP_SIZE)
    if problems:
        reasons = "; ".join(f"{'.'.join(map(str, p))}: {m}" for p, m in problems)
        return Check.not_run(
            name,
            f"tensor_parallel_size={TP_SIZE} does not fit {ctx.model_dir.name}'s "
            f"sizes: {reasons} (sizes that fit: {allowed})",
            **base_metrics,
        )
    if ctx.engine is None:
        return Check.not_run(
            name, "the main (TP=1) engine did not start; see accuracy", **base_metrics
        )
    cores = len(os.sched_getaffinity(0))
    if cores < TP_SIZE:
        return Check.not_run(
            name,
            f"the CPU engine needs one core per rank: {TP_SIZE} ranks, {cores} "
            "core(s) available to this process",
            **base_metrics,
        )

    def outputs(engine) -> list[dict]:
        # The same requests at TP=1 and TP=2.
        reply = engine.greedy(ctx.prompts, ctx.max_new_tokens, prompt_logprobs=True)
        return reply["outputs"]

    single = outputs(ctx.engine)
    options = ctx.engine_options(
        extra={**ctx.options.extra, "tensor_parallel_size": TP_SIZE},
        env={**ctx.options.env, "VLLM_CPU_OMP_THREADS_BIND": THREADS_BIND},
    )
    t0 = time.perf_counter()
    try:
        with ctx.extra_engine(f"tp{TP_SIZE}", options) as engine:
            start_s = time.perf_counter() - t0
            model_class = engine.info["model_class"]
            split = outputs(engine)
    except EngineLoadError as exc:
        return Check(
            name,
            "failed",
            {**base_metrics, "engine_error": str(exc)},
            f"vLLM could not load the model with tensor_parallel_size={TP_SIZE}: "
            f"{exc}\n(engine log: {ctx.out_dir / 'logs' / f'engine-tp{TP_SIZE}.log'})",
        )
    return judge(ctx, name, single, split, model_class, start_s, base_metrics)


def judge(
    ctx,
    name: str,
    single: list[dict],
    split: list[dict],
    model_class: str,
    start_s: float,
    metrics: dict[str, Any],
) -> Check:
    seqs = [
        compare_greedy(
            GreedyOutput(b["token_ids"], b["logprobs"]),
            GreedyOutput(a["token_ids"], a["logprobs"]),
        )
        for a, b in zip(single, split, strict=True)
    ]
    greedy_diff = max(
        (
            _max_diff(a["logprobs"][: s.matched + 1], b["logprobs"][: s.matched + 1])
            for a, b, s in zip(single, split, seqs, strict=True)
        ),
        default=0.0,
    )
    prompt_diff = max(
        (
            d
            for a, b in zip(single, split, strict=True)
            for d in _position_diffs(
                a["prompt_logprobs"] or [], b["prompt_logprobs"] or []
            )
        ),
        default=0.0,
    )
    compared = sum(s.compared for s in seqs)
    matched = sum(s.matched for s in seqs)
    metrics = {
        **metrics,
        "prompts": len(seqs),
        "max_new_tokens": ctx.max_new_tokens,
        "identical_sequences": sum(s.diverged_at is None for s in seqs),
        "diverged_accepted": sum(
            s.diverged_at is not None and s.accepted for s in seqs
        ),
        "failed_sequences": sum(not s.accepted for s in seqs),
        "tokens_identical": matched / compared if compared else 1.0,
        "greedy_logprob_max_abs_diff": greedy_diff,
        "prompt_logprob_max_abs_diff": prompt_diff,
        "prompt_logprob_atol": PROMPT_LOGPROB_ATOL,
        "vllm_model_class": model_class,
        "engine_start_s": start_s,
        "per_prompt": [s.to_dict() for s in seqs],
    }
    problems = [
        f"prompt {i}: TP={TP_SIZE} diverged from TP=1 at token {s.diverged_at}: "
        f"{s.reason}"
        for i, s in enumerate(seqs)
        if not s.accepted
    ]
    if prompt_diff > PROMPT_LOGPROB_ATOL:
        problems.append(
            f"prompt logprobs differ by up to {prompt_diff:.3g} nats between TP=1 "
            f"and TP={TP_SIZE} (> {PROMPT_LOGPROB_ATOL:g})"
        )
    main_class = ctx.engine.info["model_class"]
    if model_class != main_class:
        problems.append(
            f"the TP={TP_SIZE} engine instantiated {model_class}, the TP=1 engine "
            f"{main_class}"
        )
    summary = (
        f"tensor_parallel_size={TP_SIZE} vs 1 ({model_class}): {len(seqs)} prompts x "
        f"{ctx.max_new_tokens} greedy tokens, {metrics['identical_sequences']} "
        f"identical, {metrics['diverged_accepted']} diverged within top-{TOP_K}, "
        f"{metrics['failed_sequences']} failed; logprob max |diff| greedy "
        f"{greedy_diff:.3g}, prompt {prompt_diff:.3g} nats"
    )
    status = "failed" if problems else "passed"
    return Check(name, status, metrics, "\n".join([summary, *problems]))


def _position_diffs(a: list, b: list) -> list[float]:
    """Per step, the largest |logprob difference| over the tokens both report."""
    return [
        max((abs(x[t] - y[t]) for t in x.keys() & y.keys()), default=0.0)
        for x, y in zip(a, b, strict=False)
        if x is not None and y is not None
    ]


def _max_diff(a: list, b: list) -> float:
    """Largest |logprob difference| over the tokens both sides report, per step."""
    diffs = [
        abs(x[t] - y[t])
        for x, y in zip(a, b, strict=False)
        if x is not None and y is not None
        for t in x.keys() & y.keys()
    ]
    return max(diffs, default=0.0)
