"""Shared inputs for the publish tests: real checkpoints in the new-model layout,
built once per test session, with real validation results from
tests/fixtures/publish/ (see the README there for the commands that made them)."""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.quantize import quantize_checkpoint
from onboard.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "model_specs"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "publish"
# A token shaped like a real one and unique per session, so that finding it in
# any output can only mean it leaked.
TOKEN = "hf_onboardTest" + secrets.token_hex(12)

_LAYOUT: Path | None = None
_DENSE: Path | None = None


def build_layout(base: Path) -> Path:
    """``base/out`` laid out like `onboard new-model` output: spec.yaml,
    checkpoints/bf16, checkpoints/fp8-dynamic, validation/validation.json, and a
    validation of the FP8 checkpoint at validation-fp8/validation.json."""
    global _LAYOUT
    if _LAYOUT is not None:
        return _LAYOUT
    root = base / "out"
    spec = load_spec(SPECS / "deepseek-v3-style.yaml")
    bf16 = write_tiny_checkpoint(spec, root / "checkpoints" / "bf16", seed=0)
    quantize_checkpoint(
        bf16, "fp8-dynamic", root / "checkpoints" / "fp8-dynamic", workers=1
    )
    shutil.copy(SPECS / "deepseek-v3-style.yaml", root / "spec.yaml")
    place_validation(
        FIXTURES / "deepseek-v3-style-bf16.validation.json",
        root / "validation" / "validation.json",
        root / "checkpoints" / "bf16",
    )
    place_validation(
        FIXTURES / "deepseek-v3-style-fp8-dynamic.validation.json",
        root / "validation-fp8" / "validation.json",
        root / "checkpoints" / "fp8-dynamic",
    )
    _LAYOUT = root
    return root


def build_dense_fp8(base: Path) -> Path:
    """``base/dense/checkpoints/fp8-dynamic``: the FP8 checkpoint the bundled
    dense-gqa spec asks for, with its recorded validation beside it at
    ``base/dense/validation-fp8/validation.json`` (a failed run)."""
    global _DENSE
    if _DENSE is not None:
        return _DENSE
    root = base / "dense"
    spec = load_spec(SPECS / "dense-gqa.yaml")
    bf16 = write_tiny_checkpoint(spec, root / "checkpoints" / "bf16", seed=0)
    fp8 = quantize_checkpoint(
        bf16, "fp8-dynamic", root / "checkpoints" / "fp8-dynamic", workers=1
    )
    place_validation(
        FIXTURES / "dense-gqa-fp8-dynamic.validation.json",
        root / "validation-fp8" / "validation.json",
        Path(fp8),
    )
    _DENSE = Path(fp8)
    return _DENSE


def place_validation(fixture: Path, dest: Path, model_dir: Path) -> Path:
    """Copy a recorded validation.json, pointing its model_dir at the checkpoint
    the test regenerated from the same spec and seed (the recorded one lived in
    a temporary directory of the run that produced it)."""
    data = json.loads(fixture.read_text())
    data["model_dir"] = str(model_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(data, indent=2) + "\n")
    return dest


def copy_checkpoint(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest
