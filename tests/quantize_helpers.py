"""Checkpoints for the quantize tests, written by transformers' own classes.

A DeepSeek-V3-style model (MLA with the 576-row kv_a_proj_with_mqa, MoE with a
shared expert and grouped sigmoid routing, one MTP layer) shrunk to seconds, and
the onboard spec that describes it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from onboard.spec import parse_spec_text

# The benchmark's checkpoint writer (a script, not part of the package).
_spec = importlib.util.spec_from_file_location(
    "make_checkpoint",
    Path(__file__).resolve().parents[1] / "benchmarks" / "make_checkpoint.py",
)
make_checkpoint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_checkpoint)
write_llama_checkpoint = make_checkpoint.write_llama_checkpoint

DSV3_SPEC = """\
name: tiny-deepseek-v3
architecture: DeepseekV3ForCausalLM
model_type: deepseek_v3
vocab_size: 512
hidden_size: 256
num_hidden_layers: 2
max_position_embeddings: 2048
norm: {type: rmsnorm, eps: 1.0e-06}
attention:
  type: mla
  num_heads: 4
  mla:
    q_lora_rank: 128
    kv_lora_rank: 512
    qk_nope_head_dim: 128
    qk_rope_head_dim: 64
    v_head_dim: 128
rope: {theta: 10000.0, interleaved: true}
mlp:
  intermediate_size: 512
  moe:
    num_experts: 8
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    num_shared_experts: 1
    first_k_dense: 1
    router:
      scoring: sigmoid
      norm_topk_prob: true
      bias_correction: true
      num_groups: 4
      topk_groups: 2
      routed_scaling_factor: 2.5
mtp: {num_heads: 1, mlp: moe}
checkpoint: {layout: deepseek}
"""


def dsv3_spec():
    return parse_spec_text(DSV3_SPEC, "tiny-deepseek-v3.yaml")


def dsv3_config(**overrides):
    from transformers import DeepseekV3Config

    kw = dict(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=128,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        max_position_embeddings=2048,
        rope_interleave=True,
        num_nextn_predict_layers=1,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    kw.update(overrides)
    config = DeepseekV3Config(**kw)
    # vLLM reads the router kind from here (transformers 5 no longer writes it).
    config.topk_method = "noaux_tc"
    config.scoring_func = "sigmoid"
    return config


def write_bundled_dsv3_checkpoint(out: Path, seed: int = 0) -> Path:
    """`onboard checkpoint tiny` of the bundled model_specs/deepseek-v3-style.yaml."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.spec import load_spec

    spec = load_spec(
        Path(__file__).resolve().parents[1] / "model_specs" / "deepseek-v3-style.yaml"
    )
    return write_tiny_checkpoint(spec, out, seed=seed)


def write_dsv3_checkpoint(
    out: Path, seed: int = 0, shard_size: str = "1MB", expert_width: int = 64
) -> Path:
    """save_pretrained of a random tiny DeepSeek-V3 (bf16, several shards) + MTP."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    from onboard.checkpoint.tokenizer import write_tokenizer

    torch.manual_seed(seed)
    config = dsv3_config(moe_intermediate_size=expert_width)
    model = DeepseekV3ForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        # Decisive logits (see docs/vllm-cpu-notes.md): scale the output head, not
        # every weight.
        model.lm_head.weight.mul_(8.0)
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.uniform_(-0.05, 0.05)
    model.save_pretrained(out, max_shard_size=shard_size)
    _add_mtp_layer(out, config, seed)
    # Same file layout as onboard's tiny checkpoints: spec and offline tokenizer.
    (out / "spec.yaml").write_text(
        DSV3_SPEC.replace(
            "expert_intermediate_size: 64", f"expert_intermediate_size: {expert_width}"
        )
    )
    write_tokenizer(out, config.vocab_size, config.max_position_embeddings)
    return out


def _add_mtp_layer(out: Path, config, seed: int) -> None:
    """Append layer N (the MTP head) as a shard of its own, as DeepSeek-V3 stores it."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed + 1)
    n = config.num_hidden_layers
    h = config.hidden_size
    index_path = out / "model.safetensors.index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
    else:
        from safetensors import safe_open

        with safe_open(out / "model.safetensors", "pt") as f:
            names = list(f.keys())
        index = {
            "metadata": {},
            "weight_map": dict.fromkeys(names, "model.safetensors"),
        }
    layer0 = {k: v for k, v in index["weight_map"].items() if ".layers.1." in k}
    from safetensors import safe_open

    tensors = {}
    for name, file in layer0.items():
        with safe_open(out / file, "pt") as f:
            t = f.get_tensor(name)
        new = name.replace(".layers.1.", f".layers.{n}.")
        if t.ndim == 2:
            t = (torch.randn(t.shape, generator=g) * 0.02).to(t.dtype)
        tensors[new] = t.clone()
    p = f"model.layers.{n}."
    tensors[p + "enorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    tensors[p + "hnorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    tensors[p + "eh_proj.weight"] = (torch.randn(h, 2 * h, generator=g) * 0.02).to(
        torch.bfloat16
    )
    tensors[p + "shared_head.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    tensors[p + "shared_head.head.weight"] = (
        torch.randn(config.vocab_size, h, generator=g) * 0.02
    ).to(torch.bfloat16)
    tensors[p + "embed_tokens.weight"] = (
        torch.randn(config.vocab_size, h, generator=g) * 0.02
    ).to(torch.bfloat16)
    file = "model-mtp.safetensors"
    save_file(tensors, out / file, metadata={"format": "pt"})
    index["weight_map"].update(dict.fromkeys(tensors, file))
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True))
