"""onboard.runtime.compat: each CPU shim answers a real fault of vLLM 0.32's CPU
build (shown here on vLLM's own code, without the shim) and removes it; the
engine gets the shims a spec needs, and only those."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from generate_variants import bundled

from onboard.runtime import compat
from onboard.runtime.engine import Engine, EngineOptions, engine_state_options


@pytest.fixture
def vllm_config():
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield


def test_rope_shim_makes_the_cpu_kernel_exact_on_several_heads(
    vllm_config, monkeypatch
):
    """MLA's query rope part, [tokens, heads, dims]: vLLM's CPU kernel rotates it
    wrongly (by more than 1), the PyTorch path is exact; with the shim the CPU
    path equals the PyTorch one, for strided slices too, and writes in place."""
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    monkeypatch.setattr(RotaryEmbedding, "forward_cpu", RotaryEmbedding.forward_cpu)
    torch.manual_seed(0)
    rope = get_rope(
        64,
        max_position=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        is_neox_style=False,
    )
    positions = torch.arange(5)
    query = torch.randn(5, 4, 128 + 64)  # nope dims, then rope dims, per head
    key = torch.randn(5, 1, 64)
    want_q, want_k = rope.forward_native(
        positions, query[..., 128:].clone(), key.clone()
    )
    got_q, _ = rope.forward_cpu(positions, query[..., 128:].contiguous(), key.clone())
    assert (got_q - want_q).abs().max() > 1.0  # the fault, without the shim

    compat.shims()["rope_heads"].install()
    compat.shims()["rope_heads"].install()  # again: no second wrapper
    assert getattr(RotaryEmbedding.forward_cpu, "onboard_shim", False)
    strided = query.clone()
    got_q, got_k = rope.forward_cpu(positions, strided[..., 128:], key.clone())
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)
    torch.testing.assert_close(strided[..., 128:], want_q)  # in place
    torch.testing.assert_close(strided[..., :128], query[..., :128])
    flat_q, _ = rope.forward_cpu(
        positions, query[..., 128:].reshape(5, -1).clone(), key.reshape(5, -1).clone()
    )
    torch.testing.assert_close(flat_q.view(5, 4, 64), want_q)
    # One token, its rope key a slice of the latent row as MLA passes it: the
    # flattened key is a view of the key with other strides (an engine step
    # with a single token failed on writing it back onto itself).
    latent = torch.randn(1, 512 + 64)
    one_q = query[:1].clone()
    want_q, want_k = rope.forward_native(
        positions[:1], one_q[..., 128:].clone(), latent[:, 512:].clone().view(1, 1, 64)
    )
    got_q, got_k = rope.forward_cpu(
        positions[:1], one_q[..., 128:], latent[:, 512:].unsqueeze(1)
    )
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(latent[:, 512:].view(1, 1, 64), want_k)  # in place


def _biased_topk(logits, bias, k, scale):
    """DeepSeek-V3's routing, by hand: sigmoid scores, experts chosen by score +
    bias, weighted by their scores, renormalised and scaled."""
    scores = logits.float().sigmoid()
    ids = (scores + bias).topk(k, dim=-1).indices
    weights = scores.gather(-1, ids)
    return weights / weights.sum(-1, keepdim=True) * scale, ids


def test_router_shim_routes_sigmoid_with_bias_without_groups(monkeypatch):
    """Without expert groups vLLM's CPU router asserts softmax scores; with the
    shim it gives the biased sigmoid top-k, as vLLM's GPU router does."""
    from vllm.model_executor.layers.fused_moe.router.cpu_router import CPURouter

    monkeypatch.setattr(CPURouter, "_compute_routing", CPURouter._compute_routing)
    torch.manual_seed(0)
    logits = torch.randn(7, 16)
    bias = torch.randn(16) * 0.5
    router = CPURouter(
        top_k=4,
        global_num_experts=16,
        renormalize=True,
        scoring_func="sigmoid",
        routed_scaling_factor=2.5,
        e_score_correction_bias=bias,
    )
    with pytest.raises(AssertionError):
        router._compute_routing(logits, logits, None)
    compat.shims()["plain_topk_router"].install()
    weights, ids = router._compute_routing(logits, logits, None)
    want_w, want_ids = _biased_topk(logits, bias, 4, 2.5)
    order = ids.sort(-1).indices
    want_order = want_ids.sort(-1).indices
    assert torch.equal(ids.gather(-1, order).long(), want_ids.gather(-1, want_order))
    torch.testing.assert_close(
        weights.gather(-1, order), want_w.gather(-1, want_order), rtol=1e-5, atol=1e-6
    )
    # Plain softmax top-k is left to vLLM's own path.
    plain = CPURouter(top_k=2, global_num_experts=16, renormalize=False)
    w, _ = plain._compute_routing(logits, logits, None)
    assert math.isclose(
        w[0].sum().item(),
        logits[0].softmax(-1).topk(2).values.sum().item(),
        rel_tol=1e-5,
    )


def test_mla_blocks_shim_takes_multiples_of_16(monkeypatch):
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend

    monkeypatch.setattr(
        CPUMLABackend, "supports_block_size", CPUMLABackend.supports_block_size
    )
    assert not CPUMLABackend.supports_block_size(256)  # the fault
    compat.shims()["mla_blocks"].install()
    assert CPUMLABackend.supports_block_size(256)
    assert CPUMLABackend.supports_block_size(16)
    assert not CPUMLABackend.supports_block_size(24)


def test_every_shim_names_its_limitation_and_vllm_release():
    for name, shim in compat.shims().items():
        assert shim.name == name
        assert "vLLM 0.32" in shim.limitation, name
        assert shim.vllm_series == "0.32"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("dense-gqa", ()),
        ("deepseek-v3-style", ("rope_heads",)),  # grouped routing
        ("novel-launch", ("plain_topk_router",)),  # gqa, sigmoid routing
        (
            "kimi-k3-style",
            ("rope_heads", "plain_topk_router", "mla_blocks", "kda_torch"),
        ),
        ("qwen3-next-style", ()),
        ("gpt-oss-style", ()),
    ],
)
def test_the_engine_gets_the_shims_a_spec_needs(name, expected, tmp_path):
    spec = bundled(name)
    assert compat.shims_for(spec) == expected
    options = EngineOptions(Path("m"), None, **engine_state_options(spec))
    env = Engine(options, tmp_path, tmp_path / "log").environment()
    if not expected:
        assert compat.ENV not in env and env["VLLM_PLUGINS"] == ""
        return
    assert env[compat.ENV] == ",".join(expected)
    assert env["VLLM_PLUGINS"] == compat.ENTRY_POINT
    site = tmp_path / "site"
    (info,) = site.glob("onboard_cpu_compat-*.dist-info")
    entry = (info / "entry_points.txt").read_text()
    assert f"{compat.ENTRY_POINT} = {compat.TARGET}" in entry
    assert str(site) in env["PYTHONPATH"].split(":")


def test_register_refuses_an_unknown_shim(monkeypatch):
    monkeypatch.setenv(compat.ENV, "rope_heads,no_such_shim")
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    monkeypatch.setattr(RotaryEmbedding, "forward_cpu", RotaryEmbedding.forward_cpu)
    with pytest.raises(ValueError, match="no_such_shim"):
        compat.register()
