"""What vLLM's CPU build needs to run generated models for validation.

The generated model files are what a vLLM maintainer would merge: no platform
branch, no CPU-kernel workaround. Where vLLM's CPU build lacks a kernel or gets
one wrong, the engine that onboard starts installs a shim here, into vLLM's own
classes, in every process of that engine. Each shim names the vLLM limitation it
works around and the vLLM release it is written for; each does nothing outside
vLLM's CPU platform, and none is installed into the user's environment.

The engine reaches this package as a second ``vllm.general_plugins`` entry point
(``onboard_cpu_compat``), declared in the synthesized ``.dist-info`` beside the
generated plugin's (:func:`onboard.runtime.engine.compat_plugin`); the
environment variable ``ONBOARD_CPU_COMPAT`` names the shims a model needs
(:func:`shims_for`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec

ENV = "ONBOARD_CPU_COMPAT"
ENTRY_POINT = "onboard_cpu_compat"
TARGET = "onboard.runtime.compat:register"

logger = logging.getLogger("vllm.onboard_cpu_compat")


@dataclass(frozen=True)
class Shim:
    name: str
    limitation: str  # what vLLM's CPU build lacks or gets wrong
    vllm_series: str  # the vLLM release series the shim is written for
    install: Callable[[], None]  # idempotent; runs in each vLLM process


def _shims() -> dict[str, Shim]:
    from onboard.runtime.compat import gdn, kda, mla_blocks, rope, router

    shims = (
        Shim("rope_heads", rope.LIMITATION, "0.32", rope.install),
        Shim("plain_topk_router", router.LIMITATION, "0.32", router.install),
        Shim("mla_blocks", mla_blocks.LIMITATION, "0.32", mla_blocks.install),
        Shim("kda_torch", kda.LIMITATION, "0.32", kda.install),
        Shim("gdn_float32", gdn.LIMITATION, "0.32", gdn.install),
    )
    return {shim.name: shim for shim in shims}


def shims() -> dict[str, Shim]:
    """Every shim, by name."""
    return _shims()


def shims_for(spec: ModelSpec) -> tuple[str, ...]:
    """The shims vLLM's CPU build needs to run ``spec``'s generated model."""
    att, moe = spec.attention, spec.mlp.moe
    lin = spec.linear_attention
    needed = []
    if att.type == "mla":
        # The MLA query's rope part is [tokens, heads, dims].
        needed.append("rope_heads")
    if moe is not None and moe.router.num_groups is None:
        r = moe.router
        # sqrtsoftplus has a CPU kernel of its own (biased_topk_cpu).
        if r.scoring == "sigmoid" or (
            r.scoring == "softmax"
            and (r.bias_correction or r.routed_scaling_factor != 1)
        ):
            needed.append("plain_topk_router")
    if att.type == "mla" and lin is not None:
        needed.append("mla_blocks")
    if lin is not None and lin.type == "kimi_delta":
        needed.append("kda_torch")
    if lin is not None and lin.type == "gated_deltanet":
        needed.append("gdn_float32")
    return tuple(needed)


def register() -> None:
    """vLLM's general-plugin hook: install the shims ``ONBOARD_CPU_COMPAT`` names
    (comma-separated), on vLLM's CPU platform only. vLLM calls it in each of its
    processes; installing again changes nothing."""
    names = [n for n in os.environ.get(ENV, "").split(",") if n]
    if not names:
        return
    from vllm import __version__ as vllm_version
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    known = shims()
    for name in names:
        shim = known.get(name)
        if shim is None:
            raise ValueError(
                f"{ENV}: unknown CPU shim {name!r} (known: {sorted(known)})"
            )
        if not vllm_version.startswith(shim.vllm_series + "."):
            logger.warning(
                "onboard CPU shim %s is written for vLLM %s, not %s: not installed",
                name,
                shim.vllm_series,
                vllm_version,
            )
            continue
        shim.install()
        logger.debug("onboard CPU shim %s: %s", name, shim.limitation)
