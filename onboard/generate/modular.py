"""The vLLM model file of a family vLLM ships under a new name: a subclass of
vLLM's class that reads the checkpoint's own tensor names (onboard.spec.bases)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from onboard.generate.context import (
    RENAMED_PARAM,
    Rename,
    check_renames,
    rename_rule,
)
from onboard.spec.bases import BaseMatch
from onboard.spec.model import ModelSpec, class_prefix
from onboard.templating import py_str, render_python


@dataclass(frozen=True)
class Conversion:
    """One component bridged at load (onboard.spec.bases.Delta), as the model file
    states it: a regex over the checkpoint's tensor names and the shift."""

    constant: str  # the module-level name of the regex
    comment: str
    pattern: str  # Python raw-string body
    shift: float

    @property
    def pattern_parts(self) -> list[str]:
        """The pattern cut after each alternative, to fit lines."""
        return re.split(r"(?<=\|)", self.pattern)


def tensor_pattern(spec: ModelSpec, roles: list[str]) -> str:
    """A regex over the checkpoint's weight tensors of ``roles`` (any layer)."""
    paths = []
    for role in roles:
        path = spec.tensor_path(role)
        py_str(path.replace("{layer}", "0"))  # identifiers and dots only
        paths.append(re.escape(path).replace(r"\{layer\}", r"\d+"))
    return rf"^(?:{'|'.join(paths)})\.weight$"


def conversions(spec: ModelSpec, match: BaseMatch) -> list[Conversion]:
    """The deltas of ``match`` over the tensors ``spec``'s checkpoint has."""
    from onboard.spec.module_tree import used_roles

    used = used_roles(spec)
    out = []
    for delta in match.deltas:
        roles = [r for r in delta.roles if r in used]
        if not roles:
            continue
        comment = delta.description.format(family=match.base.architecture)
        out.append(
            Conversion(
                delta.name.upper(),
                comment[0].upper() + comment[1:],
                tensor_pattern(spec, roles),
                delta.shift,
            )
        )
    return out


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
        "conversions": conversions(spec, match),
        "config_class": f"{class_prefix(spec.architecture)}Config",
    }
    return render_python(
        "modular/vllm.py.j2",
        context,
        f"{spec.module_name}.py",
        body_template="modular/vllm_body.py.j2",
        local_imports={base.architecture: base.vllm_import},
    )
