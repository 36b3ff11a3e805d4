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


def _bf16(*shape, scale: float = 1.0):
    return (torch.randn(*shape) * scale).to(torch.bfloat16)


def _assert_near(got, want, what: str):
    """Equal up to bfloat16 rounding: the kernels compute in bfloat16, the shim
    in float32 on the same (bfloat16-representable) inputs."""
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert err <= 0.02 * scale, f"{what}: {err:.3g} against values up to {scale:.3g}"


def test_gdn_float32_shim_computes_what_the_bfloat16_kernels_do():
    """vLLM's CPU Gated DeltaNet kernels take bfloat16 only (the fault: float32
    is refused). The shim's float32 counterparts, on the same inputs, agree with
    each kernel to bfloat16 rounding and update the same cache slots: a prefill
    of two sequences from non-zero states with two value heads per key head,
    decode steps, speculative steps from the accepted slots, the packed
    convolution's prefill, decode and rolling draft update. Read with the state
    transposed, the same prefill misses by far more: the comparison sees the
    layout."""

    from vllm import _custom_ops as ops

    from onboard.runtime.compat import gdn

    torch.manual_seed(0)
    tokens, key_heads, value_heads, dim = 7, 2, 4, 64
    q, k = _bf16(1, tokens, key_heads, dim), _bf16(1, tokens, key_heads, dim)
    v = _bf16(1, tokens, value_heads, dim)
    a, b = _bf16(tokens, value_heads), _bf16(tokens, value_heads)
    A_log, dt_bias = torch.randn(value_heads) * 0.5, _bf16(value_heads)
    f32 = [x.float() for x in (q, k, v, a, b)]
    with pytest.raises(RuntimeError, match="Unsupported floating data type"):
        ops.fused_gdn_gating_cpu(A_log=A_log, a=f32[3], b=f32[4], dt_bias=dt_bias)

    g, beta = ops.fused_gdn_gating_cpu(A_log=A_log, a=a, b=b, dt_bias=dt_bias)
    got_g, got_beta = gdn.gdn_gating(A_log, f32[3], f32[4], dt_bias.float())
    _assert_near(got_g, g, "gating: log decay")
    _assert_near(got_beta, beta, "gating: step size")

    states = torch.randn(3, value_heads, dim, dim) * 0.1
    prefill = dict(
        output_final_state=True,
        cu_seqlens=torch.tensor([0, 3, tokens], dtype=torch.int32),
        head_first=False,
        use_qk_l2norm_in_kernel=True,
        initial_state_indices=torch.tensor([2, 0], dtype=torch.int32),
    )
    want_states = states.clone()
    want, _ = ops.chunk_gated_delta_rule_cpu(
        query=q, key=k, value=v, g=g, beta=beta, initial_state=want_states, **prefill
    )
    got_states = states.clone()
    got, _ = gdn.chunk_gated_delta_rule(
        *f32[:3], g, beta.float(), got_states, **prefill
    )
    _assert_near(got, want, "prefill output")
    _assert_near(got_states, want_states, "prefill states")
    torch.testing.assert_close(got_states[1], states[1])  # an unused slot
    transposed = states.transpose(-1, -2).contiguous()
    wrong, _ = gdn.chunk_gated_delta_rule(
        *f32[:3], g, beta.float(), transposed, **prefill
    )
    assert (wrong - want.float()).abs().max() > 0.1 * want.float().abs().max()

    decode = dict(
        initial_state_indices=torch.tensor([2, 0], dtype=torch.int32),
        cu_seqlens=torch.tensor([0, 1, 2], dtype=torch.int32),
        use_qk_l2norm_in_kernel=True,
    )
    want_states, got_states = states.clone(), states.clone()
    two = [x[:, :2] for x in (q, k, v)]
    want = ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=two[0], k=two[1], v=two[2], a=a[:2],
        b=b[:2], initial_state_source=want_states, **decode,
    )  # fmt: skip
    got = gdn.gated_delta_rule_update(
        A_log, dt_bias.float(), *(x.float() for x in two), f32[3][:2], f32[4][:2],
        got_states, **decode,
    )  # fmt: skip
    assert got.shape == want.shape
    _assert_near(got, want, "decode output")
    _assert_near(got_states, want_states, "decode states")

    spec = dict(
        spec_state_indices=torch.arange(8, dtype=torch.int32).view(2, 4),
        num_accepted_tokens=torch.tensor([2, 1], dtype=torch.int32),
        cu_seqlens=torch.tensor([0, 3, 6], dtype=torch.int32),
        use_qk_l2norm_in_kernel=True,
    )
    slots = torch.randn(8, value_heads, dim, dim) * 0.1
    want_slots, got_slots = slots.clone(), slots.clone()
    six = [x[0, :6] for x in (q, k, v)]
    want = ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(
        A_log=A_log, dt_bias=dt_bias, q=six[0], k=six[1], v=six[2], a=a[:6],
        b=b[:6], initial_state_source=want_slots, **spec,
    )  # fmt: skip
    got = gdn.gated_delta_rule_update_spec(
        A_log, dt_bias.float(), *(x.float() for x in six), f32[3][:6], f32[4][:6],
        got_slots, **spec,
    )  # fmt: skip
    _assert_near(got, want, "speculative output")
    _assert_near(got_slots, want_slots, "speculative states")
    torch.testing.assert_close(got_slots[3], slots[3])  # past the drafts


def _causal_convolution(history, new, weight):
    """The definition, one output at a time: channel c at step t is
    silu(sum_j weight[c, j] * input[c, t + j]) over the ``width - 1`` inputs
    before it (``history``, ``[dim, width - 1]``) and its own; with the
    inputs each sequence leaves in its state."""
    width = weight.size(-1)
    seq = torch.cat([history, new.transpose(0, 1)], dim=-1)
    out = torch.stack(
        [(weight * seq[:, t : t + width]).sum(-1) for t in range(new.size(0))]
    )
    return torch.nn.functional.silu(out), seq[:, -(width - 1) :]


def test_gdn_float32_convolution_computes_the_causal_convolution():
    """On every CPU (vLLM's packed kernels, where this CPU's build has them,
    are compared in the next test): the shim's prefill convolution of two
    sequences, one from a cached state and one from zeros, and its decode
    update, against the convolution's definition; each sequence's state holds
    its last inputs, an unused slot is untouched. The taps read in the wrong
    order (an anti-causal filter) miss by far more: the comparison sees the
    direction."""
    from onboard.runtime.compat import gdn

    torch.manual_seed(0)
    width, channels, starts = 4, 8, [0, 3, 7]
    weight = torch.randn(channels, width)
    x = torch.randn(starts[-1], channels)
    states = torch.randn(3, channels, width - 1)
    got_states = states.clone()
    got = gdn.causal_conv1d_fwd(
        x=x.transpose(0, 1), weight=weight.view(channels, 1, width), bias=None,
        conv_states=got_states, query_start_loc=torch.tensor(starts, dtype=torch.int32),
        cache_indices=torch.tensor([2, 0], dtype=torch.int32),
        has_initial_state=torch.tensor([True, False]), silu_activation=True,
        is_weight_packed=False,
    )  # fmt: skip
    got = got.transpose(0, 1)
    for seq, (slot, history) in enumerate(
        ((2, states[2]), (0, torch.zeros(channels, width - 1)))
    ):
        part = slice(starts[seq], starts[seq + 1])
        want, left = _causal_convolution(history, x[part], weight)
        torch.testing.assert_close(got[part], want, msg=f"prefill, sequence {seq}")
        torch.testing.assert_close(got_states[slot], left)
        wrong, _ = _causal_convolution(history, x[part], weight.flip(-1))
        assert (wrong - got[part]).abs().max() > 0.1 * want.abs().max()
    torch.testing.assert_close(got_states[1], states[1])

    step = torch.randn(2, channels)
    before = got_states.clone()
    out = gdn.causal_conv1d_update(
        x=step, conv_states=got_states, weight=weight.view(channels, 1, width),
        bias=None, silu_activation=True,
        conv_state_indices=torch.tensor([2, 0], dtype=torch.int32),
        is_weight_packed=False,
    )  # fmt: skip
    for seq, slot in enumerate((2, 0)):
        want, left = _causal_convolution(before[slot], step[seq : seq + 1], weight)
        torch.testing.assert_close(out[seq : seq + 1], want, msg=f"decode {seq}")
        torch.testing.assert_close(got_states[slot], left)


def _has_packed_convolution() -> bool:
    """Whether the loaded vLLM CPU kernels have the packed causal convolution:
    the AVX512-BF16 build (``vllm/_C``) has it, the AVX2 and AVX512 builds
    (``_C_AVX2``, ``_C_AVX512``, which vLLM loads on CPUs without AVX512-BF16:
    ``platforms/cpu.py`` ``import_kernels``) do not."""
    from vllm import _custom_ops  # noqa: F401  (loads the CPU kernels)

    try:
        return torch.ops._C.causal_conv1d_weight_pack is not None
    except (AttributeError, RuntimeError):
        return False


def test_gdn_float32_convolution_computes_what_the_bfloat16_kernels_do():
    """The shim's float32 convolution against vLLM's packed bfloat16 kernels:
    prefill, decode and the speculative rolling update."""
    import importlib

    from vllm import _custom_ops as ops

    from onboard.runtime.compat import gdn

    if not _has_packed_convolution():
        pytest.skip(
            "this CPU's vLLM kernel build (no AVX512-BF16) has no packed causal "
            "convolution to compare against"
        )
    torch.manual_seed(0)
    tokens = 7
    module = importlib.import_module(gdn.MODULE)
    width, channels = 4, 256
    plain = _bf16(channels, width)
    packed = ops.causal_conv1d_weight_pack(plain.contiguous())
    weight = plain.float().view(channels, 1, width)
    conv_states = _bf16(3, channels, width - 1)
    want_states, got_states = conv_states.clone(), conv_states.float()
    x = _bf16(tokens, channels).transpose(0, 1)  # as the op passes it
    conv = dict(
        bias=None,
        query_start_loc=torch.tensor([0, 3, tokens], dtype=torch.int32),
        cache_indices=torch.tensor([2, 0], dtype=torch.int32),
        has_initial_state=torch.tensor([True, False]),
        silu_activation=True,
    )
    want = module._causal_conv1d_fwd_cpu(
        x=x, weight=packed, conv_states=want_states, is_weight_packed=True, **conv
    )
    got = gdn.causal_conv1d_fwd(
        x=x.float(), weight=weight, conv_states=got_states, is_weight_packed=False,
        **conv,
    )  # fmt: skip
    _assert_near(got, want, "convolution prefill")
    torch.testing.assert_close(got_states, want_states.float())
    for draft, state_len, accepted in ((None, width - 1, None), (3, width + 1, [2, 1])):
        storage = _bf16(3, state_len, channels)  # the buffer's storage order
        want_states = storage.clone().transpose(1, 2)
        got_states = storage.float().transpose(1, 2)
        x = _bf16(2, channels) if draft is None else _bf16(2, draft, channels)
        update = dict(
            bias=None,
            silu_activation=True,
            conv_state_indices=torch.tensor([2, 0], dtype=torch.int32),
            num_accepted_tokens=None
            if accepted is None
            else torch.tensor(accepted, dtype=torch.int32),
        )
        want = module._causal_conv1d_update_cpu(
            x=x, weight=packed, conv_states=want_states, is_weight_packed=True,
            **update,
        )  # fmt: skip
        got = gdn.causal_conv1d_update(
            x=x.float(), weight=weight, conv_states=got_states,
            is_weight_packed=False, **update,
        )  # fmt: skip
        _assert_near(got, want, f"convolution update ({draft=})")
        torch.testing.assert_close(got_states, want_states.float())


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
        ("qwen3-next-style", ("gdn_float32",)),
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
