"""The `spec-decode:<method>` check: speculative decoding on the real engine.

For one method of the spec's ``speculators:`` list, an extra engine is started with
that method's ``speculative_config`` (built by :mod:`onboard.speculators`), the
check's prompts are generated greedily with top-k logprobs, and the output is
compared with the same prompts without speculation by the accuracy check's rule
(``compare_greedy``: equal tokens, or a first divergence inside each other's
top-k). Speculative decoding is lossless by construction, so any other divergence
is a bug in the draft wiring or the verifier.

Reported (metric names from docs/architecture.md): ``mean_acceptance_length`` (1 +
accepted
draft tokens per verification step), ``acceptance_rate_per_position`` (vLLM's
``spec_decode_num_accepted_tokens_per_pos`` over ``spec_decode_num_drafts``) and
``speedup`` (wall-clock of the same generate call without / with speculation,
measured in this run; on two CPU cores below 1 is an honest answer), plus the raw
counters, k, the proposer and the draft class vLLM actually instantiated, and for
draft models with several layers (MTP heads) how often each layer ran.

The baseline is the run's main engine (same settings, no speculation). An
EAGLE-3 head beside an MLA verifier runs with its attention declared a sliding
window of its whole context, so that vLLM gives it a KV-cache group of its own
(:mod:`onboard.runtime.cpu_draft`: the CPU MLA and attention backends take no
common block size); that runs on any x86-64 CPU, AMX or not.

Methods: ngram, mtp, eagle3, p_eagle and dflash run on the pinned vLLM CPU
build (measured; the EAGLE and DFlash input kernels have C++ CPU
implementations, ``vllm/utils/cpu_triton_utils.py``, and ``CPU_ATTN`` takes
their query blocks); a failure to start them is a failed check. dspark and
dflash2 are not-run with the reason (``cpu_method_limit``: vLLM 0.32 runs them
in the V2 model runner only, which needs Triton). Any other method is attempted
for real
and, if vLLM refuses it, reported as not-run with vLLM's own reason and, where
that reason points at one, the CPU feature this machine lacks.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from onboard.runtime.compare import TOP_K
from onboard.runtime.cpu_draft import (
    block_clash,
    cpu_features,
    describe,
    full_window_draft,
    lacking_note,
    needs_full_window,
    variable_drafts_note,
)
from onboard.runtime.engine import EngineLoadError
from onboard.spec.model import ModelSpec
from onboard.speculators.acceptance import PREFIX, acceptance
from onboard.speculators.methods import (
    DRAFT_METHODS,
    entry_for,
    find_draft,
    refusals,
    speculative_config,
)
from onboard.speculators.tiny_draft import lossless
from onboard.targets.cpu_kernels import cpu_method_limit, cpu_speculation_limit
from onboard.validate.results import Check

# Run on vLLM 0.32's CPU build (docs/vllm-cpu-notes.md, docs/speculators.md): a load
# failure
# of these is a failure, of the others vLLM's reason for not running on CPU.
CPU_METHODS = ("ngram", "mtp", "eagle3", "p_eagle", "dflash")
PROBES = "onboard.speculators.probes"
WARMUP_TOKENS = 4


def _counters(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k.startswith(PREFIX)}


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """Counters of one generate call (vLLM's are cumulative)."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, list):
            old = old or [0] * len(value)
            out[key] = [a - b for a, b in zip(value, old, strict=False)]
        elif isinstance(value, int | float):
            out[key] = value - (old or 0)
    return out


def timed_generate(engine, prompts, max_tokens: int, warm: bool = True):
    """Greedy outputs, the wall-clock of the generate call and its spec-decode
    counters. ``warm``: one short call first, so that first-call costs (buffer
    allocation, numba compilation of the n-gram matcher) stay out of the timing."""
    if warm:
        engine.generate(prompts[:2], temperature=0.0, max_tokens=WARMUP_TOKENS)
    before = _counters(engine.metrics())
    t0 = time.perf_counter()
    reply = engine.greedy(prompts, max_tokens)
    seconds = time.perf_counter() - t0
    counters = _delta(_counters(engine.metrics()), before)
    return reply["outputs"], seconds, counters


def run(ctx, name: str) -> Check:
    method = name.split(":", 1)[1]
    if ctx.engine is None:
        return Check.not_run(name, "the main engine did not start (see accuracy)")
    spec: ModelSpec = ctx.spec
    limit = cpu_speculation_limit(spec)
    if limit is not None:
        return Check.not_run(name, f"not run on cpu: {limit}", method=method)
    method_limit = cpu_method_limit(method)
    if method_limit is not None:
        return Check.not_run(name, f"not run on cpu: {method_limit}", method=method)
    entry = entry_for(spec, method)
    problems = refusals(spec.model_copy(update={"speculators": [entry]}))
    if problems:
        return Check(
            name,
            "failed",
            {"method": method, "refusals": problems},
            "vLLM would reject this speculative config:\n" + "\n".join(problems),
        )
    draft = None
    if method in DRAFT_METHODS:
        draft, why_not = find_draft(spec, entry, ctx.speculators_dir)
        if draft is None:
            return Check.not_run(name, why_not, method=method)
    served = {}
    if draft is not None and needs_full_window(spec, method):
        draft, served = full_window_draft(draft, ctx.out_dir / "drafts" / method)
    config = speculative_config(entry, draft)
    backend = (ctx.options.engine_kwargs().get("attention_config") or {}).get("backend")
    if method == "mtp" and backend:
        # The MTP layers are the verifier's kind of attention; left alone, vLLM
        # picks the draft's backend anew (on CPU: AMX MLA, which takes no float32).
        config["attention_backend"] = backend
    metrics: dict[str, Any] = {
        "method": method,
        "num_speculative_tokens": entry.num_speculative_tokens,
        "speculative_config": config,
        **served,
        "dtype": ctx.options.engine_kwargs()["dtype"],
        "cpu_features": cpu_features(),
        "prompts": len(ctx.prompts),
        "max_new_tokens": ctx.max_new_tokens,
    }
    options = ctx.engine_options(
        extra={**ctx.options.extra, "speculative_config": config}
    )
    try:
        with ctx.extra_engine(f"spec-{method}", options) as engine:
            metrics["engine_start_s"] = engine.info["start_s"]
            metrics["target_model_class"] = engine.info["model_class"]
            metrics["drafter"] = engine.rpc(f"{PROBES}:drafter_info")
            metrics["attention_groups"] = engine.rpc(
                "onboard.runtime.engine_probes:attention_groups"
            )
            counted = engine.rpc(f"{PROBES}:count_draft_layer_calls")
            outputs, spec_s, counters = timed_generate(
                engine, ctx.prompts, ctx.max_new_tokens
            )
            if counted:
                metrics["draft_layer_calls"] = engine.rpc(f"{PROBES}:draft_layer_calls")
    except EngineLoadError as exc:
        reason = exc.failure.get("error") or str(exc)
        note = lacking_note(reason, metrics["cpu_features"])
        why = f"{reason} ({note})" if note else reason
        # vLLM's CPU build cannot place this draft beside the MLA verifier: a
        # limit of the engine on this CPU, not a failure of the model or draft.
        if method in CPU_METHODS and not block_clash(reason):
            return Check(
                name,
                "failed",
                {**metrics, "engine_error": reason},
                f"vLLM could not start {method} speculative decoding: {why}",
            )
        return Check.not_run(
            name,
            f"not run on cpu: vLLM {_vllm_version()} refused it: {why}",
            **metrics,
            engine_error=reason,
        )
    if method == "mtp" and spec.mtp is not None:
        metrics.update(_mtp_heads(ctx, entry.num_speculative_tokens))
    if method in ("dflash", "p_eagle") and draft is not None:
        metrics.update(_replay(ctx, method, Path(draft), entry.num_speculative_tokens))
    base_outputs, base_s, _ = timed_generate(
        ctx.engine, ctx.prompts, ctx.max_new_tokens, warm=False
    )
    baseline_label = "the main engine (same settings, no speculation)"
    check = judge(
        name, metrics, counters, outputs, base_outputs, spec_s, base_s, baseline_label
    )
    known = variable_drafts_note(spec, method)
    if check.status == "failed" and not metrics["lossless"]["passed"] and known:
        check.details += "\n" + known
    return check


def _mtp_heads(ctx, k: int) -> dict[str, Any]:
    """The generated reference's view of the MTP heads on the check's prompts:
    which head vLLM runs at each draft step (the codegen's finding; the engine's
    own per-layer call counts are in ``draft_layer_calls``), the acceptance of
    that schedule as a speculative decoder counts it (``decoded_per_position``:
    the figure to set beside the engine's ``acceptance_rate_per_position``), each
    head's own acceptance (what the engine leaves on the table) and, from the
    checkpoint's ``mtp_training.json``, the same figures of the untrained heads."""
    import json

    from onboard.spec.mtp import heads_run_by_vllm
    from onboard.speculators.mtp_train import REPORT_FILE, reference_mtp_acceptance

    spec = ctx.spec
    runs = heads_run_by_vllm(spec, k)
    out: dict[str, Any] = {"mtp_heads_run_per_step": runs}
    training = Path(ctx.model_dir) / REPORT_FILE
    if training.is_file():
        report = json.loads(training.read_text())
        out["mtp_training"] = {
            "heldout": report.get("heldout"),
            "untrained_as_vllm_runs": report.get("before_as_vllm_runs"),
            "trained_as_vllm_runs": report.get("after_as_vllm_runs"),
            "untrained_own_heads": report.get("before"),
            "trained_own_heads": report.get("after"),
        }
    else:
        out["mtp_training"] = None  # heads as the checkpoint came (not trained here)
    try:
        engine_like = reference_mtp_acceptance(
            ctx.model_dir, spec, ctx.prompts, heads=runs
        )
        own = None
        if spec.mtp.num_heads > 1:
            own = reference_mtp_acceptance(
                ctx.model_dir, spec, ctx.prompts, min(k, spec.mtp.num_heads)
            )
    except Exception as exc:  # the reference is extra information, not the check
        out["mtp_reference_error"] = f"{type(exc).__name__}: {exc}"
        return out
    out["mtp_reference_acceptance_as_vllm_runs"] = engine_like.to_dict()
    if own is not None:
        out["mtp_reference_acceptance_own_heads"] = own.to_dict()
    return out


def _replay(ctx, method: str, draft: Path, k: int) -> dict[str, Any]:
    """For a draft onboard trained (its ``training.json`` beside it): the
    plain-torch copy of vLLM's DFlash draft (or P-EAGLE pass) replayed over the
    reference's greedy continuations of the check's prompts, counted as vLLM
    counts (``dflash_train.replay_acceptance``): the figure the engine's counters
    should equal. Reported as ``<method>_replay``."""
    from onboard.speculators.dflash_train import replay_acceptance

    if not (draft / "training.json").is_file():
        return {}
    try:
        replay = replay_acceptance(
            draft, ctx.model_dir, ctx.spec, ctx.prompts, k, ctx.max_new_tokens
        )
    except Exception as exc:  # extra information, not the check
        return {f"{method}_replay_error": f"{type(exc).__name__}: {exc}"}
    return {f"{method}_replay": replay}


def _rates(values) -> str:
    return ", ".join(f"{r:.2f}" for r in values)


def judge(name, metrics, counters, outputs, base_outputs, spec_s, base_s, baseline):
    rates = acceptance(counters)
    verdict = lossless(outputs, base_outputs)
    metrics.update(rates)
    k = metrics["num_speculative_tokens"]
    drafts = rates["num_drafts"]
    metrics.update(
        draft_acceptance_rate=(
            rates["num_accepted_tokens"] / rates["num_draft_tokens"]
            if rates["num_draft_tokens"]
            else 0.0
        ),
        speedup=base_s / spec_s if spec_s else None,
        generate_s=spec_s,
        baseline_generate_s=base_s,
        baseline=baseline,
        lossless=verdict,
    )
    lines = [
        f"{metrics['method']} k={k}: {drafts} drafts, mean acceptance length "
        f"{rates['mean_acceptance_length']:.2f}, acceptance per position "
        + ", ".join(f"{r:.2f}" for r in rates["acceptance_rate_per_position"])
        + f"; speed-up {metrics['speedup']:.2f}x ({base_s:.2f} s -> {spec_s:.2f} s"
        f" vs {baseline})",
        f"lossless: {verdict['identical']}/{verdict['prompts']} identical, "
        f"{'all' if verdict['passed'] else 'NOT all'} others within each other's "
        f"top-{TOP_K}",
    ]
    drafter = metrics.get("drafter") or {}
    if drafter.get("draft_model_class"):
        lines.append(f"draft model class: {drafter['draft_model_class']}")
    if metrics.get("cpu_features"):
        lines.append(f"cpu: {describe(metrics['cpu_features'])}")
    if metrics.get("draft_attention"):
        lines.append(f"draft attention: {metrics['draft_attention']}")
    if metrics.get("attention_groups"):
        lines.append(
            "attention backends (KV blocks): "
            + ", ".join(
                f"{g['backend']} ({g['kernel_block_size']}"
                + (", draft)" if g["draft"] else ")")
                for g in metrics["attention_groups"]
            )
        )
    if metrics.get("draft_layer_calls"):
        lines.append(f"draft layer calls: {metrics['draft_layer_calls']}")
    if metrics.get("mtp_heads_run_per_step"):
        lines.append(
            f"MTP head run per draft step: {metrics['mtp_heads_run_per_step']}"
        )
    own = metrics.get("mtp_reference_acceptance_own_heads")
    ran = metrics.get("mtp_reference_acceptance_as_vllm_runs")
    if ran:
        lines.append(
            "reference, as vLLM runs the heads and drafts (after each verification):"
            f" acceptance per position {_rates(ran['decoded_per_position'])}, mean "
            f"length {ran['decoded_mean_acceptance_length']:.2f}; at every slot "
            f"{_rates(ran['per_position'])}"
        )
    if own:
        lines.append(
            "reference, each head at its own step: acceptance per position "
            f"{_rates(own['decoded_per_position'])} as decoded, mean length "
            f"{own['decoded_mean_acceptance_length']:.2f}"
        )
    replay = metrics.get(f"{metrics['method']}_replay")
    if replay:
        lines.append(
            "reference replay of the draft (plain torch, as vLLM drafts): "
            f"{replay['num_drafts']} drafts, acceptance per position "
            f"{_rates(replay['acceptance_rate_per_position'])}, mean length "
            f"{replay['mean_acceptance_length']:.2f}"
        )
    training = metrics.get("mtp_training")
    if training and training.get("untrained_as_vllm_runs"):
        before = _rates(training["untrained_as_vllm_runs"]["decoded_per_position"])
        after = _rates(training["trained_as_vllm_runs"]["decoded_per_position"])
        lines.append(
            "MTP heads untrained -> trained (reference, held-out prompts, as vLLM "
            f"runs them): acceptance per position {before} -> {after}"
        )
    elif "mtp_training" in metrics and training is None:
        lines.append("MTP heads: not trained by onboard (no mtp_training.json)")
    problems = []
    if not verdict["passed"]:
        problems.append("the output with speculation differs from the output without")
    if drafts == 0:
        problems.append("vLLM made no drafts (speculation did not run)")
    status = "passed" if not problems else "failed"
    return Check(name, status, metrics, "\n".join(lines + problems))


def _vllm_version() -> str:
    from importlib.metadata import version

    try:
        return version("vllm-cpu")
    except Exception:
        return version("vllm")
