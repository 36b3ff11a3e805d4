"""The accuracy comparison, on real logprobs from transformers models.

A tiny random Llama (decisive head) is run by the same reference code the validate
command uses; a second run of the same weights, slightly perturbed weights, a wrong
rope and forced greedy divergences play the part of the engine. No mocks: every
logprob here comes out of a real forward pass.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from onboard.errors import InputError
from onboard.runtime.compare import (
    PROMPT_LOGPROB_ATOL,
    GreedyOutput,
    compare_greedy,
    compare_prompt_logprobs,
    judge_accuracy,
    margin_summary,
    margins,
    top_k,
)
from onboard.runtime.reference import run_reference
from onboard.validate.harness import parse_checks
from onboard.validate.report import render_report
from onboard.validate.results import Check, ValidationResult

NEW_TOKENS = 16
PROMPTS = [
    [5, 17, 99, 230, 41, 8],
    [300, 2, 77, 77, 150, 402, 18, 9, 60],
    [12, 480, 33],
    [250, 251, 252, 253, 254, 255, 256],
]


def _llama(seed: int = 0, head_scale: float = 16.0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=128,
        **overrides,
    )
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model


def _run(model):
    return [run_reference(model, ids, NEW_TOKENS) for ids in PROMPTS]


def _engine_style(prompt_ids: list[int], rows: np.ndarray, k: int = 5):
    """Prompt logprobs as vLLM returns them: None, then top-k plus the actual token."""
    out: list[dict[int, float] | None] = [None]
    for i in range(1, len(prompt_ids)):
        row = rows[i - 1]
        best = np.argsort(row)[::-1][:k]
        entry = {int(t): float(row[t]) for t in best}
        entry[prompt_ids[i]] = float(row[prompt_ids[i]])
        out.append(entry)
    return out


def _judge(engine_runs, reference_runs):
    return judge_accuracy(
        [
            _engine_style(ids, lp)
            for ids, (lp, _) in zip(PROMPTS, engine_runs, strict=True)
        ],
        [lp for lp, _ in reference_runs],
        [g for _, g in engine_runs],
        [g for _, g in reference_runs],
    )


def _forced(model, prompt_ids: list[int], step: int, rank: int) -> GreedyOutput:
    """Greedy decoding, except that at ``step`` the token of the given rank is taken."""
    ids = list(prompt_ids)
    tokens, tops = [], []
    with torch.inference_mode():
        for i in range(NEW_TOKENS):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            lp = torch.log_softmax(logits.float(), -1)
            values, indices = torch.topk(lp, 5)
            tops.append(dict(zip(indices.tolist(), values.tolist(), strict=True)))
            order = torch.argsort(lp, descending=True)
            token = int(order[rank if i == step else 0])
            tokens.append(token)
            ids.append(token)
    return GreedyOutput(tokens, tops)


@pytest.fixture(scope="module")
def model():
    return _llama()


@pytest.fixture(scope="module")
def reference(model):
    return _run(model)


def test_same_model_twice_agrees_exactly(model, reference):
    verdict = _judge(_run(model), reference)
    m = verdict.metrics
    assert verdict.passed, verdict.details
    assert m["prompt_logprob_max_abs_diff"] == 0.0
    assert m["greedy_identical_sequences"] == len(PROMPTS)
    assert m["greedy_matched_tokens"] == len(PROMPTS) * NEW_TOKENS
    assert m["prompt_top1_agreement"] == 1.0
    # The scaled head makes decisions decisive: a median margin well above "flat".
    assert m["top1_top2_margin_median"] > 0.3
    assert "warning" not in verdict.details


def test_float_noise_sized_perturbation_passes_with_a_nonzero_difference(
    model, reference
):
    noisy = copy.deepcopy(model)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn_like(p) * 1e-6 * p.abs().mean())
    verdict = _judge(_run(noisy), reference)
    diff = verdict.metrics["prompt_logprob_max_abs_diff"]
    assert verdict.passed, verdict.details
    assert 0.0 < diff < PROMPT_LOGPROB_ATOL


def test_a_wrong_rope_fails_with_the_worst_prompt_named(reference):
    # Same weights, the kind of bug a hand-written model has: another rope base.
    wrong = _llama(rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    verdict = _judge(_run(wrong), reference)
    assert not verdict.passed
    # Random tiny weights barely use position, yet the difference is caught.
    assert verdict.metrics["prompt_logprob_max_abs_diff"] > PROMPT_LOGPROB_ATOL
    assert "prompt logprobs differ by up to" in verdict.details
    assert "worst: prompt" in verdict.details


def test_other_weights_fail_the_greedy_rule(reference):
    verdict = _judge(_run(_llama(seed=7)), reference)
    assert not verdict.passed
    assert verdict.metrics["greedy_failed_sequences"] >= 1
    assert "greedy continuation diverged at token" in verdict.details


def test_divergence_inside_top5_is_accepted_and_stops_the_comparison(model, reference):
    prompt, step = PROMPTS[1], 3
    ref = reference[1][1]
    engine = _forced(model, prompt, step=step, rank=1)  # the runner-up at step 3
    assert engine.token_ids[:step] == ref.token_ids[:step]
    assert engine.token_ids[step] != ref.token_ids[step]
    result = compare_greedy(engine, ref)
    assert result.accepted, result.reason
    assert (result.diverged_at, result.matched) == (step, step)
    assert result.engine_token == engine.token_ids[step]
    assert result.reference_token == ref.token_ids[step]


def test_divergence_outside_top5_is_rejected(model, reference):
    prompt, step = PROMPTS[0], 2
    ref = reference[0][1]
    engine = _forced(model, prompt, step=step, rank=50)
    result = compare_greedy(engine, ref)
    assert not result.accepted
    assert result.diverged_at == step
    assert "not in the reference's top-5" in result.reason


def test_reference_token_must_be_in_the_engine_top5_too(model, reference):
    ref = reference[1][1]
    engine = _forced(model, PROMPTS[1], step=3, rank=1)
    tops = [dict(step) for step in engine.top_logprobs]
    del tops[3][ref.token_ids[3]]  # the engine's top-5 no longer holds it
    result = compare_greedy(GreedyOutput(engine.token_ids, tops), ref)
    assert not result.accepted
    assert "not in the engine's top-5" in result.reason


def test_prompt_logprob_rows_are_aligned_with_the_tokens_they_predict(reference):
    ids, (rows, _) = PROMPTS[1], reference[1]
    assert compare_prompt_logprobs(_engine_style(ids, rows), rows).max_abs_diff == 0.0
    # One row off: the comparison must notice (it would hide bugs otherwise).
    shifted = np.roll(rows, 1, axis=0)
    assert compare_prompt_logprobs(_engine_style(ids, shifted), rows).max_abs_diff > 1.0


def test_margins_come_from_top1_minus_top2(reference):
    greedy = [g for _, g in reference]
    values = margins(greedy)
    assert len(values) == len(PROMPTS) * NEW_TOKENS
    first = sorted(greedy[0].top_logprobs[0].values(), reverse=True)
    assert values[0] == pytest.approx(first[0] - first[1])
    summary = margin_summary(values)
    assert summary["min"] == min(values) and summary["min"] >= 0.0
    assert summary["median"] == pytest.approx(float(np.median(values)))
    assert margin_summary([]) == {"min": None, "median": None}


def test_flat_logits_pass_but_are_flagged():
    flat = _llama(head_scale=0.05)
    runs = _run(flat)
    verdict = _judge(_run(flat), runs)
    assert verdict.passed
    assert verdict.metrics["top1_top2_margin_median"] < 0.1
    assert "warning: median top-1/top-2 margin" in verdict.details


def test_top_k_ignores_the_extra_sampled_token():
    step = {1: -0.1, 2: -1.0, 3: -2.0, 4: -3.0, 5: -4.0, 6: -5.0, 99: -20.0}
    assert set(top_k(step)) == {1, 2, 3, 4, 5}
    assert set(top_k(step, 2)) == {1, 2}


def test_length_mismatch_fails():
    a = GreedyOutput([1, 2, 3], [{1: 0.0}, {2: 0.0}, {3: 0.0}])
    b = GreedyOutput([1, 2], [{1: 0.0}, {2: 0.0}])
    result = compare_greedy(a, b)
    assert not result.accepted and "lengths differ" in result.reason


def test_result_verdict_and_json_shape(tmp_path):
    result = ValidationResult(target="cpu", model_dir="/m")
    result.checks.append(Check.not_run("accuracy", "no reference"))
    assert not result.passed  # accuracy must pass, not-run is not a pass
    result.checks[0] = Check("accuracy", "passed", {"x": math.nan, "y": np.float32(2)})
    result.checks.append(Check.not_run("kv-cache", "later"))
    assert result.passed
    result.checks.append(Check("spec-decode:ngram", "failed"))
    assert not result.passed
    data = json.loads(result.write(tmp_path).read_text())
    assert list(data) == [
        "passed",
        "target",
        "model_dir",
        "vllm_model_class",
        "reference",
        "cpu_compat",
        "checks",
    ]
    assert data["passed"] is False
    assert [c["status"] for c in data["checks"]] == ["passed", "not-run", "failed"]
    assert [c["passed"] for c in data["checks"]] == [True, False, False]
    assert data["checks"][0]["metrics"] == {"x": None, "y": 2.0}
    assert set(data["checks"][0]) == {"name", "status", "passed", "metrics", "details"}


def test_report_is_self_contained(reference):
    verdict = _judge(reference, reference)
    result = ValidationResult(
        target="cpu", model_dir="/m", vllm_model_class="a.B", reference="ref <x>"
    )
    result.checks = [Check("accuracy", "passed", verdict.metrics, verdict.details)]
    page = render_report(result)
    assert page.startswith("<!DOCTYPE html>")
    assert "ref &lt;x&gt;" in page and "<svg" in page
    for remote in ("http://", "https://", "<script", "<link"):
        assert remote not in page.replace("http://www.w3.org/2000/svg", "")


def test_check_names():
    assert parse_checks(None) == ["accuracy"]
    assert parse_checks("kv-cache,spec-decode:mtp,quant:nvfp4") == [
        "accuracy",
        "kv-cache",
        "spec-decode:mtp",
        "quant:nvfp4",
    ]
    for bad in ("acuracy", "quant:fp9", "spec-decode:", "quant:"):
        with pytest.raises(InputError, match="unknown check"):
            parse_checks(bad)


def test_the_engine_error_behind_a_dead_engine_is_found_in_its_log(tmp_path):
    """A check whose engine dies under a request names the engine's own error
    (lines as vLLM 0.32's CPU workers log them), not only EngineDeadError."""
    from onboard.validate.harness import engine_error

    log = tmp_path / "engine.log"
    log.write_text(
        "(MainProcess pid=8330) WARNING 12-03 16:49:18 [base.py:380] ValueError: "
        "Tokenizer not available when `skip_tokenizer_init=True`\n"
        "(Worker pid=8790) ERROR 12-03 16:49:18 [multiproc_executor.py:1063] "
        "Traceback (most recent call last):\n"
        "(Worker pid=8790) ERROR 12-03 16:49:18 [multiproc_executor.py:1063] "
        "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 "
        "kv_cache_idx=0\n"
        "(EngineCore pid=8456) ERROR 12-03 16:49:18 [core.py:1512] "
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue\n"
    )
    assert engine_error(log) == (
        "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 "
        "kv_cache_idx=0"
    )
    log.write_text("(EngineCore pid=1) INFO 12-03 16:49:18 [core.py:1] started\n")
    assert engine_error(log) is None
    assert engine_error(tmp_path / "absent.log") is None


def test_an_error_the_engine_raised_in_the_worker_is_the_checks_engine_error(
    tmp_path, monkeypatch
):
    """With the engine core in onboard's worker, vLLM logs nothing of an error
    under a request: the check names the error the worker sent back."""
    from types import SimpleNamespace

    from onboard.runtime.engine import EngineRequestError
    from onboard.validate import harness

    error = "RuntimeError: Unsupported CPU attention configuration: head_dim=16"

    def runner(ctx, name):
        raise EngineRequestError("generate", error)

    monkeypatch.setattr(harness, "_runner", lambda name: runner)
    log = tmp_path / "engine.log"
    log.write_text("(MainProcess pid=1) INFO 12-03 16:49:18 [core.py:1] started\n")
    ctx = SimpleNamespace(engine=SimpleNamespace(log_path=log))
    check = harness._run_check(ctx, "accuracy")
    assert check.status == "failed"
    assert check.metrics["engine_error"] == error
    assert f"The engine's own error: {error}" in check.details
