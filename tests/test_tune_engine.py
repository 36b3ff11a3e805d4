"""The tuner's step-cost probe on the real vLLM CPU engine: timing wrappers
installed in vLLM's worker (onboard.speculators.probes.time_steps) see every
decode step and classify it by what vLLM scheduled (a batch's prefill can take
two steps when its requests reach the engine core apart: the second one is
"mixed", not decode), a decode step's target forward verifies batch x (k + 1)
tokens at most, the probe's wall step holds the worker's step, and one engine's
measurement (probe, seven rounds, counters, greedy continuations) is complete,
and vLLM's counters equal the n-gram simulation's over the engine's own greedy
continuations (onboard.speculators.simulate).

One n-gram engine (k = 2) on the DeepSeek-V3-style tiny checkpoint, about two
minutes: `make test-all`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.runtime.engine import Engine, EngineOptions
from onboard.runtime.prompts import PROMPTS
from onboard.runtime.reference import tokenize_prompts
from onboard.spec import load_spec
from onboard.speculators.methods import entry_for, speculative_config
from onboard.speculators.simulate import ngram_counters, ngram_window
from onboard.speculators.tune import (
    GREEDY_TOKENS,
    NEW_TOKENS,
    PROBE_REPEATS,
    REPEATS,
    band_chunks,
    measure,
    probe_prompts,
)

ROOT = Path(__file__).resolve().parents[1]
K = 2
pytestmark = [pytest.mark.engine, pytest.mark.acceptance]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune-engine")
    spec = load_spec(ROOT / "model_specs" / "deepseek-v3-style.yaml")
    model = write_tiny_checkpoint(spec, out / "bf16", seed=0)
    entry = entry_for(spec, "ngram").model_copy(update={"num_speculative_tokens": K})
    options = EngineOptions(
        model_dir=model,
        plugin=None,
        uses_mla=True,
        extra={"speculative_config": speculative_config(entry, None)},
    )
    prompts, _ = tokenize_prompts(model, PROMPTS, spec.vocab_size)
    probes_on = probe_prompts(model, prompts, spec.vocab_size)
    with Engine(options, out / "engine", out / "engine.log") as engine:
        engine.start()
        engine.wait_ready()
        return measure(engine, prompts, probes_on), prompts, options


def test_probe_times_every_decode_step(runs):
    runs, _, _ = runs
    for band, run in runs.items():
        print(band, run)
        batch = 8 if band == "batch-8" else 1
        assert len(run.rounds) == REPEATS and run.seconds > 0
        assert 0 < run.probe_step_s < run.seconds
        # The probe: wall per decode step and prefill from its own short runs;
        # an engine step's wall time includes the worker's part of it.
        assert len(run.probe_walls) == PROBE_REPEATS
        assert 0 < run.probe_wall_step_s < run.seconds
        assert 0 < run.probe_prefill_s < run.seconds
        # (Totals, not the medians: the median worker step can be a drafted one,
        # dearer than the average engine step.)
        for x in run.probe_raw:
            assert x["full_s"] - x["prefill_s"] > x["decode_worker_s"] > 0
        assert run.probe_tokens_per_step >= 1
        # A decode step's forward verifies at most batch x (1 + k) tokens, and
        # n-gram drafted somewhere (more than one token per sequence).
        assert max(run.forward_tokens) <= batch * (1 + K)
        assert max(run.forward_tokens) > batch
        assert run.parts_s["_model_forward"] > 0
        assert run.drafts > 0 and len(run.accepted_per_pos) == K


def test_simulated_ngram_counters_equal_the_engines(runs):
    # vLLM's schedule replayed over the engine's own greedy continuations, with
    # the replica of its n-gram proposer: the counters of the timed rounds.
    runs, prompts, options = runs
    config = options.extra["speculative_config"]
    lo, hi = ngram_window(config)
    for band, chunks in band_chunks(prompts).items():
        run = runs[band]
        assert len(run.greedy) == run.sequences
        assert all(len(g) == GREEDY_TOKENS for g in run.greedy)
        band_prompts = [p for chunk in chunks for p in chunk]
        sim = ngram_counters(band_prompts, run.greedy, NEW_TOKENS, K, lo, hi,
                             options.engine_kwargs()["max_model_len"])  # fmt: skip
        print(band, sim, run.drafts, run.accepted_per_pos)
        assert (sim.drafts, sim.draft_tokens, sim.accepted) == (
            run.drafts, run.draft_tokens, run.accepted)  # fmt: skip
        assert tuple(sim.accepted_per_pos) == run.accepted_per_pos
        # The scheduler's steps, counted in the worker, are the walk's steps.
        assert sim.steps == run.seq_steps
