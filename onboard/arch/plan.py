"""The typed architecture plan and the one function that builds it from a spec.

Every per-layer decision is made here once: each layer's token mixer (attention
kind and parameters, sliding window, KV-sharing source), its MLP (dense, or MoE
with its router) and its norms; the MTP heads' block; and the map between the
spec's checkpoint tensor names and the canonical (Llama / DeepSeek) names. The
objects are frozen: a consumer reads them, it never adjusts them.

A token mixer is one of the ``Mixer`` kinds: softmax attention (``Attention``, GQA
or MLA), which caches keys and values per token, or a linear-attention mixer
(``GatedDeltaNet``, ``KimiDeltaAttention``), which keeps a fixed-size recurrent
state per sequence. Each layer carries its own. Sparse MLA is MLA with a
``LightningIndexer`` (the indexer component's plan node): the index heads pick
the cached tokens each query attends to, and the layer also caches one index key
per token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from onboard.arch.config_keys import ConfigKeys
from onboard.components import (
    dense_mlp,
    linear_attention,
    present,
    residual_stream,
    router,
)
from onboard.components import norms as norms_component
from onboard.components.dense_mlp import DenseMLP
from onboard.components.indexer import LightningIndexer
from onboard.components.kv_sharing import KVSource
from onboard.components.linear_attention import (
    GatedDeltaNet,
    KimiDeltaAttention,
    LinearMixer,
)
from onboard.components.norms import Norms
from onboard.components.residual_stream import ResidualStream
from onboard.components.router import Router
from onboard.spec.layouts import LAYOUT_PRESETS
from onboard.spec.model import ModelSpec, RopeScaling
from onboard.spec.module_tree import (
    gpt_oss_experts,
    parameter_experts,
    transposed_experts,
    used_roles,
)
from onboard.templating import GenerationError

T = TypeVar("T")

# The names vLLM's own model files use (Llama / DeepSeek): generated modules are
# built under these, and a checkpoint that names a role otherwise is renamed.
CANONICAL: Mapping[str, str] = MappingProxyType(dict(LAYOUT_PRESETS["llama"]))


@dataclass(frozen=True)
class Rotary:
    """The model's rotary embedding, beyond what each layer's own rope says
    (``Attention.rope``, ``rope_theta``, ``rope_scaling``): what both models'
    code prints once for the whole model."""

    # Rotates interleaved pairs (GPT-J, DeepSeek's MLA), not halves (NeoX).
    interleaved: bool
    # The full-attention layers' scaling (the MTP blocks' too) and, where the
    # sliding layers have a rope of their own (Gemma-3), theirs.
    scaling: RopeScaling | None
    sliding_scaling: RopeScaling | None
    sliding_own: bool
    # MLA's partial rotary factor is a share of the whole q/k head (Mistral-4),
    # not of qk_rope_head_dim.
    whole_head: bool

    @property
    def yarn(self) -> bool:
        return self.scaling is not None and self.scaling.type == "yarn"


@dataclass(frozen=True)
class MLADims:
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    # The latent norms' eps where it is not the model's (GLM-5's 1e-6).
    latent_norm_eps: float | None = None

    @property
    def latent(self) -> int:
        """Entries of the one latent an MLA layer caches per token."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class Attention:
    """Softmax attention over the layer's own KV cache or another layer's."""

    kind: Literal["gqa", "mla"]
    num_heads: int
    num_kv_heads: int | None  # None: MLA (one latent, no KV heads)
    head_dim: int | None  # None: MLA (per-part dims in ``mla``)
    window: int | None  # sliding window in tokens; None: full attention
    rope: bool  # False: no rotary embedding in this layer (NoPE)
    rope_theta: float  # this layer's rotary base (Gemma-3: per layer kind)
    rope_scaling: str | None  # this layer's rope scaling kind; None: plain rope
    qkv_bias: bool
    o_bias: bool
    partial_rotary_factor: float
    mla: MLADims | None
    # head_dim-wide row slices per query head in q_proj: the query, then a
    # component's (the output gate's).
    query_slices: int = 1
    # Mistral-4's position-dependent query scaling (attention.llama_4_scaling).
    llama_4_scaling: bool = False
    # The plan nodes of the components this attention has (onboard.components),
    # in registry order; read one by its type with part().
    parts: tuple[Any, ...] = ()

    linear = False  # caches K/V per token, not a recurrent state

    def part(self, kind: type[T]) -> T | None:
        """This attention's plan node of type ``kind`` (None: it has none)."""
        return next((p for p in self.parts if isinstance(p, kind)), None)

    @property
    def indexer(self) -> LightningIndexer | None:
        """Sparse MLA: the indexer that picks the keys each query attends to."""
        return self.part(LightningIndexer)

    @property
    def kv_source(self) -> int | None:
        """The earlier layer whose KV cache this one reads (None: its own)."""
        source = self.part(KVSource)
        return None if source is None else source.layer

    @property
    def sliding(self) -> bool:
        return self.window is not None


Mixer = Attention | LinearMixer


@dataclass(frozen=True)
class MoEMLP:
    num_experts: int
    num_experts_per_tok: int
    expert_intermediate_size: int
    num_shared_experts: int
    shared_intermediate_size: int  # 0 without shared experts
    shared_expert_gate: bool
    router: Router
    # checkpoint.fused: the routed experts stacked in two 3-D tensors (`experts`),
    # the shared expert's gate and up in one (`shared_gate_up_proj`).
    stacked: bool = False
    shared_fused: bool = False
    # Biases on the experts' projections (gpt-oss).
    expert_bias: bool = False
    # (alpha, limit) of the clamped SwiGLU the experts use instead of the
    # activation (gpt-oss); None: act(gate) * up.
    clamped_swiglu: tuple[float, float] | None = None
    # The stacked experts as gpt-oss stores them (checkpoint.experts_format):
    # input dim first, gate and up columns interleaved.
    gpt_oss_format: bool = False
    # Stacked as `stacked`, as parameters of one module named after the roles
    # (checkpoint.experts_format parameters: Mistral-4).
    parameters_format: bool = False
    # ... input dim first (checkpoint.experts_format parameters_transposed:
    # Llama-4).
    transposed: bool = False

    kind = "moe"

    def part(self, kind: type[T]) -> T | None:
        """The block's plan node of type ``kind`` (its router)."""
        return self.router if isinstance(self.router, kind) else None


MLP = DenseMLP | MoEMLP


@dataclass(frozen=True)
class Layer:
    """One decoder layer: its token mixer, its MLP, the norms around them and how
    their outputs join the residual stream."""

    index: int
    mixer: Mixer
    mlp: MLP
    norms: Norms
    stream: ResidualStream

    @property
    def is_moe(self) -> bool:
        return isinstance(self.mlp, MoEMLP)


@dataclass(frozen=True)
class MTPPlan:
    """The multi-token-prediction heads: head ``i`` is checkpoint layer
    ``first_layer + i``, each a full-attention block with its own KV cache."""

    num_heads: int
    first_layer: int
    block: Layer  # index: first_layer (each head has the same shape)


@dataclass(frozen=True)
class TensorNames:
    """Checkpoint module paths of the roles the model has, and their canonical
    names (paths use ``{layer}`` and ``{expert}``)."""

    checkpoint: Mapping[str, str]
    canonical: Mapping[str, str]

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self.checkpoint)

    def checkpoint_name(
        self, role: str, layer: int | None = None, expert: int | None = None
    ) -> str:
        return self.checkpoint[role].format(layer=layer, expert=expert)

    @property
    def renamed(self) -> tuple[str, ...]:
        """Roles whose checkpoint path differs from the canonical one."""
        return tuple(r for r, p in self.checkpoint.items() if p != self.canonical[r])


@dataclass(frozen=True)
class ArchPlan:
    spec: ModelSpec
    layers: tuple[Layer, ...]
    mtp: MTPPlan | None
    tensors: TensorNames
    rope: Rotary
    # The plan nodes of the model-wide components (host "model"), in registry
    # order; read one by its type with part().
    parts: tuple[Any, ...] = ()

    def part(self, kind: type[T]) -> T | None:
        """The model's plan node of type ``kind`` (None: it has none)."""
        return next((p for p in self.parts if isinstance(p, kind)), None)

    @cached_property
    def config(self) -> ConfigKeys:
        """The config.json onboard writes for the spec, and the key it uses for
        each concept: both generated files read their settings under these keys.
        Built on first use (writing the config may load transformers' class)."""
        return ConfigKeys(self.spec)

    @property
    def fused(self) -> frozenset[str]:
        """The projections the checkpoint stores as one tensor (``qkv_proj``,
        ``gate_up_proj``, ``shared_gate_up_proj``, and ``experts`` stacked;
        checkpoint.fused)."""
        return frozenset(self.spec.checkpoint.fused)

    @property
    def has_moe(self) -> bool:
        return any(layer.is_moe for layer in self._blocks)

    @property
    def has_dense(self) -> bool:
        """Some block (a decoder layer or the MTP block) has the dense MLP."""
        return any(not layer.is_moe for layer in self._blocks)

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        return tuple(layer.is_moe for layer in self.layers)

    @property
    def attention_types(self) -> tuple[str, ...]:
        """Per layer, as configs spell it: full_attention / sliding_attention /
        linear_attention."""
        return tuple(
            "linear_attention"
            if layer.mixer.linear
            else "sliding_attention"
            if layer.mixer.sliding
            else "full_attention"
            for layer in self.layers
        )

    @property
    def rope_layers(self) -> tuple[bool | None, ...]:
        """Per decoder layer: whether its attention rotates q and k (None: a
        linear-attention layer, which has no positions to encode)."""
        return tuple(
            None if layer.mixer.linear else layer.mixer.rope for layer in self.layers
        )

    @property
    def nope(self) -> bool:
        """Some attention layer uses no rotary embedding."""
        return False in self.rope_layers

    @property
    def linear_layers(self) -> tuple[bool, ...]:
        """Per decoder layer: whether its mixer is linear attention."""
        return tuple(layer.mixer.linear for layer in self.layers)

    @property
    def linear(self) -> LinearMixer | None:
        """The linear-attention mixer of the layers that have one (None: every
        layer is softmax attention)."""
        return next(
            (
                b.mixer
                for b in self.layers
                if isinstance(b.mixer, (GatedDeltaNet, KimiDeltaAttention))
            ),
            None,
        )

    @property
    def layer_prefix(self) -> str:
        """The checkpoint path the decoder layers sit under (``model.layers.``)."""
        norm = self.layers[0].stream.roles[0]
        return self.tensors.checkpoint[norm].split("{layer}")[0]

    @property
    def _blocks(self) -> tuple[Layer, ...]:
        return self.layers + ((self.mtp.block,) if self.mtp else ())

    @property
    def attention(self) -> Attention:
        """The attention every attention block shares, without the per-layer
        sliding window, KV source and rope (kind, heads, dims: one for the whole
        model; the full-attention layers' rope; linear-attention layers have their
        own mixer, ``linear``)."""
        first = next(b.mixer for b in self._blocks if isinstance(b.mixer, Attention))
        theta, scaling = self.spec.rope.theta, self.rope.scaling
        return replace(
            first,
            window=None,
            parts=tuple(p for p in first.parts if not isinstance(p, KVSource)),
            rope=True,
            rope_theta=theta,
            rope_scaling=scaling.type if scaling else None,
        )

    @property
    def dense(self) -> DenseMLP | None:
        """The dense MLP of the blocks that have one (None: every block is MoE)."""
        return next((b.mlp for b in self._blocks if isinstance(b.mlp, DenseMLP)), None)

    @property
    def moe(self) -> MoEMLP | None:
        """The MoE MLP of the blocks that have one (None: no MoE block)."""
        return next((b.mlp for b in self._blocks if isinstance(b.mlp, MoEMLP)), None)

    @property
    def norms(self) -> Norms:
        """The norms every block shares (kind, eps, bias, scaling)."""
        return self.layers[0].norms

    @property
    def kv_sources(self) -> Mapping[int, int]:
        """Decoder layer -> the earlier layer whose KV cache it reads."""
        return {
            layer.index: layer.mixer.kv_source
            for layer in self.layers
            if layer.mixer.kv_source is not None
        }

    @property
    def shared_index_layers(self) -> tuple[int, ...]:
        """Decoder layers that run no indexer of their own and reuse the nearest
        earlier one's top-k (GLM-5)."""
        return tuple(
            layer.index
            for layer in self.layers
            if isinstance(layer.mixer, Attention)
            and layer.mixer.indexer is not None
            and not layer.mixer.indexer.own
        )

    @property
    def checkpoint_layers(self) -> int:
        """Layers the checkpoint numbers: the decoder's, then the MTP heads'."""
        return len(self.layers) + (self.mtp.num_heads if self.mtp else 0)

    def rope_by_kind(self, rope_parameters: object) -> bool:
        """Whether a config's rope_parameters are keyed by layer type (Gemma-3,
        OLMo-3). Each attention layer then reads its kind's, which must be the
        layer's rope in the plan (a GenerationError naming the kind otherwise)."""
        params = rope_parameters
        if not (
            isinstance(params, dict)
            and params
            and all(isinstance(v, dict) for v in params.values())
        ):
            return False
        for layer in self.layers:
            if layer.mixer.linear:  # a linear-attention layer has no rope
                continue
            kind = "sliding_attention" if layer.mixer.sliding else "full_attention"
            rope = params.get(kind) or {}
            scaling = rope.get("rope_type", "default")
            if (rope.get("rope_theta"), None if scaling == "default" else scaling) != (
                layer.mixer.rope_theta,
                layer.mixer.rope_scaling,
            ):
                raise GenerationError(
                    f"{self.spec.name}: the config's rope_parameters.{kind} is not "
                    f"the rope of layer {layer.index} in the spec"
                )
        return True

    def layout_path(self, role: str) -> str:
        """Checkpoint module path of any role of the layout, one the model lacks
        included (to name the tensors a checkpoint should not have)."""
        return self.tensors.checkpoint.get(role) or self.spec.tensor_path(role)


def build_plan(spec: ModelSpec) -> ArchPlan:
    """The plan of a spec that passed `spec check` (its rules hold)."""
    types = spec.layer_attention_types()
    norms = norms_component.COMPONENT.plan(spec, None)
    dense = dense_mlp.COMPONENT.plan(spec, None)
    moe = _moe_mlp(spec)

    def mlp(is_moe: bool) -> MLP:
        chosen = moe if is_moe else dense
        assert chosen is not None, "spec rules guarantee the MLP a layer needs"
        return chosen

    linear = linear_attention.COMPONENT.plan(spec, None)

    def mixer(i: int) -> Mixer:
        if types[i] == "linear_attention":
            assert linear is not None, "spec rules guarantee the section"
            return linear
        return _attention(spec, types[i] == "sliding_attention", i)

    layers = tuple(
        Layer(
            index=i,
            mixer=mixer(i),
            mlp=mlp(spec.is_moe_layer(i)),
            norms=norms,
            stream=residual_stream.COMPONENT.plan(spec, i),
        )
        for i in range(spec.num_hidden_layers)
    )
    mtp = None
    if spec.mtp is not None:
        first = spec.num_hidden_layers
        block = Layer(
            index=first,
            mixer=_attention(spec, False, None),
            mlp=mlp(spec.mtp.mlp == "moe"),
            norms=norms,
            stream=residual_stream.COMPONENT.plan(spec, None),
        )
        mtp = MTPPlan(num_heads=spec.mtp.num_heads, first_layer=first, block=block)
    roles = used_roles(spec)
    tensors = TensorNames(
        checkpoint=MappingProxyType({r: spec.tensor_path(r) for r in roles}),
        canonical=MappingProxyType({r: CANONICAL[r] for r in roles}),
    )
    return ArchPlan(
        spec=spec,
        layers=layers,
        mtp=mtp,
        tensors=tensors,
        rope=Rotary(
            interleaved=spec.rope.interleaved,
            scaling=spec.rope.scaling,
            sliding_scaling=spec.rope.sliding.scaling if spec.rope.sliding else None,
            sliding_own=spec.rope.sliding is not None,
            whole_head=spec.mla_whole_head_rope,
        ),
        parts=tuple(
            node
            for c in present(spec, "model")
            if c.Node is not None and (node := c.plan(spec, None)) is not None
        ),
    )


def _attention(spec: ModelSpec, sliding: bool, layer: int | None) -> Attention:
    att = spec.attention
    mla = att.mla
    theta, scaling = spec.layer_rope(spec.num_hidden_layers if layer is None else layer)
    return Attention(
        kind=att.type,
        num_heads=att.num_heads,
        num_kv_heads=None if att.type == "mla" else spec.num_kv_heads,
        head_dim=None if att.type == "mla" else spec.head_dim,
        window=att.sliding_window if sliding else None,
        rope=layer is None or spec.uses_rope(layer),
        rope_theta=theta,
        rope_scaling=scaling.type if scaling else None,
        qkv_bias=att.qkv_bias,
        o_bias=att.o_bias,
        partial_rotary_factor=att.partial_rotary_factor,
        query_slices=1 + sum(c.q_slices for c in present(spec, "attention")),
        parts=tuple(
            node
            for component in present(spec, "attention")
            if (node := component.plan(spec, layer)) is not None
        ),
        mla=None
        if mla is None
        else MLADims(
            q_lora_rank=mla.q_lora_rank,
            kv_lora_rank=mla.kv_lora_rank,
            qk_nope_head_dim=mla.qk_nope_head_dim,
            qk_rope_head_dim=mla.qk_rope_head_dim,
            v_head_dim=mla.v_head_dim,
            latent_norm_eps=mla.latent_norm_eps,
        ),
        llama_4_scaling=att.llama_4_scaling is not None,
    )


def _moe_mlp(spec: ModelSpec) -> MoEMLP | None:
    moe = spec.mlp.moe
    if moe is None:
        return None
    return MoEMLP(
        num_experts=moe.num_experts,
        num_experts_per_tok=moe.num_experts_per_tok,
        expert_intermediate_size=moe.expert_intermediate_size,
        num_shared_experts=moe.num_shared_experts,
        shared_intermediate_size=spec.shared_expert_intermediate_size,
        shared_expert_gate=moe.shared_expert_gate,
        router=router.COMPONENT.plan(spec, None),
        stacked="experts" in spec.checkpoint.fused,
        shared_fused="shared_gate_up_proj" in spec.checkpoint.fused,
        expert_bias=moe.expert_bias,
        clamped_swiglu=None
        if moe.swiglu_alpha is None or moe.swiglu_limit is None
        else (moe.swiglu_alpha, moe.swiglu_limit),
        gpt_oss_format=gpt_oss_experts(spec),
        parameters_format=parameter_experts(spec),
        transposed=transposed_experts(spec),
    )
