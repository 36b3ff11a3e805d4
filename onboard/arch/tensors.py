"""The tensors of a checkpoint of a spec: names, shapes and how tiny checkpoints
initialise them (onboard.checkpoint.tiny), read from the architecture plan.

Every stage that needs a checkpoint's tensor list (tiny checkpoints, preflight,
weight sizes, the proof's name check) reads it here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from onboard import components
from onboard.arch.plan import (
    Layer,
    MoEMLP,
    build_plan,
)
from onboard.components import TensorPlan, dense_mlp, linear_attention
from onboard.components.dense_mlp import DenseMLP
from onboard.spec.layouts import gpt_oss_param
from onboard.spec.model import ModelSpec


def tensor_param(
    spec: ModelSpec, role: str, layer: int | None = None, expert: int | None = None
) -> str:
    """The module path of ``role`` at ``layer`` (and ``expert``)."""
    return spec.tensor_path(role).format(layer=layer, expert=expert)


def plan_tensors(spec: ModelSpec) -> list[TensorPlan]:
    """Every tensor of a checkpoint of ``spec`` (no shrinking here)."""
    h, v = spec.hidden_size, spec.vocab_size
    plans: list[TensorPlan] = []
    arch = build_plan(spec)

    def add(
        role: str,
        shape: tuple[int, ...],
        init: str = "normal",
        layer: int | None = None,
        expert: int | None = None,
        suffix: str = "weight",
    ) -> None:
        name = f"{tensor_param(spec, role, layer, expert)}.{suffix}"
        plans.append(TensorPlan(name, shape, init, layer))

    def norm(role: str, size: int, layer: int | None, init: str = "ones") -> None:
        add(role, (size,), _norm_init(spec, init), layer)
        if spec.norm.type == "layernorm" and spec.norm.bias:
            add(role, (size,), "bias", layer, suffix="bias")

    tied = spec.tie_word_embeddings
    head_norm = "head_norm" if tied else "ones"  # see the module docstring
    add("embed", (v, h))
    for layer in arch.layers:
        plans += _block(spec, layer, arch.fused)
    norm("final_norm", h, None, head_norm)
    if not spec.tie_word_embeddings:
        add("lm_head", (v, h), "head")

    if spec.mtp is not None:
        head_role = "embed" if spec.tie_word_embeddings else "lm_head"
        output_head = tensor_param(spec, head_role)
        for i in range(spec.mtp.num_heads):
            layer = spec.num_hidden_layers + i
            norm("mtp_enorm", h, layer)
            norm("mtp_hnorm", h, layer)
            add("mtp_eh_proj", (h, 2 * h), layer=layer)
            assert arch.mtp is not None
            plans += _block(spec, replace(arch.mtp.block, index=layer), arch.fused)
            norm("mtp_head_norm", h, layer, head_norm)
            # DeepSeek-V3 stores a copy of the shared output head per MTP layer.
            add("mtp_head", (v, h), f"copy:{output_head}.weight", layer)
    return plans


def _block(spec: ModelSpec, block: Layer, fused: frozenset[str]) -> list[TensorPlan]:
    """The tensors of one decoder block (attention, MLP and their norms);
    ``fused``: the projections the checkpoint stores as one tensor."""
    h = spec.hidden_size
    att = block.mixer
    layer = block.index
    out: list[TensorPlan] = []

    def add(
        role: str,
        shape: tuple[int, ...],
        init: str = "normal",
        expert: int | None = None,
        suffix: str = "weight",
    ) -> None:
        out.append(
            TensorPlan(
                f"{tensor_param(spec, role, layer, expert)}.{suffix}",
                shape,
                init,
                layer,
            )
        )

    def norm(role: str | None, size: int) -> None:
        if role is None:
            return
        add(role, (size,), _norm_init(spec, "ones"))
        if block.norms.has_bias:
            add(role, (size,), "bias", suffix="bias")

    def linear(
        role: str, out_f: int, in_f: int, bias: bool = False, expert: int | None = None
    ) -> None:
        add(role, (out_f, in_f), expert=expert)
        if bias:
            add(role, (out_f,), "bias", expert=expert, suffix="bias")

    stream = block.stream
    norm(stream.at("attention_input"), h)  # parallel: the one both read
    if att.linear:
        out += linear_attention.COMPONENT.tensors(spec, block)
    elif att.mla is not None:
        mla = att.mla
        assert mla is not None
        qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank is None:
            linear("q_proj", att.num_heads * qk_head, h)
        else:
            linear("q_a_proj", mla.q_lora_rank, h)
            add("q_a_norm", (mla.q_lora_rank,), _norm_init(spec, "ones"))
            linear("q_b_proj", att.num_heads * qk_head, mla.q_lora_rank)
        linear("kv_a_proj", mla.kv_lora_rank + mla.qk_rope_head_dim, h)
        add("kv_a_norm", (mla.kv_lora_rank,), _norm_init(spec, "ones"))
        linear(
            "kv_b_proj",
            att.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim),
            mla.kv_lora_rank,
        )
        linear("o_proj", h, att.num_heads * mla.v_head_dim, att.o_bias)
    else:
        hd, kv = att.head_dim, att.num_kv_heads
        assert hd is not None and kv is not None
        # Each head's query, then what a component adds (the output gate's).
        q_rows = att.num_heads * hd * att.query_slices
        if "qkv_proj" in fused:
            linear("qkv_proj", q_rows + 2 * kv * hd, h, att.qkv_bias)
        else:
            linear("q_proj", q_rows, h, att.qkv_bias)
            linear("k_proj", kv * hd, h, att.qkv_bias)
            linear("v_proj", kv * hd, h, att.qkv_bias)
        linear("o_proj", h, att.num_heads * hd, att.o_bias)
    if not att.linear:
        for component in components.present(spec, "attention"):
            out += component.tensors(spec, block)
    norm(stream.at("attention_output"), h)
    norm(stream.at("mlp_input"), h)

    m = block.mlp
    if isinstance(m, DenseMLP):
        out += dense_mlp.COMPONENT.tensors(spec, block)
    else:
        _moe_tensors(m, h, add, linear)
    norm(stream.at("mlp_output"), h)
    return out


def _norm_init(spec: ModelSpec, init: str) -> str:
    """A norm weight's init: a 1 + weight norm (Gemma) holds the scale less one."""
    if not spec.norm.unit_offset:
        return init
    return {"ones": "zeros", "head_norm": "head_norm+1"}[init]


def _moe_tensors(
    m: MoEMLP, h: int, add: Callable[..., None], linear: Callable[..., None]
) -> None:
    """The router's and the experts' tensors, made with _block's helpers."""
    linear("router", m.num_experts, h, m.router.bias)
    if m.router.bias_correction:
        shape = (1, m.num_experts) if m.router.bias_2d else (m.num_experts,)
        add("router_bias", shape, "router_bias", suffix="e_score_correction_bias")
    width = m.expert_intermediate_size
    if m.gpt_oss_format:
        _gpt_oss_expert_tensors(m, h, add)
    elif m.stacked:
        # All experts of the layer stacked; each expert's gate rows, then its up rows
        # (experts_format parameters: as parameters of one module).
        # (experts_format parameters_transposed: input dim first).
        for role, shape in (
            ("experts_gate_up_proj", (m.num_experts, 2 * width, h)),
            ("experts_down_proj", (m.num_experts, h, width)),
        ):
            if m.transposed:
                shape = (shape[0], shape[2], shape[1])
            if m.parameters_format:
                add(role, shape, suffix=gpt_oss_param(role))
            else:
                add(role, shape)
    else:
        for e in range(m.num_experts):
            linear("expert_gate_proj", width, h, expert=e)
            linear("expert_up_proj", width, h, expert=e)
            linear("expert_down_proj", h, width, expert=e)
    if m.num_shared_experts:
        shared = m.shared_intermediate_size
        if m.shared_fused:
            linear("shared_gate_up_proj", 2 * shared, h)
        else:
            linear("shared_gate_proj", shared, h)
            linear("shared_up_proj", shared, h)
        linear("shared_down_proj", h, shared)
        if m.shared_expert_gate:
            linear("shared_expert_gate", 1, h)


def _gpt_oss_expert_tensors(m: MoEMLP, h: int, add: Callable[..., None]) -> None:
    """Stacked experts as gpt-oss stores them (checkpoint.experts_format): one
    module whose parameters stack every expert, input dim first (gate_up
    [experts, hidden, 2 x width], its gate and up columns interleaved; down
    [experts, width, hidden])."""
    e, w = m.num_experts, m.expert_intermediate_size
    for role, shape, bias in (
        ("experts_gate_up_proj", (e, h, 2 * w), (e, 2 * w)),
        ("experts_down_proj", (e, w, h), (e, h)),
    ):
        add(role, shape, suffix=gpt_oss_param(role))
        if m.expert_bias:
            add(role, bias, "bias", suffix=gpt_oss_param(role, bias=True))
