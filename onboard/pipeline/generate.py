"""``onboard generate``: the generated model code and the PR-ready vLLM tree built
from it. Composed here, above both, so that :mod:`onboard.generate` and
:mod:`onboard.pr` need not import each other."""

from __future__ import annotations

from pathlib import Path

from onboard import pr
from onboard.generate import generate_files, write_trees
from onboard.spec import load_spec
from onboard.spec.model import ModelSpec


def generate_all(spec: ModelSpec, out_dir: Path) -> list[Path]:
    """Write every generated file under ``out_dir`` (``plugin/``, ``hf/``,
    ``vllm-pr/``), each tree atomically; return their paths."""
    files = generate_files(spec)
    files.update(pr.pr_tree_files(spec, files, Path(out_dir)))
    return write_trees(files, out_dir)


def write_pr_md(spec_path: Path, gen_dir: Path, validation: Path | None) -> Path:
    """Rewrite GEN_DIR/vllm-pr/PR.md, quoting ``validation`` (default: the latest
    validation.json found next to GEN_DIR)."""
    spec = load_spec(spec_path)
    return pr.write_pr_md(spec, generate_files(spec), gen_dir, validation)
