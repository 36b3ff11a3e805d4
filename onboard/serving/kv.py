"""KV-cache bytes per token, layer by layer, as vLLM 0.32 accounts them.

vLLM gives every attention layer that owns a KV cache a spec
(vllm/v1/kv_cache_interface.py) whose page holds ``block_size`` tokens:

* MHA / GQA (``FullAttentionSpec``, ``SlidingWindowSpec``): a page is
  ``block_size x num_kv_heads x (head_size + head_size_v) x dtype bytes``, i.e.
  ``2 x kv_heads x head_dim x bytes`` per token;
* MLA (``MLAAttentionSpec``): one latent per token, ``num_kv_heads = 1``,
  ``head_size = kv_lora_rank + qk_rope_head_dim`` and no separate V:
  ``(kv_lora_rank + qk_rope_head_dim) x bytes`` per token;
* sparse MLA (an indexer) also caches one index key per token
  (``DeepseekV32IndexerCache``): ``index_head_dim`` bytes in FP8 and a float32
  scale per 128 dims;
* a layer that reads another layer's cache (cross-layer KV sharing) gets no spec
  and adds nothing (the model runner's ``shared_kv_cache_layers``), except a
  sparse-MLA layer's index keys: its indexer is its own, so is their cache.

A sliding-window layer keeps at most its window of tokens per request (vLLM keeps
``window - 1`` plus the tokens in flight, rounded up to blocks, plus one block),
so at a context of N tokens it holds ``min(N, window)`` tokens' worth; full and
MLA layers hold N.

A linear-attention layer (Gated DeltaNet) caches nothing per token: each sequence
keeps one recurrent state per layer, whatever its length (``MambaSpec``): the
convolution's last ``kernel - 1`` inputs of q, k and v (plus one per speculative
token) in the model's dtype, and a ``value_head_dim x key_head_dim`` state per
value head in the state dtype (``mamba_ssm_cache_dtype``). vLLM makes the hybrid
model's pages one size: it raises the attention block size until an attention
page holds at least a state, and pads each state to that page.
"""

from __future__ import annotations

from dataclasses import dataclass

from onboard.arch import KimiDeltaAttention, build_plan
from onboard.components.chunked_attention import Chunked
from onboard.spec.model import ModelSpec

KV_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}


@dataclass(frozen=True)
class KVLayer:
    index: int
    # "full", "sliding", "chunked" (Llama-4's chunks), "mla", or "indexer" (the
    # index keys alone)
    kind: str
    # 0 when the layer reads another layer's cache (but a sparse-MLA layer's own
    # index keys, kind "indexer")
    bytes_per_token: int
    window: int | None = None  # sliding layers; a chunked layer's chunk
    shares: int | None = None  # the layer whose cache this one reads

    def tokens(self, context: int) -> int:
        """Tokens of one request of ``context`` tokens this layer keeps."""
        return min(context, self.window) if self.window else context


@dataclass(frozen=True)
class StateLayer:
    """A linear-attention layer's state: one per sequence, whatever its length."""

    index: int
    kind: str  # the mixer: "gated_deltanet"
    conv_shape: tuple[int, int]  # (channels, kernel - 1 + speculative tokens)
    recurrent_shape: tuple[int, ...]  # (value heads, value_head_dim, key_head_dim)
    conv_bytes: int
    recurrent_bytes: int

    @property
    def bytes(self) -> int:
        return self.conv_bytes + self.recurrent_bytes


@dataclass(frozen=True)
class KVReport:
    dtype: str
    dtype_bytes: int
    layers: tuple[KVLayer, ...]
    formula: str  # per-layer bytes per token, written out
    states: tuple[StateLayer, ...] = ()  # linear-attention layers
    state_dtype: str | None = None  # their recurrent state's dtype
    state_formula: str = ""  # per-layer state bytes, written out

    @property
    def state_bytes_per_sequence(self) -> int:
        """Bytes of every linear-attention layer's state, for one sequence."""
        return sum(state.bytes for state in self.states)

    def hybrid_block_size(self, alignment: int) -> int:
        """The attention block size vLLM picks for a hybrid model
        (Platform._align_hybrid_block_size): the smallest multiple of the
        kernel's ``alignment`` whose attention page holds a whole state."""
        per_token = max((x.bytes_per_token for x in self.owning_layers), default=0)
        state = max((s.bytes for s in self.states), default=0)
        if not state or not per_token:
            return alignment
        return alignment * -(-state // (alignment * per_token))

    def state_page_bytes(self, block_size: int) -> int:
        """The page vLLM gives each state: an attention page of ``block_size``
        tokens (the state is padded to it)."""
        per_token = max((x.bytes_per_token for x in self.owning_layers), default=0)
        state = max((s.bytes for s in self.states), default=0)
        return max(state, block_size * per_token)

    @property
    def bytes_per_token(self) -> int:
        """Sum over the layers that own a cache: vLLM's page bytes / block size."""
        return sum(layer.bytes_per_token for layer in self.layers)

    @property
    def bytes_per_token_without_sharing(self) -> int:
        """As if every layer owned its cache (what KV sharing saves)."""
        return sum(self._own(layer) for layer in self.layers)

    def kv_bytes_per_request(self, context: int) -> int:
        """KV bytes of one request of ``context`` tokens (windows applied)."""
        return sum(
            layer.bytes_per_token * layer.tokens(context) for layer in self.layers
        )

    def bytes_per_request(self, context: int) -> int:
        """Cache bytes of one request of ``context`` tokens: its KV (windows
        applied) and its linear-attention states."""
        return self.kv_bytes_per_request(context) + self.state_bytes_per_sequence

    @property
    def owning_layers(self) -> tuple[KVLayer, ...]:
        """The layers that own a cache (a sharing layer's index keys included)."""
        return tuple(layer for layer in self.layers if layer.bytes_per_token)

    @property
    def sliding(self) -> bool:
        return any(layer.kind == "sliding" for layer in self.owning_layers)

    def cache_groups(self) -> list[list[int]]:
        """vLLM's KV-cache groups of the layers that own a cache
        (kv_cache_utils._get_kv_cache_groups_uniform_page_size): layers of one
        kind form a bucket; every group has the same number of layers, the
        smallest bucket's size (or the largest's when that is under 1.5 times
        the smallest); bucket b splits into groups layers[i::ceil(len/size)]."""
        buckets: dict[tuple, list[int]] = {}
        for layer in self.owning_layers:
            buckets.setdefault((layer.kind, layer.window), []).append(layer.index)
        for state in self.states:
            buckets.setdefault((state.kind, None), []).append(state.index)
        if not buckets:
            return []
        sizes = [len(b) for b in buckets.values()]
        size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
        groups = []
        for layers in buckets.values():
            n = -(-len(layers) // size)
            groups += [layers[i::n] for i in range(n)]
        return groups

    def bytes_per_block(self, block_size: int) -> int:
        """Bytes of one block in vLLM's shared pool: block_size tokens of every
        layer of the largest group (all groups alias one pool of blocks); a
        state layer's page is the attention page it is padded to."""
        per_layer = {x.index: x.bytes_per_token for x in self.owning_layers}
        page = self.state_page_bytes(block_size) // block_size if self.states else 0
        per_layer |= {s.index: page for s in self.states}
        return max(
            (block_size * sum(per_layer[i] for i in g) for g in self.cache_groups()),
            default=0,
        )

    def _own(self, layer: KVLayer) -> int:
        if layer.shares is None:
            return layer.bytes_per_token
        return next(x for x in self.layers if x.index == layer.shares).bytes_per_token


def kv_report(
    spec: ModelSpec,
    dtype: str = "bfloat16",
    *,
    model_dtype: str | None = None,
    state_dtype: str | None = None,
    num_speculative: int = 0,
) -> KVReport:
    """Per-layer KV bytes per token of the spec's decoder (MTP heads excluded:
    they hold a cache only when served as speculative drafts), and the
    linear-attention layers' states: the convolution's in ``model_dtype`` (default
    ``dtype``), the recurrent one in ``state_dtype`` (default the spec's)."""
    b = KV_DTYPE_BYTES[dtype]
    arch = build_plan(spec)
    att = arch.attention
    index = 0  # sparse MLA: a layer's index keys, cached by sharing layers too
    if att.kind == "mla":
        mla = att.mla
        assert mla is not None
        per_layer = mla.latent * b
        formula = (
            f"MLA: (kv_lora_rank {mla.kv_lora_rank} + qk_rope_head_dim "
            f"{mla.qk_rope_head_dim}) x {b} B = {per_layer:,} B"
        )
        if att.indexer is not None:
            index = att.indexer.cache_bytes_per_token
            per_layer += index
            formula += f", + the index key {index:,} B = {per_layer:,} B"
    else:
        kv_heads, head_dim = att.num_kv_heads, att.head_dim
        assert kv_heads is not None and head_dim is not None
        per_layer = 2 * kv_heads * head_dim * b
        formula = (
            f"{'MHA' if kv_heads == att.num_heads else 'GQA'}: 2 x "
            f"num_kv_heads {kv_heads} x head_dim {head_dim} x {b} B "
            f"= {per_layer:,} B"
        )
    layers = []
    for layer in arch.layers:
        if layer.mixer.linear:
            continue
        window = layer.mixer.window
        chunk = layer.mixer.part(Chunked)
        if layer.mixer.kind == "mla":
            kind = "mla"
        elif chunk is not None and layer.mixer.rope:
            # Llama-4's chunked local attention: a chunk's worth of tokens
            # (vLLM's ChunkedLocalAttentionSpec).
            kind, window = "chunked", chunk.chunk_size
        else:
            kind = "sliding" if layer.mixer.sliding else "full"
        shared = layer.mixer.kv_source is not None
        if shared and index:
            kind = "indexer"
        layers.append(
            KVLayer(
                index=layer.index,
                kind=kind,
                bytes_per_token=index if shared else per_layer,
                window=window,
                shares=layer.mixer.kv_source,
            )
        )
    states, state_dtype, state_formula = _states(
        arch, model_dtype or dtype, state_dtype, num_speculative
    )
    return KVReport(
        dtype=dtype,
        dtype_bytes=b,
        layers=tuple(layers),
        formula=formula,
        states=states,
        state_dtype=state_dtype,
        state_formula=state_formula,
    )


def _states(
    arch, conv_dtype: str, state_dtype: str | None, num_speculative: int
) -> tuple[tuple[StateLayer, ...], str | None, str]:
    lin = arch.linear
    if lin is None:
        return (), None, ""
    state_dtype = state_dtype or lin.state_dtype
    cb, sb = KV_DTYPE_BYTES[conv_dtype], KV_DTYPE_BYTES[state_dtype]
    shapes = lin.state_shapes(num_speculative=num_speculative)
    conv = shapes.conv[0] * shapes.conv[1] * cb
    heads, v_dim, k_dim = shapes.recurrent
    recurrent = heads * v_dim * k_dim * sb
    if isinstance(lin, KimiDeltaAttention):
        channels = f"3 x {lin.num_heads} x {lin.head_dim}"
        kind = "Kimi delta attention"
    else:
        channels = (
            f"2 x {lin.num_key_heads} x {lin.key_head_dim} + "
            f"{lin.num_value_heads} x {lin.value_head_dim}"
        )
        kind = "Gated DeltaNet"
    formula = (
        f"{kind}: conv ({channels}) x {shapes.conv[1]} x "
        f"{cb} B + state {heads} x {v_dim} x {k_dim} x {sb} B = {conv + recurrent:,} "
        "B per sequence"
    )
    states = tuple(
        StateLayer(
            layer.index, lin.kind, shapes.conv, shapes.recurrent, conv, recurrent
        )
        for layer in arch.layers
        if layer.mixer.linear
    )
    return states, state_dtype, formula
