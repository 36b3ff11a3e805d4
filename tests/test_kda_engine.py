"""Kimi delta attention on vLLM's CPU engine: the generated model of a KDA + gqa
hybrid against the float32 Hugging Face reference.

vLLM's KDA kernels are Triton-only, so on CPU the generated KDA layer runs the
Kimi delta rule in plain torch inside vLLM's state framework (its convolution
and recurrent states in the layer's hybrid-cache slots, by the attention
metadata). One engine start serves the module: its greedy outputs and prompt
logprobs match the reference by the accuracy check's rule, the reference of a
checkpoint with every A_log sign-flipped does not, and vLLM's cache report
holds the plan's state bytes per sequence. What this proves: the KDA math and
its state handling (prefill, decode, continued states) in the engine, beside
gqa attention, in float32; not vLLM's Triton kernels. KDA beside MLA (the
bundled kimi-k3-style) is run by test_kda_generate.
"""

from __future__ import annotations

import pytest
import torch
from conftest import generated_engine_run, judge_engine_outputs

from onboard.arch import build_plan
from onboard.serving.kv import kv_report
from onboard.spec.loader import parse_spec_text

# KDA layers and a gqa attention layer (head dims of 32 for vLLM's CPU
# attention), at the eps vLLM's KDA output norm uses; the tiny checkpoint keeps
# one layer of each kind.
KDA_GQA = """
name: kda-gqa
architecture: KdaGqaForCausalLM
model_type: kda_gqa
vocab_size: 256
hidden_size: 64
num_hidden_layers: 4
max_position_embeddings: 256
norm: {eps: 1.0e-5}
attention:
  num_heads: 4
  num_kv_heads: 2
  head_dim: 32
  layer_types: [linear_attention, linear_attention, linear_attention, full_attention]
linear_attention:
  type: kimi_delta
  num_key_heads: 2
  num_value_heads: 2
  key_head_dim: 32
  value_head_dim: 32
mlp:
  intermediate_size: 96
"""


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    """The tiny KDA + gqa checkpoint through the generated plugin on vLLM's CPU
    engine (float32): greedy outputs and prompt logprobs of the
    validation prompts, and the engine's cache report."""
    work = tmp_path_factory.mktemp("engine")
    # Every other validation prompt (8 to 23 tokens): the token loop of the CPU
    # path and the float32 reference both cost per token.
    return generated_engine_run(parse_spec_text(KDA_GQA), work, every=2)


@pytest.mark.engine
def test_engine_matches_the_reference_and_a_flipped_decay_does_not(engine_run):
    """The generated model (vLLM's KDA layer on its CPU path, gqa attention) on
    the CPU engine against the float32 reference, by the accuracy check's
    float32 rule, over six prompts and 16 decode steps each; the same engine
    outputs against the reference of the checkpoint with every A_log
    sign-flipped fail it."""
    from onboard.runtime.compare import PROMPT_LOGPROB_ATOL
    from onboard.runtime.engine import EngineOptions, engine_state_options
    from onboard.runtime.reference import load_reference

    spec, ckpt, work, prompts, info, outputs = engine_run
    assert info["model_class"].startswith("onboard_plugin_kda_gqa.")
    # The KDA CPU path is plain torch: float32, as the reference.
    assert EngineOptions(ckpt, None, **engine_state_options(spec)).dtype == "float32"
    ref = load_reference(ckpt, spec, work / "gen" / "hf", work / "ref")

    def verdict():
        return judge_engine_outputs(outputs, ref.model, prompts)

    good = verdict()
    assert good.passed, good.details
    assert good.metrics["prompt_logprob_max_abs_diff"] < 1e-3
    assert good.metrics["greedy_failed_sequences"] == 0

    # The reference of a checkpoint with every A_log sign-flipped (flipped in
    # place: the same weights as loading the edited checkpoint).
    flipped_tensors = [
        t for n, t in ref.model.named_parameters() if n.endswith("A_log")
    ]
    assert len(flipped_tensors) == sum(build_plan(spec).linear_layers) > 0
    with torch.no_grad():
        for tensor in flipped_tensors:
            tensor.neg_()
    flipped = verdict()
    assert not flipped.passed
    assert flipped.metrics["prompt_logprob_max_abs_diff"] > 10 * PROMPT_LOGPROB_ATOL


@pytest.mark.engine
def test_engine_state_accounting_equals_the_spec(engine_run):
    """vLLM's own cache report: each KDA layer's state (three convolutions'
    inputs and a [head_dim, head_dim] state per head, float32) and the attention
    layer's KV bytes per token equal the plan's arithmetic."""
    from onboard.validate.check_kv_cache import compare

    spec, *_, info, _ = engine_run
    plan = kv_report(spec, "float32", model_dtype="float32", state_dtype="float32")
    check = compare(info["kv_cache"], plan)
    assert check.status == "passed", check.details
    # Per KDA layer: the convolutions' last 3 inputs of 3 x (2 heads x 32)
    # channels and 2 heads' 32 x 32 states, float32.
    assert plan.state_bytes_per_sequence == 3 * 64 * 3 * 4 + 2 * 32 * 32 * 4
    assert check.metrics["state_bytes_per_sequence"] == plan.state_bytes_per_sequence
    layers = check.metrics["state_layers"]
    assert layers and {s["kind"] for s in layers} == {"kimi_delta"}
    assert all(s["engine_state_bytes"] == 10496 for s in layers)
