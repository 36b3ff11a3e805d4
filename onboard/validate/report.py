"""report.html: a self-contained page (inline CSS and SVG, no network) that shows
validation.json to a person: the verdict, each check with its details and numbers,
and per-prompt plots for the accuracy check."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from onboard.fsutil import atomic_write_text
from onboard.validate.results import ValidationResult

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em}
.passed{color:#17723a}.failed{color:#b3261e}.not-run{color:#7a6a00}
.badge{font-weight:600;text-transform:uppercase}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;white-space:pre-wrap}
.num{text-align:right;font-variant-numeric:tabular-nums}
"""


def render_report(result: ValidationResult) -> str:
    data = result.to_dict()
    verdict = "passed" if data["passed"] else "failed"
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>onboard validation: {_e(Path(data['model_dir']).name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>onboard validation: <span class='badge {verdict}'>{verdict}</span></h1>",
        _table(
            [
                ("model", data["model_dir"]),
                ("target", data["target"]),
                ("vLLM class instantiated", data["vllm_model_class"] or "(none)"),
                ("reference", data["reference"] or "(none)"),
            ]
        ),
        "<h2>Checks</h2>",
        _table(
            [(c["name"], _badge(c["status"])) for c in data["checks"]],
            header=("check", "status"),
            raw=True,
        ),
    ]
    for check in data["checks"]:
        parts.append(f"<h2>{_e(check['name'])} {_badge(check['status'])}</h2>")
        if check["details"]:
            parts.append(f"<pre>{_e(check['details'])}</pre>")
        parts.append(_metrics(check["metrics"]))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(result: ValidationResult, out_dir: Path) -> Path:
    path = Path(out_dir) / "report.html"
    atomic_write_text(path, render_report(result))
    return path


def _metrics(metrics: dict[str, Any]) -> str:
    scalars = [
        (k, _fmt(v)) for k, v in metrics.items() if not isinstance(v, list | dict)
    ]
    parts = [_table(scalars, header=("metric", "value"))] if scalars else []
    for key, value in metrics.items():
        if key == "per_prompt" and value:
            parts.append("<h3>Per prompt</h3>" + _per_prompt_chart(value))
            parts.append(_records(value))
        elif isinstance(value, dict) and value:
            parts.append(f"<h3>{_e(key)}</h3>")
            parts.append(_table([(k, _fmt(v)) for k, v in value.items()]))
        elif isinstance(value, list) and value:
            parts.append(f"<h3>{_e(key)}</h3>")
            if all(isinstance(v, dict) for v in value):
                parts.append(_records(value))
            else:
                parts.append(f"<pre>{_e(chr(10).join(map(str, value)))}</pre>")
    return "\n".join(parts)


def _per_prompt_chart(rows: list[dict[str, Any]]) -> str:
    """Bars: greedy tokens matched before divergence (green: accepted, red: not)."""
    width, bar, gap = 600, 14, 4
    height = len(rows) * (bar + gap) + 20
    most = max((r.get("compared") or 1) for r in rows)
    shapes = []
    for i, row in enumerate(rows):
        y = i * (bar + gap)
        w = width * (row.get("matched") or 0) / most
        color = "#2e9d55" if row.get("accepted") else "#c0392b"
        label = (
            f"prompt {row.get('prompt')}: {row.get('matched')}/{row.get('compared')}"
        )
        shapes.append(
            f"<rect x='110' y='{y}' width='{w:.1f}' height='{bar}' fill='{color}'/>"
            f"<text x='0' y='{y + bar - 3}' font-size='11'>{_e(label)}</text>"
        )
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width + 120}' "
        f"height='{height}'>{''.join(shapes)}</svg>"
        "<p>Greedy tokens identical to the reference before the first divergence.</p>"
    )


def _records(rows: list[dict[str, Any]]) -> str:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    head = "".join(f"<th>{_e(k)}</th>" for k in keys)
    body = "".join(
        "<tr>"
        + "".join(f"<td class='num'>{_e(_fmt(r.get(k)))}</td>" for k in keys)
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _table(rows, header: tuple[str, str] | None = None, raw: bool = False) -> str:
    head = (
        f"<tr><th>{_e(header[0])}</th><th>{_e(header[1])}</th></tr>" if header else ""
    )
    body = "".join(
        f"<tr><td>{_e(str(k))}</td><td>{v if raw else _e(str(v))}</td></tr>"
        for k, v in rows
    )
    return f"<table>{head}{body}</table>"


def _badge(status: str) -> str:
    return f"<span class='badge {_e(status)}'>{_e(status)}</span>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)
