"""``onboard generate``: the generated model code and the PR-ready vLLM tree built
from it. Composed here, above both, so that :mod:`onboard.generate` and
:mod:`onboard.pr` need not import each other."""

from __future__ import annotations

from pathlib import Path

from onboard import pr
from onboard.generate import generate_files, package_name, write_trees
from onboard.spec import load_spec
from onboard.spec.model import ModelSpec


def generate_all(
    spec: ModelSpec, out_dir: Path, standalone: bool = False
) -> list[Path]:
    """Write every generated file under ``out_dir`` (``plugin/``, ``hf/``,
    ``vllm-pr/``), each tree atomically; return their paths. ``standalone``: the
    whole model files even where the spec is a family vLLM ships
    (onboard.generate.render_model)."""
    files = generate_files(spec, standalone)
    files.update(pr.pr_tree_files(spec, files, Path(out_dir), standalone))
    return write_trees(files, out_dir)


def write_pr_md(spec_path: Path, gen_dir: Path, validation: Path | None) -> Path:
    """Rewrite GEN_DIR/vllm-pr/PR.md, quoting ``validation`` (default: the latest
    validation.json found next to GEN_DIR); for the files GEN_DIR holds, whole or
    modular."""
    spec = load_spec(spec_path)
    standalone = _holds_standalone(spec, Path(gen_dir))
    return pr.write_pr_md(
        spec, generate_files(spec, standalone), gen_dir, validation, standalone
    )


def _holds_standalone(spec: ModelSpec, gen_dir: Path) -> bool:
    """Whether GEN_DIR's model file is the standalone one of a spec that also has
    a modular one (`onboard generate --standalone`)."""
    from onboard.generate import render_model
    from onboard.spec.hf import find_base

    if find_base(spec) is None:
        return False
    model = gen_dir / "plugin" / package_name(spec) / f"{spec.module_name}.py"
    if not model.is_file():
        return False
    return model.read_text(encoding="utf-8") == render_model(spec, standalone=True)
