"""Gated DeltaNet on CPU in float32: the CPU kernels' float32 counterparts.

vLLM 0.32's CPU Gated DeltaNet op (``vllm/model_executor/layers/mamba/ops/cpu/
gdn_attention.py``) asserts bfloat16 ('CPU GDN attention requires BF16.'), and
its kernels (``fused_gdn_gating_cpu``, ``chunk_gated_delta_rule_cpu``, the
decode updates and the packed causal convolution) take bfloat16 only. Run in
bfloat16, a Gated DeltaNet model differs from the float32 reference by the
recurrence's rounding alone so much that the accuracy check cannot tell a subtle
fault from it.

The shim keeps vLLM's op and its bookkeeping (which sequences decode or prefill,
which cache slots they read and write, the speculative rolling buffers) and
replaces only what is bfloat16-only, for float32 inputs: each kernel by the same
recurrence in plain torch on the same cache layout (the recurrent state viewed as
``[heads, key_dim, value_dim]``, as the op views it; a speculative sequence
resumes from slot ``num_accepted - 1`` and leaves the state after draft token
``t`` in slot ``t``). bfloat16 inputs still reach vLLM's kernels unchanged.
tests/test_cpu_compat.py compares each counterpart with vLLM's kernel on the same
bfloat16 inputs.
"""

from __future__ import annotations

import typing

LIMITATION = (
    "vLLM 0.32's CPU Gated DeltaNet op and kernels take bfloat16 only; in float32 "
    "the shim runs the same recurrence and convolution in plain torch on the same "
    "cached states"
)

# The op's module, where the shim rebinds the names its functions look up.
MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"


def _l2_normalize(x, eps: float = 1e-6):
    import torch

    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gdn_gating(A_log, a, b, dt_bias):
    """``fused_gdn_gating_cpu``: the log decay ``-exp(A_log) * softplus(a +
    dt_bias)`` in float32 and the step size ``sigmoid(b)``, each ``[1, T, H]``."""
    from torch.nn import functional as F

    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g.unsqueeze(0), b.sigmoid().unsqueeze(0)


def _queries_keys(q, k, num_v_heads: int, l2_normalize: bool):
    """q and k in float32, normalised, q scaled by 1/sqrt(key_dim), each key head
    repeated for the value heads it serves (value head h reads key head
    h // (value heads per key head))."""
    q, k = q.float(), k.float()
    if l2_normalize:
        q, k = _l2_normalize(q), _l2_normalize(k)
    q = q * q.size(-1) ** -0.5
    per_key_head = num_v_heads // q.size(-2)
    return (
        q.repeat_interleave(per_key_head, dim=-2),
        k.repeat_interleave(per_key_head, dim=-2),
    )


def _delta_step(state, q, k, v, g, beta):
    """One token of the gated delta rule on ``state`` ``[H, key_dim, value_dim]``:
    decay, correct the value read at ``k`` towards ``v`` by ``beta``, read at
    ``q``."""
    import torch

    state = state * g.exp()[:, None, None]
    error = v - torch.einsum("hk,hkv->hv", k, state)
    state = state + torch.einsum("hk,hv->hkv", k, beta[:, None] * error)
    return state, torch.einsum("hk,hkv->hv", q, state)


def chunk_gated_delta_rule(
    query,
    key,
    value,
    g,
    beta,
    initial_state,
    output_final_state,
    cu_seqlens,
    head_first,
    use_qk_l2norm_in_kernel,
    initial_state_indices,
    eps=1e-5,
):
    """``chunk_gated_delta_rule_cpu``: the prefill of each sequence
    (``cu_seqlens``) from its state slot, which it updates in place."""
    import torch

    assert not head_first
    q, k = _queries_keys(query[0], key[0], value.size(-2), use_qk_l2norm_in_kernel)
    v, g, beta = value[0].float(), g[0].float(), beta[0].float()
    out = torch.empty_like(v)
    bounds = cu_seqlens.tolist()
    for seq, slot in enumerate(initial_state_indices.tolist()):
        state = initial_state[slot].float()
        for t in range(bounds[seq], bounds[seq + 1]):
            state, out[t] = _delta_step(state, q[t], k[t], v[t], g[t], beta[t])
        initial_state[slot] = state.to(initial_state.dtype)
    return out.unsqueeze(0).to(value.dtype), None


def gated_delta_rule_update(
    A_log,
    dt_bias,
    q,
    k,
    v,
    a,
    b,
    initial_state_source,
    initial_state_indices,
    cu_seqlens,
    use_qk_l2norm_in_kernel,
    softplus_beta=1.0,
    softplus_threshold=20.0,
):
    """``fused_sigmoid_gating_delta_rule_update_cpu``: decode steps with their
    gating, ``[T, 1, H, value_dim]``."""
    g, beta = gdn_gating(A_log, a, b, dt_bias)
    out, _ = chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        initial_state_source,
        True,
        cu_seqlens,
        False,
        use_qk_l2norm_in_kernel,
        initial_state_indices,
    )
    return out.transpose(0, 1)


def gated_delta_rule_update_spec(
    A_log,
    dt_bias,
    q,
    k,
    v,
    a,
    b,
    initial_state_source,
    spec_state_indices,
    num_accepted_tokens,
    cu_seqlens,
    use_qk_l2norm_in_kernel,
    softplus_beta=1.0,
    softplus_threshold=20.0,
):
    """``fused_sigmoid_gating_delta_rule_update_spec_cpu``: each sequence's draft
    tokens from the state after its last accepted token (slot ``num_accepted -
    1`` of its row), the state after draft token ``t`` kept in slot ``t``."""
    import torch

    g, beta = gdn_gating(A_log, a, b, dt_bias)
    g, beta = g[0], beta[0].float()
    q, k = _queries_keys(q, k, v.size(-2), use_qk_l2norm_in_kernel)
    v = v.float()
    out = torch.empty_like(v)
    bounds = cu_seqlens.tolist()
    accepted = num_accepted_tokens.tolist()
    for seq, slots in enumerate(spec_state_indices.tolist()):
        state = initial_state_source[slots[accepted[seq] - 1]].float()
        for step, t in enumerate(range(bounds[seq], bounds[seq + 1])):
            state, out[t] = _delta_step(state, q[t], k[t], v[t], g[t], beta[t])
            initial_state_source[slots[step]] = state.to(initial_state_source.dtype)
    return out


class _Float32Kernels:
    """vLLM's ``_custom_ops`` as the op's module sees it: the GDN kernels run in
    torch for float32 inputs, everything else (and bfloat16) as before."""

    def __init__(self, ops) -> None:
        self._ops = ops

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def fused_gdn_gating_cpu(self, A_log, a, b, dt_bias):
        if a.dtype == _float32():
            return gdn_gating(A_log, a, b, dt_bias)
        return self._ops.fused_gdn_gating_cpu(A_log=A_log, a=a, b=b, dt_bias=dt_bias)

    def chunk_gated_delta_rule_cpu(self, **kw):
        if kw["query"].dtype == _float32():
            return chunk_gated_delta_rule(**kw)
        return self._ops.chunk_gated_delta_rule_cpu(**kw)

    def fused_sigmoid_gating_delta_rule_update_cpu(self, **kw):
        if kw["q"].dtype == _float32():
            return gated_delta_rule_update(**kw)
        return self._ops.fused_sigmoid_gating_delta_rule_update_cpu(**kw)

    def fused_sigmoid_gating_delta_rule_update_spec_cpu(self, **kw):
        if kw["q"].dtype == _float32():
            return gated_delta_rule_update_spec(**kw)
        return self._ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(**kw)


def _float32():
    import torch

    return torch.float32


def _plain_weight(weight):
    """The conv weight as ``[dim, width]``: vLLM packs it for its C++ conv only
    in bfloat16, so a float32 weight is the plain ``[dim, 1, width]``."""
    return weight.view(weight.size(0), weight.size(-1))


def causal_conv1d_fwd(
    *,
    x,
    weight,
    bias,
    conv_states,
    query_start_loc,
    cache_indices,
    has_initial_state,
    silu_activation,
    is_weight_packed,
):
    """The op's packed C++ prefill convolution, by vLLM's torch one
    (``conv_states`` ``[slots, dim, width - 1]``)."""
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import (
        causal_conv1d_fn_cpu,
    )

    return causal_conv1d_fn_cpu(
        x,
        _plain_weight(weight),
        bias,
        conv_states,
        query_start_loc,
        cache_indices=cache_indices,
        has_initial_state=has_initial_state,
        activation="silu" if silu_activation else None,
    )


def causal_conv1d_update(
    *,
    x,
    conv_states,
    weight,
    bias,
    silu_activation,
    conv_state_indices,
    is_weight_packed,
    num_accepted_tokens=None,
):
    """The op's packed C++ decode convolution in torch. ``x`` is ``[N, dim]``
    (one token per sequence, ``conv_states`` ``[slots, dim, width - 1]``) or,
    with ``num_accepted_tokens``, ``[N, draft, dim]`` against a sequence's
    rolling buffer ``[dim, state_len]``: the window starts after the accepted
    history (``num_accepted - 1`` columns in)."""
    import torch
    from torch.nn import functional as F

    plain = _plain_weight(weight)
    width = plain.size(-1)
    tokens = x if x.dim() == 3 else x.unsqueeze(1)
    out = torch.empty_like(tokens)
    slots = conv_state_indices.tolist()
    accepted = None if num_accepted_tokens is None else num_accepted_tokens.tolist()
    for seq, slot in enumerate(slots):
        buffer = conv_states[slot]
        offset = 0 if accepted is None else accepted[seq] - 1
        new = tokens[seq].transpose(0, 1).to(buffer.dtype)
        window = torch.cat([buffer[:, offset : offset + width - 1], new], dim=-1)
        conv = F.conv1d(window[None], plain[:, None, :], bias, groups=plain.size(0))[0]
        if silu_activation:
            conv = F.silu(conv)
        out[seq] = conv.transpose(0, 1).to(out.dtype)
        # As vLLM's torch path rolls it: drop the accepted history, append.
        kept = buffer[:, offset + 1 : offset + 1 + buffer.size(-1) - new.size(-1)]
        buffer.copy_(torch.cat([kept, new], dim=-1))
    return out if x.dim() == 3 else out.squeeze(1)


def install() -> None:
    import importlib

    import torch

    module = importlib.import_module(MODULE)
    original = module.cpu_gdn_attention_core
    if getattr(original, "onboard_shim", False):
        return
    if getattr(module, "_CPU_GDN_ATTENTION_OPS_REGISTERED", False):
        # The op is registered with vLLM's function already (a layer was built
        # before the plugin ran); rebinding the name would change nothing.
        raise RuntimeError("gdn_float32 must be installed before the model is built")

    def cpu_gdn_attention_core(mixed_qkv, b, a, core_attn_out, layer_name) -> None:
        if mixed_qkv.dtype != torch.float32:
            return original(mixed_qkv, b, a, core_attn_out, layer_name)
        # vLLM's op without its bfloat16 assertion: the same choice between the
        # plain and the speculative (wide conv buffer) paths.
        context = module.get_forward_context()
        layer = context.no_compile_layers[module._resolve_layer_name(layer_name)]
        if context.attn_metadata is None:
            return None
        metadata = context.attn_metadata[layer.prefix]
        if metadata.num_actual_tokens == 0:
            return None
        width = layer.conv1d.weight.size(-1)
        conv_cache = layer.kv_cache[0]
        dim_first = module.is_conv_state_dim_first()
        state_len = conv_cache.size(-1) if dim_first else conv_cache.size(-2)
        if state_len > width - 1:
            module._cpu_gdn_attention_spec_aware(
                layer, metadata, mixed_qkv, b, a, core_attn_out, width, state_len
            )
        else:
            module._cpu_gdn_attention_nonspec(
                layer, metadata, mixed_qkv, b, a, core_attn_out
            )
        return None

    # vLLM registers the op with a schema read from these annotations; theirs
    # are strings, which torch would evaluate in this module's namespace.
    hints = typing.get_type_hints(original)
    cpu_gdn_attention_core.__annotations__ = {**hints, "return": None}
    cpu_gdn_attention_core.onboard_shim = True
    module.cpu_gdn_attention_core = cpu_gdn_attention_core
    module.ops = _Float32Kernels(module.ops)
    for name, float32_version in (
        ("_causal_conv1d_fwd_cpu", causal_conv1d_fwd),
        ("_causal_conv1d_update_cpu", causal_conv1d_update),
    ):
        module_version = getattr(module, name)

        def dispatch(*, _vllm=module_version, _torch=float32_version, **kw):
            if kw["weight"].dtype == torch.float32:
                return _torch(**kw)
            return _vllm(**kw)

        setattr(module, name, dispatch)
