"""An EAGLE-3 head beside an MLA verifier on vLLM's CPU build, on any x86-64 CPU.

vLLM 0.32 puts the verifier's MLA layers and a head's full-attention layer in one
KV-cache group, and one group runs one kernel block size
(``vllm/v1/worker/utils.py: prepare_kernel_block_sizes``). The CPU backends that
exist on every x86-64 CPU disagree on it: the MLA backend ``CPU_MLA`` takes
blocks of exactly 16, the attention backend ``CPU_ATTN`` of the head multiples of
32, so the engine refuses the pair ("No common block size for 16 (CPU_MLA: [16];
CPU_ATTN: [MultipleOf(32)])"). The ``AMX_MLA`` backend takes multiples of 32, but
only bfloat16 and only on CPUs with AMX tiles (``vllm/platforms/cpu.py``).

A sliding-window layer gets a KV-cache group of its own, whose block size vLLM
picks from the layer's backend (``Attention.get_kv_cache_spec``: 32 for
``CPU_ATTN``). So the head is served with its attention declared a sliding window
as long as its context: the same attention (no position is ever outside the
window), in its own group of 32-token blocks beside the verifier's 16-token MLA
groups, in float32 with ``CPU_MLA`` like the main engine, whatever the CPU has.
Only the ``config.json`` of a copy changes; the weights are the head's own files.

The groups must then share one page size (``unify_kv_cache_spec_page_size``): an
MLA page (16 tokens x 576 latent values) can be neither padded nor split, so the
head's page (32 tokens x K and V of every KV head) must fit inside it and is
padded up to it: at most 144 K+V values per token, i.e. one KV head of 128
(:func:`cpu_kv_heads`, the shape onboard trains its heads for MLA verifiers in).
A wider head makes vLLM fall back to one group for all layers, and the engine
refuses it as above.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from onboard.spec.model import ModelSpec

SLIDING = "sliding_attention"
# The draft's attention heads are this wide when the verifier has none to copy (MLA)
# (onboard.speculators.heads); one KV head of it fits MAX_KV_WIDTH below.
HEAD_DIM = 128
# The widest head (KV heads x head_dim) whose 32-token page fits a 16-token MLA
# page of kv_lora_rank + qk_rope_head_dim = 576 values: 32 * 2 * w <= 16 * 576.
MAX_KV_WIDTH = 144


def needs_full_window(spec: ModelSpec, method: str) -> bool:
    """Whether ``method``'s head meets the block-size clash above (an EAGLE-3 or
    P-EAGLE head's Llama layer beside an MLA verifier)."""
    return method in ("eagle3", "p_eagle") and spec.attention.type == "mla"


def cpu_kv_heads(spec: ModelSpec) -> int | None:
    """KV heads of a head vLLM's CPU engine can serve beside ``spec``'s verifier:
    one beside MLA (the module docstring), None (the default shape) otherwise."""
    if spec.attention.type != "mla":
        return None
    return max(1, MAX_KV_WIDTH // HEAD_DIM)


def full_window_draft(draft: str, out_dir: Path) -> tuple[str, dict[str, Any]]:
    """A copy of the local head ``draft`` in ``out_dir`` whose attention layers are
    sliding windows of the head's whole context, and what changed. A Hub id is
    returned unchanged (nothing to rewrite locally)."""
    src = Path(draft)
    if not (src / "config.json").is_file():
        return draft, {}
    config = json.loads((src / "config.json").read_text())
    layer = config["transformer_layer_config"]
    window = int(layer["max_position_embeddings"])
    layer["layer_types"] = [SLIDING] * int(layer["num_hidden_layers"])
    layer["sliding_window"] = window
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    for item in src.iterdir():
        if item.name != "config.json":
            os.symlink(item.resolve(), out_dir / item.name)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    change = {
        "draft_checkpoint": str(src),
        "draft_attention": (
            f"sliding window of {window} tokens (the head's whole context: the "
            "same attention) for a KV-cache group of its own beside the MLA "
            "verifier's"
        ),
    }
    return str(out_dir), change


def cpu_features() -> dict[str, bool]:
    """The x86 features vLLM's CPU build checks before choosing a kernel, read
    with the same probes (``torch.cpu._is_*_supported``)."""
    import torch

    probes = {
        "avx2": torch.cpu._is_avx2_supported,
        "avx512": torch.cpu._is_avx512_supported,
        "avx512_bf16": torch.cpu._is_avx512_bf16_supported,
        "amx": torch.cpu._is_amx_tile_supported,
    }
    return {name: bool(probe()) for name, probe in probes.items()}


def lacking_note(reason: str, features: dict[str, bool]) -> str:
    """What this CPU lacks that vLLM's refusal ``reason`` points at ("" when it
    points at nothing the CPU could have)."""
    lacking = [name for name, present in features.items() if not present]
    if block_clash(reason) and "amx" in lacking:
        return (
            "the MLA backend that takes 32-token blocks (AMX_MLA, bfloat16) needs "
            "AMX, which this CPU lacks"
        )
    if "AMX" in reason and "amx" in lacking:
        return "vLLM's kernel for it needs AMX, which this CPU lacks"
    if "AVX-512" in reason and "avx512" in lacking:
        return "vLLM's kernel for it needs AVX-512, which this CPU lacks"
    return ""


def block_clash(reason: str) -> bool:
    """vLLM's refusal of a draft beside the CPU MLA backend (module docstring)."""
    return "No common block size" in reason and "CPU_MLA" in reason


def describe(features: dict[str, bool]) -> str:
    """E.g. "avx2; no avx512, avx512_bf16, amx"."""
    have = [name for name, present in features.items() if present]
    lack = [name for name, present in features.items() if not present]
    text = ", ".join(have) or "none of " + ", ".join(features)
    return text + (f"; no {', '.join(lack)}" if lack and have else "")


# Methods that may draft fewer than k tokens in a step (none, when the n-gram
# matcher finds nothing), where MTP, EAGLE-3 and draft models always draft k.
VARIABLE_DRAFTS = ("ngram", "suffix")


def variable_drafts_note(spec: ModelSpec, method: str) -> str | None:
    """Why speculation of ``method`` on ``spec``'s linear-attention layers is not
    lossless on vLLM 0.32's CPU build (None: no known reason)."""
    if method not in VARIABLE_DRAFTS or not any(
        spec.is_linear_layer(i) for i in range(spec.num_hidden_layers)
    ):
        return None
    return (
        "known cause: vLLM 0.32's CPU Gated DeltaNet speculative path keeps the "
        "convolution's inputs in a rolling buffer of kernel - 1 + k columns that it "
        "shifts by the tokens a step carries and reads from the start at the "
        "accepted offset (model_executor/layers/mamba/ops/cpu/gdn_attention.py, "
        "_spec_forward); that holds only when every step carries k draft tokens, "
        f"which {method} does not (it drafts none when nothing matches), so the "
        "convolution reads stale inputs. mtp drafts k every step and is lossless."
    )
