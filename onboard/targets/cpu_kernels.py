"""What vLLM's CPU build can run, for the checks that warn before an engine starts.

The facts and where they come from are in docs/vllm-cpu-notes.md; which
quantization schemes the cpu target runs is data in ``profiles.yaml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onboard.components.base import cpu_kernel_has

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
# be bfloat16 ('CPU GDN attention requires BF16.'). These bound serving on a CPU
# in bfloat16; onboard's own engine runs the layers in float32 through a shim
# (onboard.runtime.compat.gdn) whose torch kernels take any head dim and width.
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


def cpu_speculation_limit(spec: ModelSpec) -> str | None:
    """Why vLLM's CPU engine cannot run speculative decoding on ``spec``'s model
    (None: it can).

    Kimi delta attention: vLLM's KDA kernels are Triton-only (the CPU build's
    Triton has no CPU backend). The generated KDA layer's plain-torch CPU path
    runs prefill and decode, one state per sequence; verifying draft tokens needs
    a state per draft position, which vLLM keeps in those kernels only.
    """
    lin = spec.linear_attention
    if lin is None or lin.type != "kimi_delta":
        return None
    return (
        "speculative decoding with Kimi delta attention needs vLLM's KDA "
        "kernels, which are Triton-only: the generated KDA layer's CPU path "
        "keeps one state per sequence, not one per draft position; the GPU "
        "targets' emitted run script covers this check"
    )


# The V2 model runner requires Triton (vllm/config/vllm.py:724-728, raised at
# 3189-3190 under VLLM_USE_V2_MODEL_RUNNER=1); the CPU build's Triton has no CPU
# backend, so the CPU engine always runs the V1 runner.
_V2_ONLY = (
    "raised at 3198-3202), and the V2 runner requires Triton "
    "(vllm/config/vllm.py:724-728 and 3189-3190), which the CPU build has "
    "without a CPU backend; the GPU targets' emitted run script covers this check"
)
# Methods vLLM 0.32 runs in its V2 model runner only, and why.
_V2_METHODS = {
    "dspark": (
        "vLLM 0.32 implements dspark (and enable_adaptive_verification, which "
        "onboard's dspark config sets) in the V2 model runner only: the V1 runner "
        "refuses it ('Model Runner V1 does not support: dspark speculative "
        "decoding', vllm/config/vllm.py:2976-2981, "
    ),
    "dflash2": (
        "vLLM 0.32 implements dflash2 (a DFlash2DraftModel head: grouped "
        "convolution, a Triton kernel, model_executor/models/qwen3_dflash2.py:25, "
        "and a candidate selector) in the V2 model runner only "
        "(v1/worker/gpu/spec_decode/__init__.py:34-39): the V1 runner refuses "
        "the head ('Model Runner V1 does not support: DFlash candidate-head "
        "drafts', vllm/config/vllm.py:2987-2991, "
    ),
}


def cpu_method_limit(method: str) -> str | None:
    """Why vLLM 0.32's CPU engine cannot run the speculative ``method`` (None:
    it can, or it is tried for real).

    DSpark and DFlash2 (and adaptive verification, which onboard sets for them)
    are implemented by the V2 model runner alone, and the V2 runner needs
    Triton, whose CPU backend the CPU build lacks (checked on vllm-cpu 0.32.0).
    """
    if method not in _V2_METHODS:
        return None
    return _V2_METHODS[method] + _V2_ONLY


def cpu_engine_limit(spec: ModelSpec) -> str | None:
    """Why vLLM's CPU engine cannot start ``spec``'s model at all (None: it can):
    the first of its components' limits (Llama-4's chunks off vLLM's CPU KV
    block: onboard.components.chunked_attention)."""
    from onboard import components

    for component in components.present(spec):
        limit = component.cpu_engine_limit(spec)
        if limit is not None:
            return limit
    return None


# The CPU kernel op each scheme's vLLM linear method calls where vLLM's AVX2
# kernel build lacks it: on a CPU without AVX-512, vLLM 0.32 loads
# vllm/_C_AVX2 (platforms/cpu.py import_kernels), which has no
# cpu_gemm_wna16 (its AVX512 and AVX512-BF16 builds have it): the engine starts,
# then dies in the first forward pass (CPUWNA16LinearKernel).
SCHEME_CPU_OPS = {"w4a16": "cpu_gemm_wna16", "w4a16-asym": "cpu_gemm_wna16"}


def amx_int8_gemm() -> bool:
    """Whether vLLM runs symmetric INT8 GEMMs on this CPU with its AMX kernel
    (``int8_scaled_mm_with_quant``, chosen where the CPU has AMX tiles:
    vllm/model_executor/kernels/linear/scaled_mm/cpu.py,
    ``CPUInt8ScaledMMLinearKernel.process_weights_after_loading``, and
    ``check_cpu_sgl_kernel`` in vllm/model_executor/layers/utils.py), which takes
    bfloat16 or float16 activations only ("int8_scaled_mm_with_quant: expect A
    to be bfloat16 or half", measured in float32 on an AMX host). Without AMX
    vLLM takes its oneDNN kernel, which runs float32 too."""
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def missing_cpu_kernel(scheme: str) -> str | None:
    """Why vLLM's CPU kernels on this machine cannot run ``scheme`` (None: they
    can, as far as the kernel build shows)."""
    op = SCHEME_CPU_OPS.get(scheme)
    if op is None or cpu_kernel_has(op):
        return None
    return (
        f"vLLM 0.32's CPU kernel for {scheme} ({op}) is not in the kernel build it "
        "loads on this CPU (without AVX-512: vllm/_C_AVX2, platforms/cpu.py "
        "import_kernels)"
    )
