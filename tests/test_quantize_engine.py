"""Quantized checkpoints in vLLM 0.32's CPU engine (the in-tree model classes).

`onboard validate` checks accuracy through the generated plugin; these tests pin
down what the CPU engine itself does with each scheme's files: load and generate,
or refuse with a known error (recorded in docs/quantize.md). A refusal that
changes (a vLLM upgrade adding a CPU path, or a new error) fails here first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from onboard.quantize import quantize_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from quantize_helpers import (  # noqa: E402
    write_bundled_dsv3_checkpoint,
    write_dsv3_checkpoint,
    write_llama_checkpoint,
)

LOADER = Path(__file__).parent / "quantize_engine_load.py"

# What vLLM 0.32's CPU build does with each scheme (None: loads and generates).
NO_NVFP4 = "Failed to find a kernel that can implement the NVFP4 linear layer"
NO_MXFP4 = "Failed to find a kernel that can implement the MXFP4 linear layer"
NO_MARLIN = "MarlinNvFp4LinearKernel is not supported: Marlin FP4 not available"
DENSE = {
    "fp8-dynamic": None,
    "fp8-block": None,
    "nvfp4": NO_NVFP4,
    "nvfp4a16": NO_MARLIN,
    "mxfp4": NO_MXFP4,
}
DEEPSEEK = {
    "fp8-dynamic": "Unsupported FP8 MoE backend: NONE",
    # the tiny checkpoint's 64-wide experts (see the 128-wide test below)
    "fp8-block": "is not divisible by weight quantization block_n = 128",
    "nvfp4": NO_NVFP4,
    "nvfp4a16": NO_MARLIN,
    "mxfp4": NO_MXFP4,
}


def load(model: Path) -> tuple[dict, str]:
    r = subprocess.run(
        [sys.executable, LOADER, model], capture_output=True, text=True, timeout=900
    )
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    # vLLM logs to stdout and stderr: keep both for the root cause and kernels.
    return json.loads(line[len("RESULT ") :]), r.stdout + r.stderr


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return write_llama_checkpoint(
        tmp_path_factory.mktemp("engine") / "bf16",
        hidden=512, intermediate=1536, layers=2, vocab=1024, heads=4, kv=2,
    )  # fmt: skip


@pytest.mark.engine
@pytest.mark.acceptance
def test_fp8_dynamic_dense_loads_and_generates(llama, tmp_path):
    # In `make test-all` with the sweep below: `make test` runs an fp8-dynamic
    # checkpoint in the engine through the plugin (tests/test_quant_check_engine.py).
    out = quantize_checkpoint(llama, "fp8-dynamic", tmp_path / "fp8")
    res, log = load(out)
    assert res["ok"], (res.get("error"), log[-3000:])
    assert len(res["tokens"]) == 8
    assert (
        "Selected ChannelWiseTorchFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8"
        in log
    )


def check(res: dict, log: str, expected: str | None) -> None:
    if expected is None:
        assert res["ok"], (res.get("error"), log[-3000:])
        assert len(res["tokens"]) == 8
    else:
        assert not res["ok"]
        assert expected in log, log[-3000:]


@pytest.mark.acceptance
@pytest.mark.parametrize("scheme", list(DENSE))
def test_dense_scheme_in_cpu_engine(llama, tmp_path, scheme):
    check(*load(quantize_checkpoint(llama, scheme, tmp_path / scheme)), DENSE[scheme])


@pytest.mark.acceptance
@pytest.mark.parametrize("scheme", list(DEEPSEEK))
def test_deepseek_v3_style_scheme_in_cpu_engine(tmp_path_factory, tmp_path, scheme):
    ckpt = tmp_path_factory.getbasetemp() / "engine-dsv3"
    if not ckpt.exists():
        write_bundled_dsv3_checkpoint(ckpt)
    out = quantize_checkpoint(ckpt, scheme, tmp_path / scheme)
    check(*load(out), DEEPSEEK[scheme])


@pytest.mark.acceptance
def test_fp8_block_deepseek_v3_with_128_wide_experts_loads(tmp_path):
    """MLA's 576-row kv_a_proj_with_mqa (5-row scale grid) and the CPU FP8 block
    MoE: loads once every fused partition is whole blocks."""
    ckpt = write_dsv3_checkpoint(tmp_path / "bf16", expert_width=128)
    out = quantize_checkpoint(ckpt, "fp8-block", tmp_path / "fp8-block")
    check(*load(out), None)
