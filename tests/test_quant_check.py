"""The quant:<scheme> check's parts that need no engine: the KL estimator, the
untouched-tensor assertion and the dequantized copy (real checkpoints written by
`onboard checkpoint tiny` and `onboard quantize`)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.quantize import quantize_checkpoint
from onboard.spec import load_spec
from onboard.validate.check_quant import (
    THRESHOLDS,
    compare,
    dequantize_checkpoint,
    kl_top_k,
    untouched_tensors,
)

ROOT = Path(__file__).resolve().parents[1]
DSV3 = ROOT / "model_specs" / "deepseek-v3-style.yaml"


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max()
    return x - math.log(np.exp(x).sum())


def test_thresholds_cover_every_scheme():
    from onboard.spec.model import QUANT_SCHEMES

    assert set(THRESHOLDS) == set(QUANT_SCHEMES)


def test_kl_estimator_exact_with_the_whole_vocabulary_and_a_lower_bound_below():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = _log_softmax(rng.normal(size=64) * 3)
        q = _log_softmax(np.log(np.exp(p)) + rng.normal(size=64) * 0.3)
        exact = float(np.sum(np.exp(p) * (p - q)))
        full = kl_top_k(dict(enumerate(p.tolist())), q)
        assert full == pytest.approx(exact, rel=1e-9, abs=1e-12)
        top = np.argsort(-p)[:5]
        est = kl_top_k({int(i): float(p[i]) for i in top}, q)
        # The coarsened KL, by hand: the five tokens plus one "rest" outcome.
        rest_p = 1 - np.exp(p[top]).sum()
        rest_q = 1 - np.exp(q[top]).sum()
        by_hand = float(np.sum(np.exp(p[top]) * (p[top] - q[top])))
        by_hand += rest_p * math.log(rest_p / rest_q)
        assert est == pytest.approx(by_hand, rel=1e-9)
        assert 0 <= est <= exact + 1e-12


def test_compare_top1_and_positions():
    q = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]))
    base = [[{0: math.log(0.6), 1: math.log(0.3)}, {0: math.log(0.5), 2: -1.0}]]
    stats = compare(base, [q])
    assert stats["positions"] == 2
    assert stats["top1_agreement"] == 0.5  # position 2: 0 vs 2
    assert stats["kl_divergence_max"] >= stats["kl_divergence"] > 0
    with pytest.raises(RuntimeError, match="prompt positions"):
        compare(base, [q[:1]])


@pytest.fixture(scope="module")
def dsv3(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("quant-check")
    bf16 = write_tiny_checkpoint(load_spec(DSV3), root / "bf16", seed=0)
    return bf16, quantize_checkpoint(bf16, "fp8-dynamic", root / "fp8-dynamic")


def test_routers_norms_embeddings_untouched(dsv3):
    bf16, fp8 = dsv3
    counts, problems = untouched_tensors(load_spec(DSV3), bf16, fp8, "fp8-dynamic")
    assert problems == []
    assert counts["embeddings"] >= 1 and counts["lm_head"] == 1
    assert counts["norms"] >= 6 and counts["routers"] >= 2


def test_a_changed_norm_or_router_is_reported(dsv3, tmp_path):
    bf16, fp8 = dsv3
    bad = tmp_path / "bad"
    shutil.copytree(fp8, bad)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    victims = [
        n
        for n in index["weight_map"]
        if n.endswith("input_layernorm.weight") or n.endswith("e_score_correction_bias")
    ][:2]
    for name in victims:
        shard = bad / index["weight_map"][name]
        tensors = load_file(shard)
        tensors[name] = tensors[name] + 1
        save_file(tensors, shard, metadata={"format": "pt"})
    counts, problems = untouched_tensors(load_spec(DSV3), bf16, bad, "fp8-dynamic")
    assert len(problems) == 2
    assert all("differs from the 16-bit checkpoint" in p for p in problems)


def test_a_router_bias_at_its_own_module_counts_among_the_routers(tmp_path):
    # ERNIE-4.5-MoE style: mlp.moe_statics.e_score_correction_bias, [1, E].
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from generate_variants import variant

    spec = variant("var-bias-2d")
    bf16 = write_tiny_checkpoint(spec, tmp_path / "bf16", seed=0)
    fp8 = quantize_checkpoint(bf16, "fp8-dynamic", tmp_path / "fp8")
    tiny = load_spec(bf16 / "spec.yaml")
    counts, problems = untouched_tensors(tiny, bf16, fp8, "fp8-dynamic")
    assert problems == []
    biases = [
        n
        for n in json.loads((fp8 / "model.safetensors.index.json").read_text())[
            "weight_map"
        ]
        if n.endswith("moe_statics.e_score_correction_bias")
    ]
    # Every MoE layer's gate weight and bias (the MTP head's included).
    assert biases and counts["routers"] == 2 * len(biases)


@pytest.mark.parametrize("scheme", ["fp8-dynamic", "nvfp4a16"])
def test_dequantized_copy_is_within_one_step(dsv3, tmp_path, scheme):
    bf16, fp8 = dsv3
    qdir = (
        fp8
        if scheme == "fp8-dynamic"
        else quantize_checkpoint(bf16, scheme, tmp_path / scheme)
    )
    out = dequantize_checkpoint(qdir, scheme, tmp_path / "float")
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    deq = {}
    for shard in out.glob("*.safetensors"):
        deq.update(load_file(shard))
    orig = {}
    for shard in bf16.glob("*.safetensors"):
        orig.update(load_file(shard))
    assert set(deq) == set(orig)
    name = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    w, d = orig[name].float(), deq[name]
    assert d.dtype == torch.float32
    # Within one quantization step of the row's largest value (FP8: 1/16 of a
    # value at most; FP4: half of the top grid step, 1/6 of a group's max, plus
    # the group scale's FP8 rounding).
    err = (w - d).abs()
    rel = (err.amax(dim=1) / w.abs().amax(dim=1)).max().item()
    assert 0 < rel < (0.07 if scheme == "fp8-dynamic" else 0.26)
    norm = "model.norm.weight"
    assert torch.equal(deq[norm], orig[norm])


def test_mxfp4_keeps_sinks_and_stacked_experts_16_bit(tmp_path):
    """gpt-oss-style: MXFP4 quantizes the attention projections; the sinks, the
    norms, the biased router and the stacked experts (3-D, with their biases) stay
    byte-identical, and each expert is in `ignore`, so vLLM's fused MoE layer is
    built unquantized."""
    spec = load_spec(ROOT / "model_specs" / "gpt-oss-style.yaml")
    bf16 = write_tiny_checkpoint(spec, tmp_path / "bf16", seed=0)
    qdir = quantize_checkpoint(bf16, "mxfp4", tmp_path / "mxfp4")
    counts, problems = untouched_tensors(spec, bf16, qdir, "mxfp4")
    assert problems == []
    layers = 2  # the tiny checkpoint's: one sliding, one full
    assert counts["sinks"] == layers and counts["routers"] == 2 * layers
    # The stacked experts' four tensors (weights and biases) per layer.
    assert counts["stacked experts"] == 4 * layers
    config = json.loads((qdir / "config.json").read_text())
    ignore = config["quantization_config"]["ignore"]
    experts = "model.layers.0.mlp.experts"
    assert {f"{experts}.7.{p}" for p in ("gate_proj", "up_proj", "down_proj")} <= set(
        ignore
    )
    assert "model.layers.0.mlp.router" in ignore
    tensors = {}
    for shard in qdir.glob("*.safetensors"):
        tensors.update(load_file(shard))
    assert "model.layers.0.self_attn.q_proj.weight_packed" in tensors
    assert tensors[f"{experts}.gate_up_proj"].dtype == torch.bfloat16


def test_a_hybrid_checkpoint_keeps_its_own_linear_attention_kind(tmp_path):
    """qwen3-next-style (Gated DeltaNet): the check asks for the unchanged
    tensors of the linear-attention kind the spec has (its convolutions, A_log /
    dt_bias, b/a projections), not for the other kind's (Kimi delta
    attention's, which this checkpoint has none of)."""
    spec = load_spec(ROOT / "model_specs" / "qwen3-next-style.yaml")
    bf16 = write_tiny_checkpoint(spec, tmp_path / "bf16", seed=0)
    fp8 = quantize_checkpoint(bf16, "fp8-dynamic", tmp_path / "fp8")
    tiny = load_spec(bf16 / "spec.yaml")
    counts, problems = untouched_tensors(tiny, bf16, fp8, "fp8-dynamic")
    assert problems == []
    assert counts["linear attention"] > 0 and not counts["kimi delta attention"]
