"""`onboard validate MODEL --spec SPEC --target T --emit DIR`: what to run on a GPU
target, and the thresholds its results must meet.

DIR gets a self-contained run (see docs/validation.md, "GPU targets"):

- ``run.sh`` — install the target's vLLM package (targets/profiles.yaml), lm-eval
  and the generated plugin; `vllm serve` with the serving plan's flags and the
  target's environment; the accuracy requests (``accuracy_client.py``); lm-eval
  GSM8K against the server; `vllm bench serve --save-result` over a concurrency
  sweep per variant (baseline, then one per speculative method); the server's
  /metrics after each; the Hugging Face reference (``reference_logprobs.py``) once
  the server has freed the devices. Results go to ``DIR/results/``.
- ``manifest.env`` (read by run.sh) and ``manifest.json`` (read by the Python
  scripts and by ``onboard validate --ingest``);
- ``thresholds.json`` — what ``--ingest`` judges the results against;
- ``plugin/`` (the generated vLLM plugin), ``hf/`` (the generated Hugging Face
  reference, where there is one), ``spec.yaml``.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

from onboard.errors import InputError
from onboard.fsutil import atomic_directory
from onboard.runtime.compare import TOP_K

FILES = Path(__file__).with_name("emit_files")
GPU_CONCURRENCY = (1, 4, 16, 64)
GPU_INPUT_LEN = 1024
GPU_OUTPUT_LEN = 256
PROMPTS_PER_SLOT = 5
MIN_PROMPTS = 10
# Enough for GSM8K's 8-shot prompts plus the answer.
MAX_CONTEXT = 8192
LM_EVAL_PACKAGE = "lm_eval[api]==0.4.13"
LM_EVAL_TASK = "gsm8k"
LM_EVAL_FEWSHOT = 5
MAX_NEW_TOKENS = 32
# run.sh serves with this worker extension and VLLM_SERVER_DEV_MODE=1, then asks
# each worker for the class it built (/collective_rpc; emit_files/onboard_probe.py).
PROBE_EXTENSION = "onboard_probe.ModelClassProbe"
PROBE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
MAX_PROMPT_TOKENS = 64

# Default thresholds. bf16 on both sides (vLLM's kernels and transformers' differ
# in summation order and in where they round to bf16): a logprob carries ~2^-8
# relative error, so the float32 bound of the cpu target (1e-2 nats) would fail
# correct models; greedy tokens are judged by vLLM's own rule (top-k) as on cpu.
ACCURACY_THRESHOLDS = {
    "prompt_logprob_max_abs_diff": 0.5,
    "prompt_logprob_mean_abs_diff": 0.05,
    "greedy_failed_sequences": 0,
    "top_k": TOP_K,
}
# Mean acceptance length a speculative method must reach (1.0 = nothing accepted).
SPEC_MIN_ACCEPTANCE = {"ngram": 1.0, "suffix": 1.0}
SPEC_MIN_ACCEPTANCE_DEFAULT = 1.5


# Sparse MLA: the accuracy prompts outgrow the indexer's top-k by this many tokens,
# so that every query past it attends to a chosen subset.
SPARSE_PROMPT_MARGIN = 64
SPARSE_LONG_PROMPTS = 4


def _sparse_mla(spec) -> dict[str, Any] | None:
    """The accuracy thresholds' sparse-MLA entry: prompts must be longer than the
    indexer's top-k (else the GPU run never leaves the dense-equivalent regime
    the CPU engine already covers)."""
    idx = spec.attention.indexer
    if idx is None:
        return None
    return {"index_topk": idx.topk, "min_prompt_tokens": idx.topk + 1}


def sparse_prompts(prompts: tuple[str, ...], min_tokens: int) -> list[str]:
    """SPARSE_LONG_PROMPTS long prompts (the bundled ones joined, each starting
    at another one, repeated to about 8 characters per wanted token) before the
    bundled ones."""
    out = []
    for start in range(SPARSE_LONG_PROMPTS):
        text = " ".join(prompts[start:] + prompts[:start])
        repeats = -(-8 * min_tokens // len(text))
        out.append(" ".join([text] * repeats))
    return out + list(prompts)


def variant_name(method: str) -> str:
    return f"spec-{method}"


def _speculative_variants(spec, notes: list[str]) -> dict[str, dict[str, Any]]:
    """One served variant per speculative method whose config is complete (a
    trained head or draft named in the spec, or none needed)."""
    from onboard.speculators.methods import DRAFT_METHODS, speculative_config
    from onboard.targets.cpu_kernels import cpu_method_limit

    out: dict[str, dict[str, Any]] = {}
    for entry in spec.speculators:
        limit = cpu_method_limit(entry.method)
        if limit is not None:
            notes.append(
                f"spec-decode:{entry.method}: measured only by this script (the "
                f"cpu target reports it not-run: {limit})"
            )
        if entry.method in DRAFT_METHODS and not entry.model:
            notes.append(
                f"spec-decode:{entry.method}: no draft checkpoint in the spec "
                "(speculators[].model); train the head (onboard speculators) and "
                "emit again"
            )
            continue
        out[variant_name(entry.method)] = speculative_config(entry, entry.model)
    return out


def _serve_flags(
    spec, profile, model: str, concurrency: int, dtype: str, disaggregate=None
) -> tuple[list[str], dict[str, Any] | None]:
    """The serving plan's `vllm serve` flags (layout, limits) for the target, and
    with ``disaggregate`` ("P:D") the prefill/decode layout: each side's flags
    (its --port left to run.sh) and the plan's P/D record."""
    from onboard.serving import make_deployment

    context = min(spec.max_position_embeddings, MAX_CONTEXT)
    plan = make_deployment(
        spec,
        profile,
        "bf16",
        context=context,
        concurrency=concurrency,
        dtype=dtype,
        model=model,
        disaggregate=disaggregate,
    )
    if plan.layout is None:
        raise InputError(
            f"--emit: no layout of up to 64 {profile.name} devices holds {spec.name} "
            f"at context {context} (see `onboard plan SPEC --target {profile.name}`)"
        )
    argv = list(plan.argv)
    assert argv[:3] == ["vllm", "serve", model]
    if plan.pd_layout is None:
        return argv[3:], None
    pd = plan.pd_layout
    sides = {}
    for role in (pd.prefill, pd.decode):
        flags = list(role.deployment.argv[3:])
        i = flags.index("--port")
        sides[role.role] = {"flags": flags[:i] + flags[i + 2 :], "port": role.port}
    return argv[3:], {"split": disaggregate, "sides": sides, "plan": pd.to_dict()}


def _pd_env(pd: dict[str, Any] | None) -> dict[str, Any]:
    """manifest.env's P/D entries: PD_SPLIT empty for a single deployment."""
    if pd is None:
        return {"PD_SPLIT": ""}
    from onboard.serving.disagg import PROXY_URL

    out: dict[str, Any] = {"PD_SPLIT": pd["split"], "PD_PROXY_URL": PROXY_URL}
    for role, side in pd["sides"].items():
        out[f"PD_{role.upper()}_FLAGS"] = side["flags"]
        out[f"PD_{role.upper()}_PORT"] = side["port"]
    return out


def _manifest_env(values: dict[str, Any]) -> str:
    lines = ["# Written by onboard validate --emit; read by run.sh."]
    for key, value in values.items():
        if isinstance(value, list | tuple):
            words = " ".join(shlex.quote(str(v)) for v in value)
            lines.append(f"{key}=({words})")
        else:
            lines.append(f"{key}={shlex.quote(str(value))}")
    return "\n".join(lines) + "\n"


def _check_dirs(out_dir: Path, generated: Path | None) -> None:
    if (out_dir / "results").is_dir() and any((out_dir / "results").iterdir()):
        raise InputError(
            f"--emit: {out_dir} already holds results; emit into a new directory"
        )
    if generated is not None and not (Path(generated) / "plugin").is_dir():
        raise InputError(f"{generated}: no plugin/ directory (run `onboard generate`)")


def _thresholds(
    target: str, variants: dict[str, Any], sparse: dict[str, Any] | None
) -> dict[str, Any]:
    """thresholds.json: what --ingest judges the run's results against."""
    return {
        "target": target,
        "accuracy": {**ACCURACY_THRESHOLDS, **(sparse or {})},
        "lm_eval": {
            "task": LM_EVAL_TASK,
            "metric": "exact_match,flexible-extract",
            "min": None,
            "note": "set min (e.g. the model card's GSM8K score minus 2 points) "
            "before ingest; with null the check is not judged (not-run)",
        },
        "speed": {
            "all_requests_complete": True,
            "min_output_tokens_per_s": None,
            "max_ttft_ms": None,
            "max_tpot_ms": None,
        },
        "spec_decode": {
            name.removeprefix("spec-"): {
                "min_mean_acceptance_length": SPEC_MIN_ACCEPTANCE.get(
                    name.removeprefix("spec-"), SPEC_MIN_ACCEPTANCE_DEFAULT
                )
            }
            for name in variants
            if name != "baseline"
        },
    }


def emit(
    model: str,
    spec_path: Path,
    target: str,
    out_dir: Path,
    *,
    generated: Path | None = None,
    disaggregate: str | None = None,
) -> dict[str, Any]:
    """Write the run for ``target`` into ``out_dir``; return the manifest.
    ``disaggregate`` "P:D": serve `onboard plan --disaggregate P:D`'s layout."""
    from onboard.generate import write_model_code
    from onboard.reference import auto_map
    from onboard.runtime.prompts import PROMPTS
    from onboard.spec import load_spec
    from onboard.targets import get_target

    spec = load_spec(spec_path)
    profile = get_target(target)
    out_dir = Path(out_dir)
    _check_dirs(out_dir, generated)
    notes: list[str] = []
    variants = {"baseline": None, **_speculative_variants(spec, notes)}
    # The cpu target runs float32 (as validate does); GPUs serve bf16.
    ref_dtype = "float32" if target == "cpu" else "bfloat16"
    flags, pd = _serve_flags(
        spec, profile, model, max(GPU_CONCURRENCY), ref_dtype, disaggregate
    )
    # Benchmark lengths that fit the served context (tiny specs have short ones).
    context = min(spec.max_position_embeddings, MAX_CONTEXT)
    output_len = min(GPU_OUTPUT_LEN, context // 4)
    input_len = min(GPU_INPUT_LEN, context - output_len - 16)

    prompts, max_prompt_tokens = list(PROMPTS), MAX_PROMPT_TOKENS
    sparse = _sparse_mla(spec)
    if sparse is not None:
        prompts = sparse_prompts(PROMPTS, sparse["min_prompt_tokens"])
        max_prompt_tokens = sparse["min_prompt_tokens"] + SPARSE_PROMPT_MARGIN

    with tempfile.TemporaryDirectory(prefix="onboard-emit-") as tmp:
        gen = Path(generated) if generated else Path(tmp) / "generated"
        if generated is None:
            write_model_code(spec, gen)
        from onboard.runtime.engine import read_plugin

        plugin = read_plugin(gen / "plugin")
        has_hf = (gen / "hf").is_dir() and any((gen / "hf").glob("*.py"))
        manifest: dict[str, Any] = {
            "onboard_emit": 1,
            "target": target,
            "model": model,
            "spec": spec.name,
            "architecture": spec.architecture,
            "vocab_size": spec.vocab_size,
            "vllm_package": profile.vllm.package,
            "install": profile.vllm.install,
            "env": {k: v for k, v in profile.env.items() if not v.startswith("<")},
            "serve_flags": flags,
            "plugin": {"package": plugin.package, "entry_point": plugin.entry_point},
            "model_class_probe": {
                "worker_extension_cls": PROBE_EXTENSION,
                "env": dict(PROBE_ENV),
            },
            "variants": variants,
            "concurrency": list(GPU_CONCURRENCY),
            "input_len": input_len,
            "output_len": output_len,
            "prompts_per_slot": PROMPTS_PER_SLOT,
            "min_prompts": MIN_PROMPTS,
            "lm_eval": {
                "package": LM_EVAL_PACKAGE,
                "tasks": LM_EVAL_TASK,
                "num_fewshot": LM_EVAL_FEWSHOT,
            },
            "prompts": prompts,
            "max_prompt_tokens": max_prompt_tokens,
            "max_new_tokens": MAX_NEW_TOKENS,
            "top_k": TOP_K,
            "reference_dtype": ref_dtype,
            "hf_auto_map": auto_map(spec) if has_hf else None,
            "notes": notes,
            "pd_layout": None if pd is None else pd["plan"],
        }
        thresholds = _thresholds(target, variants, sparse)
        env_values = {
            "TARGET": target,
            "MODEL": model,
            "INSTALL_CMD": profile.vllm.install,
            "LM_EVAL_PACKAGE": LM_EVAL_PACKAGE,
            "TARGET_ENV": [f"{k}={v}" for k, v in manifest["env"].items()],
            "SERVE_FLAGS": flags,
            "VARIANTS": list(variants),
            **{
                f"SPEC_CONFIG_{name.replace('-', '_')}": json.dumps(
                    cfg, separators=(",", ":")
                )
                for name, cfg in variants.items()
                if cfg is not None
            },
            "PLUGIN_ENTRY_POINT": plugin.entry_point,
            "CONCURRENCY_DEFAULT": " ".join(map(str, GPU_CONCURRENCY)),
            "INPUT_LEN": input_len,
            "OUTPUT_LEN": output_len,
            "PROMPTS_PER_SLOT": PROMPTS_PER_SLOT,
            "MIN_PROMPTS": MIN_PROMPTS,
            "LM_EVAL_TASKS_DEFAULT": LM_EVAL_TASK,
            "LM_EVAL_FEWSHOT": LM_EVAL_FEWSHOT,
            "REF_DTYPE_DEFAULT": ref_dtype,
            **_pd_env(pd),
        }
        with atomic_directory(out_dir) as dst:
            for name in (
                "run.sh",
                "accuracy_client.py",
                "reference_logprobs.py",
                "onboard_probe.py",
            ):
                shutil.copy(FILES / name, dst / name)
            (dst / "run.sh").chmod(0o755)
            (dst / "manifest.env").write_text(_manifest_env(env_values))
            (dst / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            (dst / "thresholds.json").write_text(
                json.dumps(thresholds, indent=2) + "\n"
            )
            shutil.copytree(gen / "plugin", dst / "plugin")
            if has_hf:
                shutil.copytree(gen / "hf", dst / "hf")
            shutil.copy(spec_path, dst / "spec.yaml")
            (dst / "results").mkdir()
    return manifest
