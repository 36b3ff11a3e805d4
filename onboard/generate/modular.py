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
from onboard.spec.bases import BaseMatch, bridged
from onboard.spec.model import ModelSpec, class_prefix
from onboard.spec.mtp import mtp_draft
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
    out = []
    for delta, roles in bridged(spec, match):
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


@dataclass(frozen=True)
class HeadPath:
    """Where the family's MTP draft reads one of a head's modules: the
    checkpoint's path, an f-string body over ``n`` (the head's layer), and the
    family's, or None for a tensor the draft takes from the model."""

    source: str
    target: str | None
    role: str


def head_paths(spec: ModelSpec, match: BaseMatch) -> list[HeadPath]:
    """The renames of the MTP head into the family's draft's names, the head's
    own modules before its block (WeightsMapper applies them in order)."""
    out = []
    for role, target in match.base.mtp_paths:
        path = heads_prefix(spec) if not role else spec.tensor_path(role)
        py_str(path.replace("{layer}", "0"))
        out.append(
            HeadPath(
                path.replace("{layer}", "{n}") + ".", target and target + ".", role
            )
        )
    return out


def heads_prefix(spec: ModelSpec) -> str:
    """The module path of the MTP heads' decoder layers ("model.layers.{layer}"):
    onboard stores each head as decoder layer num_hidden_layers + its index."""
    path = spec.tensor_path("input_norm")
    return path.partition("{layer}")[0] + "{layer}"


def _context(spec: ModelSpec, match: BaseMatch) -> dict:
    mtp_paths = bool(spec.mtp is not None and match.base.mtp_paths)
    return {
        "spec": spec,
        "base": match.base,
        "renames": renames(spec, match),
        "conversions": conversions(spec, match),
        "config_class": f"{class_prefix(spec.architecture)}Config",
        # The MTP heads' draft (its class: where the model file names it).
        "draft": mtp_draft(spec) if spec.mtp is not None else None,
        # The model file skips the heads where the family's model would not.
        "heads_prefix": heads_prefix(spec).replace("{layer}", "{n}")
        if mtp_paths
        else None,
    }


def render_modular(spec: ModelSpec, match: BaseMatch) -> str:
    """Source of the model file: vLLM's class of the family, renamed."""
    base = match.base
    return render_python(
        "modular/vllm.py.j2",
        _context(spec, match),
        f"{spec.module_name}.py",
        body_template="modular/vllm_body.py.j2",
        local_imports={base.architecture: base.vllm_import},
    )


def render_modular_mtp(spec: ModelSpec, match: BaseMatch) -> str:
    """Source of the MTP file: vLLM's draft of the family, reading this
    checkpoint's heads (where the family's draft would not as it is)."""
    from onboard.spec.mtp import mtp_module_name

    base = match.base
    assert base.mtp_class is not None and base.mtp_module is not None
    context = {**_context(spec, match), "head_paths": head_paths(spec, match)}
    return render_python(
        "modular/vllm_mtp.py.j2",
        context,
        f"{mtp_module_name(spec)}.py",
        body_template="modular/vllm_mtp_body.py.j2",
        local_imports={
            base.mtp_class: f"vllm.model_executor.models.{base.mtp_module}",
            f"as_{base.model_type}": f".{spec.module_name}",
        },
    )
