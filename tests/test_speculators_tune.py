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
    predict,
    render,
    step_time_baseline,
    step_time_spec,
)

ROOT = Path(__file__).resolve().parents[1]

# Eight sequences of 32 new tokens: 8 * 31 = 248 decode positions.
BASE = Run(seconds=3.1, sequences=8, calls=1)  # t1 = 3.1 / 31 = 0.1 s per step
# k = 4: 80 drafts, 120 accepted (48, 32, 24, 16 per position) -> 128 sequence
# steps (16 per sequence), 3.2 s -> 0.2 s per step; 80 of 128 steps drafted.
K4 = Run(3.2, 8, 1, drafts=80, draft_tokens=320, accepted=120,
         accepted_per_pos=(48, 32, 24, 16))  # fmt: skip
# k = 1: 40 accepted -> 208 steps (26 per sequence), 2.6 s -> 0.1 s per step.
K1 = Run(2.6, 8, 1, drafts=130, draft_tokens=130, accepted=40,
         accepted_per_pos=(40,))  # fmt: skip


def test_step_times():
    assert NEW_TOKENS == 32
    assert step_time_baseline(BASE) == pytest.approx(0.1)
    assert K4.seq_steps == 128 and step_time_spec(K4) == pytest.approx(0.2)
    assert K1.seq_steps == 208 and step_time_spec(K1) == pytest.approx(0.1)


def test_prediction_by_hand():
    # delta = (0.2 - 0.1) / 3 per extra draft token; f = 80 / 128 = 0.625;
    # p = 0.6, 0.4, 0.3, 0.2. k = 2: L = 1 + 0.625 * 1.0 = 1.625, step 0.1333 s,
    # speed-up 0.1 * 1.625 / 0.1333 = 1.21875.
    row = predict(BASE, K1, K4, 4, 2)
    assert row["draft_step_share"] == pytest.approx(0.625)
    assert row["predicted_tokens_per_step"] == pytest.approx(1.625)
    assert row["predicted_step_s"] == pytest.approx(0.1 + 0.1 / 3)
    assert row["predicted_speedup"] == pytest.approx(1.21875)
    assert row["draft_cost_ratio"] == pytest.approx(1 / 3)
    assert row["k1_step_cost_ratio"] == pytest.approx(1.0)
    # k = 3: L = 1 + 0.625 * 1.3 = 1.8125, step 0.1667 s -> 1.0875x.
    assert predict(BASE, K1, K4, 4, 3)["predicted_speedup"] == pytest.approx(1.0875)


def test_calibration_point_reproduces_the_measurement():
    # At k = K the counters fix both the step cost and the tokens per step, so the
    # model must give back the measured 3.1 / 3.2 exactly.
    row = predict(BASE, K1, K4, 4, 4)
    assert row["predicted_tokens_per_step"] == pytest.approx(248 / 128)
    assert row["predicted_speedup"] == pytest.approx(BASE.seconds / K4.seconds)


def test_no_acceptance_predicts_a_loss():
    # A draft that is never accepted only adds cost: every k predicts < 1.
    k4 = Run(6.2, 8, 1, drafts=248, draft_tokens=992, accepted=0,
             accepted_per_pos=(0, 0, 0, 0))  # fmt: skip
    k1 = Run(3.72, 8, 1, drafts=248, draft_tokens=248, accepted=0,
             accepted_per_pos=(0,))  # fmt: skip
    speedups = [predict(BASE, k1, k4, 4, k)["predicted_speedup"] for k in (1, 2, 3, 4)]
    assert speedups == pytest.approx([1 / 1.2, 1 / 1.46666, 1 / 1.73333, 0.5], rel=1e-4)


def test_render_shows_predicted_and_measured_side_by_side():
    row = {
        **predict(BASE, K1, K4, 4, 2),
        "k": 2,
        "measured_speedup": 1.1,
        "error": 1.21875 / 1.1 - 1,
        "calibration": False,
        "mean_acceptance_length": 1.6,
        "acceptance_rate_per_position": [0.6, 0.4],
    }
    report = {
        "model_dir": "M",
        "methods": {
            "ngram": {
                "default_k": 3,
                "bands": {"batch-8": {"rows": [row], "decision": "use k=2 (1.10x)"}},
            }
        },
    }
    text = render(report)
    assert "| 2 | 0.60, 0.40 | 1.60 | 1.22x | 1.10x | +11% |" in text
    assert "Decision: use k=2 (1.10x)" in text


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
