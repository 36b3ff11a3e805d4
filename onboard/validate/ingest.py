"""`onboard validate --target T --ingest DIR --out OUT`: judge what an emitted run
(:mod:`onboard.validate.emit`) brought back, against its ``thresholds.json``.

Writes ``OUT/<target>/validation.json`` (the docs/architecture.md contract, one per
target),
``OUT/<target>/report.html`` and a copy of the raw results
(``OUT/<target>/results/``). Checks:

- ``accuracy`` — vLLM's prompt logprobs and greedy continuations
  (results/vllm_accuracy.json) against the Hugging Face reference computed on the
  same machine (results/reference_accuracy.json), judged by
  :func:`onboard.runtime.compare.judge_accuracy` with the thresholds' bounds;
- ``lm-eval:<task>`` — lm-eval's results JSON (results/lm_eval/**/results_*.json);
- ``speed`` — `vllm bench serve --save-result` files (results/bench/baseline/),
  with the engine's own timings per level from the /metrics run.sh saved around
  each level (``metrics-before.prom``, ``metrics-c<C>.prom``);
- ``spec-decode:<method>`` — the server's /metrics after the speculative variant's
  benchmark (results/metrics-spec-<method>.prom) and its benchmark files.

``vllm_model_class`` is the class the baseline server's workers built
(results/model-class-baseline.json, from run.sh's model-class phase); as on the
cpu target, a class outside the generated plugin fails the accuracy check.

A missing DIR, manifest, thresholds or results, a run for another target, or a
malformed result file is bad input (exit 2); a part of the run that left no
results is a ``not-run`` check with the reason.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from onboard.errors import InputError
from onboard.runtime.compare import GreedyOutput, judge_accuracy
from onboard.validate.check_speed import (
    bench_summary,
    engine_timings,
    headline,
    histogram_totals,
    sweep_problems,
)
from onboard.validate.results import Check, ValidationResult
from onboard.validate.serve import spec_decode_counters


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"
        ) from None


def _inputs(target: str, in_dir: Path) -> tuple[dict, dict, Path]:
    from onboard.targets import get_target

    get_target(target)  # an unknown target is bad input
    if not in_dir.is_dir():
        raise InputError(f"--ingest: {in_dir}: no such directory")
    for name in ("manifest.json", "thresholds.json"):
        if not (in_dir / name).is_file():
            raise InputError(
                f"--ingest: {in_dir / name}: missing (not a directory written by "
                "`onboard validate --emit`)"
            )
    manifest = _read_json(in_dir / "manifest.json")
    thresholds = _read_json(in_dir / "thresholds.json")
    if manifest.get("target") != target:
        raise InputError(
            f"--ingest: {in_dir / 'manifest.json'}: target is "
            f"{manifest.get('target')!r} but --target is {target!r}"
        )
    results = in_dir / "results"
    if not results.is_dir() or not any(results.iterdir()):
        raise InputError(
            f"--ingest: {results}: no results (run {in_dir / 'run.sh'} on the "
            f"{target} machine first)"
        )
    return manifest, thresholds, results


# -- accuracy ---------------------------------------------------------------------


def _prompt_rows(engine_rows: list, ref_rows: list, where: str):
    """Engine and reference logprobs of one prompt, over the tokens each position
    reported, remapped to small local indices (a reference row holds only the
    tokens vLLM reported plus the reference's own top-1, not the whole vocabulary).
    The comparison is the same: every reported token, and the top-1 agreement."""
    engine_local: list[dict[int, float] | None] = []
    reference_local: list[np.ndarray] = []
    for i, (entry, ref) in enumerate(zip(engine_rows, ref_rows, strict=True)):
        if i == 0 or entry is None:
            engine_local.append(None)
            if i > 0:
                reference_local.append(np.zeros(1))
            continue
        if ref is None:
            raise InputError(f"{where}: position {i}: no reference row")
        tokens = sorted(set(entry) | set(ref["tokens"]))
        index = {t: j for j, t in enumerate(tokens)}
        missing = [t for t in entry if t not in ref["tokens"]]
        if missing:
            raise InputError(
                f"{where}: position {i}: the reference has no logprob for token(s) "
                f"{missing} vLLM reported (files from different runs?)"
            )
        row = np.full(len(tokens), -math.inf)
        for t, v in ref["tokens"].items():
            row[index[t]] = v
        engine_local.append({index[t]: v for t, v in entry.items()})
        reference_local.append(row)
    return engine_local, reference_local


def _accuracy(results: Path, thresholds: dict) -> tuple[Check, str]:
    eng_path = results / "vllm_accuracy.json"
    ref_path = results / "reference_accuracy.json"
    missing = [p.name for p in (eng_path, ref_path) if not p.is_file()]
    if missing:
        return Check.not_run(
            "accuracy",
            f"no {' or '.join(missing)} in {results} (run.sh accuracy, reference)",
        ), ""
    engine, reference = _read_json(eng_path), _read_json(ref_path)
    if len(engine["prompts"]) != len(reference["prompts"]):
        raise InputError(
            f"{ref_path}: {len(reference['prompts'])} prompts but {eng_path} has "
            f"{len(engine['prompts'])}"
        )
    limits = thresholds["accuracy"]
    prompt_e, prompt_r, greedy_e, greedy_r = [], [], [], []
    for n, (e, r) in enumerate(
        zip(engine["prompts"], reference["prompts"], strict=True)
    ):
        e_rows, r_rows = _prompt_rows(
            e["prompt_logprobs"], r["prompt_rows"], f"{ref_path}: prompt {n}"
        )
        prompt_e.append(e_rows)
        prompt_r.append(r_rows)
        greedy_e.append(_greedy(e))
        greedy_r.append(_greedy(r))
    verdict = judge_accuracy(
        prompt_e,
        prompt_r,
        greedy_e,
        greedy_r,
        atol=limits["prompt_logprob_max_abs_diff"],
        k=limits["top_k"],
    )
    m = verdict.metrics
    problems = []
    if m["prompt_logprob_mean_abs_diff"] > limits["prompt_logprob_mean_abs_diff"]:
        problems.append(
            f"mean prompt logprob |diff| {m['prompt_logprob_mean_abs_diff']:.3g} > "
            f"{limits['prompt_logprob_mean_abs_diff']:g} nats"
        )
    if "min_prompt_tokens" in limits:
        # Sparse MLA: the run shows the sparse path only on prompts past the top-k.
        longest = max(len(e.get("prompt_token_ids") or []) for e in engine["prompts"])
        m["longest_prompt_tokens"] = longest
        if longest < limits["min_prompt_tokens"]:
            problems.append(
                f"no prompt longer than index_topk {limits['index_topk']} (longest "
                f"{longest} tokens): the sparse attention path was not exercised"
            )
    # judge_accuracy fails on any failed sequence; the threshold may allow some.
    allowed = limits.get("greedy_failed_sequences", 0)
    failed_ok = m["greedy_failed_sequences"] <= allowed
    other = m["prompt_logprob_max_abs_diff"] <= limits["prompt_logprob_max_abs_diff"]
    passed = failed_ok and other and not problems
    m["thresholds"] = limits
    m["prompts"] = engine.get("prompts_note", "")
    m["reference_description"] = reference.get("description", "")
    details = "\n".join([verdict.details, *problems])
    status = "passed" if passed else "failed"
    return Check("accuracy", status, m, details), reference.get("description", "")


def _greedy(side: dict) -> GreedyOutput:
    return GreedyOutput(
        list(side["token_ids"]),
        [{int(t): v for t, v in step.items()} for step in side["top_logprobs"]],
    )


# -- lm-eval ----------------------------------------------------------------------


def _lm_eval(results: Path, thresholds: dict) -> list[Check]:
    files = sorted((results / "lm_eval").glob("**/results_*.json"))
    limits = thresholds["lm_eval"]
    if not files:
        return [
            Check.not_run(
                f"lm-eval:{limits['task']}", f"no lm-eval results in {results}/lm_eval"
            )
        ]
    data = _read_json(files[-1])  # the latest run
    checks = []
    metric, minimum = limits["metric"], limits.get("min")
    for task, scores in sorted(data.get("results", {}).items()):
        name = f"lm-eval:{task}"
        if metric not in scores:
            raise InputError(
                f"{files[-1]}: task {task} has no metric {metric!r} "
                f"(has {', '.join(sorted(scores))})"
            )
        score = scores[metric]
        metrics = {
            "task": task,
            "metric": metric,
            "score": score,
            "stderr": scores.get(metric.replace(",", "_stderr,", 1)),
            "scores": {k: v for k, v in scores.items() if k != "alias"},
            "num_samples": (data.get("n-samples", {}).get(task) or {}).get("effective"),
            "min": minimum,
            "results_file": str(files[-1]),
        }
        if minimum is None:
            checks.append(
                Check.not_run(
                    name,
                    f"{task} {metric} = {score:.4f}; thresholds.json sets no minimum "
                    "(lm_eval.min), so it is not judged",
                    **metrics,
                )
            )
            continue
        ok = score >= minimum
        checks.append(
            Check(
                name,
                "passed" if ok else "failed",
                metrics,
                f"{task} {metric} = {score:.4f} ({'>=' if ok else '<'} {minimum:g})",
            )
        )
    return checks


# -- speed and speculative decoding -----------------------------------------------


def _sweep(bench_dir: Path) -> list[dict[str, Any]]:
    files = sorted(bench_dir.glob("bench-c*.json"))
    sweep = [bench_summary(_read_json(f)) for f in files]
    for f, level in zip(files, sweep, strict=True):
        if level["concurrency"] is None or level["output_tokens_per_s"] is None:
            raise InputError(f"{f}: not a `vllm bench serve --save-result` file")
    sweep.sort(key=lambda s: s["concurrency"])
    # The engine's own timings per level: run.sh scrapes /metrics before the
    # sweep (the server already answered accuracy and lm-eval) and after each
    # level, in this order.
    before_path = bench_dir / "metrics-before.prom"
    before = (
        histogram_totals(before_path.read_text()) if before_path.is_file() else None
    )
    for level in sweep:
        path = bench_dir / f"metrics-c{level['concurrency']}.prom"
        if before is None or not path.is_file():
            before = None
            continue
        after = histogram_totals(path.read_text())
        level.update(engine_timings(before, after))
        before = after
    return sweep


def _speed(results: Path, thresholds: dict) -> tuple[Check, list | None]:
    sweep = _sweep(results / "bench" / "baseline")
    if not sweep:
        return Check.not_run(
            "speed", f"no benchmark results in {results}/bench/baseline"
        ), None
    limits = thresholds["speed"]
    metrics = {**headline(sweep), "sweep": sweep, "thresholds": limits}
    problems = sweep_problems("baseline", sweep)
    checks = [
        ("min_output_tokens_per_s", "output_tokens_per_s", lambda v, t: v >= t),
        ("max_ttft_ms", "ttft_ms", lambda v, t: v <= t),
        ("max_tpot_ms", "tpot_ms", lambda v, t: v <= t),
    ]
    for key, metric, ok in checks:
        limit = limits.get(key)
        if limit is not None and not ok(metrics[metric], limit):
            problems.append(f"{metric} {metrics[metric]:.4g} misses {key} {limit:g}")
    lines = [
        f"c={s['concurrency']}: {s['output_tokens_per_s']:.1f} tok/s, TTFT "
        f"{s['ttft_ms']:.1f} ms, TPOT {s['tpot_ms']:.1f} ms"
        for s in sweep
    ]
    status = "failed" if problems else "passed"
    return Check("speed", status, metrics, "\n".join([*lines, *problems])), sweep


def _spec_decode(
    results: Path, manifest: dict, thresholds: dict, base: list | None
) -> list[Check]:
    from onboard.speculators.acceptance import acceptance

    checks = []
    for variant, config in manifest["variants"].items():
        if config is None:
            continue
        method = config["method"]
        name = f"spec-decode:{method}"
        prom = results / f"metrics-{variant}.prom"
        if not prom.is_file():
            checks.append(Check.not_run(name, f"no {prom.name} in {results}"))
            continue
        counters = spec_decode_counters(prom.read_text())
        sweep = _sweep(results / "bench" / variant)
        metrics: dict[str, Any] = {
            "speculative_config": config,
            **acceptance(counters),
            "sweep": sweep,
        }
        problems = []
        if not counters or not counters.get("vllm:spec_decode_num_drafts"):
            problems.append(f"{prom}: the server reported no speculative drafts")
        if sweep and base:
            metrics["speedup"] = (
                sweep[0]["output_tokens_per_s"] / base[0]["output_tokens_per_s"]
            )
            metrics["speedup_concurrency"] = sweep[0]["concurrency"]
        problems += sweep_problems(variant, sweep)
        minimum = (
            thresholds["spec_decode"].get(method, {}).get("min_mean_acceptance_length")
        )
        metrics["min_mean_acceptance_length"] = minimum
        if minimum is not None and metrics["mean_acceptance_length"] < minimum:
            problems.append(
                f"mean acceptance length {metrics['mean_acceptance_length']:.3g} < "
                f"{minimum:g}"
            )
        summary = (
            f"mean acceptance length {metrics['mean_acceptance_length']:.3g} over "
            f"{metrics['num_drafts']} drafts; per position "
            + ", ".join(f"{r:.2f}" for r in metrics["acceptance_rate_per_position"])
        )
        if "speedup" in metrics:
            summary += f"; x{metrics['speedup']:.2f} vs baseline"
        status = "failed" if problems else "passed"
        checks.append(Check(name, status, metrics, "\n".join([summary, *problems])))
    return checks


def ingest(target: str, in_dir: Path, out_dir: Path) -> tuple[ValidationResult, Path]:
    """Judge DIR's results; write OUT/<target>/validation.json and report.html."""
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    manifest, thresholds, results = _inputs(target, in_dir)
    result = ValidationResult(target=target, model_dir=str(manifest["model"]))
    accuracy, reference = _accuracy(results, thresholds)
    result.reference = reference
    speed, base = _speed(results, thresholds)
    result.checks = [
        accuracy,
        *_lm_eval(results, thresholds),
        speed,
        *_spec_decode(results, manifest, thresholds, base),
    ]
    if manifest.get("plugin"):
        result.vllm_model_class = _model_class(
            results, manifest["plugin"]["package"], accuracy
        )
    target_dir = out_dir / target
    target_dir.mkdir(parents=True, exist_ok=True)
    copy = target_dir / "results"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(results, copy)
    result.write(target_dir)
    from onboard.validate.report import write_report

    write_report(result, target_dir)
    return result, target_dir


def _model_class(results: Path, package: str, accuracy: Check) -> str:
    """The class vLLM instantiated (run.sh's model-class phase asked every
    worker); recorded on the accuracy check as on the cpu target, where a class
    outside the generated plugin fails it: the numbers would be another model's."""
    path = results / "model-class-baseline.json"
    if not path.is_file():
        accuracy.details += (
            f"\nmodel class: not recorded (no {path.name}: run.sh's model-class "
            "phase did not run or the server had no onboard_probe extension)"
        )
        return ""
    data = _read_json(path)
    model_class = data.get("model_class")
    workers = data.get("workers")
    if not isinstance(workers, list) or not workers:
        raise InputError(f"{path}: no workers answered (not written by onboard_probe)")
    if not model_class:
        model_class = " / ".join(sorted(set(map(str, workers))))
    generated = model_class.startswith(package + ".")
    if accuracy.status != "not-run":
        accuracy.metrics["vllm_model_class"] = model_class
        accuracy.metrics["generated_class_instantiated"] = generated
        if not generated:
            accuracy.status = "failed"
            accuracy.details += (
                f"\nvLLM instantiated {model_class}, not the generated class from "
                f"{package}: the plugin did not take effect"
            )
    return model_class
