"""Small random checkpoints written by transformers itself (its own config and model
classes, ``save_pretrained``), for the families vLLM and transformers both ship.

Weights keep transformers' own initialisation (std 0.02, so sigmoid routers stay
unsaturated) except the output head, scaled so logits have a standard deviation of
about 8: greedy tokens are then decided by clear margins, not rounding noise.
"""

from __future__ import annotations

import json
from pathlib import Path

LOGIT_STD = 8.0


def _configs() -> dict:
    from transformers import (
        DeepseekV3Config,
        Exaone4Config,
        Gemma2Config,
        Gemma3TextConfig,
        GptOssConfig,
        GraniteConfig,
        GraniteMoeSharedConfig,
        LlamaConfig,
        MixtralConfig,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    common = dict(
        vocab_size=512, max_position_embeddings=512, tie_word_embeddings=False
    )
    # Granite's multipliers (granite-3.0-8b's; the softmax scale 1/head_dim).
    granite = dict(
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        logits_scaling=16.0,
        attention_multiplier=1 / 32,
    )
    return {
        "llama": LlamaConfig(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            **common,
        ),
        "qwen3": Qwen3Config(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
            },
            **common,
        ),
        # Post-norm blocks; without a sliding window every layer has rope.
        "exaone4": Exaone4Config(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            sliding_window=None,
            layer_types=["full_attention"] * 2,
            **common,
        ),
        # Sandwich norms scaling by 1 + weight, scaled embeddings, soft-caps,
        # query_pre_attn_scalar; a sliding and a full layer. Tied, as Gemma-2
        # ships: vLLM's in-tree Gemma2ForCausalLM has no lm_head ("no module or
        # parameter named 'lm_head'" on an untied checkpoint).
        "gemma2": Gemma2Config(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            sliding_window=16,
            query_pre_attn_scalar=64,
            **{**common, "tie_word_embeddings": True},
        ),
        # Gemma-3: q/k norms, and the sliding layer rotating with its own theta
        # (the full layer's scaled).
        "gemma3_text": Gemma3TextConfig(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {
                    "rope_type": "linear",
                    "rope_theta": 1000000.0,
                    "factor": 8.0,
                },
            },
            **common,
        ),
        "qwen3_moe": Qwen3MoeConfig(
            hidden_size=128,
            intermediate_size=256,
            moe_intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            mlp_only_layers=[0],
            decoder_sparse_step=1,
            **common,
        ),
        "mixtral": MixtralConfig(
            hidden_size=128,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_local_experts=8,
            num_experts_per_tok=2,
            **common,
        ),
        # The CPU MLA decode kernel needs kv_lora_rank 512 + qk_rope_head_dim 64.
        "deepseek_v3": DeepseekV3Config(
            hidden_size=256,
            intermediate_size=512,
            moe_intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=128,
            kv_lora_rank=512,
            qk_nope_head_dim=32,
            qk_rope_head_dim=64,
            v_head_dim=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            rope_interleave=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
            **common,
        ),
        # Sinks, sliding and full layers alternating (a window that cuts into the
        # prompts), yarn with an unrounded range, stacked experts with biases.
        "gpt_oss": GptOssConfig(
            hidden_size=128,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=8,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 64,
            },
            **common,
        ),
        "granite": GraniteConfig(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            **granite,
            **common,
        ),
        # Experts saved stacked, a fused shared expert beside the MoE block.
        "granitemoeshared": GraniteMoeSharedConfig(
            hidden_size=128,
            intermediate_size=64,
            shared_intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=8,
            num_experts_per_tok=2,
            **granite,
            **common,
        ),
    }


FAMILIES = (
    "llama",
    "qwen3",
    "exaone4",
    "gemma2",
    "gemma3_text",
    "qwen3_moe",
    "mixtral",
    "deepseek_v3",
    "gpt_oss",
    "granite",
    "granitemoeshared",
)
# Zero-initialised tensors that get values, so a dropped one shows: (name suffix,
# standard deviation). gpt-oss's sinks as large as the attention scores' spread.
RANDOMISED = (
    ("e_score_correction_bias", 0.05),
    ("self_attn.sinks", 1.0),
    ("_proj_bias", 0.02),
)


def write_hf_checkpoint(family: str, out_dir: Path, seed: int = 0) -> Path:
    """Write a tiny ``family`` checkpoint with transformers' save_pretrained."""
    import torch
    from transformers import AutoModelForCausalLM

    config = _configs()[family]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # Granite divides the logits by logits_scaling: the head makes up for it.
        std = LOGIT_STD * getattr(config, "logits_scaling", 1.0)
        model.lm_head.weight.normal_(0.0, std / config.hidden_size**0.5)
        # DeepSeek-V3's router bias correction starts at zero: values of the
        # order of the sigmoid scores' spread change choices. gpt-oss's expert
        # biases start at zero too.
        tensors = dict(model.named_buffers()) | dict(model.named_parameters())
        for name, tensor in tensors.items():
            for suffix, std in RANDOMISED:
                if name.endswith(suffix):
                    tensor.normal_(0.0, std)
    model.save_pretrained(out_dir)
    if family == "deepseek_v3":
        # transformers 5 writes neither topk_method nor scoring_func (its model
        # hard-codes both); vLLM's in-tree DeepSeek then builds no
        # e_score_correction_bias and routes by softmax (docs/vllm-cpu-notes.md). Say
        # both, as
        # a user would, so the in-tree baseline is the same model.
        path = Path(out_dir) / "config.json"
        cfg = json.loads(path.read_text())
        cfg["topk_method"] = "noaux_tc"
        cfg["scoring_func"] = "sigmoid"
        path.write_text(json.dumps(cfg, indent=2))
    return Path(out_dir)
