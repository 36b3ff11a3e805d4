"""Small checkpoints written by transformers' own classes, for the validate tests.

Random weights from transformers' initialisation (std 0.02), float32, with the output
head scaled up so that greedy decisions are decisive (a scaled head, not scaled
weights: a large init would saturate DeepSeek's sigmoid router, see
docs/vllm-cpu-notes.md), plus
a byte-level BPE tokenizer trained on the bundled prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HEAD_SCALE = 16.0
VOCAB = 512


def write_tokenizer(out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from onboard.runtime.prompts import PROMPTS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 16,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>"],
    )
    tok.train_from_iterator(PROMPTS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(out_dir)


def _save(model, out_dir: Path, config_patch: dict | None = None) -> Path:
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.save_pretrained(out_dir)
    if config_patch:
        path = out_dir / "config.json"
        config = json.loads(path.read_text())
        config.update(config_patch)
        path.write_text(json.dumps(config, indent=2))
    write_tokenizer(out_dir)
    return out_dir


def write_llama(out_dir: Path, seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )
    return _save(LlamaForCausalLM(config).float(), out_dir)


def write_deepseek_v3(out_dir: Path, seed: int = 0) -> Path:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    # The CPU MLA kernel needs kv_lora_rank=512 and qk_rope_head_dim=64
    # (docs/vllm-cpu-notes.md).
    config = DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=64,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        max_position_embeddings=512,
        num_mtp_layers=0,
        bos_token_id=0,
        eos_token_id=1,
    )
    # transformers 5 writes neither `topk_method` (without it vLLM builds no router
    # bias) nor `scoring_func` (vLLM then routes with softmax, transformers with
    # sigmoid: the accuracy check shows ~1 nat of difference).
    return _save(
        DeepseekV3ForCausalLM(config).float(),
        out_dir,
        config_patch={"topk_method": "noaux_tc", "scoring_func": "sigmoid"},
    )


def rename_tensors(src: Path, dst: Path, old: str, new: str) -> Path:
    """Copy a checkpoint with ``old`` replaced by ``new`` in every tensor name."""
    import shutil

    shutil.copytree(src, dst)
    for shard in dst.glob("*.safetensors"):
        tensors = load_file(shard)
        save_file(
            {k.replace(old, new): v for k, v in tensors.items()},
            shard,
            metadata={"format": "pt"},
        )
    index = dst / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"] = {
            k.replace(old, new): v for k, v in data["weight_map"].items()
        }
        index.write_text(json.dumps(data))
    return dst


LLAMA_SPEC = """\
name: tiny-llama
architecture: LlamaForCausalLM
model_type: llama
vocab_size: 512
hidden_size: 128
num_hidden_layers: 2
max_position_embeddings: 512
norm: {type: rmsnorm, eps: 1.0e-06}
attention: {type: gqa, num_heads: 4, num_kv_heads: 2, head_dim: 32}
rope: {theta: 10000.0}
mlp: {intermediate_size: 256}
checkpoint: {layout: llama}
"""

DEEPSEEK_V3_SPEC = """\
name: tiny-deepseek-v3
architecture: DeepseekV3ForCausalLM
model_type: deepseek_v3
vocab_size: 512
hidden_size: 128
num_hidden_layers: 2
max_position_embeddings: 512
norm: {type: rmsnorm, eps: 1.0e-06}
attention:
  type: mla
  num_heads: 2
  mla: {q_lora_rank: 64, kv_lora_rank: 512, qk_nope_head_dim: 32,
        qk_rope_head_dim: 64, v_head_dim: 32}
rope: {theta: 10000.0, interleaved: true}
mlp:
  intermediate_size: 256
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    num_shared_experts: 1
    first_k_dense: 1
    router: {scoring: sigmoid, norm_topk_prob: true, bias_correction: true,
             num_groups: 2, topk_groups: 1, routed_scaling_factor: 2.5}
checkpoint: {layout: deepseek}
"""

# The Llama checkpoint's q/k/v/o live under `self_attn`; this layout says `attn`.
WRONG_LAYOUT_SPEC = LLAMA_SPEC.replace(
    "checkpoint: {layout: llama}",
    """checkpoint:
  layout: llama
  tensor_names:
    q_proj: model.layers.{layer}.attn.q_proj
    k_proj: model.layers.{layer}.attn.k_proj
    v_proj: model.layers.{layer}.attn.v_proj
    o_proj: model.layers.{layer}.attn.o_proj""",
)


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
