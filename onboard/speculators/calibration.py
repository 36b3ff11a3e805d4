"""Training prompts cut from the bundled calibration text, shared by the EAGLE-3
and MTP-head trainers."""

from __future__ import annotations

from onboard.errors import InputError
from onboard.quantize.calibration_text import TEXT


def calibration_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """``count`` windows of ``length`` tokens spread over the calibration text."""
    ids = tokenizer(TEXT).input_ids
    if len(ids) < length + 1:
        raise InputError("the calibration text is shorter than one prompt")
    stride = max(1, (len(ids) - length) // count)
    starts = range(0, len(ids) - length, stride)
    return [ids[s : s + length] for s in starts][:count]
