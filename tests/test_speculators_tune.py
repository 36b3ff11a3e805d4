"""`onboard speculators tune`: the speed-up prediction model with hand-computed
numbers, and the command's input errors (no engine starts here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from onboard.speculators.tune import (
    NEW_TOKENS,
    Run,
    decode_steps,
    predict,
    predict_linear,
    render,
    step_time_baseline,
    step_time_spec,
)

ROOT = Path(__file__).resolve().parents[1]

# Eight sequences of 32 new tokens: 8 * 31 = 248 decode positions. The baseline's
# worker spends 0.08 s of each 0.1 s step (probe), 0.02 s per step is outside it.
BASE = Run(seconds=3.1, sequences=8, calls=1, probe_step_s=0.08,
           rounds=(3.0, 3.1, 3.4))  # fmt: skip
# k = 4: 80 drafts, 120 accepted (48, 32, 24, 16 per position) -> 128 sequence
# steps (16 per sequence), 3.2 s -> 0.2 s per step; 80 of 128 steps drafted.
K4 = Run(3.2, 8, 1, drafts=80, draft_tokens=320, accepted=120,
         accepted_per_pos=(48, 32, 24, 16), probe_step_s=0.18)  # fmt: skip
# k = 1: 40 accepted -> 208 steps (26 per sequence), 2.6 s -> 0.1 s per step.
K1 = Run(2.6, 8, 1, drafts=130, draft_tokens=130, accepted=40,
         accepted_per_pos=(40,), probe_step_s=0.08)  # fmt: skip
# k = 2, probed dearer than the line through k = 1 and k = 4 (0.1333 s) says.
K2 = Run(3.0, 8, 1, drafts=100, draft_tokens=200, accepted=80,
         accepted_per_pos=(50, 30), probe_step_s=0.16)  # fmt: skip


def test_step_times():
    assert NEW_TOKENS == 32
    assert step_time_baseline(BASE) == pytest.approx(0.1)
    assert K4.seq_steps == 128 and step_time_spec(K4) == pytest.approx(0.2)
    assert K1.seq_steps == 208 and step_time_spec(K1) == pytest.approx(0.1)
    assert BASE.spread == pytest.approx(0.4 / 3.1)


def test_prediction_by_hand():
    # f = 80 / 128 = 0.625; p = 0.6, 0.4, 0.3, 0.2 (from k = 4). k = 2:
    # L = 1 + 0.625 * 1.0 = 1.625; step = k = 2's probe 0.16 + the 0.02 s outside
    # the worker (baseline 0.1 - its probe 0.08) = 0.18 s; speed-up
    # 0.1 * 1.625 / 0.18 = 0.9028.
    row = predict(BASE, K2, K4, 2)
    assert row["draft_step_share"] == pytest.approx(0.625)
    assert row["predicted_tokens_per_step"] == pytest.approx(1.625)
    assert row["predicted_step_s"] == pytest.approx(0.18)
    assert row["step_cost_ratio"] == pytest.approx(1.8)
    assert row["predicted_speedup"] == pytest.approx(0.1 * 1.625 / 0.18)
    # k = 1 uses the same k = 4 acceptance (p_1 = 0.6): L = 1.375, step 0.1 s.
    assert predict(BASE, K1, K4, 1)["predicted_speedup"] == pytest.approx(1.375)


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
    # Same acceptance, a dearer probe: the prediction drops in proportion.
    cheap = predict(BASE, K2, K4, 2)["predicted_speedup"]
    dear = Run(**{**K2.__dict__, "probe_step_s": 0.34})
    assert predict(BASE, dear, K4, 2)["predicted_speedup"] == pytest.approx(
        cheap * 0.18 / 0.36
    )


def test_no_acceptance_predicts_a_loss():
    # A draft that is never accepted only adds cost: every k predicts < 1.
    k4 = Run(6.2, 8, 1, drafts=248, draft_tokens=992, accepted=0,
             accepted_per_pos=(0, 0, 0, 0), probe_step_s=0.1)  # fmt: skip
    assert [predict(BASE, k4, k4, k)["predicted_speedup"] for k in (1, 2, 3, 4)] == (
        pytest.approx([0.1 / 0.12] * 4)
    )


def test_decode_steps_drop_the_prefill_and_group_by_step():
    # Completion order inside vLLM: the forward ends inside execute_model, the
    # sampler and the drafter inside sample_tokens.
    step = [["_model_forward", 0.05, 24], ["execute_model", 0.06, 0],
            ["_sample", 0.01, 0], ["propose_draft_token_ids", 0.002, 0],
            ["sample_tokens", 0.02, 0]]  # fmt: skip
    prefill = [["_model_forward", 0.5, 96], ["execute_model", 0.6, 0],
               ["_sample", 0.01, 0], ["sample_tokens", 0.02, 0]]  # fmt: skip
    steps = decode_steps(prefill + step + step)
    assert len(steps) == 2
    assert steps[0]["tokens"] == 24
    assert steps[0]["execute_model"] + steps[0]["sample_tokens"] == pytest.approx(0.08)
    assert decode_steps([]) == []


def test_render_shows_predicted_and_measured_side_by_side():
    row = {
        **predict(BASE, K2, K4, 2),
        "k": 2,
        "measured_speedup": 0.95,
        "error": (0.1 * 1.625 / 0.18) / 0.95 - 1,
        "linear_error": 1.21875 / 0.95 - 1,
        "spread": 0.04,
        "baseline_spread": 0.05,
        "calibration": False,
        "mean_acceptance_length": 1.6,
        "acceptance_rate_per_position": [0.6, 0.4],
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
        "| 2 | 0.60, 0.40 | 1.60 | 1.80 | 0.90x | 0.95x (4% / 5%) | -5% | +28% |"
        in (text)
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

    from onboard.speculators.tune import measure_engine
    from onboard.validate.engine import EngineOptions

    extra = {"speculative_config": {"method": "ngram"}}
    options = EngineOptions(model_dir=tmp_path / "none", plugin=None, extra=extra)
    saved = {
        "engine": json.loads(json.dumps(options.engine_kwargs(), default=str)),
        "bands": {"batch-8": dataclasses.asdict(K4)},
    }
    (tmp_path / "ngram-k4.json").write_text(json.dumps(saved))
    runs = measure_engine(options, tmp_path, "ngram-k4", [], print)
    assert runs == {"batch-8": K4}
