"""The validation report: ``report.html`` (self-contained: inline CSS and SVG, no
script, nothing fetched) and ``summary.md`` (for pull-request descriptions), for
one or several targets' validation.json.

Every number about the run is read from validation.json and carries its JSON
pointer (``data-path``) in the page; the model's shape comes from the spec and the
KV-cache budget per target from the serving plan's arithmetic, labelled so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onboard.fsutil import atomic_write_text
from onboard.report.markdown import markdown_summary
from onboard.report.page import render
from onboard.spec.model import ModelSpec


def render_report(results: Any, spec: ModelSpec | None = None) -> str:
    """report.html's text for one result or a list of them (ValidationResult,
    a validation.json dict, or a path to one or to its directory)."""
    return render(results, spec)


def write_report(results: Any, out_dir: Path, spec: ModelSpec | None = None) -> Path:
    """Write OUT_DIR/report.html and OUT_DIR/summary.md; return report.html's path."""
    out_dir = Path(out_dir)
    path = out_dir / "report.html"
    atomic_write_text(path, render_report(results, spec))
    atomic_write_text(out_dir / "summary.md", markdown_summary(results, spec))
    return path


__all__ = ["markdown_summary", "render_report", "write_report"]
