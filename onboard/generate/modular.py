"""The vLLM model file of a family vLLM ships under a new name: a subclass of
vLLM's class that reads the checkpoint's own tensor names (onboard.spec.bases)."""

from __future__ import annotations

from onboard.generate.context import (
    RENAMED_PARAM,
    Rename,
    check_renames,
    rename_rule,
)
from onboard.spec.bases import BaseMatch
from onboard.spec.model import ModelSpec, class_prefix
from onboard.templating import render_python


def renames(spec: ModelSpec, match: BaseMatch) -> list[Rename]:
    """Regex renames from the checkpoint's module paths to the family's, one per
    path (roles that share a module, e.g. gpt-oss's stacked experts, share it)."""
    out: dict[str, Rename] = {}
    for role, (ours, theirs) in match.renames.items():
        suffix = RENAMED_PARAM.get(role, "")
        out.setdefault(ours + suffix, rename_rule(role, ours + suffix, theirs + suffix))
    rules = list(out.values())
    check_renames(spec, rules, lambda role: match.renames[role][1])
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
