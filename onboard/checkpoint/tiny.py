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
spread, so the correction changes some choices); attention sinks ~ N(0, 1); a
linear-attention layer's convolution ~ N(0, 0.3^2) (a few taps, about PyTorch's
default), ``dt_bias`` 1 and ``A_log`` = log(U(1, 16)) per value head, so every
state forgets within a few tokens and a flipped sign changes the logits; the output
heads (``lm_head``,
MTP ``shared_head.head``) ~ N(0, (LOGIT_STD / sqrt(hidden))^2), so logits have a
standard deviation of about LOGIT_STD and the top-1/top-2 margin is usually above 1.

With tied embeddings the head *is* the embedding, and scaling it would make the
embedding dominate the residual stream: the model would mostly predict its input
token, whatever the blocks compute (measured on a tied Qwen3: median margin 127).
There the embedding stays at 0.02 and the norms in front of the head (the final
norm, MTP ``shared_head.norm``) carry the scale instead. A spec whose logits are
divided by ``logits_scaling`` (Granite) gets that factor on the scale as well.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from onboard.arch.tensors import TensorPlan, plan_tensors, tensor_param
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
# Attention scores of 0.02-std weights are near zero: a sink of this size takes a
# visible share of each softmax, so a sink that is lost or misapplied shows.
SINK_STD = 1.0
# A depthwise convolution of a few taps, about PyTorch's default initialisation.
CONV_STD = 0.3
LOGIT_STD = 10.0
# What a seconds-sized checkpoint may hold (bf16: 64 MB); see write_tiny_checkpoint.
TINY_MAX_PARAMS = 32_000_000
INDEX_FILE = "model.safetensors.index.json"


def _rng(seed: int, name: str) -> np.random.Generator:
    # One generator per tensor, keyed by name: values do not depend on the order
    # tensors are made in, nor on which other tensors exist.
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def init_tensor(
    plan: TensorPlan,
    seed: int,
    hidden_size: int,
    done: dict[str, np.ndarray],
    logits_scaling: float = 1.0,
) -> np.ndarray:
    logit_std = LOGIT_STD * logits_scaling  # before the division by logits_scaling
    if plan.init == "ones":
        return np.ones(plan.shape, dtype=np.float32)
    if plan.init == "zeros":  # a norm that scales by 1 + weight
        return np.zeros(plan.shape, dtype=np.float32)
    if plan.init in ("head_norm", "head_norm+1"):
        # Tied embeddings: the scale sits before the head (less the 1 a 1 + weight
        # norm adds).
        scale = logit_std / (WEIGHT_STD * math.sqrt(hidden_size))
        offset = 1.0 if plan.init == "head_norm+1" else 0.0
        return np.full(plan.shape, scale - offset, dtype=np.float32)
    if plan.init.startswith("copy:"):
        return done[plan.init.removeprefix("copy:")]
    if plan.init == "a_log":
        # Decay rates A in [1, 16] (transformers draws [0.01, 16]): each state
        # forgets within a few tokens, so a wrong sign or a dropped exp shows.
        rates = _rng(seed, plan.name).uniform(1.0, 16.0, plan.shape)
        return np.log(rates).astype(np.float32)
    std = {
        "normal": WEIGHT_STD,
        "conv": CONV_STD,
        "bias": BIAS_STD,
        "router_bias": ROUTER_BIAS_STD,
        "sinks": SINK_STD,
        "head": logit_std / math.sqrt(hidden_size),
    }[plan.init]
    return _rng(seed, plan.name).standard_normal(plan.shape, dtype=np.float32) * std


def make_tensors(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """All tensors of a (shrunk) spec's checkpoint, in float32."""
    done: dict[str, np.ndarray] = {}
    for plan in plan_tensors(spec):
        if plan.name in done:
            raise AssertionError(f"two roles map to the tensor name {plan.name}")
        done[plan.name] = init_tensor(
            plan, seed, spec.hidden_size, done, spec.logits_scaling
        )
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
    embed = f"{tensor_param(spec, 'embed')}.weight"
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
