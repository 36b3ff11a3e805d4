"""What the report shows, taken from validation.json files, the spec and the plan.

Numbers about the run come only from validation.json (each with the JSON pointer
where it lives: ``/<file index>/checks/<i>/metrics/...``); numbers about the model
come from the spec; the KV-cache budget per target is the serving plan's
arithmetic (:func:`onboard.serving.make_deployment`), labelled as such.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onboard.arch import build_plan
from onboard.errors import InputError
from onboard.spec.model import ModelSpec

# The load the KV-cache budget is planned for (requests of the spec's full context).
PLAN_CONCURRENCY = 8
PLAN_SCHEME = "bf16"


def pointer(base: str, *keys: object) -> str:
    """A JSON pointer (RFC 6901): ``base`` then each key, escaped."""
    tokens = [str(k).replace("~", "~0").replace("/", "~1") for k in keys]
    return "/".join([base, *tokens])


@dataclass
class CheckView:
    name: str
    status: str
    details: str
    metrics: dict[str, Any]
    path: str  # JSON pointer of the check

    def metric_path(self, *keys: object) -> str:
        return pointer(self.path, "metrics", *keys)


@dataclass
class RunView:
    """One validation.json."""

    index: int
    target: str
    passed: bool
    model_dir: str
    vllm_model_class: str
    reference: str
    checks: list[CheckView] = field(default_factory=list)
    source: str = ""  # the file it was read from, when known
    # onboard's CPU shims the engine ran with (validation.json's cpu_compat).
    cpu_compat: tuple[str, ...] = ()

    def check(self, name: str) -> CheckView | None:
        return next((c for c in self.checks if c.name == name), None)

    def checks_with_prefix(self, prefix: str) -> list[CheckView]:
        return [c for c in self.checks if c.name.startswith(prefix)]


def as_dict(result: Any) -> dict[str, Any]:
    """A validation result as it is (or would be) written to validation.json."""
    if isinstance(result, dict):
        return result
    if isinstance(result, str | Path):
        path = Path(result)
        if path.is_dir():
            path = path / "validation.json"
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: cannot read validation.json: {exc}") from None
    # ValidationResult: its to_dict() is exactly what validation.json holds.
    return json.loads(json.dumps(result.to_dict()))


def as_list(results: Any) -> list[Any]:
    if isinstance(results, dict | str | Path) or hasattr(results, "to_dict"):
        return [results]
    return list(results)


def runs(results: Any) -> list[RunView]:
    out = []
    for i, raw in enumerate(as_list(results)):
        data = as_dict(raw)
        source = str(raw) if isinstance(raw, str | Path) else ""
        run = RunView(
            index=i,
            target=str(data.get("target", "?")),
            passed=bool(data.get("passed")),
            model_dir=str(data.get("model_dir", "")),
            vllm_model_class=str(data.get("vllm_model_class") or ""),
            reference=str(data.get("reference") or ""),
            source=source,
            cpu_compat=tuple(data.get("cpu_compat") or ()),
        )
        for j, c in enumerate(data.get("checks") or []):
            run.checks.append(
                CheckView(
                    name=str(c.get("name")),
                    status=str(c.get("status")),
                    details=str(c.get("details") or ""),
                    metrics=c.get("metrics") or {},
                    path=f"/{i}/checks/{j}",
                )
            )
        out.append(run)
    return out


# What a quant check's metrics say when no CPU kernel ran the scheme and the
# quantized side came from the reference on dequantized weights (check_quant).
DEQUANTIZED_PATH = "dequantized-reference"


def _named(count_of: str, names: list[str], what: str) -> str:
    noun = count_of if len(names) == 1 else count_of + "s"
    return f"{len(names)} {noun} {what}: {', '.join(names)}"


def verdict_text(run: RunView) -> str:
    """The run's verdict in one line, naming what it does not cover: e.g.
    "passed (2 checks not run on cpu: spec-decode:eagle3, tensor-parallel; 1 quant
    check scored on a dequantized reference (no cpu kernel): quant:nvfp4)"."""
    failed = [c.name for c in run.checks if c.status == "failed"]
    not_run = [c.name for c in run.checks if c.status == "not-run"]
    emulated = [
        c.name
        for c in run.checks
        if c.name.startswith("quant:")
        and c.status != "not-run"
        and c.metrics.get("path") == DEQUANTIZED_PATH
    ]
    parts = []
    if failed:
        parts.append(_named("check", failed, "failed"))
    if not_run:
        parts.append(_named("check", not_run, f"not run on {run.target}"))
    if emulated:
        parts.append(
            _named(
                "quant check",
                emulated,
                f"scored on a dequantized reference (no {run.target} kernel)",
            )
        )
    if not run.passed and not failed and not run.check("accuracy"):
        parts.append("no accuracy check")
    accuracy = run.check("accuracy")
    if run.passed:
        word = "passed"
    elif not failed and accuracy is not None and accuracy.status == "not-run":
        # Nothing failed; the engine could not run the model on this target.
        word = "not validated"
    else:
        word = "failed"
    return f"{word} ({'; '.join(parts)})" if parts else word


def verdict_lines(results: Any) -> list[str]:
    """One "validation (TARGET): VERDICT" line per validation.json."""
    return [f"validation ({r.target}): {verdict_text(r)}" for r in runs(results)]


def check_names(all_runs: Sequence[RunView]) -> list[str]:
    """Every check name over the runs, in first-seen order."""
    return list(dict.fromkeys(c.name for r in all_runs for c in r.checks))


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# -- headline numbers per check ---------------------------------------------------

# (metric, label, unit) shown in the summary matrix and the Markdown summary.
HEADLINES: dict[str, list[tuple[str, str, str]]] = {
    "accuracy": [
        ("prompt_logprob_max_abs_diff", "max |Δ logprob|", "nats"),
        ("greedy_failed_sequences", "failed greedy sequences", ""),
    ],
    "kv-cache": [
        ("bytes_per_token", "KV bytes/token", "B"),
        ("bytes_per_token_without_sharing", "without sharing", "B"),
    ],
    "quant:": [("kl_divergence", "KL", "nats"), ("top1_agreement", "top-1 agree", "")],
    "spec-decode:": [
        ("mean_acceptance_length", "mean acceptance length", ""),
        ("speedup", "speed-up", "x"),
    ],
    "speed": [
        ("output_tokens_per_s", "output", "tok/s"),
        ("ttft_ms", "TTFT", "ms"),
        ("tpot_ms", "TPOT", "ms"),
    ],
}


def headlines(check: CheckView) -> list[tuple[str, str, Any, str]]:
    """(label, JSON pointer, value, unit) of the check's key numbers present."""
    spec = HEADLINES.get(check.name) or HEADLINES.get(
        check.name.split(":", 1)[0] + ":", []
    )
    out = []
    for key, label, unit in spec:
        value = check.metrics.get(key)
        if value is not None and not isinstance(value, dict | list):
            out.append((label, check.metric_path(key), value, unit))
    return out


# -- the spec ------------------------------------------------------------------


def spec_summary(spec: ModelSpec) -> list[tuple[str, str]]:
    """The spec's shape in a few lines (facts from the spec, nothing measured)."""
    att = spec.attention
    rows = [
        ("name", spec.name),
        ("architecture", f"{spec.architecture} (model_type {spec.model_type})"),
        (
            "size",
            f"{spec.num_hidden_layers} layers, hidden {spec.hidden_size:,}, "
            f"vocab {spec.vocab_size:,}, context {spec.max_position_embeddings:,}",
        ),
    ]
    if att.type == "mla":
        assert att.mla is not None
        m = att.mla
        attention = (
            f"MLA, {att.num_heads} heads, kv_lora_rank {m.kv_lora_rank}, "
            f"q_lora_rank {m.q_lora_rank or 'none'}, qk_nope/rope/v head dims "
            f"{m.qk_nope_head_dim}/{m.qk_rope_head_dim}/{m.v_head_dim}"
        )
    else:
        kind = "MHA" if spec.num_kv_heads == att.num_heads else "GQA"
        attention = (
            f"{kind}, {att.num_heads} query heads, {spec.num_kv_heads} KV heads, "
            f"head_dim {spec.head_dim}"
        )
    extras = []
    if att.sliding_window:
        sliding = sum(layer.mixer.sliding for layer in build_plan(spec).layers)
        extras.append(f"sliding window {att.sliding_window:,} on {sliding} layers")
    if att.kv_sharing:
        pairs = ", ".join(f"{a}→{b}" for a, b in sorted(att.kv_sharing.items()))
        extras.append(f"KV sharing {pairs}")
    if att.qk_norm:
        extras.append("q/k norm")
    rows.append(("attention", "; ".join([attention, *extras])))
    theta = spec.rope.theta
    rope = f"θ {theta:,.0f}" if float(theta).is_integer() else f"θ {theta:g}"
    if spec.rope.scaling:
        scaling = spec.rope.scaling
        rope += f", {scaling.type}"
        if scaling.factor is not None:
            rope += f" x{scaling.factor:g}"
    rows.append(("rope", rope))
    moe = spec.mlp.moe
    if moe:
        rows.append(
            (
                "MoE",
                f"{moe.num_experts} experts, top-{moe.num_experts_per_tok}, "
                f"{moe.num_shared_experts} shared, expert width "
                f"{moe.expert_intermediate_size:,}, {moe.router.scoring} router, "
                f"first {moe.first_k_dense} layer(s) dense",
            )
        )
    else:
        rows.append(("MLP", f"dense, intermediate {spec.mlp.intermediate_size:,}"))
    if spec.mtp:
        rows.append(("MTP", f"{spec.mtp.num_heads} head(s), {spec.mtp.mlp} MLP"))
    rows.append(("quantization", ", ".join(spec.quantization) or "none"))
    rows.append(
        (
            "speculators",
            ", ".join(
                f"{s.method} (k={s.num_speculative_tokens})" for s in spec.speculators
            )
            or "none",
        )
    )
    rows.append(("targets", ", ".join(spec.targets) or "none"))
    return rows


@dataclass
class WeightsRow:
    scheme: str
    total_bytes: int
    total_params: int


def weight_rows(spec: ModelSpec) -> list[WeightsRow]:
    """Checkpoint bytes per scheme (the plan's arithmetic)."""
    from onboard.serving.weights import weight_report

    rows = []
    for scheme in (PLAN_SCHEME, *spec.quantization):
        w = weight_report(spec, scheme, "bfloat16")
        rows.append(WeightsRow(scheme, w.total_bytes, w.total_params))
    return rows


@dataclass
class TargetBudget:
    """One target's serving plan, as far as the KV-cache budget goes."""

    target: str
    error: str = ""
    layout: str = ""
    devices: int = 0
    memory: int = 0  # bytes per device
    usable: int = 0
    weights: int = 0
    reserve: int = 0
    kv_needed: int = 0
    kv_budget: int = 0
    kv_bytes_per_token: int = 0
    kv_bytes_per_token_device: float = 0.0
    max_context: int = 0
    max_concurrency: int = 0
    context: int = 0
    concurrency: int = PLAN_CONCURRENCY


def kv_budgets(
    spec: ModelSpec, targets: Iterable[str] | None = None
) -> list[TargetBudget]:
    """For each target of the spec: the plan at PLAN_CONCURRENCY requests of the
    full context: layout, per-device memory split, KV bytes per token, the
    maximum context at that concurrency and the maximum concurrency at the full
    context."""
    from onboard.serving import make_deployment

    out = []
    for target in targets if targets is not None else spec.targets:
        row = TargetBudget(target)
        try:
            plan = make_deployment(
                spec, target, PLAN_SCHEME, concurrency=PLAN_CONCURRENCY
            )
        except InputError as exc:
            row.error = str(exc)
            out.append(row)
            continue
        row.kv_bytes_per_token = plan.kv.bytes_per_token
        row.memory, row.usable = plan.memory_per_device, plan.usable
        row.context = plan.context
        if plan.chosen is None:
            most = max((m.layout.devices for m in plan.candidates), default=0)
            where = (
                "this machine's memory" if not plan.target.is_gpu else f"{most} devices"
            )
            row.error = (
                f"no layout fits: {PLAN_CONCURRENCY} requests of {plan.context:,} "
                f"tokens do not fit {where} (full-size spec, bf16)"
            )
        else:
            mem = plan.chosen
            row.layout, row.devices = mem.layout.name, mem.layout.devices
            row.weights, row.reserve = mem.weights, mem.reserve
            row.kv_needed, row.kv_budget = mem.kv_needed, mem.kv_budget
            row.kv_bytes_per_token_device = mem.layout.kv_bytes_per_token(
                plan.arch, plan.kv
            )
            row.max_context, row.max_concurrency = (
                plan.max_context,
                plan.max_concurrency,
            )
        out.append(row)
    return out
