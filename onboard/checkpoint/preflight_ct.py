"""What compressed-tensors writes for each quantized Linear weight (preflight).

Mirrors compressed-tensors 0.17 (the version vLLM 0.32 pins), read from its
source: ``quantization/lifecycle/initialize.py`` (``initialize_qparams``: which
``{weight,input,output}_{scale,global_scale,zero_point,g_idx}`` a module gets and
their shapes per strategy) and the compressors (``naive-quantized`` /
``float-quantized`` keep ``weight`` in FP8/INT8; ``pack-quantized`` writes
``weight_packed`` as int32 plus ``weight_shape``; ``nvfp4-pack-quantized`` and
``mxfp4-pack-quantized`` write ``weight_packed`` as uint8 with FP8 or E8M0 scales).
Pure Python on the config's JSON: no torch import, so the preflight stays fast.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

FLOATS = frozenset({"BF16", "F16", "F32", "F64"})
INTS = frozenset({"U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})
TORCH_DTYPES = {
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e8m0fnu": "F8_E8M0",
    "torch.uint8": "U8",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.float32": "F32",
}


@dataclass(frozen=True)
class QArgs:
    """compressed-tensors ``QuantizationArgs`` (the fields that decide tensors)."""

    num_bits: int
    type: str
    strategy: str
    group_size: int | None
    block: tuple[int, int] | None
    dynamic: bool | str
    symmetric: bool
    actorder: str | None
    scale_dtype: str | None

    @classmethod
    def parse(cls, d: dict | None) -> QArgs | None:
        if d is None:
            return None
        strategy = d.get("strategy")
        if strategy is None:  # what compressed-tensors infers when unset
            strategy = (
                "group"
                if d.get("group_size")
                else ("block" if d.get("block_structure") else "tensor")
            )
        block = d.get("block_structure")
        return cls(
            num_bits=int(d.get("num_bits", 8)),
            type=str(d.get("type", "int")),
            strategy=str(strategy),
            group_size=d.get("group_size"),
            block=tuple(block) if block else None,
            dynamic=d.get("dynamic", False),
            symmetric=bool(d.get("symmetric", True)),
            actorder=d.get("actorder"),
            scale_dtype=d.get("scale_dtype"),
        )


def qparam_shapes(
    args: QArgs | None, base: str, observed: tuple[int, ...]
) -> dict[str, tuple[int, ...] | None]:
    """The parameters compressed-tensors registers for ``base`` (``weight``,
    ``input``, ``output``) and their shapes (None: not checked), as
    ``compressed_tensors.quantization.lifecycle.initialize.initialize_qparams``
    (0.17) does."""
    out: dict[str, tuple[int, ...] | None] = {}
    if args is None or args.dynamic is True:
        return out
    if args.strategy == "tensor_group":
        out[f"{base}_global_scale"] = (1,)
    if args.dynamic == "local":
        return out
    shape: tuple[int, ...] | None = None
    if args.strategy == "tensor":
        shape = (1,)
    elif args.strategy == "channel" and len(observed) >= 2:
        shape = (observed[-2], 1)
    elif args.strategy in ("group", "tensor_group") and args.group_size:
        shape = (*observed[:-1], math.ceil(observed[-1] / args.group_size))
        if args.actorder == "group":
            out[f"{base}_g_idx"] = (observed[-1],)
    elif args.strategy == "block" and args.block and len(observed) >= 2:
        bh, bw = args.block
        shape = (math.ceil(observed[-2] / bh), math.ceil(observed[-1] / bw))
    out[f"{base}_scale"] = shape
    if not args.symmetric:
        out[f"{base}_zero_point"] = None
    return out


@dataclass(frozen=True)
class CTGroup:
    name: str
    targets: tuple[str, ...]
    format: str
    weights: QArgs | None
    inputs: QArgs | None
    outputs: QArgs | None

    @property
    def summary(self) -> str:
        w = self.weights
        if w is None:
            return f"{self.name} ({self.format})"
        detail = w.strategy
        if w.strategy in ("group", "tensor_group"):
            detail += f" {w.group_size}"
        elif w.strategy == "block":
            detail += f" {list(w.block or ())}"
        return f"{self.name} ({self.format}, {w.type}{w.num_bits} {detail})"


# Tensors one quantized weight becomes: name -> (shape or None, allowed dtypes or None)
Want = tuple[tuple[int, ...] | None, frozenset[str] | None]
PACKED_FP4 = ("nvfp4-pack-quantized", "mxfp4-pack-quantized")
NAIVE = ("float-quantized", "int-quantized", "naive-quantized", "mxfp8-quantized")
# Formats whose scales are stored compressed: FP8 e4m3 (NVFP4) or E8M0 as uint8.
E8M0_SCALES = ("mxfp4-pack-quantized", "mxfp8-quantized")


def ct_tensors(group: CTGroup, rows: int, cols: int) -> dict[str, Want] | None:
    """What compressed-tensors writes for a [rows, cols] Linear weight of this group
    (None for a storage format this check does not know)."""
    w, fmt = group.weights, group.format
    out: dict[str, Want] = {}
    if w is None or fmt == "dense":
        out["weight"] = ((rows, cols), FLOATS)
    elif fmt in PACKED_FP4:  # two FP4 values per byte
        out["weight_packed"] = ((rows, math.ceil(cols / 2)), frozenset({"U8"}))
    elif fmt == "pack-quantized":  # 32 // bits values per int32, and the shape
        per = 32 // w.num_bits
        out["weight_packed"] = ((rows, math.ceil(cols / per)), frozenset({"I32"}))
        out["weight_shape"] = ((2,), INTS)
    elif fmt in NAIVE:
        if w.type == "float":
            out["weight"] = ((rows, cols), frozenset({"F8_E4M3", "F8_E5M2"}))
        else:
            out["weight"] = ((rows, cols), frozenset({"I8", "U8"}))
    else:
        return None
    if w is not None and fmt != "dense":
        for name, shape in qparam_shapes(w, "weight", (rows, cols)).items():
            out[name] = (shape, _qparam_dtypes(name, fmt, w))
    for args, base, observed in (
        (group.inputs, "input", (cols,)),
        (group.outputs, "output", (rows,)),
    ):
        for name, shape in qparam_shapes(args, base, observed).items():
            out[name] = (shape, _qparam_dtypes(name, fmt, args))
    return out


def _qparam_dtypes(name: str, fmt: str, args: QArgs) -> frozenset[str] | None:
    if name.endswith("_zero_point"):
        return None
    if name.endswith("_g_idx"):
        return INTS
    if name == "weight_scale" and (fmt in E8M0_SCALES or fmt == PACKED_FP4[0]):
        # NVFP4 scales are FP8 e4m3, MX scales E8M0 exponents (stored as uint8).
        default = "U8" if fmt in E8M0_SCALES else "F8_E4M3"
        tag = TORCH_DTYPES.get(args.scale_dtype or "", default)
        return frozenset({tag, "F8_E8M0"}) if tag == "U8" else frozenset({tag})
    return FLOATS


def match_name(name: str, target: str) -> bool:
    # compressed-tensors / vLLM: "re:" + regex matched from the start, else equality.
    if target.startswith("re:"):
        try:
            return re.match(target[3:], name) is not None
        except re.error:
            return False
    return target == name


@dataclass
class CTConfig:
    groups: list[CTGroup]
    ignore: list[str]
    kv_cache: bool

    @classmethod
    def parse(cls, qc: dict) -> CTConfig:
        groups = []
        for gname, g in (qc.get("config_groups") or {}).items():
            groups.append(
                CTGroup(
                    name=gname,
                    targets=tuple(g.get("targets") or ()),
                    format=g.get("format") or qc.get("format") or "dense",
                    weights=QArgs.parse(g.get("weights")),
                    inputs=QArgs.parse(g.get("input_activations")),
                    outputs=QArgs.parse(g.get("output_activations")),
                )
            )
        return cls(
            groups, list(qc.get("ignore") or []), bool(qc.get("kv_cache_scheme"))
        )

    def __post_init__(self) -> None:
        # A 1T-parameter model has ~100k modules and its ignore list thousands of
        # names: exact names go to a set, only `re:` entries are matched one by one.
        self._ignored = {p for p in self.ignore if not p.startswith("re:")}
        self._ignore_rx = [p for p in self.ignore if p.startswith("re:")]

    def scheme_for(self, module: str) -> tuple[CTGroup | None, str]:
        """The config group that quantizes a Linear module, or None and why not."""
        if module in self._ignored:
            return None, f"quantization_config.ignore has {module!r}"
        for pattern in self._ignore_rx:
            if match_name(module, pattern):
                return None, f"quantization_config.ignore has {pattern!r}"
        for g in self.groups:
            for t in g.targets:
                if t == "Linear" or match_name(module, t):
                    return g, f"config group {g.summary} targets {t!r}"
        return None, "no config group targets it"
