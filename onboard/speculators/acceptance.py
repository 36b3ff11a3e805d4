"""Run a checkpoint with a speculative config on the real vLLM engine and read the
acceptance from vLLM's own counters.

The engine is :class:`onboard.runtime.engine.Engine` (the validate stage's worker
process and plugin environment); this module only adds the speculative config and
turns ``llm.get_metrics()``'s spec-decode counters into rates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onboard.runtime.engine import Engine, EngineOptions, Plugin

PREFIX = "vllm:spec_decode_"


def acceptance(metrics: dict[str, Any]) -> dict[str, Any]:
    """Acceptance from vLLM's counters: per draft position, the share of drafts
    whose token at that position was accepted; the mean acceptance length (tokens
    per verification step: accepted drafts + the verifier's own token)."""
    drafts = metrics.get(PREFIX + "num_drafts") or 0
    accepted = metrics.get(PREFIX + "num_accepted_tokens") or 0
    per_pos = list(metrics.get(PREFIX + "num_accepted_tokens_per_pos") or [])
    return {
        "num_drafts": drafts,
        "num_draft_tokens": metrics.get(PREFIX + "num_draft_tokens") or 0,
        "num_accepted_tokens": accepted,
        "acceptance_rate_per_position": [
            c / drafts if drafts else 0.0 for c in per_pos
        ],
        "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
    }


def run_with_speculation(
    model_dir: Path,
    speculative_config: dict[str, Any] | None,
    prompts: list[list[int]],
    work_dir: Path,
    *,
    max_new_tokens: int = 32,
    uses_mla: bool = False,
    plugin: Plugin | None = None,
    max_model_len: int = 256,
    dtype: str = "float32",
    compat: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Greedy continuations of ``prompts`` (with top-k logprobs) and the acceptance
    counters, from one engine built with ``speculative_config``."""
    options = EngineOptions(
        model_dir=Path(model_dir),
        plugin=plugin,
        max_model_len=max_model_len,
        uses_mla=uses_mla,
        extra={"speculative_config": speculative_config, "dtype": dtype},
        compat=compat,
    )
    work_dir = Path(work_dir)
    engine = Engine(options, work_dir / "engine", work_dir / "engine.log")
    engine.start()
    try:
        info = engine.wait_ready()
        reply = engine.greedy(prompts, max_new_tokens)
        metrics = engine.metrics()
    finally:
        engine.close()
    return {
        "model_class": info["model_class"],
        "outputs": reply["outputs"],
        "generate_s": reply["time_s"],
        **acceptance(metrics),
    }
