"""The `speed` check: vLLM's own serving benchmark on the cpu target.

For each variant — the checkpoint as validated (``baseline``), the same with the
spec's first speculative method the CPU engine runs without a trained draft
(``spec:ngram``, or ``spec:mtp`` when the model has MTP heads), and every quantized
checkpoint of ``ctx.quantized`` whose scheme the CPU engine loads
(``quant:<scheme>``) — one `vllm serve` starts with the generated plugin visible
(:mod:`onboard.validate.serve`) and `vllm bench serve`'s own code
(:mod:`onboard.validate.bench_sweep`) runs a concurrency sweep against it with
``--save-result``. TTFT, TPOT and throughput are read from vLLM's result JSON
(copied to ``OUT/speed/<variant>/bench-c<C>.json``); speculative acceptance from
the server's /metrics. The engine's own timings of the same requests (its /metrics
histograms, scraped after each level) are kept beside the client's: a client
TPOT far below the engine's means the tokens reached the client in bursts (the
benchmark was starved of CPU, as on a machine busy with other work): that is a
measurement the machine could not take, not a fault of the model, so the variant
is measured again, and if it still comes in bursts the check is ``not-run`` with
that reason and the machine's load, rather than ``failed`` (kept for failed
requests). See docs/validation.md ("Speed").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onboard.runtime.engine import EngineOptions
from onboard.targets.cpu_kernels import cpu_speculation_limit
from onboard.validate.results import Check
from onboard.validate.serve import Server, parse_prometheus, spec_decode_counters

CONCURRENCY = (1, 2, 4)
INPUT_LEN = 32
OUTPUT_LEN = 32
# Requests per concurrency level: enough for every slot to be busy twice.
PROMPTS_PER_SLOT = 2
MIN_PROMPTS = 4
# Requests of an emulated quantized variant (one level; see _variants).
EMULATED_PROMPTS = 2
# Speculative methods the CPU engine runs without a trained draft checkpoint.
_CPU_SPEC_METHODS = ("ngram", "mtp")
TOOL = "vllm bench serve (vllm.benchmarks.serve, random dataset, --save-result)"
# A client TPOT under this share of the engine's own is not a per-token figure:
# tokens reached the benchmark in bursts (0.005 ms when all arrive in one read).
MIN_CLIENT_ENGINE_TPOT = 0.1
# Sweeps of one variant until its tokens arrive per token (a busy machine).
MEASURE_TRIES = 2
# vLLM's /metrics histograms of the engine's token timings (seconds):
# onboard name -> metric.
ENGINE_HISTOGRAMS = {
    "engine_ttft_ms": "vllm:time_to_first_token_seconds",
    "engine_tpot_ms": "vllm:request_time_per_output_token_seconds",
    "engine_itl_ms": "vllm:inter_token_latency_seconds",
}


@dataclass
class Variant:
    label: str
    options: EngineOptions
    speculative_config: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # Only the lowest concurrency level (see _variants); None: the whole sweep.
    lowest_only: bool = False


def num_prompts(concurrency: int) -> int:
    return max(MIN_PROMPTS, PROMPTS_PER_SLOT * concurrency)


def bench_args(model: str, concurrency: int, tokenizer: str | None = None) -> list:
    """`vllm bench serve` arguments of one sweep level (without the server URL and
    the result file)."""
    return [
        "--backend",
        "vllm",
        "--model",
        model,
        "--tokenizer",
        tokenizer or model,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--num-prompts",
        str(num_prompts(concurrency)),
        "--num-warmups",
        "1",
        "--temperature",
        "0",
        "--seed",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
    ]


def bench_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one `vllm bench serve --save-result` JSON, in onboard's
    names (``ttft_ms``/``tpot_ms`` are medians, as vLLM prints them)."""
    return {
        "concurrency": result.get("max_concurrency"),
        "num_prompts": result.get("num_prompts"),
        "completed": result.get("completed"),
        "failed": result.get("failed", 0),
        "duration_s": result.get("duration"),
        "output_tokens_per_s": result.get("output_throughput"),
        "total_tokens_per_s": result.get("total_token_throughput"),
        "request_throughput": result.get("request_throughput"),
        "ttft_ms": result.get("median_ttft_ms"),
        "mean_ttft_ms": result.get("mean_ttft_ms"),
        "p99_ttft_ms": result.get("p99_ttft_ms"),
        "tpot_ms": result.get("median_tpot_ms"),
        "mean_tpot_ms": result.get("mean_tpot_ms"),
        "p99_tpot_ms": result.get("p99_tpot_ms"),
        "itl_ms": result.get("median_itl_ms"),
    }


def histogram_totals(text: str) -> dict[str, float]:
    """``<metric>_sum`` and ``<metric>_count`` of the engine histograms in a
    /metrics text, summed over engines and label sets."""
    wanted = {
        f"{m}_{part}" for m in ENGINE_HISTOGRAMS.values() for part in ("sum", "count")
    }
    totals = dict.fromkeys(wanted, 0.0)
    for name, _, value in parse_prometheus(text):
        if name in wanted:
            totals[name] += value
    return totals


def engine_timings(before: dict[str, float], after: dict[str, float]) -> dict:
    """The engine's mean TTFT, per-request TPOT and inter-token latency (ms) over
    the requests between two scrapes (one sweep level, its warm-up included)."""
    out: dict[str, Any] = {}
    for key, metric in ENGINE_HISTOGRAMS.items():
        count = after[f"{metric}_count"] - before.get(f"{metric}_count", 0.0)
        total = after[f"{metric}_sum"] - before.get(f"{metric}_sum", 0.0)
        out[key] = total / count * 1000 if count > 0 else None
    return out


def sweep_problems(label: str, sweep: list[dict[str, Any]]) -> list[str]:
    """A level whose requests did not all complete, or that measured nothing."""
    problems = []
    for level in sweep:
        c = level["concurrency"]
        if level["failed"] or level["completed"] != level["num_prompts"]:
            problems.append(
                f"{label} at concurrency {c}: {level['completed']} of "
                f"{level['num_prompts']} requests completed ({level['failed']} failed)"
            )
        elif not level["output_tokens_per_s"]:
            problems.append(f"{label} at concurrency {c}: no output tokens measured")
    return problems


def unmeasured_levels(label: str, sweep: list[dict[str, Any]]) -> list[str]:
    """A level whose client TPOT is no per-token figure (far below the engine's
    own): the tokens reached the benchmark in bursts."""
    problems = []
    for level in sweep:
        c = level["concurrency"]
        engine = level.get("engine_tpot_ms")
        if engine and (level["tpot_ms"] or 0.0) < MIN_CLIENT_ENGINE_TPOT * engine:
            problems.append(
                f"{label} at concurrency {c}: the benchmark's median TPOT "
                f"{level['tpot_ms']:.3g} ms is under {MIN_CLIENT_ENGINE_TPOT:g}x the "
                f"engine's {engine:.3g} ms: the streamed tokens reached the client "
                "in bursts (client short of CPU), so TTFT/TPOT are not per-token"
            )
    return problems


def headline(sweep: list[dict[str, Any]]) -> dict[str, Any]:
    """The docs/architecture.md metrics: best output throughput over the sweep,
    TTFT and TPOT (medians) at the lowest concurrency (one request at a time)."""
    first = min(sweep, key=lambda s: s["concurrency"])
    best = max(sweep, key=lambda s: s["output_tokens_per_s"] or 0.0)
    return {
        "output_tokens_per_s": best["output_tokens_per_s"],
        "output_tokens_per_s_concurrency": best["concurrency"],
        "ttft_ms": first["ttft_ms"],
        "tpot_ms": first["tpot_ms"],
        "latency_concurrency": first["concurrency"],
    }


def _variants(ctx) -> tuple[list[Variant], list[str]]:
    from onboard.speculators.methods import speculative_config
    from onboard.targets import get_target
    from onboard.validate.check_quant import engine_dtype

    base = ctx.engine_options()
    out = [Variant("baseline", base)]
    notes = []
    entry = next(
        (s for s in ctx.spec.speculators if s.method in _CPU_SPEC_METHODS), None
    )
    limit = cpu_speculation_limit(ctx.spec)
    if entry is not None and limit is not None:
        notes.append(f"no speculative variant: {limit}")
    elif entry is not None:
        config = speculative_config(entry, None)
        backend = (base.engine_kwargs().get("attention_config") or {}).get("backend")
        if entry.method == "mtp" and backend:
            # The MTP layers are the verifier's kind of attention; left alone, vLLM
            # picks the draft's backend anew (on CPU: AMX MLA, which takes no
            # float32), as check_spec_decode does.
            config["attention_backend"] = backend
        extra = {**base.extra, "speculative_config": config}
        out.append(
            Variant(f"spec:{entry.method}", ctx.engine_options(extra=extra), config)
        )
    elif ctx.spec.speculators:
        notes.append(
            "no speculative variant: the spec's methods ("
            + ", ".join(s.method for s in ctx.spec.speculators)
            + ") need a trained draft; the CPU sweep runs ngram/mtp only"
        )
    cpu = get_target("cpu")
    moe = ctx.spec.mlp.moe is not None
    for scheme, path in sorted(ctx.quantized.items()):
        if cpu.scheme(scheme).level(moe) == "unsupported":
            notes.append(f"quant:{scheme}: the CPU engine cannot load it (targets)")
            continue
        emulated = cpu.scheme(scheme).level(moe) == "emulated"
        if emulated:
            # FP8 without AMX-FP8 runs vLLM's W8A16 fallback, tens of times slower
            # per token than float32 here: a correctness path, not a speed one.
            # One level says so; three would take most of a full run's budget.
            notes.append(
                f"quant:{scheme}: emulated on the CPU (targets): lowest concurrency "
                f"level only, {EMULATED_PROMPTS} requests"
            )
        # The dtype the quant check runs the scheme in on this engine (fp8-block's
        # CPU kernel takes bfloat16 activations only: "fp8_scaled_mm_cpu: expect A
        # to be bfloat16 or half" at the first request in float32).
        dtype = engine_dtype(scheme, base.engine_kwargs()["dtype"])
        options = ctx.engine_options(
            model_dir=path, extra={**base.extra, "dtype": dtype}
        )
        out.append(Variant(f"quant:{scheme}", options, lowest_only=emulated))
    return out, notes


def run_variant(
    variant: Variant,
    tokenizer: str,
    work_dir: Path,
    out_dir: Path,
    log_dir: Path,
    concurrency: tuple[int, ...] = CONCURRENCY,
    min_prompts: int = MIN_PROMPTS,
) -> dict[str, Any]:
    """Serve one variant and run the sweep; its summary and the result files."""
    slug = variant.label.replace(":", "-")
    result_dir = out_dir / slug
    result_dir.mkdir(parents=True, exist_ok=True)
    server = Server(variant.options, work_dir / slug, log_dir / f"serve-{slug}.log")
    bench_log = log_dir / f"bench-{slug}.log"
    t0 = time.perf_counter()
    with server.start():
        # The benchmark client imports vLLM while the server boots, then waits
        # for /health.
        args = bench_args(server.model, max(concurrency), tokenizer)
        levels = ",".join(map(str, concurrency))
        with open(bench_log, "wb") as log:
            client = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "onboard.validate.bench_sweep",
                    "--base-url",
                    server.base_url,
                    "--concurrency",
                    levels,
                    "--result-dir",
                    str(result_dir),
                    "--prompts-per-slot",
                    str(PROMPTS_PER_SLOT),
                    "--min-prompts",
                    str(min_prompts),
                    "--",
                    *_without_num_prompts(args),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server.environment(),
                cwd=work_dir,
            )
            try:
                start_s = server.wait_ready()
                code = client.wait(timeout=900)
            finally:
                if client.poll() is None:
                    client.kill()
                    client.wait()
        if code != 0:
            tail = "\n".join(bench_log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"vllm bench serve failed (code {code}):\n{tail}")
        metrics_text = server.metrics_text()
    (result_dir / "metrics.prom").write_text(metrics_text)
    sweep = []
    before: dict[str, float] = {}
    for c in concurrency:
        level = bench_summary(json.loads((result_dir / f"bench-c{c}.json").read_text()))
        after = histogram_totals((result_dir / f"metrics-c{c}.prom").read_text())
        level.update(engine_timings(before, after))
        before = after
        sweep.append(level)
    summary: dict[str, Any] = {
        "model": server.model,
        "speculative_config": variant.speculative_config,
        "server_start_s": start_s,
        "wall_s": time.perf_counter() - t0,
        "results": str(result_dir),
        "sweep": sweep,
        **headline(sweep),
    }
    counters = spec_decode_counters(metrics_text)
    if variant.speculative_config is not None:
        from onboard.speculators.acceptance import acceptance

        summary["spec_decode"] = acceptance(counters)
    return summary


def _without_num_prompts(args: list[str]) -> list[str]:
    # bench_sweep sets --num-prompts per level (PROMPTS_PER_SLOT x concurrency).
    i = args.index("--num-prompts")
    return args[:i] + args[i + 2 :]


def run(ctx, name: str, concurrency: tuple[int, ...] = CONCURRENCY) -> Check:
    from onboard.runtime.reference import TOKENIZER_FILES

    if ctx.engine_failure is not None:
        return Check.not_run(name, "the engine did not load the model (accuracy)")
    if not any((ctx.model_dir / f).exists() for f in TOKENIZER_FILES):
        return Check.not_run(
            name, f"{ctx.model_dir} has no tokenizer: vllm bench serve sends text"
        )
    variants, notes = _variants(ctx)
    out_dir = ctx.out_dir / "speed"
    results: dict[str, Any] = {}
    problems: list[str] = []
    unmeasured: list[str] = []
    for variant in variants:
        try:
            for attempt in range(1, MEASURE_TRIES + 1):
                results[variant.label] = run_variant(
                    variant,
                    str(ctx.model_dir),
                    ctx.work_dir / "speed",
                    out_dir,
                    ctx.out_dir / "logs",
                    (min(concurrency),) if variant.lowest_only else concurrency,
                    # Emulated: seconds per token on the dense-gqa tiny checkpoint.
                    EMULATED_PROMPTS if variant.lowest_only else MIN_PROMPTS,
                )
                results[variant.label]["attempts"] = attempt
                bursts = unmeasured_levels(
                    variant.label, results[variant.label]["sweep"]
                )
                if not bursts:
                    break
        except (RuntimeError, TimeoutError, OSError, KeyError, ValueError) as exc:
            refusal = _load_refusal(ctx.out_dir / "logs", variant)
            if refusal:
                # Not measurable here, as the quant check found too (it then runs
                # the dequantized reference): a note, with vLLM's own reason.
                notes.append(
                    f"{variant.label}: not measured: vLLM's CPU engine refused the "
                    f"checkpoint ({refusal})"
                )
            else:
                problems.append(f"{variant.label}: {type(exc).__name__}: {exc}")
            continue
        problems += sweep_problems(variant.label, results[variant.label]["sweep"])
        unmeasured += bursts
    base = results.get("baseline")
    metrics: dict[str, Any] = {
        "benchmark": {
            "tool": TOOL,
            "input_len": INPUT_LEN,
            "output_len": OUTPUT_LEN,
            "num_prompts": {c: num_prompts(c) for c in concurrency},
            "temperature": 0.0,
        },
        "concurrency": list(concurrency),
        "variants": results,
    }
    if base:
        metrics.update(headline(base["sweep"]))
        for label, res in results.items():
            if label != "baseline" and base["output_tokens_per_s"]:
                res["speedup"] = (
                    res["sweep"][0]["output_tokens_per_s"]
                    / base["sweep"][0]["output_tokens_per_s"]
                )
    lines = [_line(label, res) for label, res in results.items()]
    if unmeasured:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        unmeasured.append(
            f"measured {MEASURE_TRIES} times: this machine could not take the "
            f"measurement (load average {load} on {os.cpu_count()} CPUs), so the "
            "check is not-run; rerun it on a quiet machine"
        )
    details = "\n".join([*lines, *problems, *unmeasured, *notes])
    return Check(name, verdict(base, problems, unmeasured), metrics, details)


def verdict(base: dict | None, problems: list[str], unmeasured: list[str]) -> str:
    """failed for what the model got wrong (requests failed, nothing measured, no
    baseline); not-run where the machine could not take the measurement; else
    passed."""
    if problems or not base:
        return "failed"
    return "not-run" if unmeasured else "passed"


def _load_refusal(log_dir: Path, variant: Variant) -> str:
    """For a quantized variant whose server died while loading the checkpoint:
    the quantization kernel's error from the server log (e.g. "ValueError: Weight
    output_partition_size = 64 is not divisible by weight quantization block_n =
    128."); empty for anything else, which stays a failure."""
    if not variant.label.startswith("quant:"):
        return ""
    log = log_dir / f"serve-{variant.label.replace(':', '-')}.log"
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        _, sep, error = line.partition("] ValueError: ")
        if sep and ("quantization" in error or "kernel" in error):
            return "ValueError: " + error.strip()
    return ""


def _line(label: str, res: dict[str, Any]) -> str:
    levels = ", ".join(
        f"c={s['concurrency']}: {s['output_tokens_per_s']:.1f} tok/s, TTFT "
        f"{s['ttft_ms']:.1f} ms, TPOT {s['tpot_ms']:.2f} ms"
        + (
            f" (engine {s['engine_tpot_ms']:.2f})"
            if s.get("engine_tpot_ms") is not None
            else ""
        )
        for s in res["sweep"]
    )
    extra = ""
    if "spec_decode" in res:
        sd = res["spec_decode"]
        extra = f"; mean acceptance length {sd['mean_acceptance_length']:.2f}"
    if "speedup" in res:
        extra += (
            f"; x{res['speedup']:.2f} vs baseline at c={res['sweep'][0]['concurrency']}"
        )
    return f"{label}: {levels}{extra}"
