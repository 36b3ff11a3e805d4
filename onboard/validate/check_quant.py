"""The ``quant:<scheme>`` check: a quantized checkpoint against the unquantized one.

The quantized checkpoint is ``ctx.quantized[scheme]`` (the pipeline's quantize
stage, or ``onboard validate --quantized SCHEME=DIR``), else ``ctx.model_dir``
quantized now into the run's work directory. Both sides are compared position by
position over the prompt set (teacher-forced: every prompt position predicts the
next prompt token, so both models see the same contexts):

- **unquantized** (P): the run's main engine (float32, the 16-bit checkpoint
  through the generated plugin), asked for its prompt logprobs. vLLM returns at
  most ``max_logprobs`` (default 20) per position, so P is known exactly on its
  top-20 tokens (plus the prompt token) only.
- **quantized** (Q): a second engine on the quantized checkpoint, through the same
  plugin, asked for the logprobs of the whole vocabulary (``max_logprobs=-1``). Where
  vLLM's CPU build refuses the scheme, the engine's own error is recorded and Q
  comes from the reference model (transformers, float32) run on the checkpoint's
  weights dequantized by compressed-tensors instead; and the weights probe
  (onboard.runtime.weights_probe) builds the model vLLM would serve with the
  checkpoint's quantization config and checks that it consumes every tensor into
  a parameter of the stored shape and dtype (``weights_load``; a failure fails
  the check).

Metrics (names in docs/architecture.md): ``kl_divergence`` (mean over positions of
KL(P||Q), nats), ``kl_divergence_max``, ``top1_agreement`` (share of positions
where both sides' most likely token is the same). The KL is computed exactly over
the tokens P was returned for, with all other tokens merged into one outcome (P's
and Q's remaining mass): the KL of the two distributions coarsened that way. That
is a lower bound of the full KL (log-sum inequality) and equals it when P's
returned tokens hold all of its mass; ``p_top_k_mass`` says how much they held.
Where the reference ran, ``kl_divergence_vs_reference`` is the full-vocabulary KL
with the float32 transformers reference as P (no truncation). Where the reference
also ran Q (the dequantized path), P is that reference (``judged_against:
reference``): both sides are then the same code at the same precision, and the
metrics measure the quantization alone, not the engine's distance from the
reference (which the accuracy check judges; a bfloat16 engine, as fp8-block's
on CPU, adds its rounding); the engine-side figures stay under
``vs_unquantized_engine``.

The check also asserts that embeddings, the output head, every norm, the MoE
routers (weights and bias) and the attention sinks are byte-for-byte the 16-bit
checkpoint's.

Pass: ``kl_divergence <= THRESHOLDS[scheme].kl_divergence`` and ``top1_agreement >=
THRESHOLDS[scheme].top1_agreement`` and nothing that must stay 16-bit changed.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onboard import components
from onboard.errors import InputError
from onboard.runtime.cpu_draft import cpu_features, lacking_note
from onboard.runtime.engine import EngineLoadError
from onboard.runtime.reference import ReferenceUnavailable
from onboard.targets.cpu_kernels import amx_int8_gemm, missing_cpu_kernel
from onboard.validate.results import Check


@dataclass(frozen=True)
class Threshold:
    kl_divergence: float  # mean KL(P||Q) over positions, nats (at most)
    top1_agreement: float  # share of positions with the same top token (at least)


# THE per-scheme thresholds (documented in docs/quantize.md and docs/validation.md).
# Set from measurements on the bundled tiny random checkpoints, whose output head is
# scaled 8x for decisive logits (docs/vllm-cpu-notes.md): that amplifies every weight
# error into
# the logits, so these are far looser than a real model needs (llm-compressor's
# FP8 checkpoints of real models are at KL ~0.001-0.01). Measured full-vocabulary
# KL / top-1 of the dequantized weights (dense-gqa, deepseek-v3-style): fp8-dynamic
# 0.049 / 0.92, 0.062 / 0.90; fp8-block 0.078 / 0.89, 0.070 / 0.88; nvfp4a16
# 0.66 / 0.71, 0.78 / 0.66; mxfp4 1.18 / 0.59, 1.15 / 0.67. On the CPU engine
# (dense-gqa, 5 December 2026): w4a16 1.02 / 0.58 and w4a16-asym 0.99 / 0.60
# (bfloat16; INT4 in groups of 128 errs as much as MXFP4 on these weights:
# 11% and 10% relative weight error, MXFP4 11%), w8a8-int8 0.010 / 0.96
# (float32). A broken checkpoint (wrong scales, nibble order, transposed
# weights) is at several nats. The NVFP4 weights of qwen3-next-style's tiny
# checkpoint (Gated DeltaNet; experts 128 wide) are at 1.57 / 0.60; there its
# expert scales' rows reversed give 2.41 / 0.50, a doubled global scale
# 11.5 / 0.09, swapped nibbles 24.8 / 0.005 (tests/test_quant_check_acceptance.py).
THRESHOLDS: dict[str, Threshold] = {
    "fp8-dynamic": Threshold(kl_divergence=0.2, top1_agreement=0.8),
    "fp8-block": Threshold(kl_divergence=0.2, top1_agreement=0.8),
    "nvfp4": Threshold(kl_divergence=2.0, top1_agreement=0.55),
    "nvfp4a16": Threshold(kl_divergence=2.0, top1_agreement=0.55),
    "mxfp4": Threshold(kl_divergence=1.8, top1_agreement=0.5),
    "w4a16": Threshold(kl_divergence=1.6, top1_agreement=0.5),
    "w4a16-asym": Threshold(kl_divergence=1.6, top1_agreement=0.5),
    "w8a8-int8": Threshold(kl_divergence=0.2, top1_agreement=0.8),
}

# What the main engine returns per prompt position (vLLM's default max_logprobs).
P_TOP_K = 20
# The quantized engine runs in the main engine's dtype (float32), so that the
# comparison measures the quantization alone, except where vLLM's CPU kernel
# takes 16-bit activations only: fp8-block's fp8_scaled_mm_cpu ("expect A to be
# bfloat16 or half", measured) and INT4's cpu_gemm_wna16 ('"cpu_gemm_wna16" not
# implemented for 'Float'', measured: CPUWNA16LinearKernel,
# vllm/model_executor/kernels/linear/mixed_precision/cpu.py); there it runs in
# bfloat16, and the KL includes bf16 rounding.
ENGINE_DTYPE = {"fp8-block": "bfloat16", "w4a16": "bfloat16", "w4a16-asym": "bfloat16"}


def engine_dtype(scheme: str, default: str) -> str:
    """The dtype the engine runs ``scheme``'s checkpoint in on this CPU: the
    main engine's (``default``), but where vLLM's CPU kernel takes 16-bit
    activations only (:data:`ENGINE_DTYPE`; w8a8-int8 on a CPU with AMX tiles,
    whose INT8 kernel vLLM then picks: cpu_kernels.amx_int8_gemm)."""
    if scheme == "w8a8-int8" and amx_int8_gemm():
        return "bfloat16"
    return ENGINE_DTYPE.get(scheme, default)


# Roles that must stay byte-identical, by the reason onboard.quantize keeps them.
GUARDED = {
    "embeddings": ("role embed",),
    "lm_head": ("role lm_head",),
    "norms": ("role final_norm", "role input_norm", "role post_attention_norm",
              "role attention_output_norm", "role mlp_input_norm",
              "role mlp_output_norm",
              "role q_a_norm", "role kv_a_norm"),
    "routers": ("role router", "role router_bias", "role shared_expert_gate"),
    # checkpoint.fused: experts (onboard.quantize.selection.STACKED_EXPERTS_KEPT)
    "stacked experts": ("stacked experts (3-D), kept in 16 bits",),
}  # fmt: skip
# The components' roles kept in 16 bits (onboard.components.Role.guard: linear
# attention's convolutions, A_log / dt_bias, rates and gates, and norms).
for _role, _r in components.roles().items():
    if _r.guard:
        GUARDED[_r.guard] = (*GUARDED.get(_r.guard, ()), f"role {_role}")


def run(ctx, name: str) -> Check:
    scheme = name.split(":", 1)[1]
    threshold = THRESHOLDS[scheme]
    quantized = _already_quantized(Path(ctx.model_dir))
    if quantized:
        return Check.not_run(
            name,
            f"{quantized}: this check quantizes the 16-bit checkpoint and compares "
            "the two; validate the 16-bit checkpoint for it",
        )
    if ctx.engine is None:
        return Check.not_run(
            name,
            "no unquantized baseline: the main engine did not load the 16-bit "
            "checkpoint (see the accuracy check)",
        )
    t0 = time.perf_counter()
    try:
        qdir = _quantized_dir(ctx, scheme)
    except InputError as exc:
        return Check(name, "failed", {"error": str(exc)}, f"could not quantize: {exc}")
    metrics: dict[str, Any] = {"checkpoint": str(qdir), "scheme": scheme}
    # What `onboard publish` matches against the checkpoint it is asked to publish.
    metrics["shards_sha256"] = _shard_checksums(qdir)
    problems: list[str] = []
    untouched, bad = untouched_tensors(ctx.spec, ctx.model_dir, qdir, scheme)
    metrics["untouched_tensors"] = untouched
    problems += bad

    base = _baseline_rows(ctx)
    rows, side = _quantized_rows(ctx, scheme, qdir)
    metrics.update(side)
    stats = compare(base, rows)
    if ctx.reference_outputs:
        ref = [lp for lp, _ in ctx.reference_outputs]
        metrics["kl_divergence_vs_reference"] = full_kl(ref, rows)
    if side["path"] == "dequantized-reference" and ctx.reference_outputs:
        # The reference ran Q, so P is the reference too: the same code at the
        # same precision on both sides measures the quantization alone, not the
        # engine's own distance from the reference (the accuracy check's). The
        # engine-side figures stay beside it.
        metrics["judged_against"] = "reference"
        metrics["vs_unquantized_engine"] = stats
        vs = metrics["kl_divergence_vs_reference"]
        stats = {
            **stats,
            "kl_divergence": vs["mean"],
            "kl_divergence_max": vs["max"],
            "top1_agreement": vs["top1_agreement"],
        }
    else:
        metrics["judged_against"] = "engine"
    metrics.update(stats)
    metrics["thresholds"] = {
        "kl_divergence": threshold.kl_divergence,
        "top1_agreement": threshold.top1_agreement,
    }
    metrics["kl_estimator"] = (
        "exact over the whole vocabulary"
        if metrics["judged_against"] == "reference"
        else f"exact over the unquantized engine's top-{P_TOP_K} tokens (and the "
        "prompt token) per position, the rest merged into one outcome: a lower "
        "bound of the full KL"
    )
    metrics["time_s"] = round(time.perf_counter() - t0, 2)
    load = metrics.get("weights_load")
    if load is not None and not load["passed"]:
        problems.append(f"the model vLLM builds does not load it: {load['summary']}")
    if stats["kl_divergence"] > threshold.kl_divergence:
        problems.append(
            f"KL divergence {stats['kl_divergence']:.4g} nats is above the "
            f"{scheme} threshold {threshold.kl_divergence}"
        )
    if stats["top1_agreement"] < threshold.top1_agreement:
        problems.append(
            f"top-1 agreement {stats['top1_agreement']:.3f} is below the {scheme} "
            f"threshold {threshold.top1_agreement}"
        )
    unquantized = (
        "the 16-bit reference"
        if metrics["judged_against"] == "reference"
        else "the unquantized engine"
    )
    lines = [
        f"{scheme} checkpoint {qdir}, run by {_path_text(metrics)}",
        f"KL({unquantized} || quantized): mean {stats['kl_divergence']:.4g} nats "
        f"(threshold {threshold.kl_divergence}), max "
        f"{stats['kl_divergence_max']:.4g}; top-1 agreement "
        f"{stats['top1_agreement']:.3f} (threshold {threshold.top1_agreement}) over "
        f"{stats['positions']} prompt positions",
        "16-bit tensors byte-identical: "
        + ", ".join(f"{k} {v}" for k, v in untouched.items()),
        *([f"weights load on CPU: {load['summary']}"] if load is not None else []),
        *problems,
    ]
    return Check(name, "failed" if problems else "passed", metrics, "\n".join(lines))


def _already_quantized(model_dir: Path) -> str | None:
    """Why ``model_dir`` is already quantized (a published FP8, NVFP4 or MXFP4
    checkpoint: the spec's checkpoint.source_quantization); None if it is not."""
    from onboard.config_json import read_config_json
    from onboard.quantize.selection import quantized_reason

    config_path = model_dir / "config.json"
    if not config_path.is_file():
        return None
    return quantized_reason(model_dir, read_config_json(config_path))


def _path_text(metrics: dict[str, Any]) -> str:
    if metrics["path"] == "engine":
        cls, dtype = metrics["vllm_model_class"], metrics["engine_dtype"]
        return f"vLLM's CPU engine ({cls}, {dtype})"
    lacks = f" ({metrics['cpu_lacks']})" if metrics.get("cpu_lacks") else ""
    return (
        "the reference on compressed-tensors-dequantized weights, because vLLM's "
        f"CPU engine refused it{lacks}: {metrics['engine_error']}"
    )


# ---- the two sides -------------------------------------------------------------


def _quantized_dir(ctx, scheme: str) -> Path:
    given = ctx.quantized.get(scheme)
    if given is not None:
        return Path(given)
    from onboard.quantize import quantize_checkpoint

    out = ctx.work_dir / f"quantized-{scheme}"
    if not out.is_dir():
        quantize_checkpoint(ctx.model_dir, scheme, out, spec=ctx.spec)
    ctx.quantized[scheme] = out
    return out


def _shard_checksums(qdir: Path) -> dict[str, str]:
    from onboard.quantize.st_io import file_sha256

    return {p.name: file_sha256(p) for p in sorted(qdir.glob("*.safetensors"))}


def _baseline_rows(ctx) -> list[list[dict[int, float]]]:
    """Per prompt, per position 1..n-1: the main engine's top logprobs."""
    reply = ctx.engine.generate(
        ctx.prompts, temperature=0.0, max_tokens=1, prompt_logprobs=P_TOP_K
    )
    return [o["prompt_logprobs"][1:] for o in reply["outputs"]]


def _quantized_rows(ctx, scheme: str, qdir: Path) -> tuple[list[np.ndarray], dict]:
    """Per prompt, [positions, vocab] logprobs of the quantized model, and how."""
    # The main engine's dtype, unless the scheme's CPU kernel needs another.
    dtype = engine_dtype(scheme, ctx.options.dtype)
    options = ctx.engine_options(
        model_dir=qdir,
        extra={**ctx.options.extra, "dtype": dtype, "max_logprobs": -1},
    )
    missing = missing_cpu_kernel(scheme)
    if missing is not None:
        # The engine would load, then die in its first forward pass.
        return _dequantized_side(ctx, scheme, qdir, missing)
    try:
        with ctx.extra_engine(f"quant-{scheme}", options) as engine:
            model_class = engine.info["model_class"]
            reply = engine.generate(
                ctx.prompts, temperature=0.0, max_tokens=1, prompt_logprobs=-1
            )
    except EngineLoadError as exc:
        error = exc.failure.get("error") or str(exc)
        return _dequantized_side(ctx, scheme, qdir, error)
    vocab = ctx.spec.vocab_size
    rows = [_dense(o["prompt_logprobs"][1:], vocab) for o in reply["outputs"]]
    side = {"path": "engine", "vllm_model_class": model_class}
    side["engine_dtype"] = dtype
    if ctx.plugin is not None and not model_class.startswith(ctx.plugin.package + "."):
        raise RuntimeError(
            f"vLLM instantiated {model_class} for the {scheme} checkpoint, not the "
            f"generated class from {ctx.plugin.package}"
        )
    return rows, side


def _weights_load(ctx, scheme: str, qdir: Path) -> dict[str, Any]:
    """Where the engine cannot run the scheme: does the model vLLM builds (the
    generated one) consume every tensor of the checkpoint into a parameter of the
    stored shape and dtype? (onboard.runtime.weights_probe)"""
    from onboard.runtime.weights_probe import probe_weights

    (result,) = probe_weights(
        [qdir],
        ctx.work_dir / f"weights-{scheme}",
        ctx.engine_options(model_dir=qdir),
        ctx.spec,
    )
    return result.to_dict() | {"summary": result.summary()}


def _dense(steps: list[dict[int, float]], vocab: int) -> np.ndarray:
    out = np.full((len(steps), vocab), -np.inf, dtype=np.float64)
    for i, step in enumerate(steps):
        ids = np.fromiter(step.keys(), dtype=np.int64, count=len(step))
        out[i, ids] = np.fromiter(step.values(), dtype=np.float64, count=len(step))
    return out


def _dequantized_side(
    ctx, scheme: str, qdir: Path, error: str
) -> tuple[list[np.ndarray], dict]:
    """The quantized side scored on the reference with the checkpoint's
    dequantized weights, where vLLM's CPU engine cannot run ``scheme``
    (``error`` says why)."""
    try:
        rows, reference = dequantized_reference_rows(ctx, scheme, qdir)
    except ReferenceUnavailable as ref_exc:
        raise RuntimeError(
            f"vLLM's CPU engine refused the {scheme} checkpoint ({error}) and "
            f"the reference could not run it dequantized either: {ref_exc}"
        ) from None
    side = {
        "path": "dequantized-reference",
        "engine_error": error,
        "reference": reference,
        "cpu_features": cpu_features(),
    }
    side["cpu_lacks"] = lacking_note(error, side["cpu_features"])
    side["weights_load"] = _weights_load(ctx, scheme, qdir)
    return rows, side


def dequantized_reference_rows(ctx, scheme: str, qdir: Path):
    """The reference model on the checkpoint's dequantized weights."""
    import torch

    from onboard.runtime.reference import load_reference

    work = ctx.work_dir / f"quant-{scheme}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    float_dir = dequantize_checkpoint(qdir, scheme, work / "dequantized")
    reference = load_reference(float_dir, ctx.spec, ctx.hf_dir, work)
    rows = []
    with torch.inference_mode():
        for ids in ctx.prompts:
            logits = reference.model(input_ids=torch.tensor([ids])).logits[0]
            rows.append(torch.log_softmax(logits.double(), -1)[:-1].numpy())
    description = reference.description
    reference.model = None
    shutil.rmtree(float_dir, ignore_errors=True)
    return rows, description


def dequantize_checkpoint(qdir: Path, scheme: str, out: Path) -> Path:
    """A float32 copy of a compressed-tensors checkpoint: every quantized module's
    weight decompressed by compressed-tensors, its bias and everything else
    unchanged, config.json without ``quantization_config``."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from onboard.quantize.kernels import dequantize
    from onboard.quantize.schemes import get_scheme

    sch = get_scheme(scheme)
    out.mkdir(parents=True)
    weight_map = {}
    for shard in sorted(qdir.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        modules = {k.rsplit(".", 1)[0] for k in tensors if k.endswith(".weight_scale")}
        result = {}
        for key, value in tensors.items():
            module, _, local = key.rpartition(".")
            if module not in modules or local == "bias":
                # (a quantized projection keeps its bias: gpt-oss's q/k/v/o)
                result[key] = value
            elif local in ("weight", "weight_packed"):
                result[f"{module}.weight"] = (
                    dequantize(tensors, sch, module).to(torch.float32).contiguous()
                )
        save_file(result, out / shard.name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(result, shard.name))
    config = json.loads((qdir / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for extra in qdir.iterdir():
        if extra.name.startswith("tokenizer") or extra.name == "spec.yaml":
            shutil.copyfile(extra, out / extra.name)
    return out


# ---- the comparison ---------------------------------------------------------------


def kl_top_k(p_top: dict[int, float], q_row: np.ndarray) -> float:
    """KL(P||Q) over P's returned tokens plus one outcome for all the others."""
    ids = np.fromiter(p_top.keys(), dtype=np.int64, count=len(p_top))
    lp = np.fromiter(p_top.values(), dtype=np.float64, count=len(p_top))
    lq = q_row[ids]
    p, q = np.exp(lp), np.exp(lq)
    kl = float(np.sum(p * (lp - lq)))
    p_rest = 1.0 - float(p.sum())
    q_rest = max(1.0 - float(q.sum()), 1e-300)
    if p_rest > 1e-9:  # below: float32 rounding of a distribution held in full
        kl += p_rest * (math.log(p_rest) - math.log(q_rest))
    return max(kl, 0.0)


def compare(
    base: list[list[dict[int, float]]], rows: list[np.ndarray]
) -> dict[str, Any]:
    kls, agree, mass = [], [], []
    for steps, q in zip(base, rows, strict=True):
        if len(steps) != len(q):
            raise RuntimeError(
                f"the two sides scored {len(steps)} and {len(q)} prompt positions"
            )
        for step, q_row in zip(steps, q, strict=True):
            kls.append(kl_top_k(step, q_row))
            agree.append(max(step, key=step.get) == int(np.argmax(q_row)))
            mass.append(float(np.exp(np.fromiter(step.values(), np.float64)).sum()))
    return {
        "kl_divergence": float(np.mean(kls)),
        "kl_divergence_max": float(np.max(kls)),
        "top1_agreement": float(np.mean(agree)),
        "positions": len(kls),
        "p_top_k_mass": {"mean": float(np.mean(mass)), "min": float(np.min(mass))},
    }


def full_kl(reference_rows: list[np.ndarray], rows: list[np.ndarray]) -> dict:
    """Full-vocabulary KL(R||Q), R the float32 reference's prompt log-softmax rows,
    and top-1 agreement of the two."""
    kls, agree = [], []
    for r, q in zip(reference_rows, rows, strict=True):
        r = np.asarray(r, dtype=np.float64)[: len(q)]
        kls.extend(np.sum(np.exp(r) * (r - q[: len(r)]), axis=-1).tolist())
        agree.extend((r.argmax(-1) == q[: len(r)].argmax(-1)).tolist())
    return {
        "mean": float(np.mean(kls)),
        "max": float(np.max(kls)),
        "top1_agreement": float(np.mean(agree)),
    }


# ---- what must stay 16-bit ------------------------------------------------------


def untouched_tensors(
    spec, base_dir: Path, qdir: Path, scheme: str
) -> tuple[dict[str, int], list[str]]:
    """Byte-compare every tensor the spec keeps in 16 bits with the base checkpoint;
    count embeddings, output head, norms and routers among them."""
    from safetensors import safe_open

    from onboard.quantize.schemes import get_scheme
    from onboard.quantize.selection import make_selection

    manifest = qdir / "onboard-quantize.json"
    include_mtp = False
    if manifest.is_file():
        options = json.loads(manifest.read_text()).get("options", {})
        include_mtp = bool(options.get("include_mtp"))
    selection = make_selection(
        base_dir, spec, get_scheme(scheme), include_mtp=include_mtp
    )
    located = {}
    for shard in sorted(qdir.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            located.update(dict.fromkeys(f.keys(), shard))  # noqa: SIM118
    problems: list[str] = []
    counts = dict.fromkeys(GUARDED, 0)
    counts["other"] = 0
    for name, why in sorted(selection.kept.items()):
        if name not in located:
            problems.append(f"{name} ({why}) is missing from the quantized checkpoint")
            continue
        same = _read(selection.model_dir / selection.tensor_shard[name], name) == _read(
            located[name], name
        )
        if not same:
            problems.append(f"{name} ({why}) differs from the 16-bit checkpoint")
            continue
        group = next((g for g, reasons in GUARDED.items() if why in reasons), "other")
        counts[group] += 1
    must = ["embeddings", "norms"] + (["routers"] if spec.mlp.moe else [])
    # The components' guarded roles (onboard.components.Role.guard).
    must += [
        guard
        for c in components.present(spec)
        for role in c.checkpoint_roles(spec)
        if (guard := c.roles[role].guard) and guard not in must
    ]
    if spec.mlp.moe is not None and "experts" in spec.checkpoint.fused:
        must.append("stacked experts")
    problems += [
        f"no {g} found among the unchanged tensors" for g in must if not counts[g]
    ]
    # Modules whose weight is kept (a quantized projection keeps its bias).
    modules = {n.rsplit(".", 1)[0] for n in selection.kept if n.endswith(".weight")}
    leaked = [
        n for n in located if n.rsplit(".", 1)[0] in modules and n.endswith("_scale")
    ]
    problems += [
        f"{n}: a quantization scale on a module kept in 16 bits" for n in leaked
    ]
    return counts, problems


def _read(path: Path, name: str) -> tuple[str, tuple, bytes]:
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        t = f.get_tensor(name)
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return str(t.dtype), tuple(t.shape), raw
