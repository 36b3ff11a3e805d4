"""Chunked local attention (Llama-4's ``chunked_attention`` layers): the layers
that rotate attend only to the earlier tokens of their own chunk, the positions
cut into chunks of ``chunk_size`` from 0 (a query at position p sees keys at
positions floor(p / chunk_size) * chunk_size .. p); the NoPE layers attend to
the whole context.

vLLM runs such a layer as ``ChunkedLocalAttention`` (its KV cache keeps a chunk's
worth, ``ChunkedLocalAttentionSpec``), chosen per layer as its ``llama4.py``
does, by the layer's rope; the reference masks the keys outside the query's
chunk, as transformers' chunked causal mask. vLLM's CPU attention takes a chunk
that is a multiple of its 128-token KV block only. It has no tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from onboard.components.base import (
    INT32_MAX,
    Component,
    Report,
    Section,
    TargetReport,
)

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.spec.model import ModelSpec

# vLLM's CPU attention backend's KV block: a chunk must be a multiple of it
# ("attn_chunk_size ... is not divisible by block_size 128").
CPU_BLOCK = 128


class ChunkedAttentionFields(Section):
    chunk_size: int | None = Field(
        None,
        gt=0,
        le=INT32_MAX,
        description="Chunked local attention on the layers that rotate (Llama-4's "
        "chunked_attention layers, `attention_chunk_size`): positions are cut into "
        "chunks of this many tokens from 0, and a query attends only to the "
        "earlier tokens of its own chunk; the NoPE layers (rope.nope_layers) "
        "attend to the whole context. Null: none. vLLM's CPU attention runs a "
        "multiple of 128 only.",
    )


@dataclass(frozen=True)
class Chunked:
    """The chunk of the rope layers' local attention."""

    chunk_size: int


class _ChunkedAttention(Component):
    name = "chunked_attention"
    label = "chunked local attention"
    extends = "attention"
    Fields = ChunkedAttentionFields
    Node = Chunked
    field = "attention.chunk_size"
    concept = "attention_chunk_size"
    attributes = ("chunk",)
    vllm_slots = ("gqa.attn_class", "gqa.attn_kwargs")
    hf_slots = ("gqa.init", "gqa.bias")

    def shrink(self, section: dict[str, Any]) -> None:
        # The smallest chunk vLLM's CPU attention runs (the proof's prompts
        # outgrow it: onboard.reference.prove).
        section["chunk_size"] = min(section["chunk_size"], CPU_BLOCK)

    def cpu_engine_limit(self, spec: ModelSpec) -> str | None:
        # vLLM's CPU attention keeps 128-token KV blocks, and a chunk must be a
        # multiple of the block (vLLM 0.32).
        chunk = spec.attention.chunk_size
        if chunk is None or chunk % CPU_BLOCK == 0:
            return None
        return (
            f"the cpu engine cannot run chunks of {chunk}: vLLM's CPU attention "
            f"takes a multiple of its {CPU_BLOCK}-token KV block ('attn_chunk_size "
            f"{chunk} is not divisible by block_size {CPU_BLOCK}', "
            "vllm/v1/attention/backends/utils.py)"
        )

    def target_rules(
        self, spec: ModelSpec, gpus: list[str], report: TargetReport
    ) -> None:
        limit = self.cpu_engine_limit(spec)
        if limit is not None and "cpu" in spec.targets:
            report("warning", ("attention", "chunk_size"), limit)

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if not self.present(spec):
            return
        where = ("attention", "chunk_size")
        att = spec.attention
        if att.type != "gqa":
            report(where, "generated for GQA attention only")
        if att.sliding_window is not None:
            report(where, "not beside sliding windows (one local attention kind)")
        if att.kv_sharing:
            report(where, "not generated beside cross-layer KV sharing")
        if len(spec.rope.nope_layers) == spec.num_hidden_layers:
            report(where, "chunks the layers that rotate, and none does")

    def plan(self, spec: ModelSpec, layer: int | None) -> Chunked | None:
        size = spec.attention.chunk_size
        return None if size is None else Chunked(size)

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        kinds = get("layer_types", None)
        size = get("attention_chunk_size", None)
        if not isinstance(kinds, list) or "chunked_attention" not in kinds:
            return {}  # the chunk of no layer (transformers' Llama-4 needs it set)
        return {"chunk_size": size}

    def code_context(self, node: Chunked, keys: ConfigKeys) -> Mapping[str, Any]:
        return {"key": keys.need("attention_chunk_size", node.chunk_size)}

    def describe(self, node: Chunked) -> str:
        return "the rope layers attending within chunks"


COMPONENT = _ChunkedAttention()
