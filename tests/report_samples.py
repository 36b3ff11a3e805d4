"""Validation results with every plotted metric filled in, for the report's
rendering tests. They are written here in the shape docs/architecture.md fixes for
validation.json (the numbers are illustrative inputs, not measurements); the tests
that judge real numbers render a validation.json from a real engine run."""

from __future__ import annotations

from onboard.validate.results import Check, ValidationResult


def accuracy_check(diffs: list[float], atol: float = 1e-2) -> Check:
    per_prompt = [
        {
            "prompt": i,
            "prompt_logprob_max_abs_diff": d,
            "compared": 32,
            "matched": 32 if d <= atol else 7,
            "diverged_at": None if d <= atol else 7,
            "engine_token": None,
            "reference_token": None,
            "accepted": d <= atol,
            "reason": "",
        }
        for i, d in enumerate(diffs)
    ]
    failed = sum(d > atol for d in diffs)
    return Check(
        "accuracy",
        "failed" if failed else "passed",
        {
            "num_prompts": len(diffs),
            "prompt_logprob_max_abs_diff": max(diffs),
            "prompt_logprob_atol": atol,
            "greedy_failed_sequences": failed,
            "top1_top2_margin_median": 0.68,
            "per_prompt": per_prompt,
            "timings": {"engine_start_s": 85.5, "reference_s": 53.25},
        },
        f"{len(diffs)} prompts: prompt logprobs max |diff| {max(diffs):.3g} nats",
    )


def full_result(target: str = "cpu", scale: float = 1.0) -> ValidationResult:
    result = ValidationResult(
        target=target,
        model_dir="/models/tiny-novel-launch",
        vllm_model_class="onboard_plugin_novel_launch.model.NovelLaunchForCausalLM",
        reference="transformers NovelLaunchForCausalLM (generated reference)",
    )
    result.checks = [
        accuracy_check([7.2e-6 * (1 + i % 5) * scale for i in range(12)]),
        Check(
            "kv-cache",
            "passed",
            {"bytes_per_token": 10240, "bytes_per_token_without_sharing": 16384},
            "engine = plan: 10,240 B/token (16,384 without sharing)",
        ),
        Check(
            "quant:fp8-dynamic",
            "passed",
            {
                "kl_divergence": 0.0031 * scale,
                "top1_agreement": 0.985,
                "thresholds": {"kl_divergence": 0.01, "top1_agreement": 0.95},
            },
        ),
        Check(
            "quant:nvfp4",
            "failed",
            {
                "kl_divergence": 0.0412 * scale,
                "top1_agreement": 0.91,
                "thresholds": {"kl_divergence": 0.02, "top1_agreement": 0.9},
            },
            "KL 0.0412 > 0.02",
        ),
        Check(
            "spec-decode:mtp",
            "passed",
            {
                "mean_acceptance_length": 2.31,
                "acceptance_rate_per_position": [0.82 / scale, 0.49 / scale],
                "speedup": 1.27,
            },
        ),
        Check(
            "spec-decode:ngram",
            "passed",
            {
                "mean_acceptance_length": 1.62,
                "acceptance_rate_per_position": [0.41, 0.23 / scale, 0.12 / scale],
                "speedup": 0.85,
            },
        ),
        Check.not_run("tensor-parallel", "needs 2 devices; the cpu target has 1"),
        Check(
            "speed",
            "passed",
            {
                "output_tokens_per_s": 182.5 * scale,
                "ttft_ms": 41.0,
                "tpot_ms": 9.5,
                "sweep": [
                    {
                        "variant": variant,
                        "concurrency": c,
                        "output_tokens_per_s": base * c**0.7 * scale,
                        "ttft_ms": 30.0 + 4 * c,
                        "tpot_ms": 8.0 + c / 2,
                    }
                    for variant, base in (("bf16", 40.0), ("mtp", 52.0))
                    for c in (1, 2, 4, 8)
                ],
            },
        ),
    ]
    return result
