"""Where a checkpoint keeps each role's tensors: all that quantization needs to know.

Quantization decides tensor by tensor from the checkpoint's names: the role a
tensor plays (onboard.spec.layouts), its layer, and whether the spec keeps it in
16 bits. With a spec (given, or the checkpoint's own spec.yaml) the layout comes
from it. A checkpoint as transformers or the Hub saved it has no spec: its layout
is the preset that explains most of its tensor names, the number of decoder
layers (tensors past them are MTP heads) and the KV-sharing layers come from
config.json. Neither path imports transformers, whose import alone costs more
than quantizing a 1 GB checkpoint (see docs/quantize.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from onboard.arch import build_plan
from onboard.components import kv_sharing
from onboard.components.base import ConfigProblem
from onboard.errors import InputError
from onboard.spec.layouts import (
    LAYOUT_PRESETS,
    LINEAR_ROLES,
    ROLES,
    STACKED_EXPERT_ROLES,
    role_path,
)
from onboard.spec.module_tree import used_roles

# Spellings of the decoder depth in config.json (transformers' attribute maps).
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


@dataclass(frozen=True)
class TensorLayout:
    """A checkpoint's tensor-name layout and the spec entries quantize reads."""

    layout: str  # a LAYOUT_PRESETS name
    num_hidden_layers: int
    tensor_names: Mapping[str, str] = field(default_factory=dict)  # role overrides
    kv_sharing: Mapping[int, int] = field(default_factory=dict)  # layer -> target
    keep_unquantized: tuple[str, ...] = ()
    source: str = "spec"  # what it was read from, for messages
    # The roles the spec uses, which win a path two roles share (the attention
    # module: the sinks' and KDA's).
    used: tuple[str, ...] = ()

    @classmethod
    def of_spec(cls, spec) -> TensorLayout:
        arch = build_plan(spec)  # decoder depth and KV-sharing layers
        return cls(
            layout=spec.checkpoint.layout,
            num_hidden_layers=len(arch.layers),
            tensor_names=dict(spec.checkpoint.tensor_names),
            kv_sharing=dict(arch.kv_sources),
            keep_unquantized=tuple(spec.keep_unquantized),
            used=tuple(used_roles(spec)),
        )

    def path(self, role: str) -> str:
        """Module path of a role."""
        return role_path(self.layout, self.tensor_names, role)

    def role_patterns(self) -> list[tuple[str, re.Pattern]]:
        """Each role's module path as a regex with ``layer`` / ``expert`` groups."""
        order = [*self.used, *(role for role in ROLES if role not in self.used)]
        return [(role, _pattern(self.path(role))) for role in order]


def _pattern(path: str) -> re.Pattern:
    rx = re.escape(path)
    rx = rx.replace(re.escape("{layer}"), r"(?P<layer>\d+)")
    rx = rx.replace(re.escape("{expert}"), r"(?P<expert>\d+)")
    return re.compile(rx + r"\Z")


def match_role(patterns: list[tuple[str, re.Pattern]], module: str):
    """(role, match) of the first pattern that matches ``module``, else (None, None)."""
    for role, rx in patterns:
        m = rx.match(module)
        if m:
            return role, m
    return None, None


def detect_layout(
    config: dict, tensor_names: Iterable[str], source: str
) -> TensorLayout:
    """The layout of a checkpoint without a spec, from config.json and its names.

    Every preset is tried; the one whose roles explain the most weights of the
    decoder's projections wins (Linear ones, and stacked experts), then the one
    that explains the most weights of any role (a router, a norm); the first in
    LAYOUT_PRESETS' order on a tie: presets that tie explain the same tensors the
    same way.
    """
    layers = next((config[k] for k in LAYER_COUNT_KEYS if k in config), None)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise InputError(
            f"{source}: num_hidden_layers is {layers!r}; quantize needs the decoder "
            "depth to tell MTP heads from decoder layers (fix config.json, or pass "
            "--spec)"
        )
    kv_sharing = _kv_sharing(config, layers, source)
    modules = [
        name.rpartition(".")[0] for name in tensor_names if name.endswith(".weight")
    ]
    projections = set(LINEAR_ROLES + STACKED_EXPERT_ROLES)
    best, best_count = None, (0, 0)
    for name in LAYOUT_PRESETS:
        candidate = TensorLayout(name, layers, kv_sharing=kv_sharing, source=source)
        patterns = candidate.role_patterns()
        roles = [match_role(patterns, m)[0] for m in modules]
        count = (
            sum(role in projections for role in roles),
            sum(role is not None for role in roles),
        )
        if count[0] and count > best_count:
            best, best_count = candidate, count
    if best is None:
        raise InputError(
            f"{source}: no tensor name matches a decoder projection of any known "
            f"layout ({', '.join(LAYOUT_PRESETS)}); write a spec with "
            "checkpoint.tensor_names and pass --spec"
        )
    return best


def _kv_sharing(config: dict, layers: int, source: str) -> dict[int, int]:
    """Layers that read an earlier layer's KV cache (what `spec from-hf` reads)."""
    try:
        return kv_sharing.targets_from_config(config.get(kv_sharing.CONFIG_KEY), layers)
    except ConfigProblem as exc:
        raise InputError(f"{source}: {exc}") from None
