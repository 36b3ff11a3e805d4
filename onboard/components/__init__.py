"""The components: one module per primitive of an architecture
(:mod:`onboard.components.base` says what a component owns).

Every module of this package but ``base`` defines one component as ``COMPONENT``;
the registry finds them here, so adding a primitive is its module (with its
template fragments under ``templates/components/<name>/`` and its tests), and
nothing else changes. The stages ask the registry:

- the spec: :func:`section_fields` (the fields components add to a section);
- its rules, the config.json mapping, the checkpoint roles, the plan, the
  tensors and the two generated models: :func:`present` (the components a spec
  has) and :func:`every` (all of them, for what a spec may name).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import defaultdict
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from onboard.components.base import Component, Role, Section, TensorPlan

if TYPE_CHECKING:
    from onboard.arch.plan import ArchPlan, Attention, MoEMLP
    from onboard.spec.model import ModelSpec

__all__ = [
    "Component",
    "Role",
    "Section",
    "TensorPlan",
    "config_aliases",
    "every",
    "code_parts",
    "fragments",
    "parts",
    "present",
    "roles",
    "section_fields",
]


@cache
def every() -> tuple[Component, ...]:
    """Every component, in a fixed order (by module name)."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.append(module.COMPONENT)
    return tuple(found)


def present(spec: ModelSpec, host: str | None = None) -> tuple[Component, ...]:
    """The components ``spec`` has (those whose plan node lives in ``host``,
    "attention" or "layer", where given)."""
    return tuple(c for c in every() if c.present(spec) and host in (None, c.host))


def parts(
    holder: Attention | MoEMLP | ArchPlan,
) -> tuple[tuple[Component, Any], ...]:
    """The plan nodes of ``holder`` (an architecture plan's attention, its MoE
    block, or the plan itself for the model-wide ones), each with its component,
    in registry order."""
    return tuple(
        (c, node)
        for c in every()
        if c.Node is not None and (node := holder.part(c.Node)) is not None
    )


def code_parts(arch: ArchPlan) -> tuple[tuple[Component, Any], ...]:
    """Every plan node the generated code prints from, with its component: the
    attention's parts, the MoE block's (its router), the model's."""
    holders = (arch.attention, arch.moe, arch)
    return tuple(p for h in holders if h is not None for p in parts(h))


def fragments(spec: ModelSpec, model: str) -> dict[str, list[str]]:
    """The template fragments the components of ``spec`` print at each slot of
    the ``model`` ("vllm" or "hf") templates: slot -> fragment templates, in
    registry order; a slot no component fills has none."""
    slots: dict[str, list[str]] = defaultdict(list)
    for component in present(spec):
        own = component.vllm_fragments if model == "vllm" else component.hf_fragments
        for slot, template in own.items():
            slots[slot].append(template)
    return slots


def section_fields(
    section: str, *, mixers: bool | None = None
) -> tuple[type[Section], ...]:
    """The field mixins components add to spec section ``section``
    (``attention.mla``), as bases: in reverse registry order, since pydantic
    lists the fields of the last base first (the section's own fields, then
    the components' in registry order). ``mixers``: only the token mixers'
    (True) or all but theirs (False), which the spec lists beside attention."""
    mixins = [
        c.Fields
        for c in every()
        if c.extends == section
        and c.Fields
        and (mixers is None or (c.host == "mixer") == mixers)
    ]
    return tuple(reversed(mixins))


def roles() -> Mapping[str, Role]:
    """Every checkpoint role a component adds."""
    out: dict[str, Role] = {}
    for component in every():
        out.update(component.roles)
    return out


def config_aliases() -> Mapping[str, tuple[str, ...]]:
    """The config.json concepts components add, each with its keys."""
    out: dict[str, tuple[str, ...]] = {}
    for component in every():
        out.update(component.config_aliases)
    return out
