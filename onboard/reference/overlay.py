"""A checkpoint directory that transformers loads with the generated reference
code (``trust_remote_code``): the checkpoint's files linked, the code copied in,
``config.json`` given an ``auto_map``. Validation, calibration and MTP training
all load their reference model this way."""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

from onboard.spec.model import ModelSpec


class ReferenceUnavailable(Exception):
    """No reference implementation can be loaded for this checkpoint."""


def overlay_with_remote_code(
    model_dir: Path,
    spec: ModelSpec,
    hf_dir: Path | None,
    config: dict,
    work_dir: Path,
    standalone: bool = False,
) -> Path:
    """A directory with the checkpoint's files (linked), the generated reference
    code (from GEN_DIR/hf, else generated from the spec now; ``standalone`` as
    :func:`onboard.reference.render_reference`) and a config.json whose auto_map
    points at it; the user's checkpoint is left untouched."""
    overlay = work_dir / "reference-model"
    shutil.rmtree(overlay, ignore_errors=True)
    overlay.mkdir(parents=True)
    for item in model_dir.iterdir():
        if item.name != "config.json":
            os.symlink(item.resolve(), overlay / item.name)
    if hf_dir is not None and any(hf_dir.glob("modeling_*.py")):
        for code in hf_dir.glob("*.py"):
            shutil.copy(code, overlay / code.name)
    else:
        try:
            from onboard.reference import generate_hf_reference
        except ImportError:
            raise ReferenceUnavailable(
                f"model_type {config.get('model_type')!r} is unknown to transformers "
                "and no generated Hugging Face reference is available"
            ) from None
        generate_hf_reference(spec, overlay, standalone)
    config = dict(config, auto_map=_auto_map(spec, overlay, config))
    (overlay / "config.json").write_text(json.dumps(config, indent=2))
    return overlay


def _auto_map(spec: ModelSpec, code_dir: Path, config: dict) -> dict[str, str]:
    """auto_map for the generated files: from the spec where onboard.reference
    names them, else the *Config class and the architecture found in the files."""
    try:
        from onboard.reference import auto_map, file_names

        if all((code_dir / name).is_file() for name in file_names(spec)):
            return auto_map(spec)
    except ImportError:
        pass
    architectures = config.get("architectures") or [spec.architecture]
    found: dict[str, str] = {}
    for path in sorted(code_dir.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            if path.stem.startswith("configuration_") and node.name.endswith("Config"):
                found["AutoConfig"] = f"{path.stem}.{node.name}"
            if path.stem.startswith("modeling_") and node.name in architectures:
                found["AutoModelForCausalLM"] = f"{path.stem}.{node.name}"
    if "AutoModelForCausalLM" not in found:
        raise ReferenceUnavailable(
            f"{code_dir}: no class named {architectures} in modeling_*.py"
        )
    return found
