"""Checkpoints for validation: tiny random checkpoints in the spec's layout."""

from onboard.checkpoint.tiny import plan_tensors, write_tiny_checkpoint
from onboard.spec.shrink import select_layers, shrink_spec

__all__ = ["plan_tensors", "select_layers", "shrink_spec", "write_tiny_checkpoint"]
