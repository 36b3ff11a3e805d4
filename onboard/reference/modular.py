"""The reference of a family transformers ships under a new name
(onboard.spec.bases): subclasses of transformers' classes, in the style of
transformers' ``modular_*.py`` files, with the checkpoint's own tensor names
renamed by a conversion mapping registered for the model type."""

from __future__ import annotations

import re
from dataclasses import dataclass

from onboard.spec.bases import BaseMatch, bridged
from onboard.spec.layouts import PARAM_ROLES
from onboard.spec.model import ModelSpec, class_prefix
from onboard.templating import py_str


@dataclass(frozen=True)
class Renaming:
    """One transformers ``WeightRenaming``: a regex over tensor names and its
    replacement (``\\1`` the layer or expert index)."""

    source: str
    target: str


def renamings(match: BaseMatch) -> list[Renaming] | None:
    """The renames as transformers' ``WeightRenaming`` can state them, or None
    where one needs two indices (a layer's expert: transformers' renaming carries
    one captured group)."""
    out: dict[str, Renaming] = {}
    for role, (ours, theirs) in match.renames.items():
        if len(re.findall(r"\{(?:layer|expert)\}", ours)) > 1:
            return None
        param = PARAM_ROLES.get(role)
        # A module's tensors are its path plus ".weight"/".bias"; a parameter
        # role's tensor is the path plus its name.
        end = rf"\.{param}$" if param else r"\."
        tail = f".{param}" if param else "."
        source = "^" + "".join(
            r"(\d+)" if piece in ("{layer}", "{expert}") else re.escape(piece)
            for piece in re.split(r"(\{layer\}|\{expert\})", ours)
        )
        target = re.sub(r"\{(?:layer|expert)\}", r"\\1", theirs)
        py_str(theirs.replace("{layer}", "0").replace("{expert}", "0"))
        out.setdefault(ours, Renaming(source + end, target + tail))
    return list(out.values())


@dataclass(frozen=True)
class Shifted:
    """One role's tensors shifted where they load (onboard.spec.bases.Delta), as a
    transformers ``WeightConverter`` states them: a glob over tensor names,
    converted in place."""

    pattern: str
    shift: float


def shifted(spec: ModelSpec, match: BaseMatch) -> list[Shifted]:
    """The tensors the deltas of ``match`` convert, one converter per role the
    checkpoint has (transformers' patterns carry no alternation)."""
    out = []
    for delta, roles in bridged(spec, match):
        for role in roles:
            path = spec.tensor_path(role)
            py_str(path.replace("{layer}", "0"))
            # A layer's tensor by its path within the layer: transformers
            # converts what a pattern matches under one prefix together (a "*"
            # would gather every layer's into one conversion).
            within = path.partition("{layer}.")[2] or path
            out.append(Shifted(f"{within}.weight", delta.shift))
    return out


def render_modular_reference(
    spec: ModelSpec, match: BaseMatch, config_file: str, modeling_file: str
) -> dict[str, str]:
    """File name -> source of the configuration and modeling files."""
    from onboard.templating import render_template, ruff_clean

    context = {
        "spec": spec,
        "base": match.base,
        "renames": renamings(match),
        "shifted": shifted(spec, match),
        "deltas": [
            d.description.format(family=match.base.architecture) for d in match.deltas
        ],
        "config_class": f"{class_prefix(spec.architecture)}Config",
        "config_module": config_file.removesuffix(".py"),
    }
    return {
        config_file: ruff_clean(
            render_template("modular/hf_configuration.py.j2", context), config_file
        ),
        modeling_file: ruff_clean(
            render_template("modular/hf_modeling.py.j2", context), modeling_file
        ),
    }
