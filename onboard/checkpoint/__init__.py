"""Checkpoints for validation: tiny random checkpoints in the spec's layout."""

from onboard.checkpoint.shrink import select_layers, shrink_spec
from onboard.checkpoint.tiny import plan_tensors, write_tiny_checkpoint

__all__ = ["plan_tensors", "select_layers", "shrink_spec", "write_tiny_checkpoint"]
