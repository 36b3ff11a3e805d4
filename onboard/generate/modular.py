"""The vLLM model file of a family vLLM ships under a new name: a subclass of
vLLM's class that reads the checkpoint's own tensor names (onboard.spec.bases)."""

from __future__ import annotations

import re

from onboard.generate.context import RENAMED_PARAM, Rename, _rename
from onboard.spec.bases import BaseMatch
from onboard.spec.model import ModelSpec, class_prefix
from onboard.templating import GenerationError, render_python


def renames(spec: ModelSpec, match: BaseMatch) -> list[Rename]:
    """Regex renames from the checkpoint's module paths to the family's, one per
    path (roles that share a module, e.g. gpt-oss's stacked experts, share it)."""
    out: dict[str, Rename] = {}
    for role, (ours, theirs) in match.renames.items():
        suffix = RENAMED_PARAM.get(role, "")
        out.setdefault(ours + suffix, _rename(role, ours + suffix, theirs + suffix))
    rules = list(out.values())
    # Renames run one after another: none may match a path another one produced.
    for a in rules:
        theirs = match.renames[a.role][1] + RENAMED_PARAM.get(a.role, "")
        produced = theirs.format(layer=0, expert=0)
        for b in rules:
            if b is not a and re.search(b.pattern, produced):
                raise GenerationError(
                    f"{spec.name}: checkpoint.tensor_names: renaming {a.role} to "
                    f"{produced!r} collides with the checkpoint path of {b.role}"
                )
    return rules


def render_modular(spec: ModelSpec, match: BaseMatch) -> str:
    """Source of the model file: vLLM's class of the family, renamed."""
    base = match.base
    context = {
        "spec": spec,
        "base": base,
        "renames": renames(spec, match),
        "config_class": f"{class_prefix(spec.architecture)}Config",
    }
    return render_python(
        "modular/vllm.py.j2",
        context,
        f"{spec.module_name}.py",
        body_template="modular/vllm_body.py.j2",
        local_imports={base.architecture: base.vllm_import},
    )
