"""The shrink rule: a full-size spec -> a seconds-sized spec of the same architecture.

One rule for every spec (documented in docs/checkpoints.md):

* **Kept as they are** — everything that is structure rather than size, and every
  dimension a kernel constrains: head_dim (vLLM's CPU attention accepts only some
  sizes), the MLA per-head dims and latent (the CPU MLA decode kernel only takes
  kv_lora_rank + qk_rope_head_dim = 576), norm type, activation, biases, qk-norm,
  partial rotary, rope (theta, interleave, scaling type *and* parameters: they
  define the rotation, not a size), tied embeddings, the layer patterns
  (sliding_window_pattern, MoE layer_frequency), router kind, bias correction,
  scaling factor, shared-expert gate, MTP heads and their count, the checkpoint
  layout, and the launch wishes (quantization, speculators, targets); for
  linear attention the key and value head dims and the convolution's width (the
  CPU kernels take only some), the projection layout and the state dtype.
* **Shrunk** — widths and counts: query heads to at most 2 per KV head and at most
  2 KV heads (MHA stays MHA, MQA stays MQA; MLA keeps 4 heads), hidden size to
  heads x head_dim where the spec ties them and that stays within 1024 (else 256
  with head_dim explicit), dense MLP to 2 x hidden,
  experts to at most 8 (two per group when routing is grouped, keeping the share of
  groups kept per token), top-k to at most 2, shared experts to at most 2, expert
  widths to 64 (128 where the spec ships fp8-block or INT4 and its experts are
  whole 128-wide blocks or groups: vLLM builds those layers only from whole
  ones), q_lora_rank to at most 128, index heads to at most 4 and the
  indexer's top-k to at most 32 (so a 64-token test context outgrows it, and the
  CPU engine's dense-equivalent run has 16 prompt + 16 generated tokens within
  it; the index head dim is kept), linear-attention key heads to at
  most 2 with at most 2 value heads each, vocab to the bundled tokenizer's 512,
  max positions to at most 2048 (but not below a rope scaling's original
  length), the sliding window to at most 16 tokens (so it
  cuts into a 64-token test), Llama-4's attention chunks to at most 128 tokens
  (the smallest vLLM's CPU attention runs; the proof's prompts outgrow it) and
  its NoPE temperature's floor_scale to at most 4.
* **Layers** — a subset of the original layers that keeps every kind of layer the
  spec has (attention type, linear attention included, x dense/MoE x KV-shared x
  explicitly dense) and, per
  attention type, one KV-sharing pair: the first dense layers (as many as keep the
  layer count aligned to the patterns' period, at least one, more where the dense
  head holds a kind no later layer has) and the shortest run of later layers that
  is aligned to the period and holds the rest; the first kept layer runs its own
  indexer. KV-sharing
  pairs, explicit dense-layer lists and explicit layer types are remapped to the
  kept layers; pattern fields are unchanged because the selection keeps each
  layer's position within the period.
"""

from __future__ import annotations

import math
from typing import Any

from onboard import components
from onboard.components.base import Component
from onboard.components.router import CPU_SQRTSOFTPLUS_EXPERTS, CPU_SQRTSOFTPLUS_TOP_K
from onboard.errors import InputError
from onboard.spec.model import ModelSpec
from onboard.spec.rules import check_rules

TINY_VOCAB = 512
TINY_MAX_POSITIONS = 2048
TINY_SLIDING_WINDOW = 16
TINY_WIDTH = 256  # hidden size where the spec does not tie it to heads x head_dim
TIED_MAX = 1024  # beyond it a tied hidden size gets TINY_WIDTH and an explicit head_dim
TINY_EXPERT_WIDTH = 64
# Schemes whose layers need expert widths in whole blocks or groups, and that
# multiple: fp8-block's 128 x 128 blocks (vLLM's validate_fp8_block_shape and
# validate_fp8_block_shape_moe refuse narrower partitions) and INT4's groups of
# 128 along the input (down_proj's input is the expert width; compressed-tensors
# and vLLM refuse a narrower one).
SCHEME_WIDTH_MULTIPLE = {"fp8-block": 128, "w4a16": 128, "w4a16-asym": 128}
TINY_Q_LORA_RANK = 128
MAX_KV_HEADS = 2
MAX_HEADS_PER_KV = 2
MAX_MHA_HEADS = 4
MLA_HEADS = 4
MAX_EXPERTS = 8
MAX_GROUPS = 4
MAX_TOP_K = 2
MAX_SHARED_EXPERTS = 2
MIN_LAYERS = 2


def shrink_spec(spec: ModelSpec) -> ModelSpec:
    """The seconds-sized copy of ``spec`` (same architecture; see module docstring)."""
    data = spec.model_dump(mode="python")
    data["vocab_size"] = TINY_VOCAB
    # Rope scaling keeps its parameters, so the context never drops below the
    # scaling's original length (transformers warns about such a config).
    scaling = spec.rope.scaling
    original = scaling.original_max_position_embeddings if scaling else None
    data["max_position_embeddings"] = max(
        min(spec.max_position_embeddings, TINY_MAX_POSITIONS), original or 0
    )
    att = data["attention"]
    if spec.attention.type == "mla":
        att["num_heads"] = min(spec.attention.num_heads, MLA_HEADS)
        mla = att["mla"]
        if mla["q_lora_rank"] is not None:
            mla["q_lora_rank"] = min(mla["q_lora_rank"], TINY_Q_LORA_RANK)
        data["hidden_size"] = TINY_WIDTH
    else:
        heads, kv, head_dim = spec.attention.num_heads, spec.num_kv_heads, spec.head_dim
        if kv == heads:  # MHA stays MHA
            new_kv = new_heads = min(heads, MAX_MHA_HEADS)
        else:  # GQA / MQA: keep a real group, at most two of them
            new_kv = min(kv, MAX_KV_HEADS)
            new_heads = new_kv * min(heads // kv, MAX_HEADS_PER_KV)
        att["num_heads"] = new_heads
        att["num_kv_heads"] = None if spec.attention.num_kv_heads is None else new_kv
        if spec.hidden_size == heads * head_dim and new_heads * head_dim <= TIED_MAX:
            # Families whose config has no head_dim derive it from the hidden size.
            data["hidden_size"] = new_heads * head_dim
        else:
            data["hidden_size"] = TINY_WIDTH
            att["head_dim"] = head_dim
        if att["sliding_window"] is not None:
            att["sliding_window"] = min(att["sliding_window"], TINY_SLIDING_WINDOW)

    for component in components.present(spec):
        component.shrink(_section(data, component))

    lin = spec.linear_attention
    if lin is not None:
        keys = min(lin.num_key_heads, MAX_KV_HEADS)
        data["linear_attention"]["num_key_heads"] = keys
        data["linear_attention"]["num_value_heads"] = keys * min(
            lin.num_value_heads // lin.num_key_heads, MAX_HEADS_PER_KV
        )

    mlp = data["mlp"]
    if mlp["intermediate_size"] is not None:
        mlp["intermediate_size"] = 2 * data["hidden_size"]
    if spec.mlp.moe is not None:
        _shrink_moe(spec, mlp["moe"])

    head, keep = _selection(spec)
    _remap_layers(spec, data, keep, head)
    tiny = ModelSpec.model_validate(data)

    problems = check_rules(tiny)
    if problems:  # a bug in this rule, not in the user's spec
        raise AssertionError(f"shrunk spec breaks the spec rules: {problems}")
    types, tiny_types = spec.layer_attention_types(), tiny.layer_attention_types()
    if [layer_kind(spec, i, set(keep), types) for i in keep] != [
        layer_kind(tiny, j, types=tiny_types) for j in range(tiny.num_hidden_layers)
    ]:
        raise AssertionError("shrunk spec does not keep the kept layers' kinds")
    return tiny


# A test that shrinks a real model keeps its tokenizer, so the vocabulary stays,
# and its rope tables, so the context length stays.
KEPT_BY_TINY_OVERRIDES = ("vocab_size", "max_position_embeddings")


def tiny_config_overrides(spec: ModelSpec) -> dict[str, Any]:
    """The config.json keys whose new values turn ``spec``'s full-size config into
    the shrunk spec's, vocabulary and context length excepted: what a test sets on
    the real model's config to get a random model of the same layer kinds."""
    from onboard.spec.hf import hf_config_from_spec, hf_text_config

    # A multimodal wrapper's: its text_config's keys.
    full = hf_text_config(hf_config_from_spec(spec))
    tiny = hf_text_config(hf_config_from_spec(shrink_spec(spec)))
    if set(full) != set(tiny):  # the rule keeps structure, so the same keys
        raise AssertionError(f"shrink changes the config keys: {set(full) ^ set(tiny)}")
    return {
        key: tiny[key]
        for key in sorted(full)
        if tiny[key] != full[key] and key not in KEPT_BY_TINY_OVERRIDES
    }


def _shrink_moe(spec: ModelSpec, moe: dict) -> None:
    src = spec.mlp.moe
    assert src is not None
    router = moe["router"]
    e, k = src.num_experts, src.num_experts_per_tok
    if src.router.num_groups is not None and src.router.topk_groups is not None:
        g, tg = src.router.num_groups, src.router.topk_groups
        new_g = min(g, MAX_GROUPS)
        # DeepSeek's grouped top-k scores a group by its two best experts, so keep
        # two experts per group where the spec has them.
        per_group = min(e // g, max(2, MAX_EXPERTS // new_g))
        new_e = new_g * per_group
        new_tg = new_g if tg >= g else min(max(1, round(new_g * tg / g)), new_g - 1)
        new_k = min(k, MAX_TOP_K, new_tg * per_group)
        router["num_groups"], router["topk_groups"] = new_g, new_tg
    elif (
        src.router.scoring == "sqrtsoftplus"
        and e in CPU_SQRTSOFTPLUS_EXPERTS
        and k in CPU_SQRTSOFTPLUS_TOP_K
    ):
        # vLLM's CPU kernel routes these shapes only: keep its smallest.
        new_e, new_k = CPU_SQRTSOFTPLUS_EXPERTS[0], CPU_SQRTSOFTPLUS_TOP_K[0]
    else:
        new_e = min(e, MAX_EXPERTS)
        new_k = new_e if k == e else min(k, MAX_TOP_K, new_e - 1)
    moe["num_experts"], moe["num_experts_per_tok"] = new_e, new_k
    # Whole blocks where the spec's own width is (where it is not, vLLM refuses
    # the full-size checkpoint too, and the tiny one should show it).
    width = max(
        [TINY_EXPERT_WIDTH]
        + [
            multiple
            for scheme in spec.quantization
            if (multiple := SCHEME_WIDTH_MULTIPLE.get(scheme))
            and src.expert_intermediate_size % multiple == 0
        ]
    )
    moe["expert_intermediate_size"] = width
    moe["num_shared_experts"] = min(src.num_shared_experts, MAX_SHARED_EXPERTS)
    if src.shared_expert_intermediate_size is not None:
        ratio = round(
            src.shared_expert_intermediate_size / src.expert_intermediate_size
        )
        moe["shared_expert_intermediate_size"] = width * max(1, ratio)


# ---- layer selection --------------------------------------------------------------


def layer_kind(
    spec: ModelSpec,
    i: int,
    kept: set[int] | None = None,
    types: list[str] | None = None,
) -> tuple[str, bool, bool, bool, bool, bool]:
    """What a layer is: attention type, MoE, reads another layer's KV, listed
    dense, rotates q and k, reuses an earlier indexer's top-k.

    With ``kept``, a layer reads another layer's KV only if its target is kept too
    (a shared layer whose target is dropped becomes an ordinary layer). ``types``
    is ``spec.layer_attention_types()``, passed in by callers that loop.
    """
    moe = spec.mlp.moe
    target = spec.attention.kv_sharing.get(i)
    return (
        (types or spec.layer_attention_types())[i],
        spec.is_moe_layer(i),
        target is not None and (kept is None or target in kept),
        moe is not None and i in moe.dense_layers,
        spec.uses_rope(i),
        spec.attention.indexer is not None
        and i in spec.attention.indexer.shared_layers,
    )


def _period(spec: ModelSpec) -> int:
    """Period of the formula-driven layer patterns (sliding pattern, MoE frequency)."""
    att = spec.attention
    sliding = att.sliding_window_pattern if att.layer_types is None else None
    freq = spec.mlp.moe.layer_frequency if spec.mlp.moe is not None else 1
    return math.lcm(sliding or 1, freq)


def _head_count(spec: ModelSpec, period: int) -> int:
    """Leading dense layers kept: at least one, congruent to first_k mod the period."""
    first_k = spec.mlp.moe.first_k_dense if spec.mlp.moe is not None else 0
    return 0 if first_k == 0 else (first_k - 1) % period + 1


def _head_counts(
    spec: ModelSpec, period: int, full: list[tuple], types: list[str]
) -> list[int]:
    """The head sizes worth trying: the smallest (:func:`_head_count`), and for
    each layer of the dense head whose kind or KV-sharing pair the smaller heads
    miss (a sharing layer, a shared-indexer layer sitting among the first_k
    dense layers), the smallest aligned head that holds it. Never more than
    first_k, so the kept head stays dense; a few sizes, not one per layer."""
    first_k = spec.mlp.moe.first_k_dense if spec.mlp.moe is not None else 0
    smallest = _head_count(spec, period)
    heads = [smallest]
    seen = {full[i] for i in range(smallest)}
    sharing = spec.attention.kv_sharing
    pairs = {types[i] for i in range(smallest) if i in sharing}
    for i in range(smallest, first_k):
        pair = i in sharing and types[i] not in pairs
        if full[i] in seen and not pair:
            continue
        seen.add(full[i])
        if pair:
            pairs.add(types[i])
        h = smallest + -(-(i + 1 - smallest) // period) * period
        if h <= first_k and h not in heads:
            heads.append(h)
    return heads


def select_layers(spec: ModelSpec) -> list[int]:
    """Original indices of the layers the tiny model keeps, in order."""
    return _selection(spec)[1]


def _selection(spec: ModelSpec) -> tuple[int, list[int]]:
    """The tiny model's dense head size and the original indices of its layers.

    The kept layers are the first ``h`` layers (``h`` from :func:`_head_counts`,
    congruent to first_k modulo the patterns' period) and a run ``[a, b]`` with
    ``a`` congruent to ``h`` modulo the period, so kept layer ``j`` sits where
    original layer ``keep[j]`` sat in every pattern and the pattern fields need no
    change. The run is the shortest (then the earliest) that keeps every layer
    kind and one KV-sharing pair per attention type. The first kept layer runs
    its own indexer (a shared-indexer layer reuses an earlier layer's top-k).
    """
    n = spec.num_hidden_layers
    period = _period(spec)
    first_k = spec.mlp.moe.first_k_dense if spec.mlp.moe is not None else 0
    types = spec.layer_attention_types()
    full = [layer_kind(spec, i, types=types) for i in range(n)]
    want_kinds = set(full)
    sharing = spec.attention.kv_sharing
    want_pair_types = {types[layer] for layer in sharing}
    shared_index = set(
        spec.attention.indexer.shared_layers if spec.attention.indexer else ()
    )
    need = min(MIN_LAYERS, n)

    best: list[int] | None = None
    best_head = _head_count(spec, period)
    for head in _head_counts(spec, period, full, types):

        def kind(i: int, a: int, head: int = head) -> tuple:
            # In a selection head + [a, b], a layer's target (always earlier) is
            # kept when it is a head layer or at least a: that does not depend on b.
            target = sharing.get(i)
            kept = target is not None and (target < head or target >= a)
            return full[i][:2] + (kept,) + full[i][3:]

        for a in range(max(first_k, head), n):
            if (a - head) % period or (head == 0 and a in shared_index):
                continue
            kinds = {kind(i, a) for i in range(head)}
            pair_types = {types[i] for i in range(head) if kind(i, a)[2]}
            size = head
            for b in range(a, n):
                size += 1
                if best is not None and size >= len(best):
                    break
                kinds.add(kind(b, a))
                if kind(b, a)[2]:
                    pair_types.add(types[b])
                if (
                    size >= need
                    and kinds == want_kinds
                    and pair_types == want_pair_types
                ):
                    best = list(range(head)) + list(range(a, b + 1))
                    best_head = head
                    break
    if best is None:  # no aligned run keeps everything: keep every layer
        return first_k, list(range(n))
    return best_head, best


def _section(data: dict[str, Any], component: Component) -> dict[str, Any]:
    """The dumped spec section ``component`` extends."""
    for key in (component.extends or "").split("."):
        data = data[key] if key else data
    return data


def _remap_layers(spec: ModelSpec, data: dict, keep: list[int], head: int) -> None:
    """Rewrite per-layer fields of ``data`` for the kept layers."""
    position = {orig: new for new, orig in enumerate(keep)}
    data["num_hidden_layers"] = len(keep)
    att = data["attention"]
    if att["layer_types"] is not None:
        att["layer_types"] = [spec.attention.layer_types[i] for i in keep]
    data["rope"]["nope_layers"] = [
        position[i] for i in spec.rope.nope_layers if i in position
    ]
    for component in components.present(spec):
        component.remap_layers(_section(data, component), position)
    moe = data["mlp"]["moe"]
    if moe is not None:
        if keep == list(range(spec.num_hidden_layers)):
            return
        moe["first_k_dense"] = head
        moe["dense_layers"] = [
            position[i] for i in moe["dense_layers"] if i in position
        ]


def check_shrinkable(spec: ModelSpec) -> None:
    """Refuse specs whose rules already fail (shrinking would hide the problem)."""
    problems = check_rules(spec)
    if problems:
        listed = "; ".join(f"{'.'.join(map(str, p))}: {m}" for p, m in problems)
        raise InputError(f"spec does not pass its rules: {listed}")
