"""Preflight of the checkpoint's tensors against the spec's plan.

The plan is :func:`onboard.checkpoint.tiny.plan_tensors` (the spec's own names and
shapes, MTP heads included), with what the quantization config asks of each Linear
module (``preflight_quant``). Here: the layer count, MTP heads, shapes (with the
spec fields behind each dimension), the MLA latent and dtypes; missing, unexpected
and renamed tensors are in ``preflight_names``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from onboard.arch import KimiDeltaAttention
from onboard.checkpoint.preflight_ct import FLOATS, CTConfig
from onboard.checkpoint.preflight_linear import check_linear_attention
from onboard.checkpoint.preflight_names import report_names
from onboard.checkpoint.preflight_quant import (
    QUANTIZABLE_ROLES,
    QuantCheck,
    accept_as_stored,
    kv_scale_names,
    quantization,
)
from onboard.checkpoint.preflight_report import Expect, PreflightRun
from onboard.checkpoint.preflight_spec import (
    abstract,
    by_pattern,
    describe,
    dims,
    fields_in,
    is_field,
    role_index,
    split_name,
)
from onboard.checkpoint.tiny import plan_tensors
from onboard.components.output_gate import OutputGate
from onboard.components.qk_norm import QkNorm
from onboard.spec.layouts import STACKED_EXPERT_ROLES
from onboard.targets.cpu_kernels import CPU_MLA_LATENT, cpu_gdn_problems

# A KV-sharing layer's own tensors that vLLM never runs (docs/generate.md): GQA's
# K/V projections and k-norm, MLA's latent projection and its norm.
SHARING_UNUSED_ROLES = frozenset(
    {"k_proj", "v_proj", "k_norm", "kv_a_proj", "kv_a_norm"}
)


def check_tensors(run: PreflightRun) -> None:
    """Every tensor of the spec's plan against the checkpoint's headers."""
    sharing = run.plan.kv_sources
    roles = role_index(run.plan)
    quant = quantization(run)
    qcheck = QuantCheck(quant) if quant is not None else None
    expected: dict[str, Expect] = {}
    optional: dict[str, Expect] = {}

    for plan in plan_tensors(run.spec):
        module, param = split_name(plan.name)
        role = roles.get(module)
        expect = Expect(plan.shape, None, role, param)
        linear = param == "weight" and len(plan.shape) == 2
        if role in SHARING_UNUSED_ROLES and plan.layer in sharing:
            # The layer reads an earlier layer's KV cache: the generated model
            # drops its own K/V (and k-norm) when stored, so they may be absent.
            optional[plan.name] = expect
            if linear and quant is not None:
                accept_as_stored(
                    run, module, plan.shape, role, "quantized", {}, optional
                )
            continue
        if qcheck is None or not linear or role not in QUANTIZABLE_ROLES:
            expected[plan.name] = expect
            continue
        qcheck.expect_linear(run, module, plan.shape, role, expected, optional)
    if isinstance(quant, CTConfig) and quant.kv_cache:
        for name in kv_scale_names(roles):
            optional[name] = Expect(None, None, None, name.rpartition(".")[2])

    consumed: set[str] = set()  # found tensors already reported
    if qcheck is not None:
        qcheck.report(run, roles)
        consumed = qcheck.consumed
    missing = [
        n for n, e in expected.items() if n not in run.found and n not in run.lost
    ]
    unexpected = [
        n
        for n in run.found
        if n not in expected and n not in optional and n not in consumed
    ]
    _check_present(run, expected, optional)
    missing, unexpected = check_linear_attention(run, missing, unexpected)
    missing = _check_mtp(run, _check_layer_count(run, missing))
    report_names(run, missing, unexpected, quant, expected)
    _note_cpu_mla(run)
    _note_cpu_gdn(run)


def _check_layer_count(run: PreflightRun, missing: list[str]) -> list[str]:
    """One problem when the checkpoint has fewer or more layers than the spec;
    the tensors of the layers it lacks are not listed one pattern at a time."""
    arch = run.plan
    decoder = len(arch.layers)
    prefix = arch.layer_prefix
    layers = {
        int(name[len(prefix) :].split(".", 1)[0])
        for name in run.found
        if name.startswith(prefix) and name[len(prefix) :].split(".", 1)[0].isdigit()
    }
    if not layers:
        return missing
    mtp = arch.mtp.num_heads if arch.mtp else 0
    total, have = arch.checkpoint_layers, max(layers) + 1
    if have == total or (mtp and have == decoder):
        return missing  # equal, or only the MTP heads lack (reported as such)
    run.add(
        "error",
        "layer-count",
        f"{prefix}{{layer}}",
        f"the checkpoint has {have} layers ({prefix}0-{have - 1}); the spec "
        f"has num_hidden_layers {decoder}"
        + (f" + {mtp} MTP head(s) = {total}" if mtp else ""),
        f"set num_hidden_layers in the spec to {have - mtp} (MTP heads are the "
        "last layers)"
        if mtp
        else f"set num_hidden_layers: {have} in the spec",
        spec_fields=["num_hidden_layers", "mtp.num_heads"]
        if mtp
        else ["num_hidden_layers"],
    )
    # Tensors of layers the checkpoint does not have are covered above.
    return [
        n
        for n in missing
        if not n.startswith(prefix)
        or not n[len(prefix) :].split(".", 1)[0].isdigit()
        or int(n[len(prefix) :].split(".", 1)[0]) < have
    ]


def _check_mtp(run: PreflightRun, missing: list[str]) -> list[str]:
    """A checkpoint without any of the spec's MTP heads: one problem."""
    spec, mtp = run.spec, run.plan.mtp
    if mtp is None:
        return missing
    prefix = run.plan.layer_prefix
    heads = [f"{prefix}{mtp.first_layer + i}." for i in range(mtp.num_heads)]
    if any(name.startswith(tuple(heads)) for name in run.found):
        return missing  # present, perhaps in part: missing tensors are listed
    absent = [n for n in missing if n.startswith(tuple(heads))]
    if not absent:
        return missing
    uses_mtp = any(s.method == "mtp" for s in spec.speculators)
    run.add(
        "error" if uses_mtp else "warning",
        "missing-mtp",
        f"{prefix}{mtp.first_layer}+",
        f"the spec has mtp.num_heads: {mtp.num_heads} (stored at "
        f"{heads[0]}*), but the checkpoint has no MTP layer ({len(absent)} "
        "tensors): the main model loads, MTP speculative decoding cannot"
        + (" (the spec's speculators include mtp)" if uses_mtp else ""),
        "use a checkpoint that keeps its MTP heads (transformers' "
        "save_pretrained drops them), or set mtp: null in the spec"
        + (" and remove the mtp speculator" if uses_mtp else ""),
        tensors=absent,
        spec_fields=["mtp"],
    )
    return [n for n in missing if not n.startswith(tuple(heads))]


def _check_present(
    run: PreflightRun, expected: dict[str, Expect], optional: dict[str, Expect]
) -> None:
    shapes: dict[tuple, list[str]] = defaultdict(list)
    dtypes: dict[tuple, list[str]] = defaultdict(list)
    for name, info in run.found.items():
        want = expected.get(name) or optional.get(name)
        if want is None:
            continue
        if want.shape is not None and not _same_shape(want.shape, info.shape):
            key = (abstract(name)[0], want.shape, info.shape, want.role, want.param)
            shapes[key].append(name)
        if want.param == "weight-any":
            continue
        if want.dtypes is not None:
            if info.dtype not in want.dtypes:
                dtypes[("quant", info.dtype, tuple(sorted(want.dtypes)))].append(name)
        elif info.dtype not in FLOATS:
            dtypes[("not-float", info.dtype, ())].append(name)
        elif (
            run.dtype is not None
            and info.dtype != run.dtype
            # FP32 by design: the router's bias correction, the decay's A_log,
            # the indexer's head weights (transformers keeps weights_proj so).
            and want.param not in ("e_score_correction_bias", "A_log")
            and want.role != "indexer_weights_proj"
        ):
            dtypes[("mixed", info.dtype, (run.dtype,))].append(name)
    for (pattern, want, got, role, param), names in shapes.items():
        _shape_problem(run, pattern, want, got, role, param, names, expected)
    for (what, got, want), names in dtypes.items():
        _dtype_problem(run, what, got, want, names)


def _shape_problem(
    run: PreflightRun,
    pattern: str,
    want: tuple[int, ...],
    got: tuple[int, ...],
    role: str | None,
    param: str,
    names: list[str],
    expected: dict[str, Expect],
) -> None:
    where = describe(pattern, names)
    if (
        role == "kv_a_proj"
        and param in ("weight", "weight_packed")
        and (got[:1] != want[:1])
    ):
        _mla_latent(run, where, want, got, names)
        return
    if role in ("q_norm", "k_norm") and _qk_norm_scope(run, role, got, where, names):
        return
    if role == "q_proj" and param == "weight" and _output_gate(run, want, got, where):
        return
    if param == "e_score_correction_bias" and _router_bias_rows(
        run, want, got, where, names
    ):
        return
    exprs = (
        dims(run.plan, role, param)
        if param in ("weight", "bias", "A_log", "dt_bias")
        or role in ("sinks", *STACKED_EXPERT_ROLES)
        else None
    )
    if exprs is None or len(exprs) != len(want) or len(got) != len(want):
        expect = expected[names[0]]
        if expect.weight_shape is not None and param != "weight":
            message = (
                f"shape {list(got)}, but config group {expect.scheme} stores "
                f"{list(want)} for the {param} of a {list(expect.weight_shape)} "
                "weight"
            )
            fix = (
                "make quantization_config describe how the checkpoint was "
                "quantized (group size, block structure), or re-quantize"
            )
        else:
            message = f"shape {list(got)}, expected {list(want)}"
            fix = "re-export the checkpoint, or fix the spec it was made for"
        run.add("error", "shape", where, message, fix, tensors=names)
        return
    parts, fields = [], []
    for i, ((text, value), g) in enumerate(zip(exprs, got, strict=True)):
        if value == g:
            continue
        implied = f" (the checkpoint implies {text}: {g})" if is_field(text) else ""
        parts.append(f"dim {i} is {g}, but {text} = {value}{implied}")
        fields += fields_in(text)
    run.add(
        "error",
        "shape",
        where,
        f"shape {list(got)}, the spec gives {list(want)}: " + "; ".join(parts),
        f"set {', '.join(dict.fromkeys(fields))} in the spec to the checkpoint's "
        "values (or use the checkpoint this spec describes)",
        tensors=names,
        spec_fields=dict.fromkeys(fields),
    )


def _output_gate(
    run: PreflightRun, want: tuple[int, ...], got: tuple[int, ...], where: str
) -> bool:
    """A q_proj of twice (or half) the spec's rows: the output gate it holds."""
    if run.plan.attention.kind != "gqa" or len(got) != 2 or got[1:] != want[1:]:
        return False
    gate = run.plan.attention.part(OutputGate) is not None
    if got[0] * 2 == want[0] and gate:
        said = "q_proj has one row per query channel, no output gate"
    elif got[0] == want[0] * 2 and not gate:
        said = "q_proj has twice the query rows: each head's gate beside its query"
    else:
        return False
    run.add(
        "error",
        "shape",
        where,
        f"shape {list(got)}, the spec gives {list(want)}: {said}",
        f"set attention.output_gate: {str(not gate).lower()} in the spec",
        spec_fields=["attention.output_gate"],
    )
    return True


def _router_bias_rows(
    run: PreflightRun,
    want: tuple[int, ...],
    got: tuple[int, ...],
    where: str,
    names: list[str],
) -> bool:
    """The router's bias stored with (or without) a leading dimension of one,
    where the spec says otherwise: checkpoint.router_bias_2d is wrong."""
    if tuple(d for d in got if d != 1) != tuple(d for d in want if d != 1):
        return False
    two_d = len(got) == 2
    run.add(
        "error",
        "shape",
        where,
        f"shape {list(got)}: the router's bias "
        + ("as one row [1, num_experts]" if two_d else "as [num_experts]")
        + ", where the spec's checkpoint.router_bias_2d is "
        + ("false" if two_d else "true"),
        f"set checkpoint.router_bias_2d: {str(two_d).lower()} in the spec",
        tensors=names,
        spec_fields=["checkpoint.router_bias_2d"],
    )
    return True


def _qk_norm_scope(
    run: PreflightRun, role: str, got: tuple[int, ...], where: str, names: list[str]
) -> bool:
    """A q/k norm the shape of the other scope's (per head, or over all heads):
    the spec's qk_norm_scope is wrong, not its head sizes."""
    norm = run.plan.attention.part(QkNorm)
    if norm is None:
        return False
    which = 0 if role == "q_norm" else 1
    scopes = {
        "head": "per head",
        "projection": "over all heads of the projection",
        "head_weights": "with a weight per head",
    }
    other = next(
        (s for s in scopes if replace(norm, scope=s).shapes()[which] == got),
        norm.scope,
    )
    if other == norm.scope:
        return False
    run.add(
        "error",
        "shape",
        where,
        f"shape {list(got)}: a {role} {scopes[other]}"
        + f", where the spec's attention.qk_norm_scope is {norm.scope}",
        f"set attention.qk_norm_scope: {other} in the spec",
        tensors=names,
        spec_fields=["attention.qk_norm_scope"],
    )
    return True


def _mla_latent(
    run: PreflightRun, where: str, want: tuple, got: tuple, names: list[str]
) -> None:
    mla = run.plan.attention.mla
    assert mla is not None
    rows = got[0]
    layer = abstract(names[0])[1][0]
    norm_name = run.plan.tensors.checkpoint_name("kv_a_norm", layer)
    norm = run.found.get(f"{norm_name}.weight")
    if norm is not None and len(norm.shape) == 1 and norm.shape[0] < rows:
        rank, rope = norm.shape[0], rows - norm.shape[0]
        fix = (
            f"set attention.mla.kv_lora_rank: {rank} and qk_rope_head_dim: "
            f"{rope} in the spec (kv_a_layernorm has {rank} entries)"
        )
    else:
        fix = (
            "set attention.mla.kv_lora_rank and qk_rope_head_dim in the spec so "
            f"that they sum to {rows}"
        )
    run.add(
        "error",
        "mla-latent",
        where,
        f"MLA latent size mismatch: kv_a_proj_with_mqa has {rows} rows, but "
        f"kv_lora_rank + qk_rope_head_dim = {mla.kv_lora_rank} + "
        f"{mla.qk_rope_head_dim} = {want[0]} (shape {list(got)}, expected "
        f"{list(want)})",
        fix,
        tensors=names,
        spec_fields=[
            "attention.mla.kv_lora_rank",
            "attention.mla.qk_rope_head_dim",
        ],
    )


def _note_cpu_mla(run: PreflightRun) -> None:
    spec, att = run.spec, run.plan.attention
    if att.kind != "mla":
        return
    assert att.mla is not None
    latent = att.mla.latent
    kv_a = run.plan.tensors.checkpoint_name("kv_a_proj", 0) + ".weight"
    info = run.found.get(kv_a) or run.found.get(kv_a + "_packed")
    if info is not None and info.shape:
        latent = info.shape[0]
    if latent == CPU_MLA_LATENT:
        return
    run.add(
        "warning" if "cpu" in spec.targets else "note",
        "cpu-mla",
        "attention.mla",
        f"the MLA latent is {latent}; vLLM's CPU MLA decode kernel accepts only "
        f"{CPU_MLA_LATENT} (kv_lora_rank 512 + qk_rope_head_dim 64) and fails "
        "deep inside with misleading errors ('Unsupported block size: 16')",
        "validate on a GPU target, or keep kv_lora_rank 512 and qk_rope_head_dim "
        "64 for CPU runs",
        spec_fields=[
            "attention.mla.kv_lora_rank",
            "attention.mla.qk_rope_head_dim",
        ],
    )


def _note_cpu_gdn(run: PreflightRun) -> None:
    lin = run.plan.linear
    if lin is None:
        return
    if isinstance(lin, KimiDeltaAttention):
        run.add(
            "note",
            "cpu-kda",
            "linear_attention",
            "vLLM's KDA kernels are Triton-only: on the CPU engine the generated "
            "layer runs the Kimi delta rule in plain torch, token by token, with "
            "no speculative decoding (the CPU checks cover its math and state "
            "handling, not vLLM's kernels)",
            "validate on a GPU target to check vLLM's KDA kernels and speculation",
            spec_fields=["linear_attention.type"],
        )
        return
    problems = cpu_gdn_problems(
        lin.key_head_dim, lin.value_head_dim, lin.conv_kernel_size
    )
    if not problems:
        return
    run.add(
        "warning" if "cpu" in run.spec.targets else "note",
        "cpu-gdn",
        "linear_attention",
        "vLLM's CPU Gated DeltaNet kernels cannot run this: " + "; ".join(problems),
        "validate on a GPU target, or keep equal key and value head dims of 64 or "
        "128 and conv_kernel_size 4 for CPU runs",
        spec_fields=[
            "linear_attention.key_head_dim",
            "linear_attention.value_head_dim",
            "linear_attention.conv_kernel_size",
        ],
    )


def _dtype_problem(
    run: PreflightRun, what: str, got: str, want: tuple[str, ...], names: list[str]
) -> None:
    groups = by_pattern(names)
    where = "; ".join(describe(p, n) for p, n in list(groups.items())[:3])
    if len(groups) > 3:
        where += f"; and {len(groups) - 3} more pattern(s)"
    if what == "quant":
        run.add(
            "error",
            "dtype",
            where,
            f"stored as {got}; the quantization scheme stores {' or '.join(want)}",
            "re-quantize with compressed-tensors (`onboard quantize`)",
            tensors=names,
        )
    elif what == "not-float":
        quant = (run.config or {}).get("quantization_config")
        run.add(
            "error",
            "dtype",
            where,
            f"stored as {got}, but "
            + (
                "config.json has no quantization_config"
                if quant is None
                else "the quantization config keeps it unquantized"
            )
            + ": vLLM would read the raw values as weights",
            "add the quantization_config the quantizer wrote"
            if quant is None
            else "store it in 16 bits",
            tensors=names,
        )
    else:
        run.add(
            "warning",
            "dtype",
            where,
            f"stored as {got} while config.json says {want[0]}: vLLM casts on "
            "load, but a mixed-dtype export is often a mistake",
            f"re-export in {want[0]}, or set dtype in config.json to the "
            "weights' dtype",
            tensors=names,
        )


def _same_shape(want: tuple[int, ...], got: tuple[int, ...]) -> bool:
    # A per-tensor scale is (1,) in compressed-tensors, () in some exports.
    return want == got or (want == (1,) and got == ())
