"""Preflight of tensor names: missing, unexpected and renamed tensors.

Unexpected modules are matched to missing roles (a role under another layout's
name, shapes that fit, the same indices, similar names) and the
``checkpoint.tensor_names`` override that fixes them is verified by re-planning
the spec with it. Every other missing or unexpected pattern is reported once, with
the spec field that decides whether the tensor exists.
"""

from __future__ import annotations

import difflib
from collections import defaultdict

from onboard.checkpoint.preflight_ct import FLOATS, CTConfig
from onboard.checkpoint.preflight_quant import EXPERT_ROLES, HEAD_ROLES, QUANT_PARAMS
from onboard.checkpoint.preflight_report import (
    Expect,
    PreflightRun,
    Severity,
    examples,
)
from onboard.checkpoint.preflight_spec import (
    abstract,
    by_pattern,
    canonical_roles,
    describe,
    placeholders,
    role_hint,
    split_name,
)
from onboard.checkpoint.tiny import TensorPlan, plan_tensors
from onboard.spec.layouts import PARAM_ROLES
from onboard.spec.model import ModelSpec
from onboard.templating import index_ranges

# Tensors vLLM's loader drops by name (old exports carry them).
DROPPED = (
    "rotary_emb.inv_freq",
    "rotary_pos_emb.inv_freq",
    "rotary_emb.cos_cached",
    "rotary_emb.sin_cached",
)


def report_names(
    run: PreflightRun,
    missing: list[str],
    unexpected: list[str],
    quant: CTConfig | str | None,
    expected: dict[str, Expect],
) -> None:
    """Missing and unexpected tensors, one problem per pattern; renames first, so
    that the tensors they explain are not reported again."""
    miss = by_pattern(missing)
    extra = by_pattern(unexpected)
    canon = canonical_roles(run.plan)
    scales = [p for p in extra if split_name(p)[1] in QUANT_PARAMS]
    if quant is None and scales:
        names = [n for p in scales for n in extra.pop(p)]
        run.add(
            "error",
            "quant-config",
            "config.json",
            f"the checkpoint is quantized ({len(names)} scale/packed tensors, "
            f"e.g. {examples(names, 2)}), but config.json has no "
            "quantization_config: vLLM would build unquantized layers",
            "add the quantization_config the quantizer wrote to config.json",
            tensors=names,
            config_keys=["quantization_config"],
        )
    renames = _renames(run, extra, miss, canon, expected)
    for role, module, old in renames:
        params = sorted(
            {split_name(q)[1] for q in extra if split_name(q)[0] == module}
            & {split_name(q)[1] for q in miss if split_name(q)[0] == old}
        )
        names = [n for p in params for n in extra.pop(f"{module}.{p}")]
        gone = [n for p in params for n in miss.pop(f"{old}.{p}")]
        fix, verified = _override_fix(run, role, module)
        run.add(
            "error",
            "renamed-tensor",
            describe(f"{module}.*", names),
            f"the checkpoint stores role {role!r} as {module!r}; the spec's "
            f"{run.spec.checkpoint.layout!r} layout names it "
            f"{run.plan.layout_path(role)!r}"
            + (
                f" (checked: with the override all {len(gone)} tensors match, "
                "shapes included)"
                if verified
                else ""
            ),
            fix,
            tensors=names + gone,
            spec_fields=["checkpoint.tensor_names"],
        )
    if renames:
        _layout_hint(run)
    for pattern, names in miss.items():
        module, param = split_name(pattern)
        _missing_problem(run, pattern, canon.get(module), param, names)
    for pattern, names in extra.items():
        module, param = split_name(pattern)
        _unexpected_problem(run, pattern, canon.get(module), param, names, quant)


def _renames(
    run: PreflightRun,
    extra: dict[str, list[str]],
    miss: dict[str, list[str]],
    canon: dict[str, str],
    expected: dict[str, Expect],
) -> list[tuple[str, str, str]]:
    """(role, checkpoint module pattern, spec module pattern) for unexpected
    modules that look like a missing role under another name.

    Candidates pair an unexpected module with a missing one of the same
    placeholders and parameters; the best pairs win, scored by: the name is
    the role's name in some layout preset (``w1`` for expert_gate_proj), the
    shapes fit, the same indices, then name similarity (difflib).
    """
    from onboard.spec.layouts import LAYOUT_PRESETS, preset_roles

    def modules(groups: dict[str, list[str]]) -> dict[str, dict[str, list[str]]]:
        out: dict[str, dict[str, list[str]]] = defaultdict(dict)
        for pattern, names in groups.items():
            module, param = split_name(pattern)
            out[module][param] = names
        return out

    new, old = modules(extra), modules(miss)
    # A role that is one parameter of its module (the router's bias) is told by
    # that parameter, not by the module it shares.
    param_role = {param: role for role, param in PARAM_ROLES.items()}
    scored = []
    for u, u_params in new.items():
        if u in canon:
            continue  # a known role in an unexpected place, not a new name
        for m, m_params in old.items():
            role = canon.get(m)
            shared = sorted(set(u_params) & set(m_params))
            if role is None or not shared or placeholders(u) != placeholders(m):
                continue
            owner = role
            if len(shared) == 1 and shared[0] in param_role:
                role = param_role[shared[0]]
            # A module at a preset path is that role (OLMo-2's
            # post_feedforward_layernorm is a post-norm block's, not a renamed
            # input norm; the router's bias shares the router's module).
            if preset_roles(u) and owner not in preset_roles(u):
                continue
            spelled = u.rpartition(".")[2] in {
                preset[role].rpartition(".")[2] for preset in LAYOUT_PRESETS.values()
            }
            ratio = difflib.SequenceMatcher(None, u, m).ratio()
            if not spelled and ratio < 0.6:
                continue
            shapes = all(
                _fits(run.found[u_params[p][0]].shape, expected[m_params[p][0]].shape)
                for p in shared
            )
            indices = {abstract(n)[1] for n in u_params[shared[0]]} == {
                abstract(n)[1] for n in m_params[shared[0]]
            }
            scored.append(((spelled, shapes, indices, ratio), role, u, m))
    out, used = [], set()
    for _, role, u, m in sorted(scored, reverse=True):
        if u not in used and m not in used:
            used.update((u, m))
            out.append((role, u, m))
    return out


def _stored_as(run: PreflightRun, plan: TensorPlan) -> bool:
    """The checkpoint holds this planned tensor (quantized weights: as
    weight_packed, or in FP8/INT8 with the same rows)."""
    info = run.found.get(plan.name)
    if info is None:
        return plan.name.endswith(".weight") and f"{plan.name}_packed" in run.found
    if info.dtype in FLOATS:
        return info.shape == plan.shape
    return info.shape[:1] == plan.shape[:1]


def _layout_hint(run: PreflightRun) -> None:
    """A layout preset under which every tensor of the spec is found."""
    from onboard.spec.layouts import LAYOUT_PRESETS

    spec = run.spec
    for layout in LAYOUT_PRESETS:
        if layout == spec.checkpoint.layout:
            continue
        data = spec.model_dump(mode="json")
        data["checkpoint"] = {"layout": layout, "tensor_names": {}}
        plans = plan_tensors(ModelSpec.model_validate(data))
        if all(_stored_as(run, p) for p in plans):
            run.add(
                "note",
                "layout",
                "checkpoint.layout",
                f"every tensor of the spec is found under the {layout!r} "
                f"layout (the spec says {spec.checkpoint.layout!r})",
                f"set checkpoint.layout: {layout} in the spec instead of "
                "tensor_names overrides",
                spec_fields=["checkpoint.layout"],
            )
            return


def _fits(got: tuple[int, ...], want: tuple[int, ...] | None) -> bool:
    """The same shape, or the router bias's other storage ([n] and [1, n])."""
    return got == want or (
        want is not None and [d for d in got if d != 1] == [d for d in want if d != 1]
    )


def _override_fix(run: PreflightRun, role: str, module: str) -> tuple[str, bool]:
    """The tensor_names override, checked by planning the spec with it (for the
    router's bias, with its storage as [1, num_experts] flipped if that fits)."""
    spec = run.spec
    data = spec.model_dump(mode="json")
    data["checkpoint"]["tensor_names"] = {
        **spec.checkpoint.tensor_names,
        role: module,
    }
    override = f"tensor_names: {{{role}: '{module}'}}"
    tries = [(data, override)]
    if role == "router_bias":
        flipped = not spec.checkpoint.router_bias_2d
        other = {
            **data,
            "checkpoint": {**data["checkpoint"], "router_bias_2d": flipped},
        }
        tries.append((other, f"{override}, router_bias_2d: {str(flipped).lower()}"))
    before = {p.name for p in plan_tensors(spec)}
    for candidate, text in tries:
        try:
            planned = [
                p
                for p in plan_tensors(ModelSpec.model_validate(candidate))
                if p.name not in before
            ]
        except Exception:  # the override is not a valid spec: rename instead
            planned = []
        if planned and all(_stored_as(run, p) for p in planned):
            return f"add to the spec: checkpoint: {{{text}}}", True
    return (
        "rename these tensors in the checkpoint to the spec's names (the "
        f"override checkpoint: {{{override}}} would not fit every layer)",
        False,
    )


def _missing_problem(
    run: PreflightRun, pattern: str, role: str | None, param: str, names: list[str]
) -> None:
    spec, moe, mtp = run.spec, run.plan.moe, run.plan.mtp
    where = describe(pattern, names)
    layers = {abstract(n)[1][0] for n in names if abstract(n)[1]}
    message = "missing from the checkpoint"
    fix = (
        "check the checkpoint is complete (every shard downloaded) and that the "
        f"spec describes it (layout {spec.checkpoint.layout!r}; "
        "checkpoint.tensor_names overrides a role's name)"
    )
    fields: list[str] = []
    if param in QUANT_PARAMS:
        message += (
            f": the quantization_config needs {param} for every module it "
            "quantizes (a quantizer that skips MoE experts or fused modules "
            "leaves their scales out)"
        )
        fix = (
            "re-quantize the checkpoint (`onboard quantize`, llm-compressor); "
            "a module meant to stay in 16 bits goes to quantization_config.ignore"
        )
        fields = []
    elif param == "e_score_correction_bias":
        message += (
            ": the spec says mlp.moe.router.bias_correction: true (DeepSeek-V3 "
            "noaux_tc routing), which needs the router's e_score_correction_bias"
        )
        fix = (
            "set mlp.moe.router.bias_correction: false in the spec (and "
            "topk_method in config.json accordingly), or the checkpoint lacks "
            "the bias: export it with e_score_correction_bias"
        )
        fields = ["mlp.moe.router.bias_correction"]
    elif mtp and layers and min(layers) >= mtp.first_layer:
        message += (
            f": the spec has mtp.num_heads: {mtp.num_heads}, stored at "
            f"model.layers.{mtp.first_layer}+"
        )
        fix = (
            "set mtp: null in the spec (no MTP speculative decoding), or use a "
            "checkpoint that keeps its MTP heads"
        )
        fields = ["mtp"]
    elif role is not None:
        fix, fields = role_hint(run.plan, role, param, fix, missing=True)
    elif moe is not None and "{expert}" in pattern:
        fields = ["mlp.moe.num_experts"]
    run.add(
        "error",
        "missing-tensor",
        where,
        message,
        fix,
        tensors=names,
        spec_fields=fields,
    )


def _other_norm_placement(run: PreflightRun, pattern: str) -> str | None:
    """The other norm.placement, where ``pattern`` is one of its norms' preset
    paths (OLMo-2's post_feedforward_layernorm beside a pre-norm spec)."""
    from onboard.components.residual_stream import NORM_ROLES
    from onboard.spec.layouts import preset_roles

    at = preset_roles(split_name(pattern)[0])
    mine = run.spec.norm.placement
    for placement, roles in NORM_ROLES.items():
        if placement != mine and at & (set(roles) - set(NORM_ROLES[mine])):
            return placement
    return None


def _unexpected_problem(
    run: PreflightRun,
    pattern: str,
    role: str | None,
    param: str,
    names: list[str],
    quant: CTConfig | str | None,
) -> None:
    spec = run.spec
    where = describe(pattern, names)
    # A parameter role (the attention's sinks) is told by its parameter, not by
    # the module another role may share.
    role = {p: r for r, p in PARAM_ROLES.items()}.get(param, role)
    idx = [abstract(n)[1] for n in names]
    layers = {i[0] for i in idx if i}
    severity: Severity = "error"
    message = (
        "in the checkpoint, but the spec expects no such tensor: vLLM's loader "
        "stops on it"
    )
    fix = (
        "if it is a role under another name, map it with checkpoint.tensor_names "
        "in the spec; otherwise remove it from the checkpoint"
    )
    fields: list[str] = ["checkpoint.tensor_names"]
    arch = run.plan
    decoder, total, moe = len(arch.layers), arch.checkpoint_layers, arch.moe
    if any(pattern.endswith(d) for d in DROPPED):
        severity, message = "note", "vLLM's loader drops it by name"
        fix, fields = "", []
    elif param in QUANT_PARAMS and role in HEAD_ROLES:
        message = "quantized, but vLLM builds this layer unquantized"
        fix = "keep the embedding and output heads in 16 bits"
        fields = []
    elif role == "lm_head" and spec.tie_word_embeddings:
        severity = "warning"
        message = (
            "the spec ties the output head to the embedding "
            "(tie_word_embeddings: true), so vLLM skips this tensor"
        )
        fix = (
            "if the checkpoint's head differs from its embedding, set "
            "tie_word_embeddings: false in the spec"
        )
        fields = ["tie_word_embeddings"]
    elif layers and min(layers) >= total:
        if arch.mtp is None:
            message = (
                f"layers beyond num_hidden_layers ({decoder}): "
                "MTP heads, or more decoder layers than the spec says"
            )
            fix = (
                f"set mtp: {{num_heads: {max(layers) - total + 1}}} in the spec "
                "for MTP heads (DeepSeek-V3 stores them at model.layers."
                "{num_hidden_layers + i}), or fix num_hidden_layers"
            )
        else:
            message = f"layers beyond the spec's {total} (decoder + MTP) layers"
            fix = "fix num_hidden_layers or mtp.num_heads in the spec"
        fields = ["num_hidden_layers", "mtp.num_heads"]
    elif role is not None and role.startswith("mtp_") and layers:
        message = (
            f"MTP head tensors at layers {index_ranges(layers)}, but the spec puts "
            f"MTP heads after its {decoder} decoder layers"
            + ("" if arch.mtp else " and has none (mtp: null)")
        )
        fix = f"set num_hidden_layers: {min(layers)} in the spec" + (
            "" if arch.mtp else f" and mtp: {{num_heads: {len(layers)}}}"
        )
        fields = ["num_hidden_layers", "mtp"]
    elif (
        role in EXPERT_ROLES
        and moe is not None
        and any(len(i) > 1 and i[1] >= moe.num_experts for i in idx)
    ):
        top = max(i[1] for i in idx if len(i) > 1)
        message = (
            f"experts beyond mlp.moe.num_experts ({moe.num_experts}): "
            f"the checkpoint has experts up to {top}"
        )
        fix = f"set mlp.moe.num_experts: {top + 1} in the spec"
        fields = ["mlp.moe.num_experts"]
    elif (placement := _other_norm_placement(run, pattern)) is not None:
        message += f" (it is where a {placement}-norm block keeps a norm)"
        what = {"pre": "inputs", "post": "outputs"}.get(placement, "inputs and outputs")
        fix = (
            f"if the model normalises the sublayers' {what}, set norm.placement: "
            f"{placement} in the spec"
        )
        fields = ["norm.placement"]
    elif role is not None:
        fix, fields = role_hint(run.plan, role, param, fix, missing=False)
    run.add(
        severity,
        "unexpected-tensor",
        where,
        message,
        fix,
        tensors=names,
        spec_fields=fields,
    )
