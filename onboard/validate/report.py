"""report.html and summary.md for `onboard validate` (see :mod:`onboard.report`)."""

from onboard.report import markdown_summary, render_report, write_report

__all__ = ["markdown_summary", "render_report", "write_report"]
