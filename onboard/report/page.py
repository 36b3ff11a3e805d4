"""report.html: one self-contained page (inline CSS and SVG, no script, nothing
fetched) per model, for one or several targets' validation.json."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from onboard.report import data as D
from onboard.report.svg import (
    FAIL,
    MUTED,
    PALETTE,
    PASS,
    Mark,
    Series,
    bar_chart,
    esc,
    fmt,
    line_chart,
    stacked_bars,
)
from onboard.spec.model import ModelSpec

CSS = """
:root{color-scheme:light}
body{font:14px/1.5 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;
  color:#1f2328;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:24px 28px 60px}
header{background:#fff;border-bottom:1px solid #dde1e6;padding:20px 0 14px}
header .inner{max-width:1180px;margin:0 auto;padding:0 28px}
h1{font-size:1.55em;margin:0 0 6px}h2{font-size:1.2em;margin:30px 0 10px}
h3{font-size:1.02em;margin:0 0 6px}
.sub{color:#57606a}
.verdicts>span{margin-right:14px;display:inline-block}
.verdict-note{color:#57606a}
.badge{display:inline-block;white-space:nowrap;font-weight:600;font-size:.82em;
  padding:1px 8px;border-radius:10px;text-transform:uppercase;letter-spacing:.02em}
.badge.passed{background:#dcf5e3;color:#17723a}
.badge.failed{background:#fde2e0;color:#b3261e}
.badge.not-run{background:#fff4cc;color:#7a5d00}
.card{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:14px 16px;
  margin:0 0 14px;overflow-x:auto}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(540px,1fr));
  gap:14px}
.grid .card{margin:0;overflow-x:auto}
figure{margin:0}figcaption{color:#57606a;font-size:.9em;margin-top:4px}
svg.plot{display:block;max-width:100%;height:auto}
table{border-collapse:collapse;margin:.3em 0 .6em;font-size:.95em}
td,th{border:1px solid #e1e4e8;padding:3px 9px;text-align:left;vertical-align:top;
  overflow-wrap:break-word}
td code,td.long{overflow-wrap:anywhere}
th{background:#f3f5f7;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.kv td:first-child{color:#57606a;white-space:nowrap}
pre{background:#f6f8fa;padding:.7em .9em;overflow-x:auto;white-space:pre-wrap;
  border-radius:6px;font-size:.88em;margin:.4em 0}
.missing{color:#7a5d00;background:#fffbea;border:1px dashed #e6cf7a;
  border-radius:6px;padding:18px;text-align:center}
.source{color:#57606a;font-size:.85em}
details summary{cursor:pointer;color:#0b57d0}details details{margin-left:1.2em}
"""

ATOL_KEY = "prompt_logprob_atol"


def render(results: Any, spec: ModelSpec | None = None) -> str:
    runs = D.runs(results)
    title = spec.name if spec else _model_name(runs)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>{esc(title)}: vLLM validation report</title>",
        f"<style>{CSS}</style></head><body>",
        _header(title, runs, spec),
        "<main>",
        _model_section(spec, runs),
        _matrix(runs),
        "<h2 id='plots'>Plots</h2><div class='grid'>",
        _logprob_plot(runs),
        _acceptance_plot(runs),
        _throughput_plot(runs),
        _latency_plot(runs),
        _quant_plot(runs),
        _kv_budget_plot(spec, runs),
        "</div>",
        _details(runs),
        "</main></body></html>",
    ]
    return "\n".join(parts)


def _model_name(runs: Sequence[D.RunView]) -> str:
    names = {r.model_dir.rstrip("/").rsplit("/", 1)[-1] for r in runs}
    return ", ".join(sorted(n for n in names if n)) or "model"


def _header(title: str, runs: Sequence[D.RunView], spec: ModelSpec | None) -> str:
    verdicts = "".join(f"<span>{esc(r.target)}: {_verdict(r)}</span>" for r in runs)
    sub = spec.architecture if spec else ""
    return (
        "<header><div class='inner'>"
        f"<h1>{esc(title)} <span class='sub'>vLLM validation report</span></h1>"
        f"<div class='sub'>{esc(sub)}</div>"
        f"<div class='verdicts'>{verdicts or 'no validation results'}</div>"
        "</div></header>"
    )


# -- model -----------------------------------------------------------------------


def _model_section(spec: ModelSpec | None, runs: Sequence[D.RunView]) -> str:
    runs_rows = "".join(
        f"<tr><td>{esc(r.target)}</td><td>{_verdict(r)}</td>"
        f"<td class='long'>{esc(r.model_dir)}</td>"
        f"<td><code>{esc(r.vllm_model_class or '(none)')}</code></td>"
        f"<td>{esc(', '.join(r.cpu_compat) or '(none)')}</td>"
        f"<td class='long'>{esc(r.reference or '(none)')}</td></tr>"
        for r in runs
    )
    runs_table = (
        "<table><tr><th>target</th><th>verdict</th><th>model</th>"
        "<th>vLLM class instantiated</th><th>onboard CPU shims</th>"
        "<th>reference</th></tr>"
        f"{runs_rows}</table>"
    )
    if spec is None:
        spec_html = (
            "<p class='missing'>No spec given: the model's shape is unknown.</p>"
        )
    else:
        rows = "".join(
            f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>"
            for k, v in D.spec_summary(spec)
        )
        weights = "".join(
            f"<tr><td>{esc(w.scheme)}</td><td class='num' data-path='plan:weights/"
            f"{esc(w.scheme)}/total_bytes' data-value='{w.total_bytes}'>"
            f"{_gb(w.total_bytes)}</td></tr>"
            for w in D.weight_rows(spec)
        )
        params = D.weight_rows(spec)[0].total_params
        spec_html = (
            f"<table class='kv'>{rows}"
            f"<tr><td>parameters</td><td>{_count(params)} "
            "<span class='source'>(plan arithmetic from the spec)</span></td></tr>"
            "</table><h3>Checkpoint size per scheme "
            "<span class='source'>(plan arithmetic from the spec, "
            "<code>onboard plan</code>)</span></h3>"
            f"<table><tr><th>scheme</th><th>weights</th></tr>{weights}</table>"
        )
    return (
        "<h2 id='model'>Model</h2><div class='card'>"
        f"{spec_html}<h3>Runs</h3>{runs_table}</div>"
    )


# -- summary matrix ------------------------------------------------------------------


def _matrix(runs: Sequence[D.RunView]) -> str:
    names = D.check_names(runs)
    head = "".join(f"<th>{esc(r.target)}</th>" for r in runs)
    body = []
    for name in names:
        cells = []
        for r in runs:
            c = r.check(name)
            if c is None:
                cells.append("<td class='sub'>not requested</td>")
                continue
            nums = "".join(
                f"<br><span class='sub'>{esc(label)}</span> "
                f"{_num(value, path)}{(' ' + esc(unit)) if unit else ''}"
                for label, path, value, unit in D.headlines(c)
            )
            why = ""
            if c.status == "not-run":
                why = f"<br><span class='sub'>{esc(_first_line(c.details))}</span>"
            cells.append(f"<td>{_badge(c.status)}{nums}{why}</td>")
        first = next(r for r in runs if r.check(name))
        body.append(
            f"<tr><td><a href='#{_anchor(first.index, name)}'>{esc(name)}</a></td>"
            f"{''.join(cells)}</tr>"
        )
    return (
        "<h2 id='checks'>Checks</h2><div class='card'>"
        f"<table><tr><th>check</th>{head}</tr>{''.join(body)}</table></div>"
    )


# -- plots ---------------------------------------------------------------------------


def _figure(title: str, svg: str | None, caption: str, missing: str = "") -> str:
    inner = svg if svg else f"<div class='missing'>not measured: {esc(missing)}</div>"
    return (
        f"<div class='card'><figure><h3>{esc(title)}</h3>{inner}"
        f"<figcaption>{caption}</figcaption></figure></div>"
    )


def _why_missing(runs: Sequence[D.RunView], prefix: str) -> str:
    """Why a plot has no data: the checks' statuses, or that none was requested."""
    found = [
        (r, c)
        for r in runs
        for c in r.checks
        if c.name == prefix or (prefix.endswith(":") and c.name.startswith(prefix))
    ]
    if not found:
        return f"no {prefix.rstrip(':')} check in this run"
    return "; ".join(
        f"{c.name} on {r.target} {c.status}"
        + (f" ({_first_line(c.details)})" if c.status != "passed" else "")
        for r, c in found
    )


def _logprob_plot(runs: Sequence[D.RunView]) -> str:
    marks, atol = [], None
    for r in runs:
        c = r.check("accuracy")
        if c is None:
            continue
        atol = D.number(c.metrics.get(ATOL_KEY)) or atol
        for j, row in enumerate(c.metrics.get("per_prompt") or []):
            v = D.number(row.get("prompt_logprob_max_abs_diff"))
            if v is None:
                continue
            who = f"{r.target} " if len(runs) > 1 else ""
            marks.append(
                Mark(
                    v,
                    c.metric_path("per_prompt", j, "prompt_logprob_max_abs_diff"),
                    f"{who}prompt {row.get('prompt', j)}",
                    PASS
                    if row.get("accepted", True) and (atol is None or v <= atol)
                    else FAIL,
                )
            )
    svg = None
    if marks:
        svg = bar_chart(
            marks,
            label="prompt logprob max |difference| per prompt",
            unit="nats (log scale)",
            log=True,
            threshold=(atol, f"tolerance {fmt(atol)}") if atol else None,
            lo=min([m.value for m in marks if m.value > 0] + [1e-7]) / 10,
        )
    return _figure(
        "Logprob differences: engine vs reference",
        svg,
        "Per prompt, the largest |vLLM − reference| prompt logprob over every "
        "position and every token vLLM reported (accuracy check, "
        "<code>per_prompt[].prompt_logprob_max_abs_diff</code>); red: over the "
        "tolerance or greedy continuation not accepted.",
        _why_missing(runs, "accuracy"),
    )


def _acceptance_plot(runs: Sequence[D.RunView]) -> str:
    series = []
    for r in runs:
        for c in r.checks_with_prefix("spec-decode:"):
            rates = c.metrics.get("acceptance_rate_per_position")
            if not isinstance(rates, list):
                continue
            who = f" ({r.target})" if len(runs) > 1 else ""
            s = Series(c.name.split(":", 1)[1] + who)
            for k, v in enumerate(rates):
                if D.number(v) is not None:
                    s.points.append(
                        (
                            k + 1,
                            Mark(
                                float(v),
                                c.metric_path("acceptance_rate_per_position", k),
                            ),
                        )
                    )
            if s.points:
                series.append(s)
    svg = None
    if series:
        svg = line_chart(
            series,
            label="acceptance rate per draft position",
            x_label="draft position",
            y_label="acceptance rate",
            y_max=1.0,
        )
    return _figure(
        "Speculative decoding: acceptance per draft position",
        svg,
        "Share of drafted tokens accepted at each draft position "
        "(<code>spec-decode:*</code> <code>acceptance_rate_per_position</code>).",
        _why_missing(runs, "spec-decode:"),
    )


def sweep_rows(check: D.CheckView) -> list[tuple[str, dict[str, Any], tuple]]:
    """(variant, row, keys of the row under metrics) of the speed check's sweep.
    Two shapes are read: ``variants.<label>.sweep[]`` (check_speed: one sweep per
    variant) and a flat ``sweep[]`` whose rows name their ``variant``."""
    out = []
    variants = check.metrics.get("variants")
    if isinstance(variants, dict):
        for label, res in variants.items():
            sweep = res.get("sweep") if isinstance(res, dict) else None
            for j, row in enumerate(sweep if isinstance(sweep, list) else []):
                if isinstance(row, dict):
                    out.append((str(label), row, ("variants", label, "sweep", j)))
    sweep = check.metrics.get("sweep")
    for j, row in enumerate(sweep if isinstance(sweep, list) else []):
        if isinstance(row, dict):
            out.append((str(row.get("variant") or "baseline"), row, ("sweep", j)))
    return out


def _sweep_series(runs: Sequence[D.RunView], key: str) -> list[Series]:
    by_name: dict[str, Series] = {}
    for r in runs:
        c = r.check("speed")
        if c is None:
            continue
        for name, row, keys in sweep_rows(c):
            x, y = D.number(row.get("concurrency")), D.number(row.get(key))
            if x is None or y is None or x <= 0:
                continue
            if len(runs) > 1:
                name = f"{name} ({r.target})"
            by_name.setdefault(name, Series(name)).points.append(
                (x, Mark(y, c.metric_path(*keys, key)))
            )
    return list(by_name.values())


def _throughput_plot(runs: Sequence[D.RunView]) -> str:
    series = _sweep_series(runs, "output_tokens_per_s")
    svg = None
    if series:
        svg = line_chart(
            series,
            label="output throughput vs concurrency",
            x_label="concurrent requests",
            y_label="output tokens/s",
            log_x=True,
        )
    return _figure(
        "Throughput vs concurrency",
        svg,
        "vLLM's serving benchmark over the concurrency sweep, per variant (speed "
        "check: <code>output_tokens_per_s</code> of each level of each variant's "
        "sweep).",
        _why_missing(runs, "speed"),
    )


def _latency_plot(runs: Sequence[D.RunView]) -> str:
    svg = ""
    for key, label in (
        ("ttft_ms", "TTFT (ms)"),
        ("tpot_ms", "TPOT (ms)"),
        ("engine_tpot_ms", "engine TPOT (ms)"),
    ):
        series = _sweep_series(runs, key)
        if series:
            svg += line_chart(
                series,
                label=f"{label} vs concurrency",
                x_label="concurrent requests",
                y_label=label,
                log_x=True,
            )
    return _figure(
        "Latency vs concurrency",
        svg or None,
        "Time to first token and time per output token over the same sweep "
        "(median <code>ttft_ms</code>, <code>tpot_ms</code> of each level, as the "
        "benchmark client timed them), and the engine's own mean per-request TPOT "
        "from the server's /metrics (<code>engine_tpot_ms</code>; cpu runs).",
        _why_missing(runs, "speed"),
    )


def _quant_plot(runs: Sequence[D.RunView]) -> str:
    kl, top1 = [], []
    for r in runs:
        for c in r.checks_with_prefix("quant:"):
            who = f" ({r.target})" if len(runs) > 1 else ""
            scheme = c.name.split(":", 1)[1] + who
            color = {"passed": PASS, "failed": FAIL}.get(c.status, MUTED)
            for key, out in (("kl_divergence", kl), ("top1_agreement", top1)):
                v = D.number(c.metrics.get(key))
                if v is None:
                    continue
                mark = Mark(v, c.metric_path(key), scheme, color)
                limits = c.metrics.get("thresholds")
                limit = D.number(limits.get(key)) if isinstance(limits, dict) else None
                if limit is not None:
                    mark.limit = (limit, c.metric_path("thresholds", key))
                out.append(mark)
    svg = None
    if kl or top1:
        svg = ""
        if kl:
            svg += bar_chart(kl, label="KL divergence per scheme", unit="nats (KL)")
        if top1:
            svg += bar_chart(
                top1,
                label="top-1 agreement per scheme",
                unit="top-1 agreement",
                hi=1.0,
            )
    return _figure(
        "Quantized vs baseline",
        svg,
        "Per quantization scheme: KL divergence of the quantized model's next-token "
        "distribution from the unquantized one, and how often their top-1 tokens "
        "agree (<code>quant:*</code> <code>kl_divergence</code>, "
        "<code>top1_agreement</code>); a black tick marks the scheme's threshold "
        "(<code>thresholds</code>) where the check gives one.",
        _why_missing(runs, "quant:"),
    )


def _kv_budget_plot(spec: ModelSpec | None, runs: Sequence[D.RunView]) -> str:
    measured = [
        (r, c) for r in runs if (c := r.check("kv-cache")) and c.status != "not-run"
    ]
    measured_html = "".join(
        f"<p>Measured on {esc(r.target)} (kv-cache check, {_badge(c.status)}"
        + (f", {esc(c.metrics['dtype'])} KV cache" if c.metrics.get("dtype") else "")
        + "): "
        + ", ".join(
            f"{esc(label)} {_num(v, p)}{(' ' + esc(u)) if u else ''}"
            for label, p, v, u in D.headlines(c)
        )
        + "</p>"
        for r, c in measured
    )
    if spec is None:
        return _figure("KV-cache budget per target", None, measured_html, "no spec")
    gib = 1 << 30
    bars, rows = [], []
    for b in D.kv_budgets(spec):
        base = f"plan:{b.target}"
        if b.error:
            rows.append(
                f"<tr><td>{esc(b.target)}</td><td colspan='5'>{esc(b.error)}</td></tr>"
            )
            continue
        free = max(b.kv_budget - b.kv_needed, 0)
        parts = [
            Mark(b.weights / gib, f"{base}/weights", "weights", PALETTE[0]),
            Mark(b.reserve / gib, f"{base}/reserve", "reserve", MUTED),
            Mark(
                b.kv_needed / gib,
                f"{base}/kv_needed",
                f"KV of {D.PLAN_CONCURRENCY} full-context requests",
                PALETTE[1],
            ),
            Mark(free / gib, f"{base}/kv_free", "KV headroom", "#f6c89f"),
        ]
        bars.append((f"{b.target} ({b.memory / 1e9:.0f} GB)", parts, b.usable / gib))
        rows.append(
            f"<tr><td>{esc(b.target)}</td><td>{esc(b.layout)}</td>"
            f"<td class='num'>{fmt(b.kv_bytes_per_token)}</td>"
            f"<td class='num'>{fmt(round(b.kv_bytes_per_token_device))}</td>"
            f"<td class='num'>{fmt(b.max_context)}</td>"
            f"<td class='num'>{fmt(b.max_concurrency)}</td></tr>"
        )
    svg = None
    if bars:
        svg = stacked_bars(bars, label="KV-cache budget per target", unit="GiB")
    table = (
        "<table><tr><th>target</th><th>layout</th><th>KV B/token (bf16)</th>"
        "<th>per device</th>"
        f"<th>max context at {D.PLAN_CONCURRENCY} requests</th>"
        f"<th>max requests at {fmt(spec.max_position_embeddings)} tokens</th></tr>"
        f"{''.join(rows)}</table>"
    )
    caption = (
        "Plan arithmetic from the spec, not measured (<code>onboard plan --target T "
        f"--concurrency {D.PLAN_CONCURRENCY}</code>, bf16): one device's usable "
        "memory split into weights, reserve and KV cache, for the smallest layout "
        f"that holds {D.PLAN_CONCURRENCY} requests of the full context."
    )
    return _figure(
        "KV-cache budget per target",
        svg,
        caption + table + measured_html,
        "no target of the spec has a layout that fits",
    )


# -- per-check details --------------------------------------------------------------


def _details(runs: Sequence[D.RunView]) -> str:
    parts = ["<h2 id='details'>Check details</h2>"]
    for r in runs:
        for c in r.checks:
            parts.append(
                f"<div class='card' id='{_anchor(r.index, c.name)}'>"
                f"<h3>{esc(c.name)} on {esc(r.target)} {_badge(c.status)}</h3>"
            )
            if c.details:
                parts.append(f"<pre>{esc(c.details)}</pre>")
            parts.append(_metrics(c.metrics, D.pointer(c.path, "metrics")))
            parts.append("</div>")
    return "\n".join(parts)


def _metrics(metrics: dict[str, Any], path: str) -> str:
    def short(v: Any) -> bool:  # a value that fits one table row
        if isinstance(v, list):
            return len(v) <= 32 and not any(isinstance(x, list | dict) for x in v)
        return not isinstance(v, dict)

    scalars = [(k, v) for k, v in metrics.items() if short(v)]
    parts = []
    if scalars:
        rows = "".join(
            f"<tr><td>{esc(k)}</td>{_cell(v, D.pointer(path, k))}</tr>"
            for k, v in scalars
        )
        parts.append(f"<table class='kv'>{rows}</table>")
    for key, value in metrics.items():
        if short(value):
            continue
        if isinstance(value, dict) and value:
            parts.append(
                f"<details open><summary>{esc(key)}</summary>"
                f"{_metrics(value, D.pointer(path, key))}</details>"
            )
        elif isinstance(value, list) and value:
            parts.append(f"<details><summary>{esc(key)} ({len(value)})</summary>")
            if all(isinstance(v, dict) for v in value):
                parts.append(_records(value, D.pointer(path, key)))
            else:
                parts.append(f"<p>{_inline(value, D.pointer(path, key))}</p>")
            parts.append("</details>")
    return "".join(parts)


def _records(rows: list[dict[str, Any]], path: str) -> str:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    # Long snake_case column names may break after an underscore.
    head = "".join(f"<th>{esc(k).replace('_', '_<wbr>')}</th>" for k in keys)
    body = "".join(
        "<tr>"
        + "".join(
            _cell(r[k], D.pointer(path, i, k)) if k in r else "<td></td>" for k in keys
        )
        + "</tr>"
        for i, r in enumerate(rows)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: Any, path: str) -> str:
    if isinstance(value, dict):
        return f"<td>{_metrics(value, path)}</td>"
    if isinstance(value, list):
        return f"<td>{_inline(value, path)}</td>"
    if D.number(value) is not None:
        return f"<td class='num'>{_num(value, path)}</td>"
    return f"<td>{esc(fmt(value))}</td>"


def _inline(value: Any, path: str) -> str:
    """A value inside a table cell or a line: lists and dicts written out, each
    number with its pointer."""
    if isinstance(value, list):
        items = ", ".join(_inline(v, D.pointer(path, i)) for i, v in enumerate(value))
        return f"[{items}]"
    if isinstance(value, dict):
        items = ", ".join(
            f"{esc(k)}: {_inline(v, D.pointer(path, k))}" for k, v in value.items()
        )
        return f"{{{items}}}"
    if D.number(value) is not None:
        return _num(value, path)
    return esc(fmt(value))


def _num(value: Any, path: str) -> str:
    """A number from validation.json, with where it lives."""
    return (
        f"<span class='v' data-path='{esc(path)}' data-value='{esc(repr(value))}'>"
        f"{esc(fmt(value))}</span>"
    )


def _count(n: int) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:,.3g} {unit}"
    return str(n)


def _gb(n: int) -> str:
    return f"{n / 1e9:,.3g} GB" if n >= 1e8 else f"{n / 1e6:,.3g} MB"


def _verdict(run: D.RunView) -> str:
    """The badge, then what the verdict does not cover (checks not run, quant
    checks scored on the dequantized reference) and what failed."""
    text = D.verdict_text(run)
    word = "passed" if run.passed else "failed"
    if text.startswith("not validated"):
        # Nothing failed; the engine could not run the model on this target.
        word = "not validated"
    rest = text.removeprefix(word).strip()
    note = f" <span class='verdict-note'>{esc(rest)}</span>" if rest else ""
    badge = "not-run" if word == "not validated" else word
    return _badge(badge) + note


def _badge(status: str) -> str:
    text = "not run" if status == "not-run" else status
    return f"<span class='badge {esc(status)}'>{esc(text)}</span>"


def _first_line(text: str, n: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= n else line[: n - 1] + "…"


def _anchor(index: int, name: str) -> str:
    return f"check-{index}-" + "".join(ch if ch.isalnum() else "-" for ch in name)
