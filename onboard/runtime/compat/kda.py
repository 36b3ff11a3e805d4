"""Kimi delta attention on CPU: the delta rule in plain torch.

vLLM 0.32's Kimi delta attention layer (``KimiGatedDeltaNetAttention``) runs its
recurrence with Triton kernels only (``vllm/models/kimi_k3/*/ops``), which the
CPU build cannot launch. The shim replaces the layer's ``_forward`` on CPU by
the Kimi delta rule, token by token, on the same cached states (the
convolution's by vLLM's CPU causal-conv op, the recurrent state in the KDA
kernels' ``[heads, value_dim, key_dim]`` layout), so a prefix computed here and
continued by the kernels agree. Speculative decoding needs a state per draft
position, which only the Triton kernels keep: the shim refuses it.
"""

from __future__ import annotations

LIMITATION = (
    "vLLM 0.32's Kimi delta attention kernels are Triton-only; on CPU the layer "
    "runs the delta rule in plain torch on the same cached states"
)


def _l2_normalize(x, eps: float = 1e-6):
    import torch

    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _forward(self, mixed_qkv, g1, g2, beta, core_attn_out) -> None:
    """``KimiGatedDeltaNetAttention._forward`` on CPU."""
    from vllm.forward_context import get_forward_context
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

    attn_metadata = get_forward_context().attn_metadata
    if attn_metadata is None or self.prefix not in attn_metadata:
        # Profile and warmup runs carry no state metadata.
        return
    metadata = attn_metadata[self.prefix]
    assert isinstance(metadata, GDNAttentionMetadata)
    assert metadata.spec_sequence_masks is None, (
        "speculative decoding with Kimi delta attention needs vLLM's KDA kernels"
    )
    num_tokens = metadata.num_actual_tokens
    core_attn_out[0, :num_tokens] = _delta_rule(
        self, mixed_qkv[:num_tokens], g1[0, :num_tokens], beta[0, :num_tokens], metadata
    )
    core_attn_out.copy_(self.o_norm(core_attn_out, g2))


def _delta_rule(self, mixed_qkv, raw_g, raw_beta, metadata):
    """The Kimi delta rule, token by token, for the batch's sequences (decodes
    first, then prefills), reading and writing the conv and recurrent states of
    each sequence's cache slot as vLLM's CPU Gated DeltaNet op does."""
    import torch
    from torch import nn
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import (
        causal_conv1d_fn_cpu,
    )

    num_seqs = metadata.num_decodes + metadata.num_prefills
    query_start_loc = metadata.non_spec_query_start_loc[: num_seqs + 1]
    state_indices = metadata.non_spec_state_indices_tensor[:num_seqs]
    has_initial_state = metadata.has_initial_state
    if has_initial_state is None:
        # A batch of decodes only: every sequence continues its state.
        has_initial_state = torch.ones(num_seqs, dtype=torch.bool)
    conv_state, recurrent_state = self.kv_cache
    if not is_conv_state_dim_first():
        conv_state = conv_state.transpose(-1, -2)
    conv_weight = self.conv1d.weight.view(self.conv1d.weight.size(0), -1)
    mixed_qkv = causal_conv1d_fn_cpu(
        mixed_qkv.transpose(0, 1),
        conv_weight,
        None,
        conv_state,
        query_start_loc,
        cache_indices=state_indices,
        has_initial_state=has_initial_state,
        activation="silu",
    ).transpose(0, 1)
    q, k, v = (
        x.float().view(-1, self.local_num_heads, self.head_dim)
        for x in mixed_qkv.split(self.local_projection_size, dim=-1)
    )
    q = _l2_normalize(q) * self.head_dim**-0.5
    k = _l2_normalize(k)
    # The log decay per key channel, and the delta rule's step size.
    g = -self.A_log.exp()[:, None] * nn.functional.softplus(
        raw_g.float() + self.dt_bias.view(self.local_num_heads, self.head_dim)
    )
    beta = raw_beta.float().sigmoid()
    out = torch.empty_like(v)
    bounds = query_start_loc.tolist()
    for seq, slot in enumerate(state_indices.tolist()):
        start, end = bounds[seq], bounds[seq + 1]
        # [heads, value_dim, key_dim], the layout of vLLM's KDA kernels.
        state = recurrent_state[slot].float()
        if not has_initial_state[seq]:
            state.zero_()
        for t in range(start, end):
            state = state * g[t, :, None, :].exp()
            error = v[t] - (state * k[t, :, None, :]).sum(dim=-1)
            state = state + (beta[t, :, None] * error)[..., None] * k[t, :, None, :]
            out[t] = (state * q[t, :, None, :]).sum(dim=-1)
        recurrent_state[slot] = state.to(recurrent_state.dtype)
    return out.to(mixed_qkv.dtype)


def install() -> None:
    from vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn import (
        KimiGatedDeltaNetAttention,
    )

    KimiGatedDeltaNetAttention._forward = _forward
