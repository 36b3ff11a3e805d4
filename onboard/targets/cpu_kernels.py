"""What vLLM's CPU build can run, for the checks that warn before an engine starts.

The facts and where they come from are in docs/vllm-cpu-notes.md; which
quantization schemes the cpu target runs is data in ``profiles.yaml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec

# The CPU MLA decode kernel's only latent size (kv_lora_rank + qk_rope_head_dim):
# DeepSeek's 512 + 64. Other sizes fail deep inside ('Unsupported block size: 16').
CPU_MLA_LATENT = 576

# vLLM's CPU Gated DeltaNet kernels (measured on the pinned build): the chunked
# prefill kernel (chunk_gated_delta_rule_cpu) takes key and value head dims that
# are equal and 64 or 128 ('Unexpected head dim size, 32', 'expect head_dim to be
# equal to head_dim_v'); the convolution's weights are packed for the C++ kernel
# only at width 4, which the AVX-512-BF16 path then assumes; and activations must
# be bfloat16 ('CPU GDN attention requires BF16.').
CPU_GDN_HEAD_DIMS = (64, 128)
CPU_GDN_CONV_WIDTH = 4


def cpu_gdn_problems(
    key_head_dim: int, value_head_dim: int, conv_kernel_size: int
) -> list[str]:
    """What keeps vLLM's CPU Gated DeltaNet kernels from running these dims."""
    problems = []
    if key_head_dim != value_head_dim:
        problems.append(
            f"key_head_dim {key_head_dim} and value_head_dim {value_head_dim} "
            "differ (the CPU prefill kernel needs them equal)"
        )
    elif key_head_dim not in CPU_GDN_HEAD_DIMS:
        problems.append(
            f"head dim {key_head_dim} (the CPU prefill kernel takes "
            f"{' or '.join(map(str, CPU_GDN_HEAD_DIMS))})"
        )
    if conv_kernel_size != CPU_GDN_CONV_WIDTH:
        problems.append(
            f"conv_kernel_size {conv_kernel_size} (the CPU convolution kernel's "
            f"packed weights take width {CPU_GDN_CONV_WIDTH})"
        )
    return problems


def cpu_engine_limit(spec: ModelSpec) -> str | None:
    """Why vLLM's CPU engine cannot run ``spec``'s model at all (None: it can).

    Kimi delta attention beside MLA layers: vLLM's hybrid cache aligns an MLA
    model's attention block to a multiple of 128 tokens (for its GPU MLA decode
    kernels; ``Platform._align_hybrid_block_size``), and the CPU MLA backend takes
    16-token blocks only, so the engine stops at start-up ('Aligned KV cache block
    size 256 is not supported by attention backend(s): CPU_MLA', measured on
    kimi-k3-style's tiny checkpoint). vLLM's KDA kernels are Triton-only as well;
    the generated KDA layer's plain-torch CPU path covers that, and KDA beside gqa
    attention runs. The engine's own error is recorded beside this reason by the
    checks that meet it.
    """
    lin = spec.linear_attention
    if lin is None or lin.type != "kimi_delta" or spec.attention.type != "mla":
        return None
    return (
        "vLLM's CPU build cannot run Kimi delta attention beside MLA layers: its "
        "hybrid cache aligns an MLA model's block size to a multiple of 128 tokens "
        "and the CPU MLA backend takes 16-token blocks only; the GPU targets' "
        "emitted run script covers this check"
    )
