"""Weight bytes of a spec's checkpoint per scheme, grouped by how vLLM shards them.

Every tensor comes from :func:`onboard.checkpoint.tiny.plan_tensors` (the same
list the checkpoint writer uses, at the spec's real dimensions) and is judged
quantized or kept exactly as ``onboard quantize`` judges it
(:mod:`onboard.quantize.selection`): decoder linear projections are quantized;
embeddings, the output head, norms, routers, the shared-expert gate, MTP heads and
the spec's ``keep_unquantized`` stay 16-bit. A quantized weight's bytes are those
of the tensors ``onboard quantize`` writes for it (packed values, scales, global
scales), restated in :func:`quantized_bytes` so that planning needs no torch;
tests hold both restatements equal to onboard.quantize's own.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction

from onboard import components
from onboard.arch import ArchPlan, build_plan
from onboard.checkpoint.tiny import plan_tensors
from onboard.errors import InputError
from onboard.spec.layouts import LINEAR_ROLES, ROLES, SHARING_UNUSED_LINEARS
from onboard.spec.model import ModelSpec

# How each group is laid out over ranks (see per_device_bytes).
SHARD_TP = "tp"  # split over tensor-parallel ranks
SHARD_KV = "kv-heads"  # GQA k/v: split over KV heads, replicated beyond them
SHARD_REPLICATED = "replicated"  # every rank holds all of it
SHARD_EXPERTS = "experts"  # whole experts over EP ranks, or split over TP ranks

# Role -> (group, sharding), following vLLM's layers: VocabParallelEmbedding and
# ParallelLMHead split the vocab; QKV/column/row-parallel linears split over TP;
# DeepSeek's fused q_a/kv_a projection is a ReplicatedLinear; the MoE gate is a
# ReplicatedLinear; routed experts go to EP ranks whole (or split over TP).
GROUPS: dict[str, tuple[str, str]] = {
    "embed": ("embedding", SHARD_TP),
    "lm_head": ("output head", SHARD_TP),
    "q_proj": ("attention", SHARD_TP),
    "o_proj": ("attention", SHARD_TP),
    "q_b_proj": ("attention", SHARD_TP),
    "kv_b_proj": ("attention", SHARD_TP),
    "k_proj": ("attention k/v (GQA)", SHARD_KV),
    "v_proj": ("attention k/v (GQA)", SHARD_KV),
    "q_a_proj": ("attention, replicated (MLA q_a/kv_a)", SHARD_REPLICATED),
    "kv_a_proj": ("attention, replicated (MLA q_a/kv_a)", SHARD_REPLICATED),
    "router": ("routers", SHARD_REPLICATED),
    "router_bias": ("routers", SHARD_REPLICATED),
    "shared_expert_gate": ("routers", SHARD_REPLICATED),
    "expert_gate_proj": ("routed experts", SHARD_EXPERTS),
    "expert_up_proj": ("routed experts", SHARD_EXPERTS),
    "expert_down_proj": ("routed experts", SHARD_EXPERTS),
    # checkpoint.fused: experts stacked (kept in 16 bits by quantization).
    "experts_gate_up_proj": ("routed experts", SHARD_EXPERTS),
    "experts_down_proj": ("routed experts", SHARD_EXPERTS),
    "shared_gate_up_proj": ("shared experts", SHARD_TP),
    "shared_gate_proj": ("shared experts", SHARD_TP),
    "shared_up_proj": ("shared experts", SHARD_TP),
    "shared_down_proj": ("shared experts", SHARD_TP),
}
# The components' roles, as each declares them (onboard.components.Role: the
# attention's sinks, one per query head, are split with the heads; linear
# attention's projections and convolutions over the ranks).
GROUPS.update({role: (r.group, r.shard) for role, r in components.roles().items()})
NORMS = ("norms", SHARD_REPLICATED)  # every other role is a norm (1-D)

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# onboard.quantize.worker.SMALL_COPY: kept tensors below it are copied in batches
# (one task per shard), larger ones and every quantized weight are a task each.
SMALL_COPY = 1 << 20


@dataclass
class WeightGroup:
    name: str
    shard: str
    tensors: int = 0
    params: int = 0
    quantized_params: int = 0
    bytes: int = 0


@dataclass
class WeightReport:
    scheme: str
    dtype: str  # dtype of everything left unquantized
    groups: dict[str, WeightGroup]
    num_experts: int  # routed experts per MoE layer (0 for dense models)
    num_layers: int
    mtp: WeightGroup = field(
        default_factory=lambda: WeightGroup("MTP heads", SHARD_REPLICATED)
    )
    # Tensors `onboard quantize` gives a task of their own (quantized weights and
    # kept tensors of at least SMALL_COPY bytes in the 16-bit checkpoint); with
    # source_bytes (the 16-bit checkpoint, MTP heads included), what
    # onboard.serving.quantize_time predicts from.
    own_tasks: int = 0
    source_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(g.bytes for g in self.groups.values())

    @property
    def total_params(self) -> int:
        return sum(g.params for g in self.groups.values())

    @property
    def quantized_params(self) -> int:
        return sum(g.quantized_params for g in self.groups.values())

    def per_device_bytes(
        self, tp: int, ep: int | None, pp: int = 1, kv_heads: int | None = None
    ) -> int:
        """Bytes one rank holds: tp-split groups / tp; GQA k/v / min(tp, kv_heads)
        (replicated beyond the KV heads); routed experts ceil(E / ep) whole experts
        with EP, else / tp; replicated groups whole. With pipeline stages the
        decoder layers split over pp (ceil) and one stage also holds the larger of
        the embedding and the output head."""
        out = Fraction(0)  # exact: the per-device bytes are checked by hand
        globals_ = Fraction(0)
        for g in self.groups.values():
            if g.shard == SHARD_TP:
                part = Fraction(g.bytes, tp)
            elif g.shard == SHARD_KV:
                part = Fraction(g.bytes, min(tp, kv_heads or tp))
            elif g.shard == SHARD_EXPERTS and ep:
                per_rank = math.ceil(self.num_experts / ep)
                part = Fraction(g.bytes * per_rank, self.num_experts)
            elif g.shard == SHARD_EXPERTS:
                part = Fraction(g.bytes, tp)
            else:
                part = Fraction(g.bytes)
            if g.name in ("embedding", "output head"):
                globals_ = max(globals_, part) if pp > 1 else globals_ + part
            else:
                out += part
        if pp > 1:
            out = out * math.ceil(self.num_layers / pp) / self.num_layers
        return math.ceil(out + globals_)


def quantized_bytes(scheme: str, rows: int, cols: int) -> int:
    """Checkpoint bytes of one (rows, cols) weight quantized with ``scheme``.

    What ``onboard quantize`` writes (a test checks this against
    onboard.quantize.kernels.output_tensors):
      fp8-dynamic  rows*cols FP8 + one bf16 scale per output row
      fp8-block    rows*cols FP8 + one bf16 scale per 128x128 block (ceil)
      nvfp4        rows*cols/2 packed FP4 + one FP8 scale per 16 + FP32 weight
                   and input global scales
      nvfp4a16     as nvfp4 without the input global scale
      mxfp4        rows*cols/2 packed FP4 + one E8M0 (uint8) scale per 32
      w4a16        rows*cols/2 packed INT4 + one bf16 scale per 128 + the
                   int64 [rows, cols] weight_shape
      w4a16-asym   as w4a16 + one int4 zero point per 128, packed eight to an
                   int32 down the rows
      w8a8-int8    rows*cols INT8 + one bf16 scale per output row
    """
    if scheme == "fp8-dynamic":
        return rows * cols + rows * 2
    if scheme == "fp8-block":
        return rows * cols + math.ceil(rows / 128) * math.ceil(cols / 128) * 2
    if scheme == "nvfp4":
        return rows * cols // 2 + rows * cols // 16 + 4 + 4
    if scheme == "nvfp4a16":
        return rows * cols // 2 + rows * cols // 16 + 4
    if scheme == "mxfp4":
        return rows * cols // 2 + rows * cols // 32
    if scheme in ("w4a16", "w4a16-asym"):
        groups = cols // 128
        zero_points = math.ceil(rows / 8) * groups * 4 if scheme == "w4a16-asym" else 0
        return rows * cols // 2 + rows * groups * 2 + 16 + zero_points
    if scheme == "w8a8-int8":
        return rows * cols + rows * 2
    raise InputError(f"--scheme: unknown scheme {scheme!r}")


# FP4 and INT4 schemes quantize input features in groups (onboard.quantize.schemes).
GROUP_SIZE = {"nvfp4": 16, "nvfp4a16": 16, "mxfp4": 32, "w4a16": 128, "w4a16-asym": 128}


def weight_report(
    spec: ModelSpec, scheme: str, dtype: str = "bfloat16"
) -> WeightReport:
    """Weight bytes of ``spec`` quantized with ``scheme`` ("bf16" for none)."""
    unq_bytes = DTYPE_BYTES[dtype]
    quantize = scheme != "bf16"
    arch = build_plan(spec)
    decoder, sharing = len(arch.layers), arch.kv_sources
    marks = _Marks(spec)
    roles = _RoleMatcher(arch)
    groups: dict[str, WeightGroup] = {}
    mtp = WeightGroup("MTP heads", SHARD_REPLICATED)
    own_tasks = source_bytes = 0
    for t in plan_tensors(spec):
        module, _, param = t.name.rpartition(".")
        role, layer = roles.match(module)
        numel = math.prod(t.shape)
        source_bytes += numel * unq_bytes
        quantized = (
            quantize
            and role in LINEAR_ROLES
            and param == "weight"
            and len(t.shape) == 2
            and (layer is None or layer < decoder)
            and not marks.kept(role, module)
            # A KV-sharing layer's own K/V: never run by vLLM, kept 16-bit.
            and not (role in SHARING_UNUSED_LINEARS and layer in sharing)
        )
        if quantized:
            rows, cols = t.shape
            group = GROUP_SIZE.get(scheme, 1)
            if cols % group:
                raise InputError(
                    f"{scheme} quantizes input features in groups of {group}, but "
                    f"{role} has {cols} (module {module}); choose another scheme or "
                    f"keep it in 16 bits (spec keep_unquantized: [{role}])"
                )
            nbytes = quantized_bytes(scheme, rows, cols)
        else:
            nbytes = numel * unq_bytes
        own_tasks += quantized or numel * unq_bytes >= SMALL_COPY
        parts = [(role, numel, nbytes)]
        if role == "qkv_proj":
            parts = _qkv_parts(
                arch, t.shape, numel, nbytes, scheme if quantized else None
            )
        for part_role, part_numel, part_bytes in parts:
            if layer is not None and layer >= decoder:
                target = mtp
            else:
                name, shard = GROUPS.get(part_role, NORMS)
                target = groups.setdefault(name, WeightGroup(name, shard))
            target.tensors += part_role == parts[0][0]
            target.params += part_numel
            target.bytes += part_bytes
            target.quantized_params += part_numel if quantized else 0
    return WeightReport(
        scheme=scheme,
        dtype=dtype,
        groups=groups,
        num_experts=arch.moe.num_experts if arch.moe else 0,
        num_layers=decoder,
        mtp=mtp,
        own_tasks=own_tasks,
        source_bytes=source_bytes,
    )


def _qkv_parts(
    arch: ArchPlan,
    shape: tuple[int, ...],
    numel: int,
    nbytes: int,
    scheme: str | None,
) -> list[tuple[str, int, int]]:
    """A fused q/k/v tensor (checkpoint.fused) as vLLM shards it: its q rows over
    the TP ranks, its k/v rows over the KV heads. (role, params, bytes) of each
    part; the parts add up to the tensor."""
    att = arch.attention
    assert att.head_dim is not None
    q_rows = att.num_heads * att.head_dim
    cols = numel // shape[0]
    q_bytes = (
        quantized_bytes(scheme, q_rows, cols)
        if scheme is not None and len(shape) == 2
        else nbytes * q_rows // shape[0]
    )
    q_numel = q_rows * (cols if len(shape) == 2 else 1)
    return [("q_proj", q_numel, q_bytes), ("k_proj", numel - q_numel, nbytes - q_bytes)]


class _Marks:
    """The spec's keep_unquantized entries (roles, module paths, ``re:`` regexes),
    read as onboard.quantize.selection reads them."""

    def __init__(self, spec: ModelSpec):
        self.roles: set[str] = set()
        self.paths: set[str] = set()
        self.regexes: list[re.Pattern] = []
        for i, entry in enumerate(spec.keep_unquantized):
            if entry.startswith("re:"):
                try:
                    self.regexes.append(re.compile(entry[3:]))
                except re.error as exc:
                    raise InputError(
                        f"spec keep_unquantized[{i}]: bad regular expression: {exc}"
                    ) from None
            elif entry in ROLES:
                self.roles.add(entry)
            else:
                self.paths.add(entry)

    def kept(self, role: str | None, module: str) -> bool:
        return (
            role in self.roles
            or module in self.paths
            or any(rx.search(module) for rx in self.regexes)
        )


def role_patterns(arch: ArchPlan) -> list[tuple[str, re.Pattern]]:
    """(role, regex of its module path) for every role of the spec's layout."""
    out = []
    for role in ROLES:
        rx = re.escape(arch.layout_path(role))
        rx = rx.replace(re.escape("{layer}"), r"(?P<layer>\d+)")
        rx = rx.replace(re.escape("{expert}"), r"(?P<expert>\d+)")
        out.append((role, re.compile(rx + r"\Z")))
    return out


class _RoleMatcher:
    """Role and layer of a module path, with the role cached per digit-free shape
    (a full-size MoE checkpoint has tens of thousands of expert tensors)."""

    def __init__(self, arch: ArchPlan):
        self._patterns = role_patterns(arch)
        self._cache: dict[str, tuple[str | None, re.Pattern | None]] = {}

    def match(self, module: str) -> tuple[str | None, int | None]:
        key = re.sub(r"\d+", "#", module)
        if key not in self._cache:
            self._cache[key] = next(
                ((role, rx) for role, rx in self._patterns if rx.match(module)),
                (None, None),
            )
        role, rx = self._cache[key]
        m = rx.match(module) if rx is not None else None
        if m is None:  # e.g. Mixtral's w1/w2/w3 share a digit-free shape
            role, m = next(
                ((r, x.match(module)) for r, x in self._patterns if x.match(module)),
                (None, None),
            )
        if m is None:
            return None, None
        layer = m.groupdict().get("layer")
        return role, int(layer) if layer is not None else None
