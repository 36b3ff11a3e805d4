"""The tuner's acceptance simulation (onboard.speculators.simulate) without an
engine: the n-gram replica against vLLM's own proposer function and hand-made
cases, the walk's counting against what vLLM's scheduler counts, the MTP walk
against mtp_train.decoded_walk, and the prediction from simulated counters."""

from __future__ import annotations

import random

import numpy as np
import pytest

from onboard.speculators.mtp_train import decoded_walk
from onboard.speculators.simulate import (
    Counters,
    ngram_counters,
    ngram_propose,
    ngram_window,
    walk,
)
from onboard.speculators.tune import (
    BANDS,
    Run,
    band_chunks,
    predict,
    probe_prompts,
)


def test_ngram_replica_equals_vllms_proposer_on_random_sequences():
    # vLLM's function itself (its plain-Python body under numba's @jit): a
    # KMP search over the reversed tokens. Small alphabets make many matches,
    # overlaps and ties.
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens as vllm_propose,
    )

    rng = random.Random(0)
    for _ in range(3000):
        tokens = [rng.randrange(rng.randint(1, 4)) for _ in range(rng.randint(0, 30))]
        k, lo = rng.randint(1, 5), rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        limit = len(tokens) + rng.randint(-1, 3)
        want = vllm_propose.py_func(
            np.array(tokens, dtype=np.int32), lo, hi, limit, k
        ).tolist()
        assert ngram_propose(tokens, k, lo, hi, limit) == want, (tokens, k, lo, hi)


def test_ngram_hand_made_cases():
    # The suffix (7, 8) occurred at 0 and 3: the earliest wins; up to k follow.
    assert ngram_propose([7, 8, 1, 7, 8, 2, 7, 8], 2, 2, 4) == [1, 7]
    # The longest suffix wins over an earlier shorter match: (5, 7, 8) at 4.
    assert ngram_propose([7, 8, 1, 9, 5, 7, 8, 3, 5, 7, 8], 3, 2, 4) == [3, 5, 7]
    # No suffix of min_n tokens recurs (a single repeated token is too short).
    assert ngram_propose([1, 2, 3, 1], 3, 2, 4) == []
    # Too short a context; k cut by the tokens left after the match.
    assert ngram_propose([4], 3, 2, 4) == []
    assert ngram_propose([1, 2, 1, 2], 3, 2, 4) == [1, 2]
    # An occurrence may overlap the suffix (a run of one token).
    assert ngram_propose([6, 6, 6, 6], 4, 2, 4) == [6]
    # No room left below max_model_len.
    assert ngram_propose([1, 2, 1, 2], 3, 2, 4, max_model_len=4) == []
    assert ngram_propose([1, 2, 3, 1, 2], 3, 2, 4, max_model_len=6) == [3]
    assert ngram_window({"prompt_lookup_min": 2, "prompt_lookup_max": 4}) == (2, 4)
    assert ngram_window({}) == (5, 5)
    assert ngram_window({"prompt_lookup_max": 3}) == (3, 3)


def test_walk_counts_as_vllms_scheduler():
    # max_tokens 5, k 2; greedy continuation g0..g5 (N + k - 1 = 6 tokens).
    # The drafter returns scripted drafts per frontier u (the last emitted token
    # is greedy[u]):
    #   u=0: [g1, x]   -> accepts 1, emits 2 tokens       (draft, 1 accepted)
    #   u=2: []        -> no draft, emits 1 token         (not a draft)
    #   u=3: [g4, g5]  -> accepts 2, 1 past max_tokens    (draft, 2 accepted)
    # vLLM's scheduler counts the last step's accepted tokens before the output
    # is cut at max_tokens, so accepted = 3, while the 4 new tokens after the
    # prefill's took 3 steps (n (N - 1) - accepted = 1 would undercount them).
    greedy = [10, 11, 12, 13, 14, 15]
    drafts = {0: [11, 99], 2: [], 3: [14, 15]}
    out = walk([1, 2, 3], greedy, 5, 2, lambda ctx, u: drafts[u])
    assert (out.drafts, out.draft_tokens, out.accepted) == (2, 4, 3)
    assert out.accepted_per_pos == [2, 1]
    assert out.steps == 3
    assert out.tokens_per_step == pytest.approx(4 / 3)
    # The drafter sees prompt + the tokens emitted so far.
    seen = []
    walk([1, 2, 3], greedy, 5, 2, lambda ctx, u: seen.append(ctx) or [])
    assert seen == [[1, 2, 3, 10], [1, 2, 3, 10, 11], [1, 2, 3, 10, 11, 12],
                    [1, 2, 3, 10, 11, 12, 13]]  # fmt: skip
    with pytest.raises(ValueError, match="needs 6"):
        walk([1], greedy[:5], 5, 2, lambda ctx, u: [])


def test_ngram_counters_on_a_repeating_sequence():
    # A period-3 continuation: after the first period every draft is right.
    prompt = [5, 6, 7]
    greedy = [5, 6, 7] * 4
    c = ngram_counters([prompt], [greedy], 8, 2, 2, 4)
    # u=0: context 5 6 7 5 -> (7, 5)? no earlier; (5) too short -> no draft.
    # u=1: ... 5 6 -> (5, 6) at 0 -> [7, 5] both right -> u=4; u=4: [7, 5]
    # right -> u=7 = N: stop. Drafts 2, accepted 4.
    assert (c.drafts, c.accepted, c.accepted_per_pos, c.steps) == (2, 4, [2, 2], 3)


@pytest.mark.parametrize("seed", range(5))
def test_model_draft_walk_equals_mtp_trains_decoded_walk(seed):
    rng = np.random.default_rng(seed)
    n_new, k = 32, 3
    ok = rng.random((k, n_new - 1)) < 0.6  # ok[j, slot]
    greedy = list(range(100, 100 + n_new + k - 1))

    def propose(_context, u):  # position j right where ok[j, u], else a miss
        return [greedy[u + 1 + j] if ok[j, u] else -1 for j in range(k)]

    c = walk([1, 2], greedy, n_new, k, propose)
    drafts, accepted = decoded_walk(ok)
    assert c.drafts == drafts == c.steps
    assert c.accepted_per_pos == accepted.astype(int).tolist()
    assert c.draft_tokens == k * drafts


def test_prediction_from_simulated_counters():
    # Baseline call 0.3 + 31 * 0.1 = 3.4 s. Simulated: 8 sequences, 128 steps
    # -> 248 / 128 = 1.9375 tokens per step; k = 2's probe 0.18 s per step:
    # 0.31 + 31 * 0.18 / 1.9375 = 3.19 s -> 1.0658x. The k = K rates give
    # L = 1.625 (the model before the simulation) as detail.
    base = Run(3.1, 8, 1, probe_wall_step_s=0.1, probe_prefill_s=0.3)
    k4 = Run(3.2, 8, 1, seq_steps=128, drafts=80, draft_tokens=320, accepted=120,
             accepted_per_pos=(48, 32, 24, 16))  # fmt: skip
    k2 = Run(3.0, 8, 1, probe_wall_step_s=0.18, probe_prefill_s=0.31)
    sim = Counters(sequences=8, new_tokens=32, drafts=100, draft_tokens=200,
                   accepted=120, accepted_per_pos=[70, 50], steps=128)  # fmt: skip
    row = predict(base, k2, k4, 2, sim)
    assert row["predicted_tokens_per_step"] == pytest.approx(1.9375)
    assert row["predicted_speedup"] == pytest.approx(3.4 / (0.31 + 31 * 0.18 / 1.9375))
    assert row["predicted_acceptance_per_position"] == pytest.approx([0.7, 0.5])
    assert row["draft_step_share"] == pytest.approx(100 / 128)
    assert row["kmax_tokens_per_step"] == pytest.approx(1.625)
    assert row["kmax_predicted_speedup"] == pytest.approx(
        3.4 / (0.31 + 31 * 0.18 / 1.625)
    )
    assert row["acceptance_source"] == "simulated"
    assert predict(base, k2, k4, 2)["acceptance_source"] == "k=K rates"


def test_probe_prompts_are_as_long_as_and_not_the_timed_ones(tmp_path):
    from onboard.checkpoint.tokenizer import write_tokenizer
    from onboard.runtime.prompts import PROMPTS
    from onboard.runtime.reference import tokenize_prompts

    write_tokenizer(tmp_path, 2048, 256)
    timed, _ = tokenize_prompts(tmp_path, PROMPTS, 2048)
    probes = probe_prompts(tmp_path, timed, 2048)
    assert [len(p) for p in probes] == [len(p) for p in timed]
    assert not {tuple(p) for p in probes} & {tuple(p) for p in timed}
    # Same start as the timed prompts (the tokenizer's BOS), then text.
    assert {p[0] for p in probes} == {p[0] for p in timed}
    assert len({tuple(p) for p in probes}) == len(probes)
    # Each band's calls get the counterparts of its timed prompts.
    chunks = band_chunks(probes)
    assert [len(c) for c in chunks["batch-8"]] == [8]
    assert [len(c) for c in chunks["batch-1"]] == [1] * BANDS["batch-1"][1]
    # Without a tokenizer: seeded random ids, as long.
    bare = probe_prompts(tmp_path / "none", [[1, 2, 3]] * 12, 100)
    assert [len(p) for p in bare] == [3] * 12
    assert bare == probe_prompts(tmp_path / "none", [[1, 2, 3]] * 12, 100)


@pytest.fixture(scope="module")
def dsv3(tmp_path_factory):
    """The DeepSeek-V3-style tiny checkpoint (untrained MTP head: its drafts are
    mostly wrong, which the counts below do not depend on) and its reference."""
    import tempfile
    from pathlib import Path

    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.spec import load_spec
    from onboard.speculators import mtp_train
    from onboard.threads import one_thread

    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root / "model_specs" / "deepseek-v3-style.yaml")
    out = tmp_path_factory.mktemp("dsv3")
    model_dir = write_tiny_checkpoint(spec, out / "bf16", seed=0)
    with tempfile.TemporaryDirectory() as tmp, one_thread():
        model = mtp_train.load_mtp_reference(model_dir, spec, Path(tmp))
        prompts = [[5, 9, 3, 7, 2, 8], [11, 4, 4, 6, 1, 3, 9, 2]]
        seqs = mtp_train.greedy_sequences(model, prompts, 12)
        greedy = [s[len(p) :].tolist() for s, p in zip(seqs, prompts, strict=True)]
        yield spec, model, prompts, greedy


def test_mtp_counters_walk_the_reference_drafts(dsv3):
    import torch

    from onboard.speculators.mtp_train import sequence_acceptance
    from onboard.speculators.simulate import mtp_counters

    spec, model, prompts, greedy = dsv3
    n_new = 10
    for k in (1, 2, 3):
        c = mtp_counters(model, prompts, greedy, n_new, [0] * k)
        # Every step drafts k tokens; the steps cover the N - 1 decode tokens.
        assert c.drafts == c.steps and c.draft_tokens == k * c.drafts
        assert c.sequences == 2 and c.accepted == sum(c.accepted_per_pos)
        assert c.steps <= 2 * (n_new - 1) and c.steps + c.accepted >= 2 * (n_new - 1)
        # The same as sequence_acceptance on exactly N + k - 1 greedy tokens
        # (the tokens past that are not looked at).
        cut = [
            torch.tensor(p + g[: n_new + k - 1])
            for p, g in zip(prompts, greedy, strict=True)
        ]
        ref = sequence_acceptance(model, cut, [len(p) for p in prompts], [0] * k)
        assert c.drafts == ref.decoded_drafts
        assert c.accepted_per_pos == [
            round(x * ref.decoded_drafts) for x in ref.decoded_per_position
        ]
    with pytest.raises(ValueError, match="needs 13"):
        mtp_counters(model, prompts, [g[:12] for g in greedy], 10, [0] * 4)


def test_simulate_acceptance_per_method(dsv3):
    from onboard.speculators.tune import K_VALUES, simulate_acceptance

    spec, _, _, _ = dsv3
    rng = random.Random(1)
    prompts = [[rng.randrange(3) for _ in range(8)] for _ in range(12)]
    greedy = [tuple(rng.randrange(3) for _ in range(35)) for _ in range(12)]
    base = {
        "batch-8": Run(1.0, 8, 1, greedy=tuple(greedy[:8])),
        "batch-1": Run(1.0, 4, 4, greedy=tuple(greedy[8:])),
    }

    def config_for_k(k):
        return {"method": "ngram", "num_speculative_tokens": k,
                "prompt_lookup_min": 2, "prompt_lookup_max": 4}  # fmt: skip

    sim, source = simulate_acceptance(
        "ngram", spec, None, config_for_k, base, prompts, 256
    )
    assert source.startswith("simulated")
    assert set(sim) == set(BANDS) and set(sim["batch-8"]) == set(K_VALUES)
    assert sim["batch-1"][3] == ngram_counters(
        prompts[8:], greedy[8:], 32, 3, 2, 4, 256
    )
    assert sim["batch-8"][2].sequences == 8
    # No reference drafter (EAGLE-3) or no saved continuations: the k = K rates.
    assert (
        simulate_acceptance("eagle3", spec, None, None, base, prompts, 256)[0] is None
    )
    bare = {b: Run(1.0, 8, 1) for b in BANDS}
    none, why = simulate_acceptance(
        "ngram", spec, None, config_for_k, bare, prompts, 256
    )
    assert none is None and "no greedy" in why
