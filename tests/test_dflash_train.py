"""The DFlash trainer offline (no engine; tests/test_dflash_engine.py serves the
draft): the files are the speculators format vLLM reads, the saved draft loads
back as the same module, and the prior drafts exactly the "repeat the bonus
token" rule on validation prompts, scored as vLLM drafts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import dense_tiny

from onboard.speculators import dflash_train
from onboard.speculators.heads import load_head_config
from onboard.speculators.mtp_train import decoded_walk

ROOT = Path(__file__).resolve().parents[1]
K = 3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dflash-train")
    ckpt, tiny = dense_tiny(tmp)
    report = dflash_train.train_dflash_draft(
        tiny,
        ckpt,
        tmp / "draft",
        num_speculative_tokens=K,
        budget_s=0.0,
        num_prompts=64,
        untrained_dir=tmp / "untrained",
    )
    return tmp, tiny, report


def test_speculators_format_as_vllm_reads_it(trained):
    from safetensors.torch import load_file

    tmp, tiny, _ = trained
    data = json.loads((tmp / "draft" / "config.json").read_text())
    config = load_head_config(data)
    assert config.speculators_model_type == "dflash"
    assert config.block_size == K + 1 and config.mask_token_id == tiny.vocab_size - 1
    assert config.aux_hidden_state_layer_ids == [1, 2]
    # vLLM maps sliding_window_non_causal false to a causal block (the trainer's).
    assert config.sliding_window_non_causal is False
    layer = data["transformer_layer_config"]
    assert layer["num_hidden_layers"] == dflash_train.TINY_LAYERS
    assert len(layer["layer_types"]) == dflash_train.TINY_LAYERS
    names = set(load_file(tmp / "draft" / "model.safetensors"))
    per_layer = {
        f"layers.{i}.{n}.weight"
        for i in range(dflash_train.TINY_LAYERS)
        for n in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "self_attn.q_norm",
            "self_attn.k_norm",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "input_layernorm",
            "post_attention_layernorm",
        )
    }
    top = {
        "fc.weight",
        "hidden_norm.weight",
        "norm.weight",
        "embed_tokens.weight",
        "lm_head.weight",
    }
    assert names == per_layer | top


def test_saved_draft_loads_back(trained):
    tmp, _, _ = trained
    draft, _ = dflash_train.load_draft(tmp / "draft")
    again, _ = dflash_train.load_draft(tmp / "draft")
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, 500, (2, 24), generator=gen)
    aux = torch.randn(2, 24, 2 * 512, generator=gen)
    with torch.no_grad():
        a = draft(aux, tokens, [8, 12, 16], K)
        b = again(aux, tokens, [8, 12, 16], K)
    assert torch.equal(a, b)
    exported = draft.export()
    from safetensors.torch import load_file

    saved = load_file(tmp / "draft" / "model.safetensors")
    for name, tensor in saved.items():
        assert torch.equal(exported[name], tensor.float()), name


def test_prior_at_least_repeats(trained):
    _, _, report = trained
    kept = report["validation_decoded_kept"]
    assert report["kept_step"] == 0 and report["steps"] == 0
    # The ideal "repeat the bonus token" rule on the same validation sequences:
    # the first layer alone is that rule (the induction weight 0 is one of the
    # choices), so the prior drafts at least as well, and it accepts drafts.
    rule = report["validation_repeat_rule"]
    assert kept["mean_acceptance_length"] >= rule["mean_acceptance_length"]
    assert kept["mean_acceptance_length"] > 1.2
    assert report["induction_weight"] in dflash_train.INDUCTION_WEIGHTS


def test_repeat_layer_alone_is_the_repeat_rule(trained, tmp_path):
    # With the second layer's vote at zero, the draft is exactly the rule.
    from onboard.speculators.eagle3 import collect_data
    from onboard.speculators.heads import aux_layer_ids

    tmp, tiny, _ = trained
    draft, _ = dflash_train.load_draft(tmp / "draft")
    with torch.no_grad():
        draft.layers[1].o_proj.weight.zero_()
    from transformers import AutoTokenizer

    from onboard.runtime.reference import load_reference

    model = load_reference(tmp / "tiny", tiny, None, tmp_path).model
    aux = aux_layer_ids(tiny.num_hidden_layers)
    data = collect_data(
        model, AutoTokenizer.from_pretrained(tmp / "tiny"), aux, 16, seed=3
    )
    got = dflash_train.decoded_acceptance(draft, [data], K)
    rule = dflash_train.repeat_rule_acceptance(data, K)
    assert (
        got["per_position"] == rule["per_position"] and got["drafts"] == rule["drafts"]
    )


def test_repeat_rule_counts_like_the_trainer():
    # decoded_walk over the rule's hits, on a loop of period one then two.
    seq = [5] * 20 + [6, 7] * 10
    blocks = range(4, len(seq) - K)
    ok = np.array([[seq[b] == seq[b + j] for b in blocks] for j in range(1, K + 1)])
    drafts, accepted = decoded_walk(ok)
    assert drafts > 0 and accepted[0] > 0
