"""Generate the vLLM model file and its installable plugin from a spec.

``write_model_code(spec, out_dir)`` writes ``out_dir/plugin/`` (see
:mod:`onboard.generate.plugin` for the layout) and, for a model type transformers
does not know, ``out_dir/hf/``: the Hugging Face reference (configuration and
modeling files for ``trust_remote_code``, see :mod:`onboard.reference`). Output
is a pure function of the spec and the templates in ``templates/``: the same spec
gives the same bytes. The PR-ready vLLM tree (:mod:`onboard.pr`) is built from
these files; :func:`onboard.pipeline.generate_all` writes both.
"""

from __future__ import annotations

from pathlib import Path

from onboard.errors import InputError
from onboard.fsutil import atomic_directory
from onboard.generate.context import build_context
from onboard.generate.modular import render_modular, render_modular_mtp
from onboard.generate.plugin import plugin_files
from onboard.reference import render_reference
from onboard.spec.hf import find_base, transformers_knows
from onboard.spec.model import ModelSpec
from onboard.spec.mtp import mtp_draft, mtp_module_name
from onboard.spec.naming import model_class_path, package_name
from onboard.templating import GenerationError, RenderError, render_python

__all__ = [
    "GenerationError",
    "RenderError",
    "generate_files",
    "model_class_path",
    "package_name",
    "render_model",
    "render_mtp",
    "write_model_code",
    "write_trees",
]


def render_model(spec: ModelSpec, standalone: bool = False) -> str:
    """Source of the vLLM model file for ``spec`` (formatted, lint-checked): a
    subclass of vLLM's class where ``spec`` is a family vLLM ships under a new
    name (onboard.spec.bases), unless ``standalone``."""
    match = None if standalone else find_base(spec)
    if match is not None:
        return render_modular(spec, match)
    return render_python(
        "vllm/model.py.j2",
        build_context(spec),
        f"{spec.module_name}.py",
        body_template="vllm/model_body.py.j2",
    )


def render_mtp(spec: ModelSpec, standalone: bool = False) -> str | None:
    """Source of the MTP draft file for a spec with MTP heads (formatted,
    lint-checked); see :mod:`onboard.spec.mtp`. Its blocks are the model
    file's decoder layer, imported from the sibling module (a relative import,
    which holds in the plugin package and in vLLM's models package alike).
    None where vLLM's own draft class serves the heads (a renamed family)."""
    if mtp_draft(spec, standalone).class_name is None:
        return None
    match = None if standalone else find_base(spec)
    if match is not None:
        return render_modular_mtp(spec, match)
    context = build_context(spec, mtp=True)
    return render_python(
        "vllm/mtp.py.j2",
        context,
        f"{mtp_module_name(spec)}.py",
        body_template="components/mtp/vllm.py.j2",
        local_imports={f"{context['P']}DecoderLayer": f".{spec.module_name}"},
    )


def generate_files(spec: ModelSpec, standalone: bool = False) -> dict[str, str]:
    """Relative path (under the output directory) -> text, for every output file.
    ``standalone``: the whole model file even where a family vLLM ships is the
    base (see :func:`render_model`)."""
    mtp_source = render_mtp(spec, standalone) if spec.mtp is not None else None
    model_source = render_model(spec, standalone)
    files = {
        f"plugin/{path}": text
        for path, text in plugin_files(
            spec, model_source, mtp_source, standalone
        ).items()
    }
    if not transformers_knows(spec.model_type):
        try:
            reference = render_reference(spec, standalone)
        except InputError as exc:
            # The vLLM model can still be generated; validation then reports that
            # no reference exists, with this reason.
            reference = {"README.md": f"No Hugging Face reference: {exc}\n"}
        files.update({f"hf/{name}": text for name, text in reference.items()})
    return dict(sorted(files.items()))


def write_trees(files: dict[str, str], out_dir: Path) -> list[Path]:
    """Write ``files`` (paths under ``out_dir``) and return their paths.

    Each output tree (the first path part: ``plugin/``, ``hf/``, ...) is replaced
    as a whole and atomically, so a failed write leaves the previous output
    untouched.
    """
    out_dir = Path(out_dir)
    written: list[Path] = []
    trees = sorted({path.split("/", 1)[0] for path in files})
    for tree in trees:
        with atomic_directory(out_dir / tree) as tmp:
            tmp.chmod(0o755)  # mkdtemp makes it private; this is an output tree
            for path, text in files.items():
                top, rest = path.split("/", 1)
                if top != tree:
                    continue
                target = tmp / rest
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
                written.append(out_dir / path)
    return written


def write_model_code(spec: ModelSpec, out_dir: Path) -> list[Path]:
    """``out_dir/plugin/`` and ``out_dir/hf/`` alone: what vLLM and the reference
    load. ``onboard generate`` adds the PR tree
    (:func:`onboard.pipeline.generate.generate_all`)."""
    return write_trees(generate_files(spec), out_dir)
