"""`onboard validate BF16_DIR --quantized SCHEME=DIR`: the quant:<scheme> check on
the real vLLM CPU engine, through the generated plugin.

One run (five engines: the 16-bit model, then one per quantized checkpoint) on
the bundled dense-gqa spec's tiny checkpoint: fp8-dynamic, w4a16 and w8a8-int8,
which vLLM's CPU build runs (the engine path: its CPU FP8, INT4 and INT8
kernels), and nvfp4a16, which it refuses (its error is recorded and the
checkpoint is dequantized into the reference instead). The full per-scheme
sweep on the DeepSeek-V3-style checkpoint is tests/test_quant_check_acceptance.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.quantize import quantize_checkpoint
from onboard.spec import load_spec
from onboard.targets.cpu_kernels import missing_cpu_kernel
from onboard.validate.check_quant import THRESHOLDS

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "model_specs" / "dense-gqa.yaml"
ONBOARD = str(Path(sys.executable).with_name("onboard"))
SCHEMES = ("fp8-dynamic", "nvfp4a16", "w4a16", "w8a8-int8")


def _validate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [ONBOARD, "validate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("quant-check-engine")
    bf16 = write_tiny_checkpoint(load_spec(SPEC), root / "bf16", seed=0)
    quantized = {s: quantize_checkpoint(bf16, s, root / s) for s in SCHEMES}
    t0 = time.perf_counter()
    proc = _validate(
        bf16,
        "--spec", bf16 / "spec.yaml",  # the tiny checkpoint's sizes
        "--out", root / "validation",
        *[a for s, d in quantized.items() for a in ("--quantized", f"{s}={d}")],
    )  # fmt: skip
    print(f"\nvalidate with four quant checks: {time.perf_counter() - t0:.0f} s")
    print(f"validation.json: {root / 'validation' / 'validation.json'}")
    path = root / "validation" / "validation.json"
    assert path.is_file(), proc.stdout + proc.stderr
    result = json.loads(path.read_text())
    checks = {c["name"]: c for c in result["checks"]}
    for name in (f"quant:{s}" for s in SCHEMES):
        m = checks[name]["metrics"]
        print(name, m.get("path"), m.get("kl_divergence"), m.get("top1_agreement"))
    return {"proc": proc, "result": result, "checks": checks, "quantized": quantized}


@pytest.mark.engine
def test_run_passes_with_every_quant_check(run):
    assert run["proc"].returncode == 0, run["proc"].stdout + run["proc"].stderr
    assert run["result"]["passed"] is True
    assert [c["name"] for c in run["result"]["checks"]] == [
        "accuracy",
        *(f"quant:{s}" for s in SCHEMES),
    ]


@pytest.mark.engine
def test_fp8_dynamic_runs_in_the_engine_through_the_plugin(run):
    check = run["checks"]["quant:fp8-dynamic"]
    m = check["metrics"]
    assert check["status"] == "passed", check["details"]
    assert m["path"] == "engine" and m["engine_dtype"] == "float32"
    assert m["judged_against"] == "engine" and "vs_unquantized_engine" not in m
    assert m["vllm_model_class"].startswith("onboard_plugin_")
    limit = THRESHOLDS["fp8-dynamic"]
    assert 0 < m["kl_divergence"] <= limit.kl_divergence
    assert m["kl_divergence_max"] >= m["kl_divergence"]
    assert limit.top1_agreement <= m["top1_agreement"] <= 1
    assert m["positions"] >= 100
    # The float32 transformers reference gives the full-vocabulary KL: the top-k
    # estimate is a lower bound of a KL of the same size.
    assert m["kl_divergence_vs_reference"]["mean"] >= 0
    assert m["untouched_tensors"]["embeddings"] >= 1
    assert m["untouched_tensors"]["norms"] >= 1
    assert m["shards_sha256"] == {
        name: v["sha256"]
        for name, v in json.loads(
            (run["quantized"]["fp8-dynamic"] / "onboard-quantize.json").read_text()
        )["shards"].items()
    }


@pytest.mark.engine
@pytest.mark.parametrize("scheme", ["w4a16", "w8a8-int8"])
def test_int_schemes_run_in_the_engine_through_the_plugin(run, scheme):
    # vLLM's CPU kernels: CPUWNA16LinearKernel (INT4 weights, 16-bit activations;
    # bfloat16 only, so the KL includes bf16 rounding) and
    # CPUInt8ScaledMMLinearKernel (INT8 weights, dynamic per-token INT8
    # activations; float32 like the 16-bit side, but bfloat16 where the CPU has
    # AMX tiles: vLLM then takes its AMX kernel, which fails in float32 with
    # "int8_scaled_mm_with_quant: expect A to be bfloat16 or half").
    check = run["checks"][f"quant:{scheme}"]
    m = check["metrics"]
    assert check["status"] == "passed", check["details"]
    missing = missing_cpu_kernel(scheme)
    if missing is not None:
        # This CPU's vLLM kernel build lacks the scheme's op (AVX2: no
        # cpu_gemm_wna16): scored on the dequantized reference, saying why,
        # without starting an engine that would die in its first forward pass.
        assert m["path"] == "dequantized-reference"
        assert m["engine_error"] == missing and missing in check["details"]
        assert 0 < m["kl_divergence"] <= THRESHOLDS[scheme].kl_divergence
        return
    amx = torch.cpu._is_amx_tile_supported()
    dtype = "bfloat16" if scheme == "w4a16" or amx else "float32"
    assert m["path"] == "engine" and m["engine_dtype"] == dtype
    assert "engine_error" not in m
    assert m["vllm_model_class"].startswith("onboard_plugin_")
    limit = THRESHOLDS[scheme]
    assert 0 < m["kl_divergence"] <= limit.kl_divergence
    assert limit.top1_agreement <= m["top1_agreement"] < 1
    assert m["positions"] >= 100
    assert m["untouched_tensors"]["embeddings"] >= 1
    assert m["untouched_tensors"]["lm_head"] >= 1


@pytest.mark.engine
def test_nvfp4a16_is_dequantized_where_the_engine_refuses(run):
    check = run["checks"]["quant:nvfp4a16"]
    m = check["metrics"]
    assert check["status"] == "passed", check["details"]
    assert m["path"] == "dequantized-reference"
    assert "Marlin FP4 not available" in m["engine_error"]
    assert "Marlin FP4 not available" in check["details"]
    assert 0 < m["kl_divergence"] <= THRESHOLDS["nvfp4a16"].kl_divergence
    assert m["top1_agreement"] >= THRESHOLDS["nvfp4a16"].top1_agreement
    # Both sides are the reference (same code, same precision): the verdict's
    # figures are the full-vocabulary ones, the engine's stay beside them.
    assert m["judged_against"] == "reference"
    assert m["kl_divergence"] == m["kl_divergence_vs_reference"]["mean"]
    assert m["top1_agreement"] == m["kl_divergence_vs_reference"]["top1_agreement"]
    assert m["vs_unquantized_engine"]["positions"] == m["positions"]
    assert "KL(the 16-bit reference || quantized)" in check["details"]
    # The weights probe: the generated model consumes every tensor of it.
    load = m["weights_load"]
    assert load["passed"], load["summary"]
    assert load["model_class"].startswith("onboard_plugin_")
    assert load["consumed"] == load["tensors"] > 0
    assert "weights load on CPU:" in check["details"]


def test_bad_quantized_option_is_bad_input(tmp_path):
    proc = _validate(tmp_path, "--spec", SPEC, "--out", tmp_path / "v",
                     "--quantized", "fp8-dynamic")  # fmt: skip
    assert proc.returncode == 2
    assert "--quantized: expected SCHEME=DIR, got 'fp8-dynamic'" in proc.stderr
    proc = _validate(tmp_path, "--spec", SPEC, "--out", tmp_path / "v",
                     "--quantized", f"fp8-dynamic={tmp_path / 'none'}")  # fmt: skip
    assert proc.returncode == 2 and "no such directory" in proc.stderr
