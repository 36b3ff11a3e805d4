"""Preflight of quantized checkpoints: the quantization config and its tensors.

For compressed-tensors, each Linear module of the spec is resolved as vLLM
resolves it (``ignore`` first, then the first config group whose targets match)
and must hold exactly what compressed-tensors writes for that group
(:func:`onboard.checkpoint.preflight_ct.ct_tensors`); modules the config ignores
stay unquantized; fused partners agree. Other quant methods and unknown storage
formats are accepted as stored, with a warning.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from onboard.checkpoint.preflight_ct import FLOATS, CTConfig, ct_tensors
from onboard.checkpoint.preflight_report import Expect, PreflightRun, examples
from onboard.checkpoint.preflight_spec import abstract, describe
from onboard.spec.layouts import COMPONENT_KEPT
from onboard.spec.layouts import LINEAR_ROLES as DECODER_LINEAR_ROLES

# Roles vLLM builds as Linear layers (LinearBase): what a compressed-tensors
# "Linear" target quantizes: the decoder's Linear roles plus the Linear layers the
# quantizer keeps in 16 bits (without lm_head, which vLLM builds as ParallelLMHead).
LINEAR_ROLES = frozenset(
    DECODER_LINEAR_ROLES + ("router", "shared_expert_gate") + COMPONENT_KEPT
)
# Vocabulary-sized layers vLLM builds unquantized whatever the config says.
HEAD_ROLES = frozenset({"embed", "lm_head", "mtp_head"})
QUANTIZABLE_ROLES = LINEAR_ROLES | HEAD_ROLES  # checked against the quant config
EXPERT_ROLES = ("expert_gate_proj", "expert_up_proj", "expert_down_proj")
# Projections vLLM loads as one fused layer: one quantization scheme for all.
FUSED_SETS = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("shared_gate_proj", "shared_up_proj"),
    ("q_a_proj", "kv_a_proj"),
    ("linear_in_proj_qkv", "linear_in_proj_z"),  # vLLM's one in_proj_qkvz
    ("linear_in_proj_b", "linear_in_proj_a"),  # vLLM's one in_proj_ba
    EXPERT_ROLES,  # one FusedMoE layer per decoder layer
)
# Parameters quantizers add next to (or instead of) a Linear module's weight.
QUANT_PARAMS = frozenset(
    {
        "weight_packed",
        "weight_scale",
        "weight_global_scale",
        "weight_zero_point",
        "weight_g_idx",
        "weight_shape",
        "weight_scale_inv",
        "input_scale",
        "input_global_scale",
        "input_zero_point",
        "output_scale",
        "output_zero_point",
        "qweight",
        "qzeros",
        "scales",
        "g_idx",
    }
)


@dataclass
class QuantCheck:
    """What the quantization config expects of each Linear module of the spec,
    collected while the spec's tensors are planned and reported afterwards."""

    quant: CTConfig | str
    quantized: dict[str, bool] = field(default_factory=dict)  # module -> per config
    mismatched: dict[tuple, list[str]] = field(
        default_factory=lambda: defaultdict(list)
    )
    consumed: set[str] = field(default_factory=set)  # found tensors already reported
    unknown_formats: set[str] = field(default_factory=set)

    def expect_linear(
        self,
        run: PreflightRun,
        module: str,
        shape: tuple[int, ...],
        role: str | None,
        expected: dict[str, Expect],
        optional: dict[str, Expect],
    ) -> None:
        """Adds what a quantizable Linear module must hold to ``expected``."""
        quant = self.quant
        stored_as = stored(run, module)
        if isinstance(quant, str):  # a method this check does not model
            accept_as_stored(run, module, shape, role, stored_as, expected, optional)
            return
        group, why = (
            (None, "vLLM builds it unquantized")
            if role in HEAD_ROLES
            else quant.scheme_for(module)
        )
        self.quantized[module] = group is not None
        if stored_as != "absent" and (stored_as == "quantized") != (group is not None):
            self.consumed.update(module_tensors(run, module))
            self.mismatched[(abstract(module)[0], stored_as, why)].append(module)
            return
        wants = (
            {"weight": (shape, None)} if group is None else ct_tensors(group, *shape)
        )
        if wants is None:  # a storage format this check does not model
            if group.name not in self.unknown_formats:
                self.unknown_formats.add(group.name)
                run.add(
                    "warning",
                    "quant-config",
                    f"config group {group.name}",
                    f"storage format {group.format!r} is not checked: its "
                    "tensors are accepted as stored",
                    "check them by hand",
                )
            accept_as_stored(run, module, shape, role, stored_as, expected, optional)
            return
        summary = group.summary if group else ""
        for p, (want, dtypes) in wants.items():
            expected[f"{module}.{p}"] = Expect(want, dtypes, role, p, shape, summary)

    def report(self, run: PreflightRun, roles: dict[str, str]) -> None:
        report_quant_mismatch(run, self.mismatched)
        report_fused(run, self.quantized, roles)


def quantization(run: PreflightRun) -> CTConfig | str | None:
    qc = (run.config or {}).get("quantization_config")
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method == "compressed-tensors":
        try:
            parsed = CTConfig.parse(qc)
        except (AttributeError, TypeError, ValueError) as exc:
            run.add(
                "error",
                "quant-config",
                "quantization_config",
                f"cannot read the compressed-tensors config: {exc}",
                "write it with compressed-tensors / llm-compressor",
            )
            return str(method)
        if not parsed.groups:
            run.add(
                "error",
                "quant-config",
                "quantization_config",
                "no config_groups: nothing says how weights are stored",
                "write it with compressed-tensors / llm-compressor",
            )
        return parsed
    run.add(
        "warning",
        "quant-config",
        "quantization_config",
        f"quant_method {method!r}: onboard checks the names and shapes of its "
        "unquantized tensors; Linear weights and their scale tensors are "
        "accepted as stored",
        "prefer compressed-tensors (`onboard quantize`), which is checked fully",
    )
    return str(method)


def stored(run: PreflightRun, module: str) -> str:
    """How the checkpoint stores a Linear module: quantized, plain or absent."""
    if run.with_qparams is None:  # once: modules with quantization tensors
        run.with_qparams = {
            module
            for module, _, param in (n.rpartition(".") for n in run.found)
            if param in QUANT_PARAMS
        }
    weight = run.found.get(f"{module}.weight")
    if module in run.with_qparams or (
        weight is not None and weight.dtype not in FLOATS
    ):
        return "quantized"
    return "plain" if weight is not None else "absent"


def module_tensors(run: PreflightRun, module: str) -> list[str]:
    return [
        f"{module}.{p}"
        for p in ("weight", "bias", *sorted(QUANT_PARAMS))
        if f"{module}.{p}" in run.found
    ]


def kv_scale_names(roles: dict[str, str]) -> list[str]:
    """The KV-cache scales a `kv_cache_scheme` may add to each attention layer."""
    attn = {m.rpartition(".")[0] for m, r in roles.items() if r == "o_proj"}
    kv = [m for m, r in roles.items() if r in ("k_proj", "v_proj", "kv_b_proj")]
    names = [f"{a}.{p}" for a in attn for p in ("k_scale", "v_scale", "q_scale")]
    names += [f"{m}.output_scale" for m in kv]
    return names


def accept_as_stored(
    run: PreflightRun,
    module: str,
    shape: tuple[int, ...],
    role: str | None,
    stored: str,
    expected: dict[str, Expect],
    optional: dict[str, Expect],
) -> None:
    """A Linear module whose quantized form this check does not model: its
    quantization tensors are accepted, the weight is required only unquantized
    (GPTQ-style formats replace it with qweight)."""
    weight = Expect(shape, None, role, "weight-any")
    if stored == "quantized":
        optional[f"{module}.weight"] = weight
    else:
        expected[f"{module}.weight"] = weight
    for p in QUANT_PARAMS:
        optional[f"{module}.{p}"] = Expect(None, None, role, p)


def report_quant_mismatch(
    run: PreflightRun, mismatched: dict[tuple, list[str]]
) -> None:
    for (pattern, stored, why), modules in mismatched.items():
        names = [t for m in modules for t in module_tensors(run, m)]
        where = describe(pattern, modules)
        if stored == "plain":
            dtype = run.found[f"{modules[0]}.weight"].dtype
            run.add(
                "error",
                "quant-mismatch",
                where,
                f"the checkpoint stores it unquantized ({dtype}), but {why}: "
                "vLLM would build a quantized layer and find no scales",
                f"add {pattern.replace('{layer}', '*').replace('{expert}', '*')!r}"
                " (exact names, or a `re:` pattern) to quantization_config.ignore",
                tensors=names,
                config_keys=["quantization_config.ignore"],
            )
        else:
            run.add(
                "error",
                "quant-mismatch",
                where,
                f"the checkpoint stores it quantized, but {why}: vLLM builds it "
                "unquantized and cannot load the quantized tensors",
                "keep it in 16 bits in the checkpoint"
                + (
                    ", or remove it from quantization_config.ignore"
                    if "ignore" in why
                    else ""
                ),
                tensors=names,
                config_keys=["quantization_config.ignore"],
            )


def report_fused(
    run: PreflightRun, quantized: dict[str, bool], roles: dict[str, str]
) -> None:
    sets: dict[tuple, dict[str, bool]] = defaultdict(dict)
    for module, q in quantized.items():
        role = roles.get(module)
        for i, members in enumerate(FUSED_SETS):
            if role in members:
                pattern, idx = abstract(module)
                sets[(i, idx[:1])][module] = q
    for (_, layer), modules in sorted(sets.items()):
        if len(set(modules.values())) > 1:
            quant = sorted(m for m, q in modules.items() if q)
            plain = sorted(m for m, q in modules.items() if not q)
            run.add(
                "error",
                "quant-fused",
                f"layer {layer[0]}" if layer else "model",
                f"vLLM loads {examples(quant + plain)} as one fused layer, but "
                f"the quantization config quantizes {examples(quant)} and not "
                f"{examples(plain)} (vLLM: 'Found different quantization "
                "schemes')",
                "quantize all of them or list all of them in "
                "quantization_config.ignore",
                tensors=quant + plain,
                config_keys=["quantization_config.ignore"],
            )
