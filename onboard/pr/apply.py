"""``onboard pr check|apply GEN_DIR --vllm-src PATH``.

PATH contains ``vllm/``: a repository checkout (it also has ``tests/models`` or
``.git``) or the site-packages directory of an installed vLLM. The patch is
``GEN_DIR/vllm-pr/changes.patch`` (its ``vllm/`` part computed from the pinned,
installed vLLM; the new test file) plus, for a checkout, the ``tests/`` and
``docs/`` edits of ``edits.json`` applied to the checkout's own files. An
installed package gets the ``vllm/`` part only.

Safety: the tree's vLLM version must be the pinned one; ``git apply --check``
runs first and ``git apply`` (all files or none) only after it passed; a patch
that already applied (its reverse applies) is refused. Every refusal is an
InputError (exit 2) and leaves the tree unchanged.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from onboard.errors import InputError
from onboard.pr.build import (
    PrChanges,
    apply_changes,
    same_release,
    tree_version,
    unified_diff,
)
from onboard.pr.edits import Edit
from onboard.pr.versions import PINNED_VLLM


@dataclass
class VllmPatch:
    root: Path
    kind: str  # "checkout" | "installed package"
    patch: str
    files: list[str]
    skipped: list[str] = field(default_factory=list)

    def summary(self, verb: str) -> str:
        lines = [f"{verb} {len(self.files)} file(s) in {self.root} ({self.kind}):"]
        lines += [f"  {path}" for path in self.files]
        if self.skipped:
            lines.append(
                "an installed package has no tests/ or docs/: their part was not "
                "applied (use a vLLM repository checkout for the whole PR):"
            )
            lines += [f"  skipped {path}" for path in self.skipped]
        return "\n".join(lines)


def _sections(patch: str) -> list[tuple[str, str]]:
    """(path, text) of each file of a git-style patch."""
    parts = re.split(r"(?m)^(?=diff --git )", patch)
    out = []
    for part in parts:
        if not part.strip():
            continue
        match = re.match(r"diff --git a/(\S+) b/", part)
        if match is None:
            raise InputError(f"unexpected patch text: {part[:80]!r}")
        out.append((match.group(1), part))
    return out


def _read_tree(gen_dir: Path) -> tuple[str, list[Edit]]:
    tree = Path(gen_dir) / "vllm-pr"
    patch_path, edits_path = tree / "changes.patch", tree / "edits.json"
    for path in (patch_path, edits_path):
        if not path.is_file():
            raise InputError(f"{path}: missing (run `onboard generate SPEC --out DIR`)")
    meta = json.loads(edits_path.read_text())
    if meta.get("vllm_version") != PINNED_VLLM:
        raise InputError(
            f"{edits_path}: generated for vLLM {meta.get('vllm_version')}, this "
            f"onboard targets {PINNED_VLLM}: regenerate"
        )
    return patch_path.read_text(), [Edit.from_dict(e) for e in meta["edits"]]


def make_patch(gen_dir: Path, vllm_src: Path) -> VllmPatch:
    """The patch for the tree at ``vllm_src``; refuses another vLLM version."""
    root = Path(vllm_src)
    if not (root / "vllm").is_dir():
        raise InputError(f"--vllm-src {root}: no vllm/ directory in it")
    version = tree_version(root)
    if version is None:
        raise InputError(
            f"--vllm-src {root}: cannot tell its vLLM version (no vllm/_version.py "
            "and no vllm*.dist-info)"
        )
    if not same_release(version):
        raise InputError(
            f"--vllm-src {root}: vLLM {version}, but the PR targets vLLM "
            f"{PINNED_VLLM}; nothing was changed"
        )
    patch, edits = _read_tree(gen_dir)
    sections = _sections(patch)
    checkout = (root / ".git").exists() or (root / "tests" / "models").is_dir()
    if checkout:
        # The tests/ and docs/ entries go into this checkout's own files.
        plan = PrChanges({}, [e for e in edits if e.part != "vllm"], [], None)
        extra = unified_diff(apply_changes(plan, root, parts=("tests", "docs")))
        sections += _sections(extra)
        return VllmPatch(
            root,
            "checkout",
            "".join(text for _, text in sections),
            [path for path, _ in sections],
        )
    kept = [(p, t) for p, t in sections if p.startswith("vllm/")]
    skipped = [p for p, _ in sections if not p.startswith("vllm/")]
    skipped += sorted({e.path for e in edits if e.part != "vllm"})
    return VllmPatch(
        root,
        "installed package",
        "".join(text for _, text in kept),
        [p for p, _ in kept],
        skipped,
    )


def _git_apply(root: Path, patch: str, *args: str) -> subprocess.CompletedProcess:
    with tempfile.NamedTemporaryFile("w", suffix=".patch", delete=False) as f:
        f.write(patch)
        name = f.name
    try:
        # Stop git from treating an enclosing repository (e.g. a project that
        # holds the virtualenv) as the one to patch: paths are relative to root.
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.resolve().parent)}
        return subprocess.run(
            ["git", "apply", "-p1", *args, name],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.unlink(name)


def check(gen_dir: Path, vllm_src: Path) -> VllmPatch:
    """Dry run: raise InputError unless the patch applies cleanly."""
    plan = make_patch(gen_dir, vllm_src)
    if not plan.files:
        raise InputError(f"{plan.root}: the patch is empty")
    forward = _git_apply(plan.root, plan.patch, "--check")
    if forward.returncode == 0:
        return plan
    reverse = _git_apply(plan.root, plan.patch, "--check", "--reverse")
    if reverse.returncode == 0:
        raise InputError(
            f"{plan.root}: the PR is already applied (its reverse applies); "
            "nothing was changed"
        )
    raise InputError(
        f"{plan.root}: the patch does not apply; nothing was changed:\n"
        + forward.stderr.strip()
    )


def apply(gen_dir: Path, vllm_src: Path) -> VllmPatch:
    plan = check(gen_dir, vllm_src)
    result = _git_apply(plan.root, plan.patch)
    if result.returncode != 0:  # git apply writes all files or none
        raise InputError(f"{plan.root}: git apply failed:\n{result.stderr.strip()}")
    return plan
