"""A private copy of the installed vLLM package to apply the PR to.

The installed package is ~500 MB in ~6000 files; the copy is a farm of hard links
(no bytes copied, a second or two), with ``__pycache__`` left out so that Python
compiles the copy's own modules. Files a patch rewrites must not be shared with
the installed package: ``git apply`` writes a new file rather than writing
through the link (checked by tests/test_pr.py), and ``real`` files are copied
anyway. Falls back to copying where hard links are impossible (another file
system).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from onboard.pr.build import installed_vllm_root


def vllm_farm(dst: Path, real: Iterable[str] = ()) -> Path:
    """``dst/vllm``: the installed vLLM as hard links; ``real`` (paths relative to
    ``dst``, e.g. ``vllm/model_executor/models/registry.py``) as real copies.
    Returns ``dst`` (put it first on PYTHONPATH)."""
    src = installed_vllm_root() / "vllm"
    dst = Path(dst)
    real = {dst / path for path in real}
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        target_dir = dst / "vllm" / Path(dirpath).relative_to(src)
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            source, target = Path(dirpath) / name, target_dir / name
            if target in real:
                shutil.copy2(source, target)
                continue
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
    return dst
