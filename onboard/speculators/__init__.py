"""Speculative decoding: vLLM configs for every method, speculators-format draft
heads and their training recipes, and a trained EAGLE-3 head for tiny checkpoints
(docs/speculators.md)."""

from onboard.speculators.write import check_speculators, write_speculators

__all__ = ["check_speculators", "write_speculators"]
