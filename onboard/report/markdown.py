"""summary.md: the validation verdict as Markdown, for pull-request descriptions."""

from __future__ import annotations

from typing import Any

from onboard.report import data as D
from onboard.report.svg import fmt
from onboard.spec.model import ModelSpec

_STATUS = {"passed": "✅ passed", "failed": "❌ **failed**", "not-run": "⚪ not run"}


def markdown_summary(results: Any, spec: ModelSpec | None = None) -> str:
    """A short Markdown summary of one or several targets' validation.json: the
    verdict per target and a table of every check with its key numbers (all
    taken from the results), for pull-request descriptions."""
    runs = D.runs(results)
    title = spec.name if spec else ", ".join(r.model_dir for r in runs)
    if not runs:
        return f"### vLLM validation: {title or 'model'}\n\nNo validation results.\n"
    lines = [f"### vLLM validation: {title}", ""]
    if spec is not None:
        lines.append(f"`{spec.architecture}`: " + _shape(spec))
        lines.append("")
    lines.append("Verdict: " + ", ".join(f"{r.target} {_verdict(r)}" for r in runs))
    lines += ["", "| check | " + " | ".join(r.target for r in runs) + " |"]
    lines.append("|---" * (len(runs) + 1) + "|")
    for name in D.check_names(runs):
        cells = []
        for r in runs:
            c = r.check(name)
            if c is None:
                cells.append("–")
                continue
            nums = "; ".join(
                f"{label} {fmt(value)}{(' ' + unit) if unit else ''}"
                for label, _, value, unit in D.headlines(c)
            ).replace("|", "\\|")
            cell = _STATUS.get(c.status, c.status)
            if nums:
                cell += f": {nums}"
            elif c.status != "passed" and c.details:
                cell += f" ({_cell_text(c.details)})"
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Full report: `report.html` beside this file (self-contained)."]
    return "\n".join(lines) + "\n"


def _verdict(run: D.RunView) -> str:
    text = D.verdict_text(run).replace("|", "\\|")
    if run.passed:
        return "✅ " + text
    if text.startswith("not validated"):
        return "⚪ " + text
    return "❌ **failed**" + text.removeprefix("failed")


def _shape(spec: ModelSpec) -> str:
    parts = [
        f"{spec.num_hidden_layers} layers",
        f"hidden {spec.hidden_size:,}",
        spec.attention.type.upper(),
    ]
    if spec.mlp.moe:
        moe = spec.mlp.moe
        parts.append(f"MoE {moe.num_experts} experts top-{moe.num_experts_per_tok}")
    if spec.mtp:
        parts.append(f"MTP x{spec.mtp.num_heads}")
    if spec.attention.kv_sharing:
        parts.append("KV sharing")
    return ", ".join(parts)


def _cell_text(text: str, n: int = 100) -> str:
    line = text.strip().splitlines()[0]
    line = line.replace("|", "\\|")
    return line if len(line) <= n else line[: n - 1] + "…"
