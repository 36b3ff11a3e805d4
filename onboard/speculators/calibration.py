"""Training prompts cut from the bundled calibration text, and the verifier's
greedy continuations of them, shared by the EAGLE-3 and MTP-head trainers."""

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


def greedy_continuations(model, ids, new_tokens: int, attention_mask=None):
    """``ids`` [batch, length] followed by ``new_tokens`` greedy tokens each:
    what the verifier itself would say next, the drafts' training targets."""
    import torch

    with torch.inference_mode():
        return model.generate(
            ids,
            attention_mask=attention_mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
