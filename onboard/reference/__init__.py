"""The generated Hugging Face reference: configuration and modeling for
``trust_remote_code``, for architectures transformers does not know.

:func:`generate_hf_reference` renders ``configuration_<module>.py`` and
``modeling_<module>.py`` from the spec (``templates/hf/``);
:func:`install_reference` copies them into a checkpoint directory and points its
config.json's ``auto_map`` at them, so ``AutoModelForCausalLM.from_pretrained(dir,
trust_remote_code=True)`` builds the reference. See docs/reference.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from onboard.errors import InputError
from onboard.fsutil import atomic_write_text
from onboard.reference.context import reference_context
from onboard.spec.hf import find_base
from onboard.spec.model import ModelSpec, class_prefix

__all__ = [
    "auto_map",
    "file_names",
    "generate_hf_reference",
    "install_reference",
    "render_reference",
]


def file_names(spec: ModelSpec) -> tuple[str, str]:
    """(configuration file, modeling file) names for ``spec``."""
    return (
        f"configuration_{spec.module_name}.py",
        f"modeling_{spec.module_name}.py",
    )


def render_reference(spec: ModelSpec, standalone: bool = False) -> dict[str, str]:
    """File name -> source of the two generated files (formatted, lint-clean).

    A family transformers ships under a new name (onboard.spec.bases) gets
    subclasses of transformers' classes, unless ``standalone`` or its tensor
    names need renames transformers cannot state
    (:func:`onboard.reference.modular.renamings`)."""
    from onboard.reference.modular import renamings, render_modular_reference
    from onboard.templating import render_template, ruff_clean

    match = None if standalone else find_base(spec)
    if match is not None and renamings(match) is not None:
        return render_modular_reference(spec, match, *file_names(spec))
    context = reference_context(spec)
    config_file, modeling_file = file_names(spec)
    return {
        config_file: ruff_clean(
            render_template("hf/configuration.py.j2", context), config_file
        ),
        modeling_file: ruff_clean(
            render_template("hf/modeling.py.j2", context), modeling_file
        ),
    }


def auto_map(spec: ModelSpec) -> dict[str, str]:
    """config.json ``auto_map`` entries that select the generated classes."""
    config_file, modeling_file = (name[: -len(".py")] for name in file_names(spec))
    return {
        "AutoConfig": f"{config_file}.{class_prefix(spec.architecture)}Config",
        "AutoModelForCausalLM": f"{modeling_file}.{spec.architecture}",
    }


def generate_hf_reference(
    spec: ModelSpec, out_dir: Path, standalone: bool = False
) -> list[Path]:
    """Write the configuration and modeling files into ``out_dir``; return them
    (``standalone``: as :func:`render_reference`)."""
    out_dir = Path(out_dir)
    written = []
    for name, source in render_reference(spec, standalone).items():
        atomic_write_text(out_dir / name, source)
        written.append(out_dir / name)
    return written


def install_reference(
    spec: ModelSpec, checkpoint_dir: Path, standalone: bool = False
) -> list[Path]:
    """Make ``checkpoint_dir`` load as the generated reference (``standalone``:
    as :func:`render_reference`).

    Writes the two files next to the weights and adds ``auto_map`` (AutoConfig and
    AutoModelForCausalLM) to config.json, each file replaced atomically. Returns
    the files written.
    """
    checkpoint_dir = Path(checkpoint_dir)
    config_path = checkpoint_dir / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{config_path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{config_path}: cannot read it as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise InputError(f"{config_path}: expected a JSON object")
    if config.get("model_type") != spec.model_type:
        raise InputError(
            f"{config_path}: model_type is {config.get('model_type')!r} but the spec "
            f"{spec.name!r} says {spec.model_type!r}; the reference would not match "
            "this checkpoint"
        )
    written = generate_hf_reference(spec, checkpoint_dir, standalone)
    config["auto_map"] = {**config.get("auto_map", {}), **auto_map(spec)}
    atomic_write_text(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return [*written, config_path]
