"""Parallel layouts and the memory one device needs for each.

A layout is tensor parallel (TP) within one NVLink/xGMI domain, optionally data
parallel (DP) replicas of the attention with the routed experts spread over every
rank (expert parallel, EP; MoE models only), pipeline stages (PP; dense models
across domains) and decode context parallelism (DCP: the KV cache of each request
sharded over the TP ranks that would otherwise hold copies of it).

Per device: weights (see :class:`onboard.serving.weights.WeightReport`), a reserve
(non-torch memory, activations, logits) and the KV cache of the requests that
rank serves. The rules are written out in :func:`reserve_bytes` and
:meth:`Layout.kv_bytes_per_request`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onboard.arch import ArchPlan
from onboard.serving.kv import KVReport
from onboard.serving.weights import WeightReport
from onboard.spec.model import ModelSpec

GiB = 1 << 30
# TP stays inside one scale-up domain and at most 8 ranks (vLLM's recipes; beyond
# that the all-reduces cost more than the memory saved).
MAX_TP = 8
# Activation buffers counted as this many bf16 tensors of max_num_batched_tokens x
# hidden_size (residual, normed input, q/k/v, attention output, MLP gate/up halves
# and their product at a few times the hidden size).
ACTIVATION_BUFFERS = 16
LOGIT_BYTES = 4  # float32 logits per vocabulary entry per scheduled sequence


@dataclass(frozen=True)
class Layout:
    tp: int
    dp: int = 1
    pp: int = 1
    ep: bool = False
    dcp: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def name(self) -> str:
        parts = [f"TP{self.tp}"]
        if self.dp > 1:
            parts.append(f"DP{self.dp}")
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        if self.ep:
            parts.append(f"EP{self.tp * self.dp}")
        if self.dcp > 1:
            parts.append(f"DCP{self.dcp}")
        return " x ".join(parts)

    def with_dcp(self, dcp: int) -> Layout:
        return Layout(self.tp, self.dp, self.pp, self.ep, dcp)

    # -- KV cache --------------------------------------------------------------

    def kv_replicas(self, arch: ArchPlan) -> int:
        """TP ranks that hold the same KV cache: MLA keeps one latent per token
        on every TP rank; GQA splits KV heads over TP and copies them beyond."""
        kv_heads = arch.attention.num_kv_heads
        if kv_heads is None:  # MLA
            return self.tp
        return max(1, self.tp // kv_heads)

    def kv_bytes_per_token(self, arch: ArchPlan, kv: KVReport) -> float:
        """One rank's KV bytes per token (uncapped by windows)."""
        heads_split = self.tp / self.kv_replicas(arch)
        return kv.bytes_per_token / heads_split / self.dcp / self.pp

    def kv_bytes_per_request(self, arch: ArchPlan, kv: KVReport, context: int) -> float:
        """One rank's share of one request's cache.

        The KV bytes are split over TP like the KV heads (MLA: not at all;
        GQA: over min(tp, kv_heads) ranks), over DCP ranks, and over pipeline
        stages (each holds its layers). Linear-attention states split over TP
        (vLLM shards their heads) and pipeline stages, and every DCP rank holds
        them whole."""
        heads_split = self.tp / self.kv_replicas(arch)
        kv_part = kv.kv_bytes_per_request(context) / heads_split / self.dcp / self.pp
        return kv_part + kv.state_bytes_per_sequence / self.tp / self.pp

    def requests_per_rank(self, concurrency: int) -> int:
        """DP replicas each serve their own requests (ceil)."""
        return math.ceil(concurrency / self.dp)


def candidate_layouts(
    arch: ArchPlan, devices_per_domain: int, max_devices: int, only: int | None = None
):
    """Layouts by device count (1, 2, 4, ... up to max_devices; ``only``: that
    count alone), each count in preference order: TP (+EP for MoE), then DP
    attention with EP (MoE), then across scale-up domains TP x DP with EP (MoE) or
    TP x PP (dense)."""
    moe = arch.has_moe
    tp_max = min(devices_per_domain, MAX_TP)
    n = 1 if only is None else only
    while n <= (max_devices if only is None else only):
        out: list[Layout] = []
        if n <= tp_max:
            out.append(Layout(tp=n, ep=moe and n > 1))
        if moe and n > 1:
            if n > tp_max:
                out.append(Layout(tp=tp_max, dp=n // tp_max, ep=True))
            out.append(Layout(tp=1, dp=n, ep=True))
        elif not moe and n > tp_max:
            out.append(Layout(tp=tp_max, pp=n // tp_max))
        yield from out
        n *= 2


def tp_problem(arch: ArchPlan, tp: int) -> str | None:
    """Why vLLM cannot split this model over ``tp`` ranks (None if it can)."""
    heads = arch.attention.num_heads
    if heads % tp:
        return f"num_heads {heads} is not divisible by TP {tp}"
    kv = arch.attention.num_kv_heads
    if kv is not None:  # GQA
        if kv % tp and tp % kv:
            return f"num_kv_heads {kv} and TP {tp}: neither divides the other"
    return None


def reserve_bytes(
    spec: ModelSpec,
    max_num_batched_tokens: int,
    sequences: int,
    overhead_gib: float,
    act_bytes: int,
) -> tuple[int, dict[str, int]]:
    """Memory a rank needs besides weights and KV cache, itemised:

    * non-torch: the target's fixed ``overhead_gib`` (CUDA/HIP context,
      NCCL/RCCL buffers, CUDA graphs);
    * activations: ACTIVATION_BUFFERS x max_num_batched_tokens x hidden_size x
      activation bytes (vLLM measures the real peak in its profile run);
    * logits: sequences x vocab_size x 4 B (float32 logits of every running
      sequence).
    """
    items = {
        "non-torch overhead": int(overhead_gib * GiB),
        "activations": ACTIVATION_BUFFERS
        * max_num_batched_tokens
        * spec.hidden_size
        * act_bytes,
        "logits": sequences * spec.vocab_size * LOGIT_BYTES,
    }
    return sum(items.values()), items


@dataclass
class DeviceMemory:
    """One rank's memory for a layout at the requested load."""

    layout: Layout
    usable: int
    weights: int
    reserve: int
    kv_needed: int  # requests_per_rank x per-request KV at the requested context
    problem: str | None = None  # the layout is not buildable

    @property
    def kv_budget(self) -> int:
        return self.usable - self.weights - self.reserve

    @property
    def fits(self) -> bool:
        return self.problem is None and self.kv_needed <= self.kv_budget

    @property
    def weights_fit(self) -> bool:
        return self.problem is None and self.kv_budget > 0


def device_memory(
    arch: ArchPlan,
    weights: WeightReport,
    kv: KVReport,
    layout: Layout,
    *,
    usable: int,
    reserve: int,
    context: int,
    concurrency: int,
) -> DeviceMemory:
    problem = tp_problem(arch, layout.tp)
    per_device = weights.per_device_bytes(
        layout.tp,
        layout.tp * layout.dp if layout.ep else None,
        layout.pp,
        arch.attention.num_kv_heads,  # None: MLA
    )
    kv_needed = math.ceil(
        layout.requests_per_rank(concurrency)
        * layout.kv_bytes_per_request(arch, kv, context)
    )
    return DeviceMemory(layout, usable, per_device, reserve, kv_needed, problem)


def max_context(
    arch: ArchPlan, kv: KVReport, mem: DeviceMemory, concurrency: int
) -> int:
    """Largest context (<= max_position_embeddings) whose KV cache for
    ``concurrency`` requests fits the rank's KV budget (0 if none)."""
    budget = mem.kv_budget
    per_rank = mem.layout.requests_per_rank(concurrency)

    def fits(n: int) -> bool:
        return per_rank * mem.layout.kv_bytes_per_request(arch, kv, n) <= budget

    lo, hi = 0, arch.spec.max_position_embeddings
    while lo < hi:  # largest n in [0, hi] with fits(n); fits is monotone
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_concurrency(
    arch: ArchPlan, kv: KVReport, mem: DeviceMemory, context: int
) -> int:
    """Requests of ``context`` tokens the layout's KV caches hold at once."""
    per_request = mem.layout.kv_bytes_per_request(arch, kv, context)
    if per_request <= 0 or mem.kv_budget <= 0:
        return 0
    return int(mem.kv_budget // per_request) * mem.layout.dp
