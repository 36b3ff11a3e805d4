"""Tiny random checkpoints in the spec's own tensor-name layout.

``write_tiny_checkpoint`` shrinks the spec (:mod:`onboard.spec.shrink`) and
writes, atomically: ``spec.yaml``, ``config.json``, ``generation_config.json``,
safetensors shards split by layer with ``model.safetensors.index.json``, and a
byte-level BPE tokenizer. Every file is a function of (spec, seed): each tensor
draws from its own generator seeded by (seed, tensor name).

Initialisation (see docs/vllm-cpu-notes.md: decisive logits without saturated routers):
linear
weights ~ N(0, 0.02); norm weights 1; biases ~ N(0, 0.02); the router's
``e_score_correction_bias`` ~ N(0, 0.05) (of the order of the sigmoid scores'
spread, so the correction changes some choices); the output heads (``lm_head``,
MTP ``shared_head.head``) ~ N(0, (LOGIT_STD / sqrt(hidden))^2), so logits have a
standard deviation of about LOGIT_STD and the top-1/top-2 margin is usually above 1.

With tied embeddings the head *is* the embedding, and scaling it would make the
embedding dominate the residual stream: the model would mostly predict its input
token, whatever the blocks compute (measured on a tied Qwen3: median margin 127).
There the embedding stays at 0.02 and the norms in front of the head (the final
norm, MTP ``shared_head.norm``) carry the scale instead.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from onboard.arch import DenseMLP, Layer, MoEMLP, build_plan
from onboard.checkpoint import safetensors_io
from onboard.checkpoint.tokenizer import BOS_ID, EOS_ID, PAD_ID, write_tokenizer
from onboard.errors import InputError
from onboard.fsutil import atomic_directory
from onboard.spec.loader import dump_spec
from onboard.spec.model import ModelSpec
from onboard.spec.shrink import check_shrinkable, shrink_spec

WEIGHT_STD = 0.02
BIAS_STD = 0.02
ROUTER_BIAS_STD = 0.05
LOGIT_STD = 10.0
# What a seconds-sized checkpoint may hold (bf16: 64 MB); see write_tiny_checkpoint.
TINY_MAX_PARAMS = 32_000_000
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorPlan:
    """One checkpoint tensor: its name, shape and how it is initialised.

    ``init`` is ``normal`` (std ``WEIGHT_STD``), ``ones``, ``bias``,
    ``router_bias``, ``head`` (scaled output head), ``head_norm`` (a norm carrying
    the head's scale, tied embeddings) or ``copy:<name>`` (same values as another
    tensor, e.g. MTP heads sharing the output head).
    """

    name: str
    shape: tuple[int, ...]
    init: str
    layer: int | None  # decoder layer (MTP heads count on), None for global tensors


def _param(
    spec: ModelSpec, role: str, layer: int | None = None, expert: int | None = None
) -> str:
    return spec.tensor_path(role).format(layer=layer, expert=expert)


def plan_tensors(spec: ModelSpec) -> list[TensorPlan]:
    """Every tensor of a checkpoint of ``spec`` (no shrinking here)."""
    h, v = spec.hidden_size, spec.vocab_size
    plans: list[TensorPlan] = []

    def add(
        role: str,
        shape: tuple[int, ...],
        init: str = "normal",
        layer: int | None = None,
        expert: int | None = None,
        suffix: str = "weight",
    ) -> None:
        name = f"{_param(spec, role, layer, expert)}.{suffix}"
        plans.append(TensorPlan(name, shape, init, layer))

    def norm(role: str, size: int, layer: int | None, init: str = "ones") -> None:
        add(role, (size,), init, layer)
        if spec.norm.type == "layernorm":
            add(role, (size,), "bias", layer, suffix="bias")

    tied = spec.tie_word_embeddings
    head_norm = "head_norm" if tied else "ones"  # see the module docstring
    add("embed", (v, h))
    arch = build_plan(spec)
    for layer in arch.layers:
        plans += _block(spec, layer)
    norm("final_norm", h, None, head_norm)
    if not spec.tie_word_embeddings:
        add("lm_head", (v, h), "head")

    if spec.mtp is not None:
        head_role = "embed" if spec.tie_word_embeddings else "lm_head"
        output_head = _param(spec, head_role)
        for i in range(spec.mtp.num_heads):
            layer = spec.num_hidden_layers + i
            norm("mtp_enorm", h, layer)
            norm("mtp_hnorm", h, layer)
            add("mtp_eh_proj", (h, 2 * h), layer=layer)
            assert arch.mtp is not None
            plans += _block(spec, replace(arch.mtp.block, index=layer))
            norm("mtp_head_norm", h, layer, head_norm)
            # DeepSeek-V3 stores a copy of the shared output head per MTP layer.
            add("mtp_head", (v, h), f"copy:{output_head}.weight", layer)
    return plans


def _block(spec: ModelSpec, block: Layer) -> list[TensorPlan]:
    """The tensors of one decoder block (attention, MLP and their norms)."""
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
                f"{_param(spec, role, layer, expert)}.{suffix}", shape, init, layer
            )
        )

    def norm(role: str, size: int) -> None:
        add(role, (size,), "ones")
        if block.norms.kind == "layernorm":
            add(role, (size,), "bias", suffix="bias")

    def linear(
        role: str, out_f: int, in_f: int, bias: bool = False, expert: int | None = None
    ) -> None:
        add(role, (out_f, in_f), expert=expert)
        if bias:
            add(role, (out_f,), "bias", expert=expert, suffix="bias")

    attention_norm, mlp_norm = block.norms.roles
    if block.norms.placement == "pre":
        norm(attention_norm, h)
    if att.mla is not None:
        mla = att.mla
        assert mla is not None
        qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank is None:
            linear("q_proj", att.num_heads * qk_head, h)
        else:
            linear("q_a_proj", mla.q_lora_rank, h)
            add("q_a_norm", (mla.q_lora_rank,), "ones")
            linear("q_b_proj", att.num_heads * qk_head, mla.q_lora_rank)
        linear("kv_a_proj", mla.kv_lora_rank + mla.qk_rope_head_dim, h)
        add("kv_a_norm", (mla.kv_lora_rank,), "ones")
        linear(
            "kv_b_proj",
            att.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim),
            mla.kv_lora_rank,
        )
        linear("o_proj", h, att.num_heads * mla.v_head_dim, att.o_bias)
    else:
        hd, kv = att.head_dim, att.num_kv_heads
        assert hd is not None and kv is not None
        linear("q_proj", att.num_heads * hd, h, att.qkv_bias)
        linear("k_proj", kv * hd, h, att.qkv_bias)
        linear("v_proj", kv * hd, h, att.qkv_bias)
        linear("o_proj", h, att.num_heads * hd, att.o_bias)
        if att.qk_norm:
            add("q_norm", (hd,), "ones")
            add("k_norm", (hd,), "ones")
    # pre: the MLP's input norm; post: attention's output norm (same place).
    norm(mlp_norm if block.norms.placement == "pre" else attention_norm, h)

    m = block.mlp
    if isinstance(m, DenseMLP):
        inter = m.intermediate_size
        linear("gate_proj", inter, h)
        linear("up_proj", inter, h)
        linear("down_proj", h, inter)
    else:
        _moe_tensors(m, h, add, linear)
    if block.norms.placement == "post":
        norm(mlp_norm, h)
    return out


def _moe_tensors(
    m: MoEMLP, h: int, add: Callable[..., None], linear: Callable[..., None]
) -> None:
    """The router's and the experts' tensors, made with _block's helpers."""
    add("router", (m.num_experts, h))
    if m.router.bias_correction:
        add("router", (m.num_experts,), "router_bias", suffix="e_score_correction_bias")
    for e in range(m.num_experts):
        linear("expert_gate_proj", m.expert_intermediate_size, h, expert=e)
        linear("expert_up_proj", m.expert_intermediate_size, h, expert=e)
        linear("expert_down_proj", h, m.expert_intermediate_size, expert=e)
    if m.num_shared_experts:
        shared = m.shared_intermediate_size
        linear("shared_gate_proj", shared, h)
        linear("shared_up_proj", shared, h)
        linear("shared_down_proj", h, shared)
        if m.shared_expert_gate:
            linear("shared_expert_gate", 1, h)


def _rng(seed: int, name: str) -> np.random.Generator:
    # One generator per tensor, keyed by name: values do not depend on the order
    # tensors are made in, nor on which other tensors exist.
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def init_tensor(
    plan: TensorPlan, seed: int, hidden_size: int, done: dict[str, np.ndarray]
) -> np.ndarray:
    if plan.init == "ones":
        return np.ones(plan.shape, dtype=np.float32)
    if plan.init == "head_norm":  # tied embeddings: the scale sits before the head
        scale = LOGIT_STD / (WEIGHT_STD * math.sqrt(hidden_size))
        return np.full(plan.shape, scale, dtype=np.float32)
    if plan.init.startswith("copy:"):
        return done[plan.init.removeprefix("copy:")]
    std = {
        "normal": WEIGHT_STD,
        "bias": BIAS_STD,
        "router_bias": ROUTER_BIAS_STD,
        "head": LOGIT_STD / math.sqrt(hidden_size),
    }[plan.init]
    return _rng(seed, plan.name).standard_normal(plan.shape, dtype=np.float32) * std


def make_tensors(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """All tensors of a (shrunk) spec's checkpoint, in float32."""
    done: dict[str, np.ndarray] = {}
    for plan in plan_tensors(spec):
        if plan.name in done:
            raise AssertionError(f"two roles map to the tensor name {plan.name}")
        done[plan.name] = init_tensor(plan, seed, spec.hidden_size, done)
    return done


def _shards(spec: ModelSpec, plans: list[TensorPlan]) -> list[list[str]]:
    """Tensor names per shard: split by layer into (at most) two halves.

    Global tensors before the layers (the embedding) go with the first half, the
    final norm / output head and the MTP layers with the second, as large
    checkpoints do.
    """
    total_layers = spec.num_hidden_layers + (spec.mtp.num_heads if spec.mtp else 0)
    if total_layers < 2:
        return [[p.name for p in plans]]
    split = (total_layers + 1) // 2
    embed = f"{_param(spec, 'embed')}.weight"
    first = [
        p.name
        for p in plans
        if p.name == embed or (p.layer is not None and p.layer < split)
    ]
    chosen = set(first)
    return [first, [p.name for p in plans if p.name not in chosen]]


def write_tiny_checkpoint(
    spec: ModelSpec,
    out_dir: Path,
    seed: int = 0,
    dtype: str = "bfloat16",
    *,
    finish: Callable[[Path, ModelSpec], None] | None = None,
) -> Path:
    """Shrink ``spec`` and write its random checkpoint to ``out_dir`` (atomically).

    ``finish(directory, tiny_spec)`` runs on the complete files before the
    directory appears: the callers that train MTP heads pass
    :func:`onboard.speculators.mtp_train.head_trainer` (a step of the speculators
    layer, which this one does not import). Returns ``out_dir``. Same arguments ->
    byte-identical files.
    """
    from onboard.spec.hf import hf_config_from_spec

    if dtype not in safetensors_io.DTYPES:
        raise InputError(f"--dtype: choose one of {', '.join(safetensors_io.DTYPES)}")
    if seed < 0 or seed >= 2**63:
        raise InputError(f"--seed must be in [0, 2**63), got {seed}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a directory")
    check_shrinkable(spec)
    tiny = shrink_spec(spec)

    config = dict(hf_config_from_spec(tiny))
    # Token ids belong to the tokenizer, not the spec.
    config.update(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    config["dtype"] = dtype
    generation_config = {
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "do_sample": False,
    }

    plans = plan_tensors(tiny)
    params = sum(math.prod(p.shape) for p in plans)
    if params > TINY_MAX_PARAMS:
        # Kept dims (head_dim, the MLA latent) or a long layer period make it big.
        raise InputError(
            f"the tiny copy of {spec.name} would have {params / 1e6:.0f}M parameters "
            f"({tiny.num_hidden_layers} layers of hidden size {tiny.hidden_size}), "
            f"more than the {TINY_MAX_PARAMS // 10**6}M of a seconds-sized test: "
            "the layer patterns' period and the dims kernels constrain (head_dim, "
            "the MLA ranks) are kept as they are (docs/checkpoints.md)"
        )
    tensors = make_tensors(tiny, seed)
    shards = _shards(tiny, plans)
    try:
        with atomic_directory(out_dir) as tmp:
            _write_files(tmp, tiny, config, generation_config, tensors, shards, dtype)
            if finish is not None:
                finish(tmp, tiny)
    except OSError as exc:  # unwritable place, full disk: the user's to fix
        raise InputError(f"{out_dir}: cannot write the checkpoint: {exc}") from None
    return out_dir


def _write_files(
    tmp: Path,
    tiny: ModelSpec,
    config: dict,
    generation_config: dict,
    tensors: dict[str, np.ndarray],
    shards: list[list[str]],
    dtype: str,
) -> None:
    (tmp / "spec.yaml").write_text(dump_spec(tiny), encoding="utf-8")
    _write_json(tmp / "config.json", config)
    _write_json(tmp / "generation_config.json", generation_config)
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        total += safetensors_io.save_file(
            {n: tensors[n] for n in names}, tmp / file, dtype
        )
        weight_map.update(dict.fromkeys(names, file))
    _write_json(
        tmp / INDEX_FILE,
        {
            "metadata": {"total_size": total},
            "weight_map": dict(sorted(weight_map.items())),
        },
    )
    write_tokenizer(tmp, tiny.vocab_size, tiny.max_position_embeddings)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
