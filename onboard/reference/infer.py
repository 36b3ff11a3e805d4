"""Infer a spec from a config.json and prove it, finding by the proof what the
config does not state.

A family's modeling code may fix what its config has no key for: Qwen3 always has
q/k norms, GLM-4-MoE always routes by sigmoid with a bias correction. For a family
onboard has verified those facts are known (onboard.spec.hf.FAMILIES); for any
other, each such concept (:data:`~onboard.spec.hf.OPEN_CONCEPTS`) is a question the
tiny model of the family answers:

- the ones a checkpoint shows in its tensor names (q/k norms, biases, norm
  placement and bias, a shared-expert gate, a router bias, the checkpoint layout
  and which projections it stores fused) are chosen so that the spec names
  exactly the tensors transformers saved;
- the others (rope interleaving, sigmoid or softmax scores, top-k renormalisation)
  are each tried, and the proof must accept exactly one combination.

Nothing is accepted without the proof of onboard.reference.prove.
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
from dataclasses import replace
from typing import Any

from onboard import components
from onboard.errors import InputError
from onboard.reference.prove import FamilyModel, Proof, ProofFailed, family_model
from onboard.reference.remote import RemoteCode
from onboard.spec.hf import (
    NOPE_WHEN_SLIDING,
    OPEN_CONCEPTS,
    model_type_of,
    open_concepts,
    quiet_transformers,
    spec_from_hf_config,
    stated_concepts,
    unstated_concepts,
)
from onboard.spec.layouts import FUSED_FORMS, LAYOUT_PRESETS, PARAM_ROLES, preset_roles
from onboard.spec.model import ModelSpec
from onboard.spec.module_tree import has_dense_mlp, used_roles
from onboard.spec.rules import check_rules

# Concepts a checkpoint's tensor names show (the rest need the forward pass).
VISIBLE = (
    "qkv_bias",
    "o_bias",
    "n_shared_experts",
    "shared_expert_gate",
    "moe_expert_bias",
    *(concept for c in components.every() for concept in c.visible),
)
_MOE_ONLY = {
    "moe_router_bias",
    "moe_expert_bias",
    "n_shared_experts",
    "shared_expert_gate",
    "topk_method",
    "scoring_func",
    "norm_topk_prob",
}
_GQA_ONLY = {
    "qkv_bias",
    "o_bias",
    # The components of GQA's section (MLA's own section's are MLA's).
    *(
        concept
        for c in components.every()
        if c.extends == "attention"
        for concept in c.config_aliases
    ),
}
# The checkpoint's own form, which no config says: its layout preset and the
# projections it stores as one tensor (checkpoint.fused).
_Ckpt = tuple[str, tuple[str, ...]]


def infer_spec(
    config: dict[str, Any],
    *,
    name: str | None = None,
    source: str = "config.json",
    remote: RemoteCode | None = None,
) -> tuple[ModelSpec, Proof]:
    """The spec of ``config``, proven against transformers' class for its family
    (which must exist), or against the family's ``remote`` code; raises
    :class:`ProofFailed` when no spec proves."""
    if isinstance(config.get("text_config"), dict):
        open_ = []  # a wrapper is read only around a family whose facts are known
    elif remote is None:
        open_ = open_concepts(model_type_of(config, source))
    else:  # what the config does not state, its code may fix
        open_ = unstated_concepts(set(config) | _declared(remote))
    # What _search starts from: what the config says through a key its class
    # does not read (MiniMax's use_qk_norm), else the first value.
    stated = stated_concepts(config)
    start = {
        c: stated[c]
        if c in stated and stated[c] in OPEN_CONCEPTS[c]
        else OPEN_CONCEPTS[c][0]
        for c in open_
    }
    base = spec_from_hf_config(config, name=name, source=source, facts=start)
    concepts = _questions(base, open_)
    with family_model(base, config, remote) as family:
        if base.checkpoint.language_model_prefix is not None:
            base, family = _with_wrapper_modules(base, family)
        if not concepts and not family.misfits(base):
            return base, family.prove(base)
        return _search(base, config, concepts, family, name, source, start)


def _with_wrapper_modules(
    spec: ModelSpec, family: FamilyModel
) -> tuple[ModelSpec, FamilyModel]:
    """A multimodal wrapper's spec with where the family saved its language
    model (checkpoint.language_model_prefix) and the modules outside it (its
    vision tower) as checkpoint.skipped_prefixes."""
    if family.saved_prefix is not None and family.saved_prefix != family.prefix:
        family = replace(family, prefix=family.saved_prefix)
    found = family.wrapper_modules()
    ckpt = spec.checkpoint
    if (
        found == sorted(ckpt.skipped_prefixes)
        and family.prefix == ckpt.language_model_prefix
    ):
        return spec, family
    data = spec.model_dump(mode="json")
    data["checkpoint"].update(
        language_model_prefix=family.prefix, skipped_prefixes=found
    )
    return ModelSpec.model_validate(data), family


def _declared(remote: RemoteCode) -> set[str]:
    """The keys the remote config class writes by default (none if it cannot be
    built without arguments)."""
    try:
        with quiet_transformers():
            return set(remote.config_class().to_dict())
    except Exception:  # its own validation: the config's keys are what it has
        return set()


def _questions(spec: ModelSpec, concepts: list[str]) -> list[str]:
    """The open concepts that change this spec's model."""
    moe = spec.mlp.moe
    kinds = set(spec.layer_attention_types())
    out = []
    for c in concepts:
        if c == NOPE_WHEN_SLIDING and kinds != {"sliding_attention", "full_attention"}:
            continue
        if c in _MOE_ONLY and moe is None:
            continue
        if c == "shared_expert_gate" and moe is not None and not moe.num_shared_experts:
            continue
        if c in _GQA_ONLY and spec.attention.type != "gqa":
            continue
        if c == "norm_bias" and spec.norm.type != "layernorm":
            continue
        out.append(c)
    return out


def _fused_moves(spec: ModelSpec) -> list[str]:
    """The projections a checkpoint of ``spec`` could store fused."""
    moves = []
    if spec.attention.type == "gqa" and not spec.attention.kv_sharing:
        moves.append("qkv_proj")
    if has_dense_mlp(spec):
        moves.append("gate_up_proj")
    moe = spec.mlp.moe
    if moe is not None:
        if moe.num_shared_experts:
            moves.append("shared_gate_up_proj")
        moves.append("experts")  # stacked
    return moves


def _search(
    base: ModelSpec,
    config: dict,
    concepts: list[str],
    family: FamilyModel,
    name: str | None,
    source: str,
    start: dict[str, Any],
) -> tuple[ModelSpec, Proof]:
    refused: list[InputError] = []

    def spec_with(facts: dict[str, Any], ckpt: _Ckpt) -> ModelSpec | None:
        try:
            spec = spec_from_hf_config(config, name=name, source=source, facts=facts)
        except InputError as exc:  # a combination the spec rules refuse
            refused.append(exc)
            return None
        layout, fused = ckpt
        if (spec.checkpoint.layout, tuple(spec.checkpoint.fused)) != ckpt:
            data = spec.model_dump(mode="json")
            data["checkpoint"].update(layout=layout, fused=list(fused))
            spec = ModelSpec.model_validate(data)
            if check_rules(spec):  # e.g. gpt-oss's experts_format, unstacked
                return None
        return renamed(spec, family)

    visible = [c for c in concepts if c in VISIBLE]
    facts = {c: start.get(c, OPEN_CONCEPTS[c][0]) for c in concepts}
    ckpt: _Ckpt = (base.checkpoint.layout, tuple(base.checkpoint.fused))
    misfit = family.misfits(base)
    # Each visible concept names its own tensors: move one at a time while the
    # names fit better.
    moves: list[tuple[str, Any]] = [(c, v) for c in visible for v in OPEN_CONCEPTS[c]]
    moves += [("layout", v) for v in LAYOUT_PRESETS if base.mlp.moe is not None]
    moves += [("fused", role) for role in _fused_moves(base)]
    while misfit:
        trials = []
        for concept, value in moves:
            trial, trial_ckpt = facts, ckpt
            if concept == "layout":
                if value == ckpt[0]:
                    continue
                trial_ckpt = (value, ckpt[1])
            elif concept == "fused":  # stored fused, or apart
                fused = set(ckpt[1]) ^ {value}
                trial_ckpt = (ckpt[0], tuple(r for r in FUSED_FORMS if r in fused))
            elif facts[concept] == value:
                continue
            else:
                trial = {**facts, concept: value}
            spec = spec_with(trial, trial_ckpt)
            if spec is not None:
                trials.append((family.misfits(spec), trial, trial_ckpt))
        better = [t for t in trials if t[0] < misfit]
        if not better:
            break
        misfit, facts, ckpt = min(better, key=lambda t: t[0])

    hidden = [c for c in concepts if c not in VISIBLE]
    proven: list[tuple[dict, ModelSpec, Proof]] = []
    first_failure: ProofFailed | None = None
    for values in itertools.product(*(OPEN_CONCEPTS[c] for c in hidden)):
        trial = {**facts, **dict(zip(hidden, values, strict=True))}
        spec = spec_with(trial, ckpt)
        if spec is None:
            continue
        try:
            proven.append((trial, spec, family.prove(spec)))
        except ProofFailed as exc:
            first_failure = first_failure or exc
        if misfit:
            break  # the names do not fit: every try fails on them
    if not proven:
        raise first_failure or refused[-1]  # else no combination was a valid spec
    distinct = {
        json.dumps(s.model_dump(mode="json"), sort_keys=True) for _, s, _ in proven
    }
    if len(distinct) > 1:
        differ = sorted(c for c in hidden if len({str(t[c]) for t, _, _ in proven}) > 1)
        raise ProofFailed(
            f"{base.name}: the tiny model of the family cannot tell apart "
            f"{', '.join(differ)}: several values give transformers' logits, and "
            "the config does not say which the family uses"
        )
    found, spec, proof = proven[0]
    if ckpt[0] != base.checkpoint.layout:
        found = {**found, "checkpoint.layout": ckpt[0]}
    if ckpt[1]:
        found = {**found, "checkpoint.fused": list(ckpt[1])}
    for role, path in spec.checkpoint.tensor_names.items():
        found = {**found, f"checkpoint.tensor_names.{role}": path}
    if spec.checkpoint.router_bias_2d:
        found = {**found, "checkpoint.router_bias_2d": True}
    return spec, replace(proof, found=found)


def renamed(spec: ModelSpec, family: FamilyModel) -> ModelSpec:
    """``spec`` with ``checkpoint.tensor_names`` for each role none of whose
    tensors the family saved, where exactly one unnamed module of the family has
    the same tensors (parameters, shapes, layers); the proof then checks them.
    The router's bias may be stored with a leading dimension of one (ERNIE-4.5-
    MoE's ``moe_statics``): then ``checkpoint.router_bias_2d`` is set too."""
    named, saved = family.named(spec), family.tensors
    extra = _modules({n: v for n, v in saved.items() if n not in named})
    # A module at a preset path is that role (OLMo-2's post_feedforward_layernorm
    # is a post-norm block's, not a renamed input norm).
    extra = {m: t for m, t in extra.items() if not preset_roles(m)}
    found: dict[str, str] = {}
    two_d = spec.checkpoint.router_bias_2d
    for role in used_roles(spec):
        template = spec.tensor_path(role)
        if "{expert}" in template:
            continue  # experts are found by the layout preset
        role_tensors = {n: v for n, v in named.items() if _is_role(n, template, role)}
        mine = _modules(role_tensors)
        if len(mine) != 1:
            continue
        ((path, tensors),) = mine.items()
        if any(n in saved for n in role_tensors):
            if role == "router_bias" and all(
                saved.get(n) == _other_rows(v) for n, v in role_tensors.items()
            ):
                two_d = not two_d  # the right name, stored in the other shape
            continue
        shapes = [tensors]
        if role == "router_bias":
            shapes.append(frozenset((p, i, _other_rows(v)) for p, i, v in tensors))
        for i, want in enumerate(shapes):
            fits = [module for module, theirs in extra.items() if theirs == want]
            if len(fits) > 1:  # the same shapes: the most similar name
                fits = difflib.get_close_matches(path, fits, n=1, cutoff=0.0)
            if len(fits) == 1 and fits[0] not in found.values():
                found[role] = fits[0]
                two_d = two_d != bool(i)
                break
    if not found and two_d == spec.checkpoint.router_bias_2d:
        return spec
    data = spec.model_dump(mode="json")
    data["checkpoint"]["tensor_names"] = {**spec.checkpoint.tensor_names, **found}
    data["checkpoint"]["router_bias_2d"] = two_d
    return ModelSpec.model_validate(data)


def _other_rows(shape: tuple[int, ...]) -> tuple[int, ...]:
    """[n] as [1, n] and [1, n] as [n]: the two ways the router's bias is stored."""
    return tuple(shape[1:]) if len(shape) == 2 and shape[0] == 1 else (1, *shape)


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _modules(tensors: dict[str, tuple[int, ...]]) -> dict[str, frozenset]:
    """Module path, with ``{layer}`` for the layer index -> its (parameter, layer,
    shape) set."""
    out: dict[str, set] = {}
    for name, shape in tensors.items():
        module, param = name.rsplit(".", 1)
        layer = _LAYER.search(module)
        index = layer.group(1) if layer else None
        if layer:
            module = (
                module[: layer.start()] + ".layers.{layer}." + module[layer.end() :]
            )
        out.setdefault(module, set()).add((param, index, shape))
    return {m: frozenset(v) for m, v in out.items()}


def _is_role(name: str, template: str, role: str) -> bool:
    """Whether tensor ``name`` is ``role``'s (its module at ``template``; a role
    that is one parameter of its module, by that parameter)."""
    module, param = name.rsplit(".", 1)
    pattern = re.escape(template).replace(r"\{layer\}", r"\d+")
    if re.fullmatch(pattern, module) is None:
        return False
    if role in PARAM_ROLES:
        return param == PARAM_ROLES[role]
    return param not in PARAM_ROLES.values()
