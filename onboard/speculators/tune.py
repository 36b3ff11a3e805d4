"""`onboard speculators tune`: pick the draft length k per method from measurements.

vLLM fixes k per engine, so every k costs an engine start (about a minute here).
Per method the tuner starts one engine per k = 1..K (K = 4) and shares one engine
without speculation; in each it times the same greedy requests for two batch
bands (batch 8: eight prompts in one call; batch 1: four prompts one at a time)
and reads vLLM's spec-decode counters.

Cost model (what is predicted from what; ``predict`` is the pure function):

- per sequence, a decode step emits 1 + the accepted draft tokens, so over n
  sequences of N new tokens the number of sequence-steps is
  ``S = n (N - 1) - accepted`` (the first token comes from the prefill);
- ``t1``: time of one decode step without speculation (baseline time per call over
  N - 1 steps); ``s(k)``: time of one step with k drafts (spec time per call over
  S / n steps). A step verifies k + 1 tokens per sequence and runs the draft k
  times, so ``s(k) = s(1) + (k - 1) * delta``: linear in k, calibrated on the k = 1
  and k = K engines. ``delta / t1`` is the draft/target cost ratio of one more draft
  token; ``s(1) / t1`` the cost of a step with one draft relative to a plain step;
- acceptance: ``p_i``, vLLM's per-position acceptance (accepted at position i over
  drafts) from the k = K engine, and ``f``, the share of steps that had a draft
  (1 for model drafts; below 1 for n-gram, which drafts only on a match). A draft
  at position i does not depend on k, so the mean tokens per step for any k is
  ``L(k) = 1 + f * sum(p_1..p_k)``;
- predicted speed-up ``t1 * L(k) / s(k)``; measured speed-up: baseline wall-clock
  over speculative wall-clock for the same requests.

k = 1 and k = K calibrate the step cost (their acceptance is still predicted);
k = 2 and 3 are predictions from the other engines' numbers alone. The best k is
the measured best; when no k beats 1.0 the tuner declines speculation for that
band, with the numbers.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onboard.fsutil import atomic_write_text
from onboard.spec.model import ModelSpec, Speculator
from onboard.speculators.acceptance import PREFIX
from onboard.validate.engine import Engine, EngineOptions, Plugin

K_VALUES = (1, 2, 3, 4)
NEW_TOKENS = 32
BANDS = {"batch-8": (8, 1), "batch-1": (1, 4)}  # band: (batch size, calls)
TOLERANCE = 0.15
# Rounds per band and engine; the fastest counts (see measure).
REPEATS = 5


@dataclass
class Run:
    """One band on one engine: wall-clock and spec-decode counter deltas."""

    seconds: float
    sequences: int
    calls: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    @property
    def seq_steps(self) -> int:
        return self.sequences * (NEW_TOKENS - 1) - self.accepted


def step_time_baseline(base: Run) -> float:
    return base.seconds / base.calls / (NEW_TOKENS - 1)


def step_time_spec(run: Run) -> float:
    return run.seconds / run.calls / (run.seq_steps / run.sequences)


def predict(base: Run, k1: Run, kmax: Run, kmax_value: int, k: int) -> dict:
    """Predicted speed-up of draft length ``k`` from the baseline, the k = 1 and
    the k = K runs (see the module docstring)."""
    t1 = step_time_baseline(base)
    s1, sk = step_time_spec(k1), step_time_spec(kmax)
    delta = (sk - s1) / (kmax_value - 1)
    rates = [c / kmax.drafts if kmax.drafts else 0.0 for c in kmax.accepted_per_pos]
    f = kmax.drafts / kmax.seq_steps if kmax.seq_steps else 0.0
    length = 1 + f * sum(rates[:k])
    step = s1 + (k - 1) * delta
    return {
        "predicted_speedup": t1 * length / step,
        "predicted_tokens_per_step": length,
        "predicted_step_s": step,
        "baseline_step_s": t1,
        "draft_cost_ratio": delta / t1,
        "k1_step_cost_ratio": s1 / t1,
        "draft_step_share": f,
    }


def _counters(engine: Engine) -> dict[str, Any]:
    return {k: v for k, v in engine.metrics().items() if k.startswith(PREFIX)}


def measure(engine: Engine, prompts: list[list[int]]) -> dict[str, Run]:
    """Time every band on one engine (after one warm-up call): each band REPEATS
    times, keeping the fastest round (the least disturbed on a shared machine);
    the counters are per round (greedy rounds repeat the same tokens)."""
    engine.generate(prompts[:2], temperature=0.0, max_tokens=4)
    runs = {}
    start = 0
    for band, (batch, calls) in BANDS.items():
        chunks = [prompts[start + i * batch : start + (i + 1) * batch]
                  for i in range(calls)]  # fmt: skip
        start += batch * calls
        before = _counters(engine)
        rounds = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            for chunk in chunks:
                engine.generate(
                    chunk, temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True
                )
            rounds.append(time.perf_counter() - t0)
        after = _counters(engine)

        def per_round(key, after=after, before=before):
            return round(
                ((after.get(PREFIX + key) or 0) - (before.get(PREFIX + key) or 0))
                / REPEATS
            )

        pos_after = list(after.get(PREFIX + "num_accepted_tokens_per_pos") or [])
        pos_before = list(before.get(PREFIX + "num_accepted_tokens_per_pos") or []) or [
            0
        ] * len(pos_after)
        runs[band] = Run(
            seconds=min(rounds),
            sequences=batch * calls,
            calls=calls,
            drafts=per_round("num_drafts"),
            draft_tokens=per_round("num_draft_tokens"),
            accepted=per_round("num_accepted_tokens"),
            accepted_per_pos=tuple(
                round((a - b) / REPEATS)
                for a, b in zip(pos_after, pos_before, strict=True)
            ),
        )
    return runs


def _start(options: EngineOptions, work: Path, label: str, log) -> Engine:
    engine = Engine(options, work / f"engine-{label}", work / f"engine-{label}.log")
    engine.start()
    info = engine.wait_ready()
    log(f"{label}: engine ready in {info['start_s']:.0f} s")
    return engine


def tune_method(
    spec: ModelSpec,
    entry: Speculator,
    config_for_k,
    base: dict[str, Run],
    options: EngineOptions,
    work: Path,
    prompts: list[list[int]],
    log=lambda _m: None,
) -> dict[str, Any]:
    """Measure k = 1..K for one method and compare with the predictions."""
    runs: dict[int, dict[str, Run]] = {}
    for k in (K_VALUES[0], K_VALUES[-1], *K_VALUES[1:-1]):
        extra = {**options.extra, "speculative_config": config_for_k(k)}
        engine = _start(
            dataclasses.replace(options, extra=extra),
            work,
            f"{entry.method}-k{k}",
            log,
        )
        try:
            runs[k] = measure(engine, prompts)
        finally:
            engine.close()
    kmax = K_VALUES[-1]
    result: dict[str, Any] = {"default_k": entry.num_speculative_tokens, "bands": {}}
    for band in BANDS:
        rows = []
        for k in K_VALUES:
            row = predict(
                base[band], runs[K_VALUES[0]][band], runs[kmax][band], kmax, k
            )
            run = runs[k][band]
            measured = base[band].seconds / run.seconds
            row.update(
                k=k,
                measured_speedup=measured,
                error=row["predicted_speedup"] / measured - 1,
                calibration=k in (K_VALUES[0], kmax),
                seconds=run.seconds,
                baseline_seconds=base[band].seconds,
                mean_acceptance_length=1 + run.accepted / run.drafts
                if run.drafts
                else 1.0,
                acceptance_rate_per_position=[
                    c / run.drafts if run.drafts else 0.0 for c in run.accepted_per_pos
                ],
                num_drafts=run.drafts,
                num_draft_tokens=run.draft_tokens,
                num_accepted_tokens=run.accepted,
            )
            rows.append(row)
        best = max(rows, key=lambda r: r["measured_speedup"])
        result["bands"][band] = {
            "rows": rows,
            "best_k": best["k"] if best["measured_speedup"] > 1.0 else None,
            "best_measured_speedup": best["measured_speedup"],
            "within_tolerance": all(abs(r["error"]) <= TOLERANCE for r in rows),
            "decision": (
                f"use k={best['k']} ({best['measured_speedup']:.2f}x)"
                if best["measured_speedup"] > 1.0
                else "decline speculation: no k is faster than decoding without it "
                f"(best k={best['k']}: {best['measured_speedup']:.2f}x)"
            ),
        }
    return result


def tune(
    model_dir: Path,
    spec: ModelSpec,
    methods: list[str],
    out_dir: Path,
    *,
    speculators_dir: Path | None = None,
    plugin: Plugin | None = None,
    log=lambda _m: None,
) -> dict[str, Any]:
    """Tune every method; write OUT/tune.json and OUT/tune.md; return the report."""
    from onboard.errors import InputError
    from onboard.speculators.methods import speculative_config
    from onboard.validate.check_spec_decode import (
        engine_dtype_for,
        entry_for,
        find_draft,
    )
    from onboard.validate.prompts import PROMPTS
    from onboard.validate.reference import tokenize_prompts

    model_dir = Path(model_dir).resolve()
    out_dir = Path(out_dir)
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    prompts, _ = tokenize_prompts(model_dir, PROMPTS, spec.vocab_size)
    mla = spec.attention.type == "mla"
    report: dict[str, Any] = {
        "model_dir": str(model_dir),
        "new_tokens": NEW_TOKENS,
        "bands": {b: {"batch": v[0], "calls": v[1]} for b, v in BANDS.items()},
        "methods": {},
    }
    bases: dict[str | None, dict[str, Run]] = {}
    t_start = time.perf_counter()
    for method in methods:
        entry = entry_for(spec, method)
        draft = None
        if method in ("eagle3", "dflash", "dspark", "draft_model"):
            draft, why = find_draft(spec, entry, speculators_dir)
            if draft is None:
                raise InputError(f"--methods {method}: {why}")
        dtype = engine_dtype_for(spec, method)
        extra = {"dtype": dtype} if dtype else {}
        options = EngineOptions(
            model_dir=model_dir,
            plugin=plugin,
            uses_mla=mla and dtype is None,
            extra=extra,
        )
        if dtype not in bases:
            engine = _start(options, work, f"baseline-{dtype or 'default'}", log)
            try:
                bases[dtype] = measure(engine, prompts)
            finally:
                engine.close()

        def config_for_k(k, entry=entry, draft=draft, method=method, dtype=dtype):
            cfg = speculative_config(
                entry.model_copy(update={"num_speculative_tokens": k}), draft
            )
            if method == "mtp" and mla and dtype is None:
                cfg["attention_backend"] = "CPU_MLA"
            return cfg

        report["methods"][method] = tune_method(
            spec, entry, config_for_k, bases[dtype], options, work, prompts, log
        )
        report["methods"][method]["dtype"] = dtype or "float32"
    report["seconds"] = time.perf_counter() - t_start
    atomic_write_text(out_dir / "tune.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(out_dir / "tune.md", render(report))
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"# Draft-length tuning: {report['model_dir']}", ""]
    for method, result in report["methods"].items():
        for band, data in result["bands"].items():
            lines += [
                f"## {method}, {band} (default k={result['default_k']})",
                "",
                "| k | acceptance per position | mean acceptance length | "
                "predicted speed-up | measured speed-up | error |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for r in data["rows"]:
                rates = ", ".join(f"{x:.2f}" for x in r["acceptance_rate_per_position"])
                mark = " (calibration)" if r["calibration"] else ""
                lines.append(
                    f"| {r['k']}{mark} | {rates} | {r['mean_acceptance_length']:.2f} | "
                    f"{r['predicted_speedup']:.2f}x | {r['measured_speedup']:.2f}x | "
                    f"{r['error']:+.0%} |"
                )
            r0 = data["rows"][0]
            lines += [
                "",
                "Draft/target cost ratio per draft token "
                f"{r0['draft_cost_ratio']:.2f}; "
                f"a step with one draft costs {r0['k1_step_cost_ratio']:.2f} plain "
                f"steps. Decision: {data['decision']}.",
                "",
            ]
    return "\n".join(lines)
