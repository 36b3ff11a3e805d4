"""A P-EAGLE head trained by onboard, on vLLM's CPU engine (the dense-gqa tiny).

One fixture does the work: the speculators stage trains the head on the tiny
checkpoint (data collection and the prior, about a minute), `validate` runs
`spec-decode:p_eagle` (the main engine without speculation and one engine with
the head: vLLM's `eagle3` with `parallel_drafting`). The held-out prompts are
the accuracy check's, never used in training. A fault (the head without the
recency score its mask slots find the bonus slot by) is scored by the head's
plain-torch replay, which the same run shows to equal vLLM's own counters.
Two engine starts and the training, about 5 minutes: `make test-all` only
(tests/test_peagle.py covers the head offline in `make test`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import changed_copy, stage_trained_check

from onboard.speculators import peagle

pytestmark = [pytest.mark.engine, pytest.mark.acceptance]
K = 3


def drop_recency(head: Path, out: Path) -> Path:
    """A copy of the P-EAGLE ``head`` without the rope pairs its prior gives the
    recency score (the fast quarter of each half of every head's query and key):
    its mask slots no longer find the bonus slot."""

    def change(tensors, config):
        hd = config["transformer_layer_config"]["head_dim"]
        for name in ("q_proj", "k_proj"):
            weight = tensors[f"layers.0.self_attn.{name}.weight"]
            rows = weight.view(-1, hd, weight.shape[-1])
            rows[:, : hd // 4] = 0
            rows[:, hd // 2 : hd // 2 + hd // 4] = 0

    return changed_copy(head, out, change)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("p_eagle")
    no_steps = (peagle, "BUDGET_S")
    faults = {"no-recency": drop_recency}
    check, replays, _ = stage_trained_check(tmp, "p_eagle", K, no_steps, faults)
    return check, replays["no-recency"]


def test_p_eagle_drafts_in_one_pass_losslessly(run):
    # vLLM serves the P-EAGLE head as its EAGLE-3 class with parallel drafting:
    # k drafts per step from one pass of the draft layer, the output unchanged.
    check, _ = run
    assert check.status == "passed", check.details
    m = check.metrics
    assert m["speculative_config"]["parallel_drafting"] is True
    assert m["drafter"]["draft_model_class"].endswith("Eagle3LlamaForCausalLM")
    assert m["num_drafts"] > 50 and m["num_draft_tokens"] == K * m["num_drafts"]
    assert m["lossless"]["identical"] == m["lossless"]["prompts"], m["lossless"]
    # Measured 2.36 (0.51, 0.44, 0.41): the mask slots' drafts are accepted too.
    assert m["mean_acceptance_length"] > 1.8, check.details
    assert m["acceptance_rate_per_position"][2] > 0.2
    # One draft pass per step: the batch takes at most max_new_tokens + 1 steps
    # (the prefill's and one per token), while k passes per step would call the
    # layer k times per step, and a request drafts at every one of its steps.
    calls = m["draft_layer_calls"]["0"]
    assert calls <= m["max_new_tokens"] + 1 < K * m["num_drafts"] / m["prompts"]


def test_the_plain_torch_pass_predicts_vllm_exactly(run):
    check, _ = run
    m = check.metrics
    replay = m["p_eagle_replay"]
    assert replay["num_drafts"] == m["num_drafts"]
    accepted = [round(r * m["num_drafts"]) for r in m["acceptance_rate_per_position"]]
    assert replay["num_accepted_tokens_per_pos"] == accepted


def test_without_its_recency_score_the_later_positions_fall_away(run):
    # The same head with the recency pairs zeroed still drafts its first token
    # by EAGLE-3's induction, but its mask slots no longer repeat the bonus
    # token. Measured (replay): 0.63, 0.17, 0.15, length 1.96, against 0.51,
    # 0.44, 0.41, 2.36 (the first position's rate moves because the drafts then
    # start at other slots).
    check, replay = run
    m = check.metrics
    for pos in (1, 2):
        rate = m["acceptance_rate_per_position"][pos]
        assert replay["acceptance_rate_per_position"][pos] < 0.5 * rate, replay
    assert replay["mean_acceptance_length"] < m["mean_acceptance_length"] - 0.3
