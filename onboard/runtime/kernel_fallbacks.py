"""Kernel selection on vLLM's CPU build, for building a quantized model whose
kernels the CPU cannot run (the weights probe, :mod:`onboard.runtime.weights_probe`).

vLLM 0.32's CPU build refuses to *build* a layer of some quantization formats: it
finds no kernel for it (NVFP4, MXFP4), or its kernel needs AMX tiles (FP8-block,
and the CPU experts of gpt-oss's MXFP4, of INT4 and of INT8 on a CPU without
AMX). Building is all the
probe needs: it loads the checkpoint into the parameters and runs nothing. Each
fallback wraps one of vLLM's selection functions: vLLM's own choice runs first, and
only where it raises does the wrapper return a kernel class vLLM itself has for
the format (its emulation kernel, or the CPU kernel with the hardware check
skipped). The quantization scheme's ``create_weights`` is vLLM's own, so the
parameters (names, shapes, dtypes, weight loaders) are exactly what vLLM builds on
a machine that runs the format.

Never installed into an engine: a model built this way cannot run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

# What each fallback replaced, for the probe's report.
TAKEN: list[str] = []


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:100]


def _replace_everywhere(original: Callable, replacement: Callable) -> None:
    """Point every loaded vLLM module's name for ``original`` at ``replacement``
    (the schemes import the selection functions by name)."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm") or module is None:
            continue
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if value is original:
                setattr(module, attr, replacement)


def _without_checks(cls: type, config: Any) -> Any:
    """An instance of kernel ``cls`` whose constructor may assert hardware or
    optional packages: the probe only needs the object to exist."""
    try:
        return cls(config)
    except AssertionError:
        kernel = cls.__new__(cls)
        kernel.config = config
        return kernel


def install() -> None:
    """Wrap vLLM's kernel and MoE-backend selection (idempotent)."""
    if getattr(install, "done", False):
        return
    import vllm.model_executor.kernels.linear as linear
    import vllm.model_executor.layers.fused_moe.oracle.int8 as moe_int8
    import vllm.model_executor.layers.fused_moe.oracle.int_wna16 as moe_wna16
    import vllm.model_executor.layers.fused_moe.oracle.mxfp4 as moe_mxfp4
    import vllm.model_executor.layers.fused_moe.oracle.nvfp4 as moe_nvfp4

    # The modules that import the selection functions by name.
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors  # noqa: F401, E501
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_mxfp4  # noqa: F401, E501
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4  # noqa: F401, E501
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w8a8_fp8  # noqa: F401, E501
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w8a8_int8  # noqa: F401, E501
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_wna16  # noqa: F401, E501
    import vllm.model_executor.layers.quantization.mxfp4  # noqa: F401
    from vllm.platforms import current_platform

    choose_scaled_mm = linear.choose_scaled_mm_linear_kernel
    init_nvfp4 = linear.init_nvfp4_linear_kernel
    init_mxfp4 = linear.init_mxfp4_linear_kernel
    select_nvfp4_moe = moe_nvfp4.select_nvfp4_moe_backend
    select_mxfp4_moe = moe_mxfp4.select_mxfp4_moe_backend
    select_int8_moe = moe_int8.select_int8_moe_backend
    select_wna16_moe = moe_wna16.select_wna16_moe_backend

    def choose_scaled_mm_linear_kernel(config, possible_kernels, *args, **kwargs):
        # FP8 (block) and INT8: the CPU block kernel refuses without AMX tiles.
        try:
            return choose_scaled_mm(config, possible_kernels, *args, **kwargs)
        except ValueError as exc:
            for kernel in possible_kernels.get(current_platform._enum, []):
                if kernel.can_implement(config)[0]:
                    why = _first_line(exc)
                    TAKEN.append(f"scaled-mm linear: {kernel.__name__} ({why})")
                    return kernel
            raise

    def emulated(original: Callable, label: str, build: Callable) -> Callable:
        """``original``, or where it finds no kernel, vLLM's emulation kernel of
        the format (``build``: its instance, from the same arguments)."""

        def select(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            except ValueError as exc:
                TAKEN.append(f"{label}: emulation ({_first_line(exc)})")
                return build(*args, **kwargs)

        return select

    def nvfp4_emulation(use_a16: bool = False):
        # No CPU entry among vLLM's NVFP4 linear kernels (W4A16 forces Marlin).
        from vllm.model_executor.kernels.linear.nvfp4.base import (
            NvFp4LinearLayerConfig,
        )
        from vllm.model_executor.kernels.linear.nvfp4.emulation import (
            EmulationNvFp4LinearKernel,
        )

        return _without_checks(EmulationNvFp4LinearKernel, NvFp4LinearLayerConfig())

    def mxfp4_emulation(activation_quant_key=None):
        # No CPU entry among vLLM's MXFP4 linear kernels.
        from vllm.model_executor.kernels.linear.mxfp4.base import (
            MxFp4LinearLayerConfig,
        )
        from vllm.model_executor.kernels.linear.mxfp4.emulation import (
            EmulationMxfp4LinearKernel,
        )

        config = MxFp4LinearLayerConfig(activation_quant_key=activation_quant_key)
        return _without_checks(EmulationMxfp4LinearKernel, config)

    init_nvfp4_linear_kernel = emulated(init_nvfp4, "NVFP4 linear", nvfp4_emulation)
    init_mxfp4_linear_kernel = emulated(init_mxfp4, "MXFP4 linear", mxfp4_emulation)

    def select_nvfp4_moe_backend(config, weight_key, activation_key):
        # No NVFP4 fused-MoE backend on CPU.
        try:
            return select_nvfp4_moe(config, weight_key, activation_key)
        except (ValueError, NotImplementedError) as exc:
            backend = moe_nvfp4.NvFp4MoeBackend.EMULATION
            try:
                experts = moe_nvfp4.backend_to_kernel_cls(backend)[0]
            except Exception:  # noqa: BLE001 (its module needs Triton)
                experts = None
            TAKEN.append(f"NVFP4 MoE: emulation ({_first_line(exc)})")
            return backend, experts

    def cpu_experts(original: Callable, label: str, oracle, backend, experts: str):
        """``original``, or where it finds no backend, vLLM's x86 CPU experts
        (``experts``, a class of ``oracle``'s CPU backend), which need AMX tiles:
        vLLM picks them (and their padding) on a CPU that has them."""

        def select(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            except (ValueError, NotImplementedError) as exc:
                TAKEN.append(f"{label}: {experts} ({_first_line(exc)})")
                classes = oracle.backend_to_kernel_cls(backend)
                return backend, next(c for c in classes if c.__name__ == experts)

        return select

    # gpt-oss's MXFP4 experts; INT4 (W4A16) and INT8 (W8A8) experts.
    select_mxfp4_moe_backend = cpu_experts(
        select_mxfp4_moe, "MXFP4 MoE", moe_mxfp4, moe_mxfp4.Mxfp4MoeBackend.CPU,
        "CPUExpertsMxfp4",
    )  # fmt: skip
    select_int8_moe_backend = cpu_experts(
        select_int8_moe, "INT8 MoE", moe_int8, moe_int8.Int8MoeBackend.CPU,
        "CPUExpertsInt8",
    )  # fmt: skip
    select_wna16_moe_backend = cpu_experts(
        select_wna16_moe, "WNA16 MoE", moe_wna16, moe_wna16.WNA16MoEBackend.CPU,
        "CPUExpertsInt4",
    )  # fmt: skip

    for original, replacement in (
        (choose_scaled_mm, choose_scaled_mm_linear_kernel),
        (init_nvfp4, init_nvfp4_linear_kernel),
        (init_mxfp4, init_mxfp4_linear_kernel),
        (select_nvfp4_moe, select_nvfp4_moe_backend),
        (select_mxfp4_moe, select_mxfp4_moe_backend),
        (select_int8_moe, select_int8_moe_backend),
        (select_wna16_moe, select_wna16_moe_backend),
    ):
        _replace_everywhere(original, replacement)
    install.done = True  # type: ignore[attr-defined]
