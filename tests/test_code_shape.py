"""The shape the code keeps so that it stays simple to read and change."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "onboard"
MAX_FUNCTION_LINES = 150


def test_no_function_is_longer_than_the_limit():
    long = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    where = path.relative_to(ROOT.parent)
                    long.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these functions:\n" + "\n".join(long)


TEMPLATES = ROOT.parent / "templates"
MAX_TEMPLATE_LINES = 400


def test_no_template_is_longer_than_the_limit():
    """Templates are per-component fragments (templates/components/<kind>/) that
    the ladders (templates/vllm/, templates/hf/) compose: none grows past the
    limit."""
    long = [
        f"{path.relative_to(TEMPLATES)} ({n} lines)"
        for path in sorted(TEMPLATES.rglob("*.j2"))
        if (n := len(path.read_text().splitlines())) > MAX_TEMPLATE_LINES
    ]
    assert not long, "split these templates:\n" + "\n".join(long)
