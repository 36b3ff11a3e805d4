"""The PR-ready vLLM tree: ``DIR/vllm-pr/`` of ``onboard generate``.

``pr_tree_files(spec, generated, out_dir)`` returns the files of the tree (paths
under ``vllm-pr/``): every new file, every edited ``vllm/`` file as it reads after
the change (edited from the installed vLLM, which must be the pinned version),
``edits.json`` (the declarative edits, incl. the ``tests/`` and ``docs/`` ones),
``changes.patch`` and ``PR.md``. ``onboard pr check|apply`` (:mod:`onboard.pr.apply`)
apply the change to a vLLM tree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from onboard.errors import InputError
from onboard.pr.build import (
    REGISTRY,
    FileChange,
    PrChanges,
    apply_changes,
    installed_vllm_root,
    pr_changes,
    same_release,
    tree_version,
    unified_diff,
)
from onboard.pr.versions import PINNED_VLLM

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec

TREE = "vllm-pr"
__all__ = ["PINNED_VLLM", "TREE", "pr_tree_files", "write_pr_md"]


def pr_tree_files(
    spec: ModelSpec,
    generated: dict[str, str],
    out_dir: Path | None = None,
    standalone: bool = False,
) -> dict[str, str]:
    """``vllm-pr/...`` path -> text. ``generated`` is generate_files' output (the
    plugin's rendered model is consumed from it; ``standalone`` as it was asked
    for); ``out_dir`` is where a previous validation.json may be found for
    PR.md."""
    from onboard.pr.describe import latest_validation, render_pr_md

    plugin = {
        path.split("/", 1)[1]: text
        for path, text in generated.items()
        if path.startswith("plugin/")
    }
    plan = pr_changes(spec, plugin)
    root = installed_vllm_root()
    version = tree_version(root)
    if version is None or not same_release(version):
        raise InputError(
            f"the installed vLLM ({root}) is {version or 'of unknown version'}, but "
            f"the vllm-pr tree targets vLLM {PINNED_VLLM} (onboard/pr/versions.py)"
        )
    vllm_changes = apply_changes(plan, root, parts=("vllm",))
    tests_new = _new_only(plan, ("tests", "docs"))
    files = {f"{TREE}/{c.path}": c.new for c in vllm_changes + tests_new}
    files[f"{TREE}/changes.patch"] = unified_diff(vllm_changes + tests_new)
    files[f"{TREE}/edits.json"] = (
        json.dumps(
            {
                "vllm_version": PINNED_VLLM,
                "spec": spec.name,
                "new_files": sorted(plan.new_files),
                "edits": [edit.to_dict() for edit in plan.edits],
            },
            indent=2,
            ensure_ascii=False,
        )
        + "\n"
    )
    validation = latest_validation(Path(out_dir)) if out_dir is not None else None
    files[f"{TREE}/PR.md"] = render_pr_md(
        spec, plan, validation, _notes(spec, root), standalone
    )
    return dict(sorted(files.items()))


def _notes(spec: ModelSpec, root: Path) -> list[str]:
    registry = (root / REGISTRY).read_text(encoding="utf-8")
    if f'    "{spec.architecture}": (' not in registry:
        return []
    return [
        f"vLLM {PINNED_VLLM} already serves `{spec.architecture}` with its own "
        "module; this tree re-points the registry entry to the generated module "
        f"`{spec.module_name}.py` so that the in-tree validation exercises the "
        "generated code. For an upstream PR of an architecture vLLM already has, "
        "drop that registry change and compare the generated file with vLLM's."
    ]


def _new_only(plan: PrChanges, parts: tuple[str, ...]) -> list[FileChange]:
    return [
        FileChange(path, None, text)
        for path, text in plan.new_files.items()
        if path.split("/", 1)[0] in parts
    ]


def write_pr_md(
    spec: ModelSpec,
    generated: dict[str, str],
    gen_dir: Path,
    validation: Path | None,
    standalone: bool = False,
) -> Path:
    """Rewrite GEN_DIR/vllm-pr/PR.md, quoting ``validation`` (default: the latest
    validation.json found next to GEN_DIR). ``generated`` is generate_files'
    output for ``spec`` (``standalone`` as it was asked for)."""
    from onboard.fsutil import atomic_write_text
    from onboard.pr.describe import latest_validation, render_pr_md

    target = Path(gen_dir) / TREE / "PR.md"
    if not target.parent.is_dir():
        raise InputError(f"{target.parent}: missing (run `onboard generate` first)")
    if validation is not None and not Path(validation).is_file():
        raise InputError(f"--validation {validation}: no such file")
    validation = validation or latest_validation(Path(gen_dir))
    plugin = {
        path.split("/", 1)[1]: text
        for path, text in generated.items()
        if path.startswith("plugin/")
    }
    plan = pr_changes(spec, plugin)
    notes = _notes(spec, installed_vllm_root())
    atomic_write_text(target, render_pr_md(spec, plan, validation, notes, standalone))
    return target
