"""A trained EAGLE-3 head on a tiny checkpoint, measured on the real vLLM engine.

For a spec: write its tiny checkpoint, train a head on the checkpoint's own greedy
outputs (:mod:`onboard.speculators.eagle3`), keep the same head untrained as the
baseline, then run the accuracy check's prompts (never used in training) through
three engines — trained head, untrained head, no speculation — and report vLLM's
acceptance counters and whether the greedy outputs agree (lossless).

Every engine runs float32; beside an MLA verifier (CPU_MLA) the head is served
with a full-context sliding window, so that it gets a KV-cache group of its own
(:mod:`onboard.runtime.cpu_draft`: the CPU MLA and attention backends share no
block size). That runs on any x86-64 CPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onboard.runtime.compare import GreedyOutput, compare_greedy
from onboard.runtime.compat import shims_for
from onboard.runtime.cpu_draft import full_window_draft, needs_full_window
from onboard.runtime.engine import Plugin
from onboard.spec.model import ModelSpec
from onboard.speculators.acceptance import run_with_speculation

NUM_SPECULATIVE_TOKENS = 3


def _greedy(outputs: list[dict]) -> list[GreedyOutput]:
    return [GreedyOutput(o["token_ids"], o["logprobs"]) for o in outputs]


def lossless(with_draft: list[dict], without: list[dict]) -> dict[str, Any]:
    """The accuracy check's rule per prompt: equal tokens, or a first divergence
    where each side's token is in the other's top-k (a near tie)."""
    results = [
        compare_greedy(a, b)
        for a, b in zip(_greedy(with_draft), _greedy(without), strict=True)
    ]
    return {
        "prompts": len(results),
        "identical": sum(r.diverged_at is None for r in results),
        "passed": all(r.accepted for r in results),
        "divergences": [r.to_dict() for r in results if r.diverged_at is not None],
    }


def _run(model_dir, spec, speculative, prompts, work, plugin) -> dict[str, Any]:
    if speculative is not None and needs_full_window(spec, "eagle3"):
        model, _ = full_window_draft(speculative["model"], Path(work) / "draft")
        speculative = {**speculative, "model": model}
    return run_with_speculation(
        model_dir,
        speculative,
        prompts,
        work,
        uses_mla=spec.attention.type == "mla",
        plugin=plugin,
        compat=shims_for(spec),
    )


def evaluate_tiny_eagle3(
    spec: ModelSpec,
    work_dir: Path,
    *,
    seed: int = 0,
    budget_s: float = 240.0,
    plugin: Plugin | None = None,
    log=lambda _m: None,
) -> dict[str, Any]:
    """Train, serve and measure; returns (and writes to WORK/report.json) the
    acceptance of the trained and untrained heads and the lossless comparison."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.runtime.prompts import PROMPTS
    from onboard.runtime.reference import tokenize_prompts
    from onboard.spec import load_spec
    from onboard.speculators.eagle3 import train_eagle3_head

    work_dir = Path(work_dir)
    model_dir = write_tiny_checkpoint(spec, work_dir / "tiny", seed=seed)
    tiny = load_spec(model_dir / "spec.yaml")
    trained, untrained = work_dir / "eagle3-trained", work_dir / "eagle3-untrained"
    training = train_eagle3_head(
        tiny,
        model_dir,
        trained,
        num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
        seed=seed,
        budget_s=budget_s,
        untrained_dir=untrained,
        log=log,
    )
    log(f"trained {training['steps']} steps in {training['seconds']:.0f} s")
    prompts, note = tokenize_prompts(model_dir, PROMPTS, tiny.vocab_size)
    runs = {}
    for label, head in (("trained", trained), ("untrained", untrained)):
        speculative = {
            "method": "eagle3",
            "model": str(head),
            "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        }
        log(f"engine with the {label} head")
        runs[label] = _run(
            model_dir, tiny, speculative, prompts, work_dir / f"engine-{label}", plugin
        )
    log("engine without speculation")
    runs["none"] = _run(
        model_dir, tiny, None, prompts, work_dir / "engine-none", plugin
    )
    report = {
        "spec": spec.name,
        "engine_dtype": "float32",
        "model_class": runs["trained"]["model_class"],
        "prompts": note,
        "training": training,
        "trained": {k: v for k, v in runs["trained"].items() if k != "outputs"},
        "untrained": {k: v for k, v in runs["untrained"].items() if k != "outputs"},
        "no_speculation_generate_s": runs["none"]["generate_s"],
        "lossless_trained": lossless(
            runs["trained"]["outputs"], runs["none"]["outputs"]
        ),
        "lossless_untrained": lossless(
            runs["untrained"]["outputs"], runs["none"]["outputs"]
        ),
    }
    (work_dir / "report.json").write_text(json.dumps(report, indent=2))
    return report
