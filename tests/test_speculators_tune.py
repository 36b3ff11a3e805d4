"""`onboard speculators tune`: the speed-up prediction model with hand-computed
numbers, and the command's input errors (no engine starts here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from onboard.speculators.probes import step_kind
from onboard.speculators.tune import (
    NEW_TOKENS,
    Run,
    decode_steps,
    group_steps,
    predict,
    predict_adaptive,
    predict_linear,
    render,
    render_adaptive,
    sequence_steps,
    step_time_baseline,
    step_time_spec,
)

ROOT = Path(__file__).resolve().parents[1]

# Eight sequences of 32 new tokens: 8 * 31 = 248 decode positions. The baseline's
# probe: 0.1 s per plain step (wall), 0.3 s of prefill per call -> a call of 32
# tokens is predicted at 0.3 + 31 * 0.1 = 3.4 s.
BASE = Run(seconds=3.1, sequences=8, calls=1, seq_steps=248, probe_wall_step_s=0.1,
           probe_prefill_s=0.3, rounds=(3.0, 3.1, 3.4))  # fmt: skip
# k = 4: 80 drafts, 120 accepted (48, 32, 24, 16 per position), 128 sequence
# steps (16 per sequence), 3.2 s -> 0.2 s per step; 80 of 128 steps drafted.
K4 = Run(3.2, 8, 1, seq_steps=128, drafts=80, draft_tokens=320, accepted=120,
         accepted_per_pos=(48, 32, 24, 16), probe_wall_step_s=0.2,
         probe_prefill_s=0.3)  # fmt: skip
# k = 1: 40 accepted -> 208 steps (26 per sequence), 2.6 s -> 0.1 s per step.
K1 = Run(2.6, 8, 1, seq_steps=208, drafts=130, draft_tokens=130, accepted=40,
         accepted_per_pos=(40,), probe_wall_step_s=0.1,
         probe_prefill_s=0.3)  # fmt: skip
# k = 2, probed dearer than the line through k = 1 and k = 4 (0.1333 s) says; its
# worker took 0.15 s of a 0.17 s engine step.
K2 = Run(3.0, 8, 1, seq_steps=168, drafts=100, draft_tokens=200, accepted=80,
         accepted_per_pos=(50, 30), probe_wall_step_s=0.18, probe_prefill_s=0.31,
         probe_step_s=0.15, probe_engine_step_s=0.17)  # fmt: skip


def test_step_times():
    assert NEW_TOKENS == 32
    assert step_time_baseline(BASE) == pytest.approx(0.1)
    assert K4.seq_steps == 128 and step_time_spec(K4) == pytest.approx(0.2)
    assert K1.seq_steps == 208 and step_time_spec(K1) == pytest.approx(0.1)
    assert BASE.spread == pytest.approx(0.4 / 3.1)


def test_prediction_by_hand():
    # f = 80 / 128 = 0.625; p = 0.6, 0.4, 0.3, 0.2 (from k = 4). k = 2:
    # L = 1 + 0.625 * 1.0 = 1.625; a call: 0.31 + 31 * 0.18 / 1.625 = 3.7438 s
    # against the baseline's 3.4 s -> 0.9082x.
    row = predict(BASE, K2, K4, 2)
    assert row["draft_step_share"] == pytest.approx(0.625)
    assert row["predicted_tokens_per_step"] == pytest.approx(1.625)
    assert row["predicted_step_s"] == pytest.approx(0.18)
    assert row["step_cost_ratio"] == pytest.approx(1.8)
    assert row["baseline_call_s"] == pytest.approx(3.4)
    assert row["predicted_call_s"] == pytest.approx(0.31 + 31 * 0.18 / 1.625)
    assert row["predicted_speedup"] == pytest.approx(3.4 / 3.743846, rel=1e-6)
    assert row["outside_worker_s"] == pytest.approx(0.02)
    # k = 1 uses the same k = 4 acceptance (p_1 = 0.6): L = 1.375.
    assert predict(BASE, K1, K4, 1)["predicted_speedup"] == pytest.approx(
        3.4 / (0.3 + 3.1 / 1.375)
    )


def test_rates_lose_the_tokens_counted_past_max_tokens():
    # The same counters, but the scheduler took 136 steps, not 248 - 120 = 128:
    # the last steps accepted 8 tokens past max_tokens. Measured L(4) = 248 / 136;
    # the rates' formula, 1 + (136 share drafted) ..., is scaled to it.
    k4 = Run(**{**K4.__dict__, "seq_steps": 136})
    f = 80 / 136
    counted = 1 + f * 1.5
    for k, rates in ((4, 1.5), (2, 1.0)):
        row = predict(BASE, K2, k4, k)
        assert row["draft_step_share"] == pytest.approx(f)
        assert row["predicted_tokens_per_step"] == pytest.approx(
            (1 + f * rates) * (248 / 136) / counted
        )
    assert predict(BASE, K2, k4, 4)["predicted_tokens_per_step"] == pytest.approx(
        k4.tokens_per_step
    )


def test_without_prefill_the_prediction_is_t1_l_over_s():
    base = Run(**{**BASE.__dict__, "probe_prefill_s": 0.0})
    k2 = Run(**{**K2.__dict__, "probe_prefill_s": 0.0})
    assert predict(base, k2, K4, 2)["predicted_speedup"] == pytest.approx(
        0.1 * 1.625 / 0.18
    )


def test_linear_model_by_hand():
    # delta = (0.2 - 0.1) / 3 per extra draft token; k = 2: step 0.1333 s,
    # speed-up 0.1 * 1.625 / 0.1333 = 1.21875 (k = 2's own probe is ignored).
    row = predict_linear(BASE, K1, K4, 4, 2)
    assert row["predicted_speedup"] == pytest.approx(1.21875)
    assert row["draft_cost_ratio"] == pytest.approx(1 / 3)
    assert row["k1_step_cost_ratio"] == pytest.approx(1.0)
    assert predict_linear(BASE, K1, K4, 4, 3)["predicted_speedup"] == pytest.approx(
        1.0875
    )


def test_probed_step_cost_moves_the_prediction():
    # Same acceptance, a dearer probed step: the predicted call gets longer by
    # the extra decode time, the speed-up drops.
    cheap = predict(BASE, K2, K4, 2)
    dear = predict(BASE, Run(**{**K2.__dict__, "probe_wall_step_s": 0.36}), K4, 2)
    assert dear["predicted_call_s"] - cheap["predicted_call_s"] == pytest.approx(
        31 * 0.18 / 1.625
    )
    assert dear["predicted_speedup"] < cheap["predicted_speedup"]


def test_no_acceptance_predicts_a_loss():
    # A draft that is never accepted only adds cost: every k predicts < 1.
    k4 = Run(6.2, 8, 1, seq_steps=248, drafts=248, draft_tokens=992, accepted=0,
             accepted_per_pos=(0, 0, 0, 0), probe_wall_step_s=0.12,
             probe_prefill_s=0.3)  # fmt: skip
    assert [predict(BASE, k4, k4, k)["predicted_speedup"] for k in (1, 2, 3, 4)] == (
        pytest.approx([3.4 / (0.3 + 31 * 0.12)] * 4)
    )


def test_decode_steps_keep_only_decode_steps():
    # Completion order inside vLLM: the forward ends inside execute_model, the
    # sampler and the drafter inside sample_tokens. The batch's prefill took two
    # steps (requests arrived apart), the second also decoding the first ones.
    def step(kind, tokens, decoding, seconds=0.06):
        return [["_model_forward", seconds - 0.01, tokens, "", 0],
                ["execute_model", seconds, 0, kind, decoding],
                ["_sample", 0.01, 0, "", 0],
                ["propose_draft_token_ids", 0.002, 0, "", 0],
                ["sample_tokens", 0.02, 0, "", 0]]  # fmt: skip

    empty = [["execute_model", 0.001, 0, "empty", 0]]  # nothing scheduled
    records = (step("prefill", 96, 0, 0.5) + step("mixed", 131, 5, 0.6) + empty
               + step("decode", 24, 8) + step("decode", 20, 6))  # fmt: skip
    steps = decode_steps(records)
    assert [s["tokens"] for s in steps] == [24, 20]
    # The sequence-steps: every request decoded, the mixed step's too.
    assert sequence_steps(group_steps(records)) == 5 + 8 + 6
    assert steps[0]["execute_model"] + steps[0]["sample_tokens"] == pytest.approx(0.08)
    assert [s["kind"] for s in group_steps(records)] == [
        "prefill", "mixed", "decode", "decode"]  # fmt: skip
    assert decode_steps([]) == []


def test_step_kind_from_vllms_scheduler_output():
    # vLLM's own scheduler-output and request-state classes; the runner is only
    # the holder of its ``requests`` (what step_kind reads of it).
    from types import SimpleNamespace

    from vllm.v1.core.sched.output import (
        CachedRequestData,
        NewRequestData,
        SchedulerOutput,
    )
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    def state(req_id, prompt):
        return CachedRequestState(req_id=req_id, prompt_token_ids=list(range(prompt)),
                                  mm_features=[], sampling_params=None,
                                  generator=None, block_ids=([0],),
                                  num_computed_tokens=0,
                                  output_token_ids=[])  # fmt: skip

    runner = SimpleNamespace(requests={"a": state("a", 28), "b": state("b", 30)})
    new = NewRequestData(req_id="c", prompt_token_ids=list(range(28)),
                         mm_features=[], sampling_params=None, pooling_params=None,
                         block_ids=([1],), num_computed_tokens=0,
                         lora_request=None)  # fmt: skip

    def output(new_reqs, cached: dict[str, int], tokens: dict[str, int]):
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=CachedRequestData(
                req_ids=list(cached), resumed_req_ids=set(), new_token_ids=[],
                all_token_ids={}, new_block_ids=[None] * len(cached),
                num_computed_tokens=list(cached.values()),
                num_output_tokens=[0] * len(cached)),
            num_scheduled_tokens=tokens,
            total_num_scheduled_tokens=sum(tokens.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            finished_req_ids=set(), free_encoder_mm_hashes=[],
        )  # fmt: skip

    assert step_kind(runner, output([new], {}, {"c": 28})) == ("prefill", 0)
    # a and b decode (past their prompts, a with 2 drafts), c's prefill arrives.
    mixed = output([new], {"a": 29, "b": 31}, {"a": 3, "b": 1, "c": 28})
    assert step_kind(runner, mixed) == ("mixed", 2)
    assert step_kind(runner, output([], {"a": 29, "b": 31}, {"a": 3, "b": 1})) == (
        "decode",
        2,
    )
    # b's prompt not fully computed yet (a chunked or resumed prefill).
    assert step_kind(runner, output([], {"a": 29, "b": 16}, {"a": 1, "b": 14})) == (
        "mixed",
        1,
    )
    assert step_kind(runner, output([], {}, {})) == ("empty", 0)


# Adaptive verification, K = 2: 19 sequences, every step drafts (310 drafts in
# 310 sequence steps), p = 0.6, 0.3 -> L(2) = 1.9 = 19 * 31 / 310 (scale 1).
# Drafter 0.02 s at k = 1, 0.04 s at k = 2: c(0) = 0.1 + 0.04 = 0.14,
# c(1) = 0.15 - 0.02 + 0.04 = 0.17, c(2) = 0.2.
AV = {
    1: Run(2.0, 19, 1, probe_wall_step_s=0.15, probe_prefill_s=0.3,
           parts_s={"propose_draft_token_ids": 0.02}),
    2: Run(2.0, 19, 1, seq_steps=310, drafts=310, draft_tokens=620, accepted=279,
           accepted_per_pos=(186, 93), probe_wall_step_s=0.2, probe_prefill_s=0.3,
           parts_s={"propose_draft_token_ids": 0.04}),
}  # fmt: skip


def test_adaptive_verification_by_hand():
    one = predict_adaptive(BASE, AV, 2, batch=1)
    assert one["step_costs_s"] == pytest.approx([0.14, 0.17, 0.2])
    # Uninformed: (1 + 0, 0.6, 0.9) / (0.14, 0.17, 0.2) = 7.14, 9.41, 9.5: both
    # drafts verified, as fixed k = 2: 3.4 / (0.3 + 31 * 0.2 / 1.9).
    low = one["uninformed"]
    assert low["verified_drafts_per_request"] == 2
    assert low["predicted_tokens_per_step"] == pytest.approx(1.9)
    assert low["predicted_speedup"] == pytest.approx(3.4 / (0.3 + 31 * 0.2 / 1.9))
    # Oracle: 0, 1, 2 accepted with 0.4, 0.3, 0.3; each step verifies exactly its
    # accepted drafts ((1 + 1) / 0.17 > 1 / 0.14, 3 / 0.2 > 2 / 0.17): 0.9 per
    # request, 0.4 * 0.14 + 0.3 * 0.17 + 0.3 * 0.2 = 0.167 s per step.
    high = one["oracle"]
    assert high["verified_drafts_per_request"] == pytest.approx(0.9)
    assert high["predicted_step_s"] == pytest.approx(0.167)
    assert high["predicted_tokens_per_step"] == pytest.approx(1.9)
    assert high["predicted_speedup"] == pytest.approx(3.4 / (0.3 + 31 * 0.167 / 1.9))
    # Batch 8: costs linear in the slots, so every accepted slot is admitted.
    eight = predict_adaptive(BASE, AV, 2, batch=8)["oracle"]
    assert eight["verified_drafts_per_request"] == pytest.approx(0.9)
    assert eight["predicted_step_s"] == pytest.approx(0.167)
    assert one["measured_speedup"] is None
    assert "vllm/config/vllm.py:2980-2981" in one["not_measured"]
    text = "\n".join(render_adaptive(one))
    assert "| uninformed | 2.00 | 1.900 | 200.0 | 0.95x |" in text
    assert "| oracle | 0.90 | 1.900 | 167.0 | 1.12x |" in text


def test_render_shows_predicted_and_measured_side_by_side():
    row = {
        **predict(BASE, K2, K4, 2),
        "k": 2,
        "measured_speedup": 0.95,
        "error": 3.4 / 3.743846 / 0.95 - 1,
        "linear_error": 1.21875 / 0.95 - 1,
        "spread": 0.04,
        "baseline_spread": 0.05,
        "calibration": False,
        "mean_acceptance_length": 1.6,
        "acceptance_rate_per_position": [0.6, 0.4],
        "measured_tokens_per_step": 1.6,
        "kmax_error": 3.4 / 3.743846 / 0.95 - 1,
    }
    report = {
        "model_dir": "M",
        "methods": {
            "ngram": {
                "default_k": 3,
                "bands": {"batch-8": {"rows": [row], "decision": "decline"}},
            }
        },
    }
    text = render(report)
    assert (
        "| 2 | 0.60, 0.40 (0.60, 0.40) | 1.60 | 1.625 / 1.600 | 180.0 (1.80); "
        "150.0 / 20.0 | 0.91x | 0.95x (4% / 5%) | -4% | -4% | +28% |" in text
    )
    assert "Decision: decline." in text


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from onboard.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_tune_refuses_bad_input_before_any_engine(tmp_path):
    spec = str(ROOT / "model_specs" / "dense-gqa.yaml")
    result = _cli("speculators", "tune", str(tmp_path), "--spec", spec,
                  "--out", str(tmp_path / "o"))  # fmt: skip
    assert result.returncode == 2
    assert "no config.json" in result.stderr
    result = _cli("speculators", "tune", str(tmp_path), "--spec", spec,
                  "--methods", "medusa", "--out", str(tmp_path / "o"))  # fmt: skip
    assert result.returncode == 2
    assert "unknown method 'medusa'" in result.stderr
    # The plain form still writes the configs (the group's default command).
    result = _cli("speculators", spec, "--out", str(tmp_path / "w"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "w" / "speculative-config.ngram.json").is_file()


def test_a_measured_engine_is_read_back_not_restarted(tmp_path):
    # A rerun reuses WORK/<label>.json when the engine settings match: no engine
    # starts here (the model directory does not even exist).
    import dataclasses
    import json

    from onboard.runtime.engine import EngineOptions
    from onboard.speculators.tune import FORMAT, measure_engine

    extra = {"speculative_config": {"method": "ngram"}}
    options = EngineOptions(model_dir=tmp_path / "none", plugin=None, extra=extra)
    saved = {
        "format": FORMAT,
        "engine": json.loads(json.dumps(options.engine_kwargs(), default=str)),
        "bands": {"batch-8": dataclasses.asdict(K4)},
    }
    (tmp_path / "ngram-k4.json").write_text(json.dumps(saved))
    runs = measure_engine(options, tmp_path, "ngram-k4", [], [], print)
    assert runs == {"batch-8": K4}
