"""Wall time of `onboard quantize --ray` on N nodes, predicted for a spec's checkpoint.

The model benchmarks/ray_scaling.py fits (docs/benchmarks.md has the run):

    time = start + bytes / (N x per-node bandwidth) + tasks x per-task cost / N

- bytes: the spec's 16-bit checkpoint at its real dimensions (every tensor of
  onboard.checkpoint.tiny.plan_tensors, MTP heads included);
- tasks: what onboard.quantize.worker.make_tasks makes of it: one per quantized
  weight and per kept tensor of at least 1 MiB, plus one per shard (its small
  tensors and its finish), shards of SHARD_BYTES. Fused partners (nvfp4's q/k/v
  or gate/up sharing a global scale) are one task there, so this count is an upper
  bound for them;
- per-node bandwidth: stated by the caller (``--node-gbps``: GB of the 16-bit
  checkpoint one node reads, quantizes and writes per second, the slowest of its
  storage or network share and its cores). The benchmark's checkpoints (0.2 GB)
  do not resolve it on one machine, so no default stands in for it;
- start and per-task cost: the fit of the benchmark's run (RAY_FIT), for the two
  schemes it measures; other schemes use the larger of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onboard.errors import InputError
from onboard.serving.weights import weight_report
from onboard.spec.model import ModelSpec

# benchmarks/ray_scaling.py, run of 4 December 2026 on a 2-core machine (table and
# fit in docs/benchmarks.md): scheme -> (start s, per-task s).
RAY_FIT: dict[str, tuple[float, float]] = {
    "fp8-dynamic": (3.96, 0.00140),
    "nvfp4a16": (5.59, 0.00145),
}
RAY_FIT_SOURCE = "benchmarks/ray_scaling.py, 4 December 2026 (docs/benchmarks.md)"
# The shard size of most Hub checkpoints (DeepSeek-V3: 163 shards of ~4.3 GB).
SHARD_BYTES = 5 * 10**9


@dataclass(frozen=True)
class QuantizeTime:
    scheme: str
    nodes: int
    node_gbps: float
    source_bytes: int
    shards: int
    tasks: int
    start_s: float
    task_s: float
    fit_scheme: str  # the scheme whose fitted constants are used

    @property
    def bytes_s(self) -> float:
        return self.source_bytes / 1e9 / (self.nodes * self.node_gbps)

    @property
    def tasks_s(self) -> float:
        return self.tasks * self.task_s / self.nodes

    @property
    def total_s(self) -> float:
        return self.start_s + self.bytes_s + self.tasks_s

    def lines(self) -> list[str]:
        fit = (
            self.fit_scheme
            if self.fit_scheme == self.scheme
            else f"{self.fit_scheme}'s, the larger (no run of {self.scheme})"
        )
        return [
            f"onboard quantize --ray, {self.scheme}, {self.nodes} node(s): "
            f"~{_duration(self.total_s)}",
            f"  = start {self.start_s:.1f} s"
            f" + {self.source_bytes / 1e9:,.1f} GB / ({self.nodes} x "
            f"{self.node_gbps:g} GB/s) = {self.bytes_s:,.0f} s"
            f" + {self.tasks:,} tasks x {self.task_s * 1e3:.2f} ms / {self.nodes}"
            f" = {self.tasks_s:,.0f} s",
            f"  bytes: the 16-bit checkpoint ({self.shards} shards of <= "
            f"{SHARD_BYTES / 1e9:g} GB); per-node bandwidth: --node-gbps; start "
            f"and per-task cost: {fit} fit, {RAY_FIT_SOURCE}",
        ]

    def to_dict(self) -> dict:
        return {
            "scheme": self.scheme,
            "nodes": self.nodes,
            "node_gbps": self.node_gbps,
            "source_bytes": self.source_bytes,
            "shards": self.shards,
            "tasks": self.tasks,
            "start_s": self.start_s,
            "task_s": self.task_s,
            "fit_scheme": self.fit_scheme,
            "bytes_s": self.bytes_s,
            "tasks_s": self.tasks_s,
            "total_s": self.total_s,
        }


def quantize_time(
    spec: ModelSpec, scheme: str, nodes: int, node_gbps: float
) -> QuantizeTime:
    """Predict quantizing ``spec``'s 16-bit checkpoint with ``scheme`` on ``nodes``
    Ray nodes of ``node_gbps`` GB/s each (see the module docstring)."""
    if scheme == "bf16":
        raise InputError(
            "--node-gbps: the quantize-time prediction needs a quantized --scheme "
            "(bf16 is not quantized)"
        )
    if not node_gbps > 0 or math.isinf(node_gbps):
        raise InputError(f"--node-gbps must be a positive number, got {node_gbps}")
    if nodes < 1:
        raise InputError(f"--nodes must be at least 1, got {nodes}")
    report = weight_report(spec, scheme)
    shards = max(1, math.ceil(report.source_bytes / SHARD_BYTES))
    fit_scheme = (
        scheme if scheme in RAY_FIT else max(RAY_FIT, key=lambda s: RAY_FIT[s][1])
    )
    start, task = RAY_FIT[fit_scheme]
    return QuantizeTime(
        scheme=scheme,
        nodes=nodes,
        node_gbps=node_gbps,
        source_bytes=report.source_bytes,
        shards=shards,
        tasks=report.own_tasks + shards,
        start_s=start,
        task_s=task,
        fit_scheme=fit_scheme,
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
