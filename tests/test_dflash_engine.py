"""A DFlash draft trained by onboard, on vLLM's CPU engine (the dense-gqa tiny).

One fixture does the work: the speculators stage trains the draft on the tiny
checkpoint (data collection and the prior, about 30 s), `validate` runs the
`spec-decode:dflash` check (the main engine without speculation and one engine
with the draft). The held-out prompts are the accuracy check's, never used in
training. Two subtle faults (the config reading the verifier one layer early; a
permuted weight) are scored by the draft's plain-torch replay, which the same
run shows to equal vLLM's own counters (an engine per fault measured the same:
docs/speculators.md); two engine starts: part of `make test`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import changed_copy, stage_trained_check

from onboard.pipeline import stage_speculators

pytestmark = [pytest.mark.engine]
K = 3


def shift_layer_ids(draft: Path, out: Path) -> Path:
    """A copy of ``draft`` whose config reads the verifier one layer early
    (``aux_hidden_state_layer_ids`` minus one: the off-by-one between vLLM's
    numbering and DFlash's ``target_layer_ids``); the weights are linked."""
    out.mkdir(parents=True)
    config = json.loads((draft / "config.json").read_text())
    config["aux_hidden_state_layer_ids"] = [
        i - 1 for i in config["aux_hidden_state_layer_ids"]
    ]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "model.safetensors").symlink_to(draft / "model.safetensors")
    shutil.copy(draft / "training.json", out / "training.json")
    return out


def permute_value_rows(draft: Path, out: Path) -> Path:
    """A copy of ``draft`` whose first layer's v_proj rows are permuted."""
    import torch

    def change(tensors, _config):
        name = "layers.0.self_attn.v_proj.weight"
        gen = torch.Generator().manual_seed(0)
        perm = torch.randperm(len(tensors[name]), generator=gen)
        tensors[name] = tensors[name][perm].contiguous()

    return changed_copy(draft, out, change)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dflash")
    # The stage's 30 s of steps stay out of `make test`.
    no_steps = (stage_speculators, "DFLASH_BUDGET_S")
    faults = {
        "shifted-layer-ids": shift_layer_ids,
        "permuted-weight": permute_value_rows,
    }
    check, replays, draft = stage_trained_check(tmp, "dflash", K, no_steps, faults)
    training = json.loads((draft / "training.json").read_text())
    return check, replays, training


def test_vllm_serves_the_trained_draft_losslessly(run):
    check, _, _ = run
    assert check.status == "passed", check.details
    m = check.metrics
    assert m["drafter"]["draft_model_class"].endswith("DFlashQwen3ForCausalLM")
    # k drafted tokens at every verification step.
    assert m["num_drafts"] > 50 and m["num_draft_tokens"] == K * m["num_drafts"]
    # Greedy output with the draft equals the output without, token for token.
    assert m["lossless"]["identical"] == m["lossless"]["prompts"], m["lossless"]


def test_drafts_are_accepted_on_held_out_prompts(run):
    # Measured (docs/speculators.md) on the accuracy check's prompts.
    check, _, training = run
    m = check.metrics
    assert m["mean_acceptance_length"] > 1.5, check.details
    assert m["acceptance_rate_per_position"][0] > 0.25
    # The kept draft was chosen on validation prompts, scored as vLLM drafts.
    assert training["validation_decoded_kept"]["mean_acceptance_length"] > 1.4


def test_the_plain_torch_copy_predicts_vllm_exactly(run):
    # dflash_train's draft module, replayed over the reference's greedy
    # continuations as vLLM drafts, gives vLLM's own counters: the same drafts
    # and the same accepted tokens at every position.
    check, _, _ = run
    m = check.metrics
    replay = m["dflash_replay"]
    assert replay["num_drafts"] == m["num_drafts"]
    accepted = [round(r * m["num_drafts"]) for r in m["acceptance_rate_per_position"]]
    assert replay["num_accepted_tokens_per_pos"] == accepted


@pytest.mark.parametrize("fault", ["shifted-layer-ids", "permuted-weight"])
def test_subtle_faults_are_caught(run, fault):
    # The same draft reading the verifier one layer early (a config-only fault:
    # same tensors, loads without complaint), or with one tensor's rows
    # permuted (same shapes and statistics), is (almost) never accepted: the
    # draft uses the verifier's states, and the acceptance figure is not
    # vacuous. Measured (replay; the engine gave the same counts for the
    # first): 1.003 and 1.10, against 2.50.
    check, faults, _ = run
    replay = faults[fault]
    assert replay["num_drafts"] > 50
    assert replay["mean_acceptance_length"] < 1.3, replay
    assert (
        check.metrics["mean_acceptance_length"]
        >= replay["mean_acceptance_length"] + 0.5
    )
