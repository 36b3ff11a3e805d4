"""Acceptance: every scheme on the bundled DeepSeek-V3-style tiny checkpoint
(MLA + MoE + MTP) loads in vLLM's CPU engine or, where that build has no path for
it, is dequantized into the reference, and passes its threshold, with routers,
norms and embeddings untouched. One validate run: the 16-bit engine plus one
engine per scheme (`make test-all`; numbers in docs/quantize.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.generate import write_model_code
from onboard.quantize import quantize_checkpoint
from onboard.runtime.prompts import PROMPTS
from onboard.runtime.reference import load_reference, tokenize_prompts
from onboard.spec import load_spec
from onboard.validate import validate
from onboard.validate.check_quant import THRESHOLDS, dequantize_checkpoint, full_kl

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "model_specs" / "deepseek-v3-style.yaml"
SCHEMES = ("fp8-dynamic", "fp8-block", "nvfp4", "nvfp4a16", "mxfp4", "w4a16",
           "w4a16-asym", "w8a8-int8")  # fmt: skip
# vLLM 0.32's CPU build on this checkpoint (docs/quantize.md): every scheme is
# refused, for these reasons, so each is dequantized into the reference. The
# INT4 and INT8 experts need AMX (fused_moe/experts/cpu_moe.py,
# CPUExpertsInt4/Int8._supports_current_device); on a CPU with AMX they run in the
# engine.
REFUSALS = {
    "fp8-dynamic": "Unsupported FP8 MoE backend: NONE",
    # (CPUs with AMX run it in the engine)
    "fp8-block": "requires AMX tile support",
    "nvfp4": "Failed to find a kernel that can implement the NVFP4 linear layer",
    "nvfp4a16": "Marlin FP4 not available",
    "mxfp4": "Failed to find a kernel that can implement the MXFP4 linear layer",
    "w4a16": "No WNA16 MoE backend supports the deployment configuration",
    "w4a16-asym": "No WNA16 MoE backend supports the deployment configuration",
    "w8a8-int8": "No Int8 MoE backend supports the deployment configuration",
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


def _faulty(src: Path, out: Path, edit) -> Path:
    shutil.copytree(src, out)
    for path in out.glob("*.safetensors"):
        tensors = load_file(path)
        for name in list(tensors):
            tensors[name] = edit(name, tensors[name])
        save_file(tensors, str(path), metadata={"format": "pt"})
    return out


@pytest.mark.acceptance
def test_the_nvfp4_threshold_fails_subtle_faults_on_the_most_sensitive_tiny_model(
    tmp_path,
):
    """The quant check's dequantized path, on qwen3-next-style's tiny checkpoint
    (the bundled model whose NVFP4 error is largest): the correct checkpoint is
    within the nvfp4 threshold, and each fault, down to the expert scales' rows
    reversed, is outside it (KL or top-1)."""
    spec = load_spec(ROOT / "model_specs" / "qwen3-next-style.yaml")
    bf16 = write_tiny_checkpoint(spec, tmp_path / "bf16", seed=0)
    spec = load_spec(bf16 / "spec.yaml")
    write_model_code(spec, tmp_path / "gen")
    nvfp4 = quantize_checkpoint(bf16, "nvfp4", tmp_path / "nvfp4", spec=spec)
    prompts, _ = tokenize_prompts(bf16, PROMPTS, spec.vocab_size)

    def rows(model_dir: Path) -> list:
        ref = load_reference(model_dir, spec, tmp_path / "gen" / "hf", tmp_path / "w")
        with torch.inference_mode():
            return [
                torch.log_softmax(
                    ref.model(input_ids=torch.tensor([ids])).logits[0].double(), -1
                )[:-1].numpy()
                for ids in prompts
            ]

    base = rows(bf16)
    faults = {
        "correct": lambda name, t: t,
        "expert scales' rows reversed": lambda name, t: (
            torch.flip(t, [0])
            if name.endswith(".weight_scale") and ".mlp.experts." in name
            else t
        ),
        "global scale doubled": lambda name, t: (
            t * 2 if name.endswith("weight_global_scale") else t
        ),
        "nibbles swapped": lambda name, t: (
            ((t & 0x0F) << 4) | ((t >> 4) & 0x0F)
            if name.endswith("weight_packed")
            else t
        ),
    }
    limit = THRESHOLDS["nvfp4"]
    measured = {}
    for i, (fault, edit) in enumerate(faults.items()):
        checkpoint = _faulty(nvfp4, tmp_path / f"f{i}", edit)
        floats = dequantize_checkpoint(checkpoint, "nvfp4", tmp_path / f"d{i}")
        measured[fault] = full_kl(base, rows(floats))
    print(json.dumps(measured, indent=1))

    def within(m: dict) -> bool:
        return (
            m["mean"] <= limit.kl_divergence
            and m["top1_agreement"] >= limit.top1_agreement
        )

    assert within(measured.pop("correct"))
    for fault, m in measured.items():
        assert not within(m), (fault, m)
