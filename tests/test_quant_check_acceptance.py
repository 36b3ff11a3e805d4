"""Acceptance: every scheme on the bundled DeepSeek-V3-style tiny checkpoint
(MLA + MoE + MTP) loads in vLLM's CPU engine or, where that build has no path for
it, is dequantized into the reference, and passes its threshold, with routers,
norms and embeddings untouched. One validate run: the 16-bit engine plus one
engine per scheme (`make test-all`; numbers in docs/quantize.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.quantize import quantize_checkpoint
from onboard.spec import load_spec
from onboard.validate import validate

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "model_specs" / "deepseek-v3-style.yaml"
SCHEMES = ("fp8-dynamic", "fp8-block", "nvfp4", "nvfp4a16", "mxfp4")
# vLLM 0.32's CPU build on this checkpoint (docs/quantize.md): every scheme is
# refused, for these reasons, so each is dequantized into the reference.
REFUSALS = {
    "fp8-dynamic": "Unsupported FP8 MoE backend: NONE",
    "fp8-block": "is not divisible by weight quantization block_n = 128",
    "nvfp4": "Failed to find a kernel that can implement the NVFP4 linear layer",
    "nvfp4a16": "Marlin FP4 not available",
    "mxfp4": "Failed to find a kernel that can implement the MXFP4 linear layer",
}


@pytest.mark.acceptance
@pytest.mark.engine
def test_every_scheme_on_the_deepseek_v3_style_checkpoint(tmp_path):
    bf16 = write_tiny_checkpoint(load_spec(SPEC), tmp_path / "bf16", seed=0)
    quantized = {s: quantize_checkpoint(bf16, s, tmp_path / s) for s in SCHEMES}
    result = validate(
        bf16,
        bf16 / "spec.yaml",
        "cpu",
        tmp_path / "validation",
        checks=",".join(f"quant:{s}" for s in SCHEMES),
        quantized=quantized,
    )
    checks = {c.name: c for c in result.checks}
    summary = {
        s: {
            k: checks[f"quant:{s}"].metrics.get(k)
            for k in ("path", "kl_divergence", "kl_divergence_max", "top1_agreement",
                      "kl_divergence_vs_reference", "untouched_tensors", "engine_error")
        }
        for s in SCHEMES
    }  # fmt: skip
    print("\n" + json.dumps(summary, indent=1))
    assert checks["accuracy"].passed, checks["accuracy"].details
    for scheme in SCHEMES:
        check = checks[f"quant:{scheme}"]
        assert check.passed, check.details
        m = check.metrics
        if m["path"] == "engine":
            assert m["vllm_model_class"].startswith("onboard_plugin_")
        else:
            assert m["path"] == "dequantized-reference"
            assert REFUSALS[scheme] in m["engine_error"]
        untouched = m["untouched_tensors"]
        assert untouched["embeddings"] and untouched["norms"] and untouched["routers"]
        assert untouched["lm_head"] == 1
    assert result.passed
