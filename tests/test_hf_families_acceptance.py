"""Acceptance: the path of scripts/hf_families.py, family by family.

For each family its config class's defaults are shrunk, the spec is inferred and
proven against transformers (`spec from-hf`), the vLLM model, plugin and reference
are generated, and `onboard validate --checks accuracy` runs the generated model on
the CPU engine against transformers, on a checkpoint transformers wrote itself
(a few minutes per family: make test-all only). `make test` proves these families
and more in tests/test_prove.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from hf_families import run_one  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.acceptance]

# One of each part the proof finds or the config states: whole-projection and
# after-rope q/k norms, post-norm blocks, NoPE layers, sliding windows, shared and
# gated experts, sigmoid routing with a bias, interleaved rope, o_proj without bias,
# the router's bias on the MoE block (with NoPE full-attention layers the proof
# finds) and on a module of its own as [1, num_experts] beside softmax scores,
# MLA DeepSeek checkpoints exactly as transformers writes them (no scoring_func or
# topk_method, V2's null n_group); fused q/k/v and gate/up tensors, parallel blocks
# with weight-only LayerNorms and scaled logits, interleaved partial rope;
# Gemma's sandwich and 1 + weight norms, scaled embeddings, soft-caps and its
# softmax scale, and a rope per layer kind; GLM-4's sandwich norms under its own
# names; Granite's multipliers and its experts saved stacked (with a fused
# shared expert); attention sinks with stacked, biased experts; Gated DeltaNet
# layers with grouped (Qwen3-Next) and split (Qwen3.5) projections beside gated
# attention and 1 + weight norms (the CPU engine runs them in bfloat16); the
# multimodal wrappers around the Qwen3.5 ones and Gemma-3's, served text-only
# from a checkpoint with its vision tower (model.language_model.*, model.visual.*;
# Gemma-3's language_model.model.*, vision_tower, multi_modal_projector).
FAMILIES = (
    "gemma2",
    "gemma3_text",
    "olmoe",
    "olmo2",
    "hunyuan_v1_dense",
    "smollm3",
    "exaone4",
    "glm4_moe",
    "qwen2_moe",
    "dots1",
    "seed_oss",
    "ernie4_5",
    "exaone_moe",
    "ernie4_5_moe",
    "deepseek_v2",
    "deepseek_v3",
    "phi3",
    "cohere2",
    "glm",
    "glm4",
    "granite",
    "granitemoeshared",
    "gpt_oss",
    "qwen3_next",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "qwen3_5",
    "qwen3_5_moe",
    "gemma3",
    "deepseek_v32",
    "glm_moe_dsa",
    "mistral4",
)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_family_is_proven_and_validated_on_the_engine(model_type, tmp_path):
    row = run_one(model_type, validate=True, work=tmp_path)
    assert row.status == "proven and validated", row.detail
