"""The deployment :func:`onboard.serving.make_deployment` computes: a record of
its own module so that the modules filling and writing it (``serve``,
``render``) import it from below instead of from the package that imports
them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from onboard.arch import ArchPlan
from onboard.serving.kv import KVReport
from onboard.serving.layout import DeviceMemory, Layout
from onboard.serving.weights import WeightReport
from onboard.spec.model import ModelSpec
from onboard.targets import SchemeSupport, TargetProfile


@dataclass(frozen=True)
class Decision:
    pays: bool
    reason: str


@dataclass
class Deployment:
    spec: ModelSpec
    arch: ArchPlan  # the spec's architecture deployment
    target: TargetProfile
    scheme: str
    support: SchemeSupport
    dtype: str
    kv_cache_dtype: str
    context: int
    concurrency: int
    output_len: int
    weights: WeightReport
    kv: KVReport
    memory_per_device: int  # bytes
    usable: int  # memory_per_device x utilization
    reserve: int
    reserve_items: dict[str, int]
    candidates: list[DeviceMemory]
    chosen: DeviceMemory | None
    dcp: Decision
    pd: Decision
    max_context: int = 0
    max_concurrency: int = 0
    kv_block_size: int | None = None
    cpu_kv_space_gib: int | None = None
    num_blocks: int | None = None
    model: str = ""
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    pd_commands: list[tuple[str, list[str]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # --nodes: the layout spans exactly these nodes, served through a Ray cluster
    # whose start commands (where to run, argv) come first.
    nodes_requested: int | None = None
    ray_commands: list[tuple[str, list[str]]] = field(default_factory=list)
    # --disaggregate: the prefill/decode layout (onboard.serving.disagg.PDLayout);
    # --node-gbps: the quantize-time prediction (onboard.serving.quantize_time).
    pd_layout: Any = None
    quantize_time: Any = None

    @property
    def layout(self) -> Layout | None:
        return self.chosen.layout if self.chosen else None

    @property
    def nodes(self) -> int:
        if self.layout is None:
            return 0
        return math.ceil(self.layout.devices / self.target.devices_per_node)

    def to_dict(self) -> dict:
        """The deployment's numbers, for JSON output and reports."""
        layout = self.layout
        return {
            "spec": self.spec.name,
            "target": self.target.name,
            "scheme": self.scheme,
            "scheme_support": self.support.support,
            "dtype": self.dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
            "context": self.context,
            "concurrency": self.concurrency,
            "weights": {
                "total_bytes": self.weights.total_bytes,
                "total_params": self.weights.total_params,
                "quantized_params": self.weights.quantized_params,
                "mtp_bytes": self.weights.mtp.bytes,
                "groups": {
                    g.name: {"params": g.params, "bytes": g.bytes, "shard": g.shard}
                    for g in self.weights.groups.values()
                },
            },
            "kv_cache": {
                "bytes_per_token": self.kv.bytes_per_token,
                "bytes_per_token_without_sharing": (
                    self.kv.bytes_per_token_without_sharing
                ),
                "bytes_per_request": self.kv.bytes_per_request(self.context),
                "layers": [
                    {
                        "index": x.index,
                        "kind": x.kind,
                        "bytes_per_token": x.bytes_per_token,
                        "window": x.window,
                        "shares": x.shares,
                    }
                    for x in self.kv.layers
                ],
            },
            "layout": None
            if layout is None
            else {
                "name": layout.name,
                "tp": layout.tp,
                "dp": layout.dp,
                "pp": layout.pp,
                "ep": layout.ep,
                "dcp": layout.dcp,
                "devices": layout.devices,
                "nodes": self.nodes,
            },
            "per_device": None
            if self.chosen is None
            else {
                "memory": self.memory_per_device,
                "usable": self.usable,
                "weights": self.chosen.weights,
                "reserve": self.reserve,
                "kv_budget": self.chosen.kv_budget,
                "kv_needed": self.chosen.kv_needed,
            },
            "max_context": self.max_context,
            "max_concurrency": self.max_concurrency,
            "num_blocks": self.num_blocks,
            "kv_block_size": self.kv_block_size,
            "dcp": {"pays": self.dcp.pays, "reason": self.dcp.reason},
            "pd_disaggregation": {"pays": self.pd.pays, "reason": self.pd.reason},
            "env": self.env,
            "command": self.argv,
            "nodes_requested": self.nodes_requested,
            "ray_cluster_commands": [
                {"where": where, "command": argv} for where, argv in self.ray_commands
            ],
            "pd_layout": self.pd_layout.to_dict() if self.pd_layout else None,
            "quantize_time": (
                self.quantize_time.to_dict() if self.quantize_time else None
            ),
        }
