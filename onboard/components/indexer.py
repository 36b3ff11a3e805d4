"""Sparse MLA's lightning indexer (DeepSeek Sparse Attention: DeepSeek-V3.2,
GLM-5): per layer, index heads score every cached token and MLA attends only to
the top-k of them; GLM-5's shared layers run none and reuse the nearest earlier
layer's picks.

vLLM builds it from its own parts (``SparseAttnIndexer``, the FP8 index-key
cache ``DeepseekV32IndexerCache``: ``vllm/model_executor/models/deepseek_v2.py``);
its fragments (``templates/components/indexer/``) print at the MLA component's
slots and the model's. config.json states it as DeepSeek-V3.2's
``index_n_heads``, ``index_head_dim``, ``index_topk`` and GLM-5's
``indexer_rope_interleave`` and ``indexer_types``.

The indexer's section takes no fields from other components.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from onboard.components.base import (
    Component,
    ConfigProblem,
    HeadCount,
    HeadDim,
    LayerIndex,
    Report,
    Role,
    Section,
    TargetReport,
    TensorPlan,
)
from onboard.errors import printable

if TYPE_CHECKING:
    from onboard.arch.plan import Layer
    from onboard.spec.model import ModelSpec

# The indexer's top-k (docs/spec.md, "Limits"): the released sparse-MLA models
# pick 2048 tokens; the generated model allocates max_num_batched_tokens x
# index_topk int32 for the picks, so a typo of 2**31 - 1 would ask for terabytes.
MAX_INDEX_TOPK = 16384
# The tiny copy of a spec (onboard.spec.shrink): at most this many index heads,
# and a top-k below a 64-token test context, so the choice shows; the CPU engine
# runs the model dense within it (prompt + generated <= top-k).
TINY_INDEX_HEADS = 4
TINY_INDEX_TOPK = 32
# The vLLM indexer quantizes each index query to FP8 in groups of this many dims
# (per_token_group_quant_fp8) and asserts whole groups on a GPU.
INDEX_QUANT_BLOCK = 128

_I = "attention.indexer."


class Indexer(Section):
    """The lightning indexer of sparse MLA (DeepSeek Sparse Attention: DeepSeek-V3.2,
    GLM-5): per layer, index heads score every cached token and MLA attends only to
    the top-k of them.

    Fixed by the families, not fields: the index query is projected from MLA's
    normalised query latent (`wq_b`), the one index key from the hidden state
    (`wk`) through a LayerNorm with bias (`k_norm`, eps 1e-6); rope turns the
    first qk_rope_head_dim dims of each; a token's score is the sum over heads of
    weight x relu(q.k / sqrt(head_dim)), the per-head weights projected from the
    hidden state (`weights_proj`) and scaled by num_heads**-0.5."""

    num_heads: HeadCount = Field(description="Index heads (`index_n_heads`).")
    head_dim: HeadDim = Field(
        description="Dims of each index head and of the index key "
        "(`index_head_dim`); the first qk_rope_head_dim of them rotate. A "
        f"multiple of {INDEX_QUANT_BLOCK} for a GPU target (vLLM's indexer "
        f"quantizes the index queries to FP8 in groups of {INDEX_QUANT_BLOCK} "
        "dims; `spec check` refuses other dims beside a GPU target)."
    )
    topk: Annotated[int, Field(gt=0, le=MAX_INDEX_TOPK)] = Field(
        description="Tokens each query attends to (`index_topk`); a context no "
        "longer than it attends densely. The generated model keeps a buffer of "
        "that many token ids per batched token."
    )
    rope_interleave: bool = Field(
        False,
        description="The index rope rotates interleaved pairs (GLM-5) instead of "
        "NeoX halves (DeepSeek-V3.2); MLA's own rope follows rope.interleaved.",
    )
    shared_layers: list[LayerIndex] = Field(
        default_factory=list,
        description="Layers that run no indexer of their own and attend to the "
        "tokens the nearest earlier indexer picked (GLM's `indexer_types` "
        "`shared`), each once, in increasing order; layer 0 always runs its own.",
    )


class IndexerFields(Section):
    indexer: Indexer | None = Field(
        None,
        description="Sparse MLA: the lightning indexer that picks the tokens each "
        "query attends to (needs MLA with a q_lora_rank); null: dense attention.",
    )


@dataclass(frozen=True)
class LightningIndexer:
    """The indexer of one MLA layer: index heads score the cached tokens and MLA
    attends only to the ``topk`` best of them."""

    num_heads: int
    head_dim: int  # of each index head and of the one index key per token
    topk: int
    rope_interleave: bool  # the index rope's pairs: interleaved (GLM-5) or halves
    # False: the layer runs no indexer and reuses the nearest earlier one's top-k.
    own: bool = True

    @property
    def cache_bytes_per_token(self) -> int:
        """Bytes one token's index key takes in vLLM's indexer cache
        (DeepseekV32IndexerCache): FP8, one byte per dim, and a float32 scale
        per block of INDEX_QUANT_BLOCK dims."""
        return self.head_dim + self.head_dim // INDEX_QUANT_BLOCK * 4


def _role(module: str, **kw: Any) -> Role:
    # All kept in 16 bits (the quant check's "indexer" guard): the scores pick
    # which tokens MLA sees, a discrete choice that a rounding error flips;
    # transformers keeps weights_proj in float32 and vLLM fuses wk with
    # weights_proj into one layer. vLLM replicates the indexer on every rank.
    return Role(
        f"model.layers.{{layer}}.self_attn.indexer.{module}",
        ("attn", "indexer"),
        guard="indexer",
        **kw,
    )


_KEPT = {"kept": True, "group": "indexer (replicated)", "shard": "replicated"}

CONCEPTS = {
    "index_n_heads": "num_heads",
    "index_head_dim": "head_dim",
    "index_topk": "topk",
    "indexer_rope_interleave": "rope_interleave",
    # GLM-5: per layer, "full" runs the indexer, "shared" reuses the previous
    # one's picks.
    "indexer_types": "shared_layers",
}


class _Indexer(Component):
    name = "indexer"
    label = "a lightning indexer"
    extends = "attention"
    Fields = IndexerFields
    Node = LightningIndexer
    concept_fields = {concept: (_I + f,) for concept, f in CONCEPTS.items()}
    roles = {
        "indexer_wq_b": _role(
            "wq_b",
            dims=(f"{_I}num_heads × {_I}head_dim", "attention.mla.q_lora_rank"),
            **_KEPT,
        ),
        "indexer_wk": _role("wk", dims=(f"{_I}head_dim", "hidden_size"), **_KEPT),
        # A LayerNorm with bias, whatever norm.type says.
        "indexer_k_norm": _role(
            "k_norm",
            linear=False,
            dims=(f"{_I}head_dim",),
            group="norms",
            shard="replicated",
        ),  # fmt: skip
        "indexer_weights_proj": _role(
            "weights_proj", dims=(f"{_I}num_heads", "hidden_size"), **_KEPT
        ),
    }

    # Its module class and its place in MLA's __init__, the top-k buffers of the
    # model and of the MTP heads; the reference's module class.
    vllm_slots = (
        "mla.classes",
        "mla.after_rope",
        "model.topk_buffer",
        "mtp.topk_buffer",
    )
    hf_slots = ("modeling.classes",)

    def present(self, spec: ModelSpec) -> bool:
        return spec.attention.indexer is not None

    def plan(self, spec: ModelSpec, layer: int | None) -> LightningIndexer:
        idx = spec.attention.indexer
        assert idx is not None
        return LightningIndexer(
            num_heads=idx.num_heads,
            head_dim=idx.head_dim,
            topk=idx.topk,
            rope_interleave=idx.rope_interleave,
            # An MTP head's block (layer None) runs an indexer of its own.
            own=layer not in idx.shared_layers,
        )

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        idx = spec.attention.indexer
        assert idx is not None
        out: dict[str, Any] = {
            "index_n_heads": idx.num_heads,
            "index_head_dim": idx.head_dim,
            "index_topk": idx.topk,
            "indexer_rope_interleave": idx.rope_interleave,
        }
        if idx.shared_layers:  # written only where some layer shares, as GLM's
            out["indexer_types"] = [  # class defaults it
                "shared" if i in idx.shared_layers else "full"
                for i in range(spec.num_hidden_layers)
            ]
        return out

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        # Every key is read (marked understood) before any is refused.
        topk, shared = get("index_topk", None), get("indexer_types", None)
        sizes = {k: get(k, None) for k in ("index_n_heads", "index_head_dim")}
        interleave = bool(get("indexer_rope_interleave", False))
        if topk is None:
            stray = [k for k, v in sizes.items() if v is not None]
            if stray or shared is not None:
                names = ", ".join(stray or ["indexer_types"])
                raise ConfigProblem(f"{names}: set but index_topk is not")
            return {}
        for concept, value in sizes.items():
            if value is None:
                raise ConfigProblem(
                    f"{concept}: required for the indexer (index_topk is set)"
                )
        fields = {
            "num_heads": sizes["index_n_heads"],
            "head_dim": sizes["index_head_dim"],
            "topk": topk,
            "rope_interleave": interleave,
        }
        if shared is not None:
            fields["shared_layers"] = _shared_layers(
                shared, get("num_hidden_layers", 0)
            )
        return {"indexer": fields}

    def rules(self, spec: ModelSpec, report: Report) -> None:
        att, idx = spec.attention, spec.attention.indexer
        if idx is None:
            return
        where: tuple[str, ...] = ("attention", "indexer")
        if att.type != "mla" or att.mla is None:
            report(
                where, "the indexer selects tokens for MLA: it needs attention.type mla"
            )
            return
        if att.mla.q_lora_rank is None:
            # The index queries are projected from MLA's query latent.
            report(
                where, "the indexer needs attention.mla.q_lora_rank (a query latent)"
            )
        if idx.head_dim < att.mla.qk_rope_head_dim:
            report(
                (*where, "head_dim"),
                f"must be at least attention.mla.qk_rope_head_dim "
                f"({att.mla.qk_rope_head_dim}): rope turns that many of its dims",
            )
        if spec.linear_attention is not None:
            report(
                where, "an indexer beside linear-attention layers is not expressible"
            )
        if spec.rope.nope_layers:
            # The index rope turns what MLA's rope turns; no family skips it.
            report(
                where,
                "an indexer beside NoPE layers (rope.nope_layers) is not expressible",
            )
        shared = idx.shared_layers
        if len(set(shared)) != len(shared) or shared != sorted(shared):
            report(
                (*where, "shared_layers"), "list each layer once, in increasing order"
            )
        for layer in sorted(set(shared)):
            if layer == 0 or layer >= spec.num_hidden_layers:
                report(
                    (*where, "shared_layers"),
                    f"layer {layer}: a shared layer reuses an earlier layer's top-k, "
                    f"so it is one of layers 1..{spec.num_hidden_layers - 1}",
                )
        if spec.mtp is not None and idx.shared_layers:
            # An MTP head runs an indexer of its own (DeepSeek-V3.2's, vLLM's
            # deepseek_mtp); beside GLM's shared layers its kind has no config entry.
            report(
                (*where, "shared_layers"),
                "MTP heads beside shared indexer layers are not expressible yet",
            )

    def shrink(self, section: dict[str, Any]) -> None:
        idx = section["indexer"]
        idx["num_heads"] = min(idx["num_heads"], TINY_INDEX_HEADS)
        idx["topk"] = min(idx["topk"], TINY_INDEX_TOPK)

    def remap_layers(
        self, section: dict[str, Any], position: Mapping[int, int]
    ) -> None:
        idx = section["indexer"]
        idx["shared_layers"] = [
            position[i] for i in idx["shared_layers"] if i in position
        ]

    def target_rules(
        self, spec: ModelSpec, gpus: list[str], report: TargetReport
    ) -> None:
        idx = spec.attention.indexer
        assert idx is not None
        if idx.head_dim % INDEX_QUANT_BLOCK == 0:
            return
        report(
            "error" if gpus else "warning",
            ("attention", "indexer", "head_dim"),
            f"head_dim {idx.head_dim} is not a multiple of {INDEX_QUANT_BLOCK}: "
            "vLLM's indexer quantizes the index queries to FP8 in groups of "
            f"{INDEX_QUANT_BLOCK} dims and asserts whole groups"
            + (
                f", so {', '.join(gpus)} cannot run it"
                if gpus
                else " on a GPU (the cpu engine runs the model densely)"
            ),
        )

    def tensors(self, spec: ModelSpec, layer: Layer) -> list[TensorPlan]:
        idx, mla = layer.mixer.part(LightningIndexer), layer.mixer.mla
        if idx is None or not idx.own or mla is None or mla.q_lora_rank is None:
            return []
        h, i = spec.hidden_size, layer.index

        def name(role: str) -> str:
            return self.tensor_name(spec, role, i)

        return [
            TensorPlan(
                f"{name('indexer_wq_b')}.weight",
                (idx.num_heads * idx.head_dim, mla.q_lora_rank),
                "normal",
                i,
            ),
            TensorPlan(f"{name('indexer_wk')}.weight", (idx.head_dim, h), "normal", i),
            TensorPlan(f"{name('indexer_k_norm')}.weight", (idx.head_dim,), "ones", i),
            TensorPlan(f"{name('indexer_k_norm')}.bias", (idx.head_dim,), "bias", i),
            TensorPlan(
                f"{name('indexer_weights_proj')}.weight",
                (idx.num_heads, h),
                "normal",
                i,
            ),
        ]


def _shared_layers(kinds: Any, num_layers: Any) -> list[int]:
    """GLM's ``indexer_types`` as the layers that reuse an earlier layer's picks."""
    if (
        not isinstance(kinds, list)
        or not all(isinstance(k, str) for k in kinds)
        or set(kinds) - {"full", "shared"}
        or len(kinds) != num_layers
        or kinds[:1] == ["shared"]
    ):
        raise ConfigProblem(
            f"indexer_types={printable(repr(kinds), 120)}: must list full or "
            f"shared for each of the {num_layers} layers, the first full"
        )
    return [i for i, kind in enumerate(kinds) if kind == "shared"]


COMPONENT = _Indexer()
