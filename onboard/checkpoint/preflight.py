"""Checkpoint preflight: does a checkpoint on disk fit the spec, before any engine?

``preflight(spec, checkpoint_dir)`` reads metadata only: ``config.json``, the
safetensors index and, of every shard, the 8-byte header length and the JSON header
(tensor names, dtypes, shapes, byte ranges). No tensor data is read, so a
1T-parameter checkpoint is checked in seconds. It compares:

1. files: the index against the shards on disk (missing, unlisted, truncated or
   corrupt shards, tensors the index misplaces);
2. ``config.json`` against :func:`onboard.spec.hf.hf_config_from_spec` for every
   forward-relevant key, with vLLM's known traps spelled out (``topk_method`` for
   the router's bias correction, ``n_group: null``);
3. tensors against :func:`onboard.checkpoint.tiny.plan_tensors` (the spec's own
   names and shapes, MTP heads included): missing, unexpected (with the
   ``checkpoint.tensor_names`` override when a renamed role explains them), shape
   mismatches with the spec fields behind each dimension, dtype surprises;
4. quantized checkpoints (compressed-tensors): for each Linear module, exactly the
   parameters compressed-tensors writes for its scheme (``weight_packed``,
   ``weight_scale``, ``weight_global_scale``, ``input_scale``, ...), with shapes and
   dtypes; modules the config ignores stay unquantized; fused partners agree.

Every mismatch is a :class:`Problem` with the fix. Problems about many tensors of
one pattern (all layers, all experts) are reported once, with the index ranges.
"""

from __future__ import annotations

import difflib
import json
import math
import shlex
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from onboard.checkpoint.preflight_ct import FLOATS, CTConfig, ct_tensors
from onboard.checkpoint.preflight_spec import (
    abstract,
    by_pattern,
    canonical_roles,
    config_spec_fields,
    describe,
    dims,
    fields_in,
    is_field,
    placeholders,
    ranges,
    role_hint,
    role_index,
    split_name,
)
from onboard.checkpoint.tiny import INDEX_FILE, TensorPlan, plan_tensors
from onboard.config_json import non_finite_keys
from onboard.errors import InputError
from onboard.fsutil import BadIndex, read_weight_map
from onboard.spec.layouts import LINEAR_ROLES as DECODER_LINEAR_ROLES
from onboard.spec.model import ModelSpec

Severity = Literal["error", "warning", "note"]

MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit
# Bits per element of each safetensors dtype (sub-byte FP4/FP6 included).
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "U16": 16,
    "I16": 16,
    "F16": 16,
    "BF16": 16,
    "U32": 32,
    "I32": 32,
    "F32": 32,
    "U64": 64,
    "I64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
CONFIG_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}

# Roles vLLM builds as Linear layers (LinearBase): what a compressed-tensors
# "Linear" target quantizes: the decoder's Linear roles plus the Linear layers the
# quantizer keeps in 16 bits (without lm_head, which vLLM builds as ParallelLMHead).
LINEAR_ROLES = frozenset(
    DECODER_LINEAR_ROLES + ("router", "shared_expert_gate", "mtp_eh_proj")
)
# Vocabulary-sized layers vLLM builds unquantized whatever the config says.
HEAD_ROLES = frozenset({"embed", "lm_head", "mtp_head"})
QUANTIZABLE_ROLES = LINEAR_ROLES | HEAD_ROLES  # checked against the quant config
EXPERT_ROLES = ("expert_gate_proj", "expert_up_proj", "expert_down_proj")
# Projections vLLM loads as one fused layer: one quantization scheme for all.
FUSED_SETS = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("shared_gate_proj", "shared_up_proj"),
    ("q_a_proj", "kv_a_proj"),
    EXPERT_ROLES,  # one FusedMoE layer per decoder layer
)
# Parameters quantizers add next to (or instead of) a Linear module's weight.
# A KV-sharing layer's own tensors that vLLM never runs (docs/generate.md).
SHARING_UNUSED_ROLES = frozenset({"k_proj", "v_proj", "k_norm"})

QUANT_PARAMS = frozenset(
    {
        "weight_packed",
        "weight_scale",
        "weight_global_scale",
        "weight_zero_point",
        "weight_g_idx",
        "weight_shape",
        "weight_scale_inv",
        "input_scale",
        "input_global_scale",
        "input_zero_point",
        "output_scale",
        "output_zero_point",
        "qweight",
        "qzeros",
        "scales",
        "g_idx",
    }
)
# Tensors vLLM's loader drops by name (old exports carry them).
DROPPED = (
    "rotary_emb.inv_freq",
    "rotary_pos_emb.inv_freq",
    "rotary_emb.cos_cached",
    "rotary_emb.sin_cached",
)
# Size mismatches from which preflight looks for the checkpoint's own spec.yaml.
SPEC_HINT_MISMATCHES = 3
CPU_MLA_LATENT = 576  # vLLM's CPU MLA decode kernel: kv_lora_rank 512 + rope 64


# ---- the report ------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One mismatch between the checkpoint and the spec, with its fix.

    ``kind`` is a stable identifier (``missing-tensor``, ``unexpected-tensor``,
    ``renamed-tensor``, ``shape``, ``mla-latent``, ``dtype``, ``config``,
    ``missing-shard``, ``corrupt-shard``, ``unindexed-shard``, ``index``,
    ``quant-config``, ``quant-mismatch``, ``quant-fused``, ``cpu-mla``, ...);
    ``where`` is a file, a config key or a tensor-name pattern (``{layer}`` and
    ``{expert}`` standing for the indices); ``tensors`` lists every concrete tensor
    concerned; ``spec_fields`` and ``config_keys`` name what the fix touches.
    """

    severity: Severity
    kind: str
    where: str
    message: str
    fix: str = ""
    tensors: tuple[str, ...] = ()
    spec_fields: tuple[str, ...] = ()
    config_keys: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        # No square brackets: the CLI prints through rich, which reads them as markup.
        out = [f"{self.severity} ({self.kind}) {self.where}: {self.message}"]
        if self.fix:
            out.append(f"  fix: {self.fix}")
        return out


@dataclass
class PreflightReport:
    """What :func:`preflight` found; ``ok`` when no problem is an error."""

    checkpoint: Path
    problems: list[Problem] = field(default_factory=list)
    shards: int = 0  # shard headers read
    tensors: int = 0  # tensors in them
    header_bytes: int = 0  # bytes read from shard files (length fields + headers)
    data_bytes: int = 0  # tensor data the headers declare (never read)
    quantization: str | None = None  # quantization_config.quant_method
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def check_seconds(self) -> float:
        """Time spent checking (reading headers and comparing), imports excluded."""
        return sum(t for phase, t in self.timings.items() if phase != "imports")

    def by_kind(self, kind: str) -> list[Problem]:
        return [p for p in self.problems if p.kind == kind]

    def lines(self) -> list[str]:
        order = {"error": 0, "warning": 1, "note": 2}
        out: list[str] = []
        for p in sorted(self.problems, key=lambda p: order[p.severity]):
            out += p.lines()
        total = self.check_seconds
        verdict = (
            "matches the spec"
            if not self.problems
            else f"{len(self.errors)} error(s), {len(self.warnings)} warning(s)"
        )
        out.append(
            f"{self.checkpoint}: {self.tensors} tensors in {self.shards} shard(s), "
            f"{_size(self.data_bytes)} of weights not read ({self.header_bytes} "
            f"header bytes read) in {total:.2f} s"
            + (
                f" (+{self.timings['imports']:.1f} s importing transformers)"
                if self.timings.get("imports", 0) >= 0.05
                else ""
            )
            + f": {verdict}"
        )
        return out


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


# ---- safetensors headers -----------------------------------------------------------


class HeaderError(Exception):
    """A shard whose header cannot be trusted (truncated, corrupt)."""


class TensorInfo(NamedTuple):
    dtype: str
    shape: tuple[int, ...]
    shard: str


def read_header(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], int, int]:
    """A safetensors file's tensors as ``{name: (dtype, shape)}``, the bytes read
    (8 + header length) and the data bytes the header declares.

    Reads the 8-byte length and the JSON header, never the data; checks what a
    truncated or corrupt file breaks (lengths, JSON, dtypes, shapes against byte
    ranges, contiguous ranges, the file size from ``stat``).
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise HeaderError(f"truncated: {size} bytes, no header length")
            n = int.from_bytes(raw, "little")
            if n > MAX_HEADER:
                raise HeaderError(f"corrupt: header length {n} is over 100 MiB")
            if 8 + n > size:
                raise HeaderError(
                    f"truncated: the header needs {8 + n} bytes, the file has {size}"
                )
            head = f.read(n)
    except OSError as exc:
        raise HeaderError(f"cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"corrupt header: {exc}") from None
    if not isinstance(header, dict):
        raise HeaderError("corrupt header: not a JSON object")
    header.pop("__metadata__", None)
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(map(int, entry["shape"]))
            begin, end = map(int, entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise HeaderError(f"corrupt header entry for {name!r}") from None
        if dtype not in DTYPE_BITS:
            raise HeaderError(f"{name}: unknown dtype {dtype!r}")
        if min(shape, default=0) < 0 or end < begin:
            raise HeaderError(f"{name}: negative shape or byte range")
        if (end - begin) * 8 != math.prod(shape) * DTYPE_BITS[dtype]:
            raise HeaderError(
                f"{name}: byte range {begin}..{end} does not fit shape "
                f"{list(shape)} of {dtype}"
            )
        tensors[name] = (dtype, shape)
        ranges.append((begin, end, name))
    ranges.sort()
    pos = 0
    for begin, end, name in ranges:
        if begin != pos:
            raise HeaderError(f"corrupt header: {name} starts at {begin}, not {pos}")
        pos = end
    data = size - 8 - n
    if pos != data:
        what = "truncated" if pos > data else "trailing bytes"
        raise HeaderError(
            f"{what}: the header declares {pos} bytes of tensor data, the file "
            f"holds {data}"
        )
    return tensors, 8 + n, pos


# ---- the check ---------------------------------------------------------------------


def preflight(
    spec: ModelSpec, checkpoint_dir: Path, *, config_keys: bool = True
) -> PreflightReport:
    """Compare a checkpoint's headers and config.json with the spec (no weights read).

    Bad input (not a directory) raises InputError; everything about the checkpoint
    itself is a :class:`Problem` in the report. ``config_keys=False`` leaves out
    the comparison of config.json's keys as transformers' config classes read them
    (their import costs seconds; `quantize` copies those keys unchanged): files,
    config values, architecture and tensors are still checked.
    """
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise InputError(f"{root}: not a checkpoint directory")
    run = _Run(spec, root)
    t0 = time.perf_counter()
    # Computing the spec's config.json needs transformers' config classes, whose
    # import (it pulls in torch) costs seconds once per process: timed apart.
    if config_keys:
        _config_class(spec.model_type)
    t1 = time.perf_counter()
    run.read_files()
    t2 = time.perf_counter()
    if run.config is not None:
        run.check_config(keys=config_keys)
    t3 = time.perf_counter()
    run.check_tensors()
    run.suggest_own_spec()
    t4 = time.perf_counter()
    report = run.report
    report.timings = {
        "imports": t1 - t0,
        "headers": t2 - t1,
        "config": t3 - t2,
        "tensors": t4 - t3,
    }
    return report


@dataclass
class _Expect:
    shape: tuple[int, ...] | None
    dtypes: frozenset[str] | None  # None: the checkpoint's float dtype
    role: str | None
    param: str
    weight_shape: tuple[int, ...] | None = None  # of the quantized weight
    scheme: str = ""  # the config group that quantizes it


class _Run:
    def __init__(self, spec: ModelSpec, root: Path):
        self.spec = spec
        self.root = root
        self.report = PreflightReport(root)
        self.config: dict | None = None
        self.found: dict[str, TensorInfo] = {}
        self.lost: set[str] = set()  # indexed into shards that are missing/unreadable
        self.dtype: str | None = None  # config.json's float dtype, as a tag
        self._with_qparams: set[str] | None = None

    def add(
        self,
        severity: Severity,
        kind: str,
        where: str,
        message: str,
        fix: str = "",
        **extra: Any,
    ) -> None:
        extra = {k: tuple(v) for k, v in extra.items()}
        self.report.problems.append(
            Problem(severity, kind, where, message, fix, **extra)
        )

    # ---- files ---------------------------------------------------------------

    def read_files(self) -> None:
        self._read_config()
        self._read_shards()

    def _read_config(self) -> None:
        path = self.root / "config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.add(
                "error",
                "config",
                "config.json",
                "missing: vLLM and transformers read the architecture and every "
                "size from it",
                "add the checkpoint's config.json (`onboard checkpoint tiny` shows "
                "the one onboard writes for this spec)",
            )
            return
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            self.add(
                "error",
                "config",
                "config.json",
                f"cannot read: {exc}",
                "re-download or fix the file",
            )
            return
        if not isinstance(config, dict):
            self.add(
                "error",
                "config",
                "config.json",
                "not a JSON object",
                "re-download or fix the file",
            )
            return
        for key in non_finite_keys(config)[:5]:
            self.add(
                "error",
                "config",
                key,
                "is NaN or infinite; no model config means that",
                "fix the value (a corrupt or hand-edited config.json?)",
                config_keys=[key],
            )
        self.config = config
        dtype = config.get("dtype", config.get("torch_dtype"))
        self.dtype = CONFIG_DTYPES.get(str(dtype))
        qc = config.get("quantization_config")
        if isinstance(qc, dict):
            self.report.quantization = str(qc.get("quant_method"))

    def _read_shards(self) -> None:
        index_path = self.root / INDEX_FILE
        weight_map: dict[str, str] | None = None
        if index_path.is_file():
            try:
                weight_map = read_weight_map(index_path)
            except BadIndex as exc:
                # Without a trusted index only the shards on disk are read: a name
                # with a path in it is never opened.
                self.add(
                    "error",
                    "index",
                    INDEX_FILE,
                    exc.problem,
                    "regenerate or re-download the index (shards are plain file "
                    "names beside it); the shards on disk are checked without it",
                )
                weight_map = None
        on_disk = sorted(p.name for p in self.root.glob("*.safetensors"))
        listed = sorted(set(weight_map.values())) if weight_map else on_disk
        if not listed:
            self.add(
                "error",
                "missing-shard",
                str(self.root),
                "no .safetensors files",
                "download the weights (safetensors)",
            )
            return
        bad: set[str] = set()
        counts = Counter((weight_map or {}).values())
        for shard in listed:
            path = self.root / shard
            if not path.is_file():
                bad.add(shard)
                self.add(
                    "error",
                    "missing-shard",
                    shard,
                    f"the index lists it ({counts[shard]} tensors), but it is not "
                    "on disk",
                    "download or copy the missing shard: the checkpoint is incomplete",
                )
                continue
            try:
                tensors, nread, ndata = read_header(path)
            except HeaderError as exc:
                bad.add(shard)
                self.add(
                    "error",
                    "corrupt-shard",
                    shard,
                    str(exc),
                    "re-download the shard (an interrupted download or copy "
                    "truncates it)",
                )
                continue
            self.report.shards += 1
            self.report.header_bytes += nread
            self.report.data_bytes += ndata
            for name, (dtype, shape) in tensors.items():
                if name in self.found:
                    self.add(
                        "error",
                        "index",
                        name,
                        f"stored twice, in {self.found[name].shard} and {shard}",
                        "keep one copy: which one vLLM loads is undefined",
                        tensors=[name],
                    )
                self.found[name] = TensorInfo(dtype, shape, shard)
        self.report.tensors = len(self.found)
        if weight_map is None:
            return
        self.lost = {t for t, s in weight_map.items() if s in bad}
        for shard in sorted(set(on_disk) - set(listed)):
            self.add(
                "warning",
                "unindexed-shard",
                shard,
                "on disk but not in the index: vLLM and transformers load only the "
                "shards the index lists, so its tensors are ignored",
                f"add its tensors to {INDEX_FILE} or delete the file",
            )
        elsewhere, nowhere = [], []
        for name, shard in weight_map.items():
            info = self.found.get(name)
            if shard in bad or (info is not None and info.shard == shard):
                continue
            (elsewhere if info is not None else nowhere).append(name)
        if nowhere:
            self.add(
                "error",
                "index",
                INDEX_FILE,
                f"lists {len(nowhere)} tensor(s) that no shard holds, e.g. "
                f"{_examples(nowhere)}",
                "re-download the shards (or regenerate the index): loaders "
                "trusting the index fail on these",
                tensors=nowhere,
            )
        if elsewhere:
            self.add(
                "warning",
                "index",
                INDEX_FILE,
                f"puts {len(elsewhere)} tensor(s) in the wrong shard, e.g. "
                f"{_examples(elsewhere)}",
                "regenerate the index",
                tensors=elsewhere,
            )
        unlisted = [t for t in self.found if t not in weight_map]
        if unlisted:
            self.add(
                "warning",
                "index",
                INDEX_FILE,
                f"does not list {len(unlisted)} tensor(s) its shards hold, e.g. "
                f"{_examples(unlisted)}",
                "regenerate the index",
                tensors=unlisted,
            )

    def suggest_own_spec(self) -> None:
        """Many size mismatches usually mean the wrong spec: point at the spec.yaml
        written with the checkpoint (`onboard checkpoint tiny`, `new-model`) when
        that one has the config's sizes."""
        mismatches = [
            p
            for p in self.report.errors
            if p.kind in ("shape", "config", "layer-count")
        ]
        if len(mismatches) < SPEC_HINT_MISMATCHES or self.config is None:
            return
        from onboard.spec import load_spec

        sizes = ("hidden_size", "num_hidden_layers", "vocab_size")
        config = tuple(self.config.get(key) for key in sizes)
        if config == tuple(getattr(self.spec, key) for key in sizes):
            return
        parent = self.root.parent
        candidates = [self.root / "spec.yaml"]
        if parent.name == "checkpoints":  # new-model's DIR/checkpoints/<name>
            candidates.append(parent.parent / "spec.yaml")
        for path in candidates:
            if not path.is_file():
                continue
            try:
                own = load_spec(path)
            except InputError:  # a hint only: a spec that does not load is skipped
                continue
            if tuple(getattr(own, key) for key in sizes) == config:
                command = shlex.join(
                    [
                        "onboard",
                        "spec",
                        "check",
                        str(path),
                        "--checkpoint",
                        str(self.root),
                    ]
                )
                self.add(
                    "note",
                    "spec-hint",
                    str(path),
                    "has this checkpoint's sizes (the spec checked has not); check "
                    f"against it: {command}",
                )
                return

    # ---- config.json -----------------------------------------------------------

    def check_config(self, keys: bool = True) -> None:
        spec, raw = self.spec, self.config
        assert raw is not None
        if raw.get("model_type") != spec.model_type:
            self.add(
                "error",
                "config",
                "model_type",
                f"config.json says {raw.get('model_type')!r}, the spec "
                f"{spec.model_type!r}",
                f'set "model_type": "{spec.model_type}" '
                "(vLLM picks the config class by it), or use the spec of this "
                "checkpoint",
                spec_fields=["model_type"],
                config_keys=["model_type"],
            )
        if raw.get("architectures") != [spec.architecture]:
            self.add(
                "error",
                "config",
                "architectures",
                f"config.json says {raw.get('architectures')!r}, the spec "
                f"[{spec.architecture!r}]",
                f'set "architectures": ["{spec.architecture}"] (vLLM picks the '
                "model class by it)",
                spec_fields=["architecture"],
                config_keys=["architectures"],
            )
        if keys:
            self._check_config_keys()

    def _check_config_keys(self) -> None:
        from onboard.spec import hf

        spec, raw = self.spec, self.config
        try:
            expected = hf.hf_config_from_spec(spec)
        except InputError as exc:
            self.add(
                "error",
                "config",
                "config.json",
                f"the spec has no config.json form to compare with: {exc}",
                "fix the spec first (`onboard spec check`)",
            )
            return
        known = _config_class(spec.model_type)
        actual = raw
        if known is not None:
            # What vLLM sees: transformers' config class fills defaults and maps
            # aliases and legacy keys (rope_scaling) before anyone reads the config.
            try:
                actual = _normalised(known, raw)
            except Exception as exc:  # the class's own validation, e.g. a wrong type
                self.add(
                    "error",
                    "config",
                    "config.json",
                    f"transformers' {known.__name__} rejects it: "
                    + " ".join(str(exc).split()),
                    "fix the config so transformers (and vLLM) can load it",
                )
        skip = hf.IGNORED | {"architectures", "model_type", "dtype"}
        compared: set[str] = set()
        for key, want in expected.items():
            if key in skip:
                continue
            compared.add(key)
            self._compare_key(key, want, actual, raw, known)
        aliases = {a for names in hf.ALIASES.values() for a in names}
        # Other spellings of compared keys are reported with them.
        spelled = {
            a for names in hf.ALIASES.values() if compared & set(names) for a in names
        }
        for key in sorted(set(raw) - set(expected) - skip - {"quantization_config"}):
            if key.startswith("_") or key in ("rope_scaling", "rope_theta"):
                continue  # legacy rope keys: compared through rope_parameters
            if key in spelled:
                continue
            self.add(
                "note",
                "config-extra",
                key,
                f"config.json sets {key} = {_short(raw[key])}, which the spec's "
                "config does not have"
                + ("" if key in aliases else "; the generated model does not read it"),
                "if it changes the forward pass, the spec cannot express it",
                config_keys=[key],
            )

    def _compare_key(
        self, key: str, want: Any, actual: dict, raw: dict, known: Any
    ) -> None:
        from onboard.spec import hf

        got = actual.get(key, _MISSING)
        if _same(want, got):
            return
        if isinstance(want, dict) and isinstance(got, dict):
            for sub in sorted(set(want) | set(got)):
                w, g = want.get(sub, _MISSING), got.get(sub, _MISSING)
                if not _same(w, g):
                    self._config_problem(f"{key}.{sub}", key, w, g, raw, known)
            return
        # Another spelling of the same concept (the generated model reads `key`).
        concept = next((c for c, names in hf.ALIASES.items() if key in names), None)
        if got is _MISSING and concept is not None:
            for alias in hf.ALIASES[concept]:
                if alias != key and alias in raw and _same(want, raw[alias]):
                    self.add(
                        "error",
                        "config",
                        key,
                        f"config.json spells it {alias!r}; the generated model and "
                        f"vLLM read {key!r}",
                        f'rename "{alias}" to "{key}" in config.json',
                        config_keys=[key, alias],
                    )
                    return
        self._config_problem(key, key, want, got, raw, known)

    def _config_problem(
        self, path: str, key: str, want: Any, got: Any, raw: dict, known: Any
    ) -> None:
        spec = self.spec
        fields = config_spec_fields().get(key, ())
        if got is _MISSING:
            said = f"config.json has no {path}"
        elif key not in raw and known is not None:
            said = (
                f"config.json does not set {path}, so transformers' "
                f"{known.__name__} uses its default {_short(got)}"
            )
        else:
            said = f"config.json has {path} = {_short(got)}"
        message = f"{said}; the spec needs {_short(want)}"
        fix = f"set {path} to {json.dumps(want)} in config.json" + (
            f", or, if the checkpoint is right, {', '.join(fields)} in the spec"
            if fields
            else ""
        )
        moe = spec.mlp.moe
        if key == "topk_method" and moe is not None and moe.router.bias_correction:
            message += (
                ". The spec routes with a bias correction (router.bias_correction: "
                "true); vLLM builds the router's e_score_correction_bias only when "
                "topk_method is noaux_tc, so without it the in-tree model has no "
                "bias parameter and loading fails with KeyError "
                "'...mlp.gate.e_score_correction_bias'"
            )
            fix = (
                'add "topk_method": "noaux_tc" to config.json; if the checkpoint '
                "has no e_score_correction_bias, set mlp.moe.router.bias_correction: "
                "false in the spec instead"
            )
        elif key in ("n_group", "topk_group") and got is None:
            message += (
                f". {key}: null breaks vLLM's grouped routing: its DeepSeek-style "
                "MoE reads getattr(config, 'n_group', 1), gets None, and the router "
                "fails (`assert topk_group is not None` on CPU)"
            )
            fix = (
                f'set "{key}": {json.dumps(want)} in config.json (1 and 1 mean '
                "ungrouped top-k)"
            )
        self.add(
            "error",
            "config",
            path,
            message,
            fix,
            spec_fields=fields,
            config_keys=[key],
        )

    # ---- tensors -------------------------------------------------------------

    def check_tensors(self) -> None:
        spec = self.spec
        roles = role_index(spec)
        quant = self._quantization()
        expected: dict[str, _Expect] = {}
        optional: dict[str, _Expect] = {}
        consumed: set[str] = set()  # found tensors already reported
        quantized: dict[str, bool] = {}  # module -> quantized per the config
        mismatched: dict[tuple, list[str]] = defaultdict(list)
        unknown_formats: set[str] = set()

        for plan in plan_tensors(spec):
            module, param = split_name(plan.name)
            role = roles.get(module)
            expect = _Expect(plan.shape, None, role, param)
            linear = param == "weight" and len(plan.shape) == 2
            if role in SHARING_UNUSED_ROLES and plan.layer in spec.attention.kv_sharing:
                # The layer reads an earlier layer's KV cache: the generated model
                # drops its own K/V (and k-norm) when stored, so they may be absent.
                optional[plan.name] = expect
                if linear and quant is not None:
                    self._accept_as_stored(
                        module, plan.shape, role, "quantized", {}, optional
                    )
                continue
            if quant is None or not linear or role not in QUANTIZABLE_ROLES:
                expected[plan.name] = expect
                continue
            stored = self._stored(module)
            if isinstance(quant, str):  # a method this check does not model
                self._accept_as_stored(
                    module, plan.shape, role, stored, expected, optional
                )
                continue
            group, why = (
                (None, "vLLM builds it unquantized")
                if role in HEAD_ROLES
                else quant.scheme_for(module)
            )
            quantized[module] = group is not None
            if stored != "absent" and (stored == "quantized") != (group is not None):
                consumed.update(self._module_tensors(module))
                mismatched[(abstract(module)[0], stored, why)].append(module)
                continue
            wants = (
                {"weight": (plan.shape, None)}
                if group is None
                else ct_tensors(group, *plan.shape)
            )
            if wants is None:  # a storage format this check does not model
                if group.name not in unknown_formats:
                    unknown_formats.add(group.name)
                    self.add(
                        "warning",
                        "quant-config",
                        f"config group {group.name}",
                        f"storage format {group.format!r} is not checked: its "
                        "tensors are accepted as stored",
                        "check them by hand",
                    )
                self._accept_as_stored(
                    module, plan.shape, role, stored, expected, optional
                )
                continue
            summary = group.summary if group else ""
            for p, (shape, dtypes) in wants.items():
                expected[f"{module}.{p}"] = _Expect(
                    shape, dtypes, role, p, plan.shape, summary
                )
        if isinstance(quant, CTConfig) and quant.kv_cache:
            for name in self._kv_scale_names(roles):
                optional[name] = _Expect(None, None, None, name.rpartition(".")[2])

        self._report_quant_mismatch(mismatched)
        self._report_fused(quantized, roles)
        missing = [
            n for n, e in expected.items() if n not in self.found and n not in self.lost
        ]
        unexpected = [
            n
            for n in self.found
            if n not in expected and n not in optional and n not in consumed
        ]
        self._check_present(expected, optional)
        missing = self._check_mtp(self._check_layer_count(missing))
        self._report_names(missing, unexpected, quant, expected)
        self._note_cpu_mla()

    def _accept_as_stored(
        self,
        module: str,
        shape: tuple[int, ...],
        role: str | None,
        stored: str,
        expected: dict[str, _Expect],
        optional: dict[str, _Expect],
    ) -> None:
        """A Linear module whose quantized form this check does not model: its
        quantization tensors are accepted, the weight is required only unquantized
        (GPTQ-style formats replace it with qweight)."""
        weight = _Expect(shape, None, role, "weight-any")
        if stored == "quantized":
            optional[f"{module}.weight"] = weight
        else:
            expected[f"{module}.weight"] = weight
        for p in QUANT_PARAMS:
            optional[f"{module}.{p}"] = _Expect(None, None, role, p)

    def _check_layer_count(self, missing: list[str]) -> list[str]:
        """One problem when the checkpoint has fewer or more layers than the spec;
        the tensors of the layers it lacks are not listed one pattern at a time."""
        spec = self.spec
        prefix = spec.tensor_path("input_norm").split("{layer}")[0]
        layers = {
            int(name[len(prefix) :].split(".", 1)[0])
            for name in self.found
            if name.startswith(prefix)
            and name[len(prefix) :].split(".", 1)[0].isdigit()
        }
        if not layers:
            return missing
        mtp = spec.mtp.num_heads if spec.mtp else 0
        total, have = spec.num_hidden_layers + mtp, max(layers) + 1
        if have == total or (mtp and have == spec.num_hidden_layers):
            return missing  # equal, or only the MTP heads lack (reported as such)
        self.add(
            "error",
            "layer-count",
            f"{prefix}{{layer}}",
            f"the checkpoint has {have} layers ({prefix}0-{have - 1}); the spec "
            f"has num_hidden_layers {spec.num_hidden_layers}"
            + (f" + {mtp} MTP head(s) = {total}" if mtp else ""),
            f"set num_hidden_layers in the spec to {have - mtp} (MTP heads are the "
            "last layers)"
            if mtp
            else f"set num_hidden_layers: {have} in the spec",
            spec_fields=["num_hidden_layers", "mtp.num_heads"]
            if mtp
            else ["num_hidden_layers"],
        )
        # Tensors of layers the checkpoint does not have are covered above.
        return [
            n
            for n in missing
            if not n.startswith(prefix)
            or not n[len(prefix) :].split(".", 1)[0].isdigit()
            or int(n[len(prefix) :].split(".", 1)[0]) < have
        ]

    def _check_mtp(self, missing: list[str]) -> list[str]:
        """A checkpoint without any of the spec's MTP heads: one problem."""
        spec = self.spec
        if spec.mtp is None:
            return missing
        prefix = spec.tensor_path("input_norm").split("{layer}")[0]
        heads = [
            f"{prefix}{spec.num_hidden_layers + i}." for i in range(spec.mtp.num_heads)
        ]
        if any(name.startswith(tuple(heads)) for name in self.found):
            return missing  # present, perhaps in part: missing tensors are listed
        absent = [n for n in missing if n.startswith(tuple(heads))]
        if not absent:
            return missing
        uses_mtp = any(s.method == "mtp" for s in spec.speculators)
        self.add(
            "error" if uses_mtp else "warning",
            "missing-mtp",
            f"{prefix}{spec.num_hidden_layers}+",
            f"the spec has mtp.num_heads: {spec.mtp.num_heads} (stored at "
            f"{heads[0]}*), but the checkpoint has no MTP layer ({len(absent)} "
            "tensors): the main model loads, MTP speculative decoding cannot"
            + (" (the spec's speculators include mtp)" if uses_mtp else ""),
            "use a checkpoint that keeps its MTP heads (transformers' "
            "save_pretrained drops them), or set mtp: null in the spec"
            + (" and remove the mtp speculator" if uses_mtp else ""),
            tensors=absent,
            spec_fields=["mtp"],
        )
        return [n for n in missing if not n.startswith(tuple(heads))]

    def _quantization(self) -> CTConfig | str | None:
        qc = (self.config or {}).get("quantization_config")
        if qc is None:
            return None
        method = qc.get("quant_method") if isinstance(qc, dict) else None
        if method == "compressed-tensors":
            try:
                parsed = CTConfig.parse(qc)
            except (AttributeError, TypeError, ValueError) as exc:
                self.add(
                    "error",
                    "quant-config",
                    "quantization_config",
                    f"cannot read the compressed-tensors config: {exc}",
                    "write it with compressed-tensors / llm-compressor",
                )
                return str(method)
            if not parsed.groups:
                self.add(
                    "error",
                    "quant-config",
                    "quantization_config",
                    "no config_groups: nothing says how weights are stored",
                    "write it with compressed-tensors / llm-compressor",
                )
            return parsed
        self.add(
            "warning",
            "quant-config",
            "quantization_config",
            f"quant_method {method!r}: onboard checks the names and shapes of its "
            "unquantized tensors; Linear weights and their scale tensors are "
            "accepted as stored",
            "prefer compressed-tensors (`onboard quantize`), which is checked fully",
        )
        return str(method)

    def _stored(self, module: str) -> str:
        """How the checkpoint stores a Linear module: quantized, plain or absent."""
        if self._with_qparams is None:  # once: modules with quantization tensors
            self._with_qparams = {
                module
                for module, _, param in (n.rpartition(".") for n in self.found)
                if param in QUANT_PARAMS
            }
        weight = self.found.get(f"{module}.weight")
        if module in self._with_qparams or (
            weight is not None and weight.dtype not in FLOATS
        ):
            return "quantized"
        return "plain" if weight is not None else "absent"

    def _module_tensors(self, module: str) -> list[str]:
        return [
            f"{module}.{p}"
            for p in ("weight", "bias", *sorted(QUANT_PARAMS))
            if f"{module}.{p}" in self.found
        ]

    def _kv_scale_names(self, roles: dict[str, str]) -> list[str]:
        attn = {m.rpartition(".")[0] for m, r in roles.items() if r == "o_proj"}
        kv = [m for m, r in roles.items() if r in ("k_proj", "v_proj", "kv_b_proj")]
        names = [f"{a}.{p}" for a in attn for p in ("k_scale", "v_scale", "q_scale")]
        names += [f"{m}.output_scale" for m in kv]
        return names

    def _report_quant_mismatch(self, mismatched: dict[tuple, list[str]]) -> None:
        for (pattern, stored, why), modules in mismatched.items():
            names = [t for m in modules for t in self._module_tensors(m)]
            where = describe(pattern, modules)
            if stored == "plain":
                dtype = self.found[f"{modules[0]}.weight"].dtype
                self.add(
                    "error",
                    "quant-mismatch",
                    where,
                    f"the checkpoint stores it unquantized ({dtype}), but {why}: "
                    "vLLM would build a quantized layer and find no scales",
                    f"add {pattern.replace('{layer}', '*').replace('{expert}', '*')!r}"
                    " (exact names, or a `re:` pattern) to quantization_config.ignore",
                    tensors=names,
                    config_keys=["quantization_config.ignore"],
                )
            else:
                self.add(
                    "error",
                    "quant-mismatch",
                    where,
                    f"the checkpoint stores it quantized, but {why}: vLLM builds it "
                    "unquantized and cannot load the quantized tensors",
                    "keep it in 16 bits in the checkpoint"
                    + (
                        ", or remove it from quantization_config.ignore"
                        if "ignore" in why
                        else ""
                    ),
                    tensors=names,
                    config_keys=["quantization_config.ignore"],
                )

    def _report_fused(self, quantized: dict[str, bool], roles: dict[str, str]) -> None:
        sets: dict[tuple, dict[str, bool]] = defaultdict(dict)
        for module, q in quantized.items():
            role = roles.get(module)
            for i, members in enumerate(FUSED_SETS):
                if role in members:
                    pattern, idx = abstract(module)
                    sets[(i, idx[:1])][module] = q
        for (_, layer), modules in sorted(sets.items()):
            if len(set(modules.values())) > 1:
                quant = sorted(m for m, q in modules.items() if q)
                plain = sorted(m for m, q in modules.items() if not q)
                self.add(
                    "error",
                    "quant-fused",
                    f"layer {layer[0]}" if layer else "model",
                    f"vLLM loads {_examples(quant + plain)} as one fused layer, but "
                    f"the quantization config quantizes {_examples(quant)} and not "
                    f"{_examples(plain)} (vLLM: 'Found different quantization "
                    "schemes')",
                    "quantize all of them or list all of them in "
                    "quantization_config.ignore",
                    tensors=quant + plain,
                    config_keys=["quantization_config.ignore"],
                )

    def _check_present(
        self, expected: dict[str, _Expect], optional: dict[str, _Expect]
    ) -> None:
        shapes: dict[tuple, list[str]] = defaultdict(list)
        dtypes: dict[tuple, list[str]] = defaultdict(list)
        for name, info in self.found.items():
            want = expected.get(name) or optional.get(name)
            if want is None:
                continue
            if want.shape is not None and not _same_shape(want.shape, info.shape):
                key = (abstract(name)[0], want.shape, info.shape, want.role, want.param)
                shapes[key].append(name)
            if want.param == "weight-any":
                continue
            if want.dtypes is not None:
                if info.dtype not in want.dtypes:
                    dtypes[("quant", info.dtype, tuple(sorted(want.dtypes)))].append(
                        name
                    )
            elif info.dtype not in FLOATS:
                dtypes[("not-float", info.dtype, ())].append(name)
            elif (
                self.dtype is not None
                and info.dtype != self.dtype
                and want.param != "e_score_correction_bias"  # FP32 by design
            ):
                dtypes[("mixed", info.dtype, (self.dtype,))].append(name)
        for (pattern, want, got, role, param), names in shapes.items():
            self._shape_problem(pattern, want, got, role, param, names, expected)
        for (what, got, want), names in dtypes.items():
            self._dtype_problem(what, got, want, names)

    def _shape_problem(
        self,
        pattern: str,
        want: tuple[int, ...],
        got: tuple[int, ...],
        role: str | None,
        param: str,
        names: list[str],
        expected: dict[str, _Expect],
    ) -> None:
        spec = self.spec
        where = describe(pattern, names)
        if (
            role == "kv_a_proj"
            and param in ("weight", "weight_packed")
            and (got[:1] != want[:1])
        ):
            self._mla_latent(where, want, got, names)
            return
        exprs = dims(spec, role, param) if param in ("weight", "bias") else None
        if exprs is None or len(exprs) != len(want) or len(got) != len(want):
            expect = expected[names[0]]
            if expect.weight_shape is not None and param != "weight":
                message = (
                    f"shape {list(got)}, but config group {expect.scheme} stores "
                    f"{list(want)} for the {param} of a {list(expect.weight_shape)} "
                    "weight"
                )
                fix = (
                    "make quantization_config describe how the checkpoint was "
                    "quantized (group size, block structure), or re-quantize"
                )
            else:
                message = f"shape {list(got)}, expected {list(want)}"
                fix = "re-export the checkpoint, or fix the spec it was made for"
            self.add("error", "shape", where, message, fix, tensors=names)
            return
        parts, fields = [], []
        for i, ((text, value), g) in enumerate(zip(exprs, got, strict=True)):
            if value == g:
                continue
            implied = f" (the checkpoint implies {text}: {g})" if is_field(text) else ""
            parts.append(f"dim {i} is {g}, but {text} = {value}{implied}")
            fields += fields_in(text)
        self.add(
            "error",
            "shape",
            where,
            f"shape {list(got)}, the spec gives {list(want)}: " + "; ".join(parts),
            f"set {', '.join(dict.fromkeys(fields))} in the spec to the checkpoint's "
            "values (or use the checkpoint this spec describes)",
            tensors=names,
            spec_fields=dict.fromkeys(fields),
        )

    def _mla_latent(
        self, where: str, want: tuple, got: tuple, names: list[str]
    ) -> None:
        mla = self.spec.attention.mla
        assert mla is not None
        rows = got[0]
        layer = abstract(names[0])[1][0]
        norm_name = self.spec.tensor_path("kv_a_norm").format(layer=layer)
        norm = self.found.get(f"{norm_name}.weight")
        if norm is not None and len(norm.shape) == 1 and norm.shape[0] < rows:
            rank, rope = norm.shape[0], rows - norm.shape[0]
            fix = (
                f"set attention.mla.kv_lora_rank: {rank} and qk_rope_head_dim: "
                f"{rope} in the spec (kv_a_layernorm has {rank} entries)"
            )
        else:
            fix = (
                "set attention.mla.kv_lora_rank and qk_rope_head_dim in the spec so "
                f"that they sum to {rows}"
            )
        self.add(
            "error",
            "mla-latent",
            where,
            f"MLA latent size mismatch: kv_a_proj_with_mqa has {rows} rows, but "
            f"kv_lora_rank + qk_rope_head_dim = {mla.kv_lora_rank} + "
            f"{mla.qk_rope_head_dim} = {want[0]} (shape {list(got)}, expected "
            f"{list(want)})",
            fix,
            tensors=names,
            spec_fields=[
                "attention.mla.kv_lora_rank",
                "attention.mla.qk_rope_head_dim",
            ],
        )

    def _note_cpu_mla(self) -> None:
        spec = self.spec
        if spec.attention.type != "mla":
            return
        mla = spec.attention.mla
        latent = mla.kv_lora_rank + mla.qk_rope_head_dim
        kv_a = spec.tensor_path("kv_a_proj").format(layer=0) + ".weight"
        info = self.found.get(kv_a) or self.found.get(kv_a + "_packed")
        if info is not None and info.shape:
            latent = info.shape[0]
        if latent == CPU_MLA_LATENT:
            return
        self.add(
            "warning" if "cpu" in spec.targets else "note",
            "cpu-mla",
            "attention.mla",
            f"the MLA latent is {latent}; vLLM's CPU MLA decode kernel accepts only "
            f"{CPU_MLA_LATENT} (kv_lora_rank 512 + qk_rope_head_dim 64) and fails "
            "deep inside with misleading errors ('Unsupported block size: 16')",
            "validate on a GPU target, or keep kv_lora_rank 512 and qk_rope_head_dim "
            "64 for CPU runs",
            spec_fields=[
                "attention.mla.kv_lora_rank",
                "attention.mla.qk_rope_head_dim",
            ],
        )

    def _dtype_problem(
        self, what: str, got: str, want: tuple[str, ...], names: list[str]
    ) -> None:
        groups = by_pattern(names)
        where = "; ".join(describe(p, n) for p, n in list(groups.items())[:3])
        if len(groups) > 3:
            where += f"; and {len(groups) - 3} more pattern(s)"
        if what == "quant":
            self.add(
                "error",
                "dtype",
                where,
                f"stored as {got}; the quantization scheme stores {' or '.join(want)}",
                "re-quantize with compressed-tensors (`onboard quantize`)",
                tensors=names,
            )
        elif what == "not-float":
            quant = (self.config or {}).get("quantization_config")
            self.add(
                "error",
                "dtype",
                where,
                f"stored as {got}, but "
                + (
                    "config.json has no quantization_config"
                    if quant is None
                    else "the quantization config keeps it unquantized"
                )
                + ": vLLM would read the raw values as weights",
                "add the quantization_config the quantizer wrote"
                if quant is None
                else "store it in 16 bits",
                tensors=names,
            )
        else:
            self.add(
                "warning",
                "dtype",
                where,
                f"stored as {got} while config.json says {want[0]}: vLLM casts on "
                "load, but a mixed-dtype export is often a mistake",
                f"re-export in {want[0]}, or set dtype in config.json to the "
                "weights' dtype",
                tensors=names,
            )

    # ---- names: missing, unexpected, renamed -------------------------------------

    def _report_names(
        self,
        missing: list[str],
        unexpected: list[str],
        quant: CTConfig | str | None,
        expected: dict[str, _Expect],
    ) -> None:
        miss = by_pattern(missing)
        extra = by_pattern(unexpected)
        canon = canonical_roles(self.spec)
        scales = [p for p in extra if split_name(p)[1] in QUANT_PARAMS]
        if quant is None and scales:
            names = [n for p in scales for n in extra.pop(p)]
            self.add(
                "error",
                "quant-config",
                "config.json",
                f"the checkpoint is quantized ({len(names)} scale/packed tensors, "
                f"e.g. {_examples(names, 2)}), but config.json has no "
                "quantization_config: vLLM would build unquantized layers",
                "add the quantization_config the quantizer wrote to config.json",
                tensors=names,
                config_keys=["quantization_config"],
            )
        renames = self._renames(extra, miss, canon, expected)
        for role, module, old in renames:
            params = sorted(
                {split_name(q)[1] for q in extra if split_name(q)[0] == module}
                & {split_name(q)[1] for q in miss if split_name(q)[0] == old}
            )
            names = [n for p in params for n in extra.pop(f"{module}.{p}")]
            gone = [n for p in params for n in miss.pop(f"{old}.{p}")]
            fix, verified = self._override_fix(role, module)
            self.add(
                "error",
                "renamed-tensor",
                describe(f"{module}.*", names),
                f"the checkpoint stores role {role!r} as {module!r}; the spec's "
                f"{self.spec.checkpoint.layout!r} layout names it "
                f"{self.spec.tensor_path(role)!r}"
                + (
                    f" (checked: with the override all {len(gone)} tensors match, "
                    "shapes included)"
                    if verified
                    else ""
                ),
                fix,
                tensors=names + gone,
                spec_fields=["checkpoint.tensor_names"],
            )
        if renames:
            self._layout_hint()
        for pattern, names in miss.items():
            module, param = split_name(pattern)
            self._missing_problem(pattern, canon.get(module), param, names)
        for pattern, names in extra.items():
            module, param = split_name(pattern)
            self._unexpected_problem(pattern, canon.get(module), param, names, quant)

    def _renames(
        self,
        extra: dict[str, list[str]],
        miss: dict[str, list[str]],
        canon: dict[str, str],
        expected: dict[str, _Expect],
    ) -> list[tuple[str, str, str]]:
        """(role, checkpoint module pattern, spec module pattern) for unexpected
        modules that look like a missing role under another name.

        Candidates pair an unexpected module with a missing one of the same
        placeholders and parameters; the best pairs win, scored by: the name is
        the role's name in some layout preset (``w1`` for expert_gate_proj), the
        shapes fit, the same indices, then name similarity (difflib).
        """
        from onboard.spec.layouts import LAYOUT_PRESETS

        def modules(groups: dict[str, list[str]]) -> dict[str, dict[str, list[str]]]:
            out: dict[str, dict[str, list[str]]] = defaultdict(dict)
            for pattern, names in groups.items():
                module, param = split_name(pattern)
                out[module][param] = names
            return out

        new, old = modules(extra), modules(miss)
        scored = []
        for u, u_params in new.items():
            if u in canon:
                continue  # a known role in an unexpected place, not a new name
            for m, m_params in old.items():
                role = canon.get(m)
                shared = sorted(set(u_params) & set(m_params))
                if role is None or not shared or placeholders(u) != placeholders(m):
                    continue
                spelled = u.rpartition(".")[2] in {
                    preset[role].rpartition(".")[2]
                    for preset in LAYOUT_PRESETS.values()
                }
                ratio = difflib.SequenceMatcher(None, u, m).ratio()
                if not spelled and ratio < 0.6:
                    continue
                shapes = all(
                    self.found[u_params[p][0]].shape == expected[m_params[p][0]].shape
                    for p in shared
                )
                indices = {abstract(n)[1] for n in u_params[shared[0]]} == {
                    abstract(n)[1] for n in m_params[shared[0]]
                }
                scored.append(((spelled, shapes, indices, ratio), role, u, m))
        out, used = [], set()
        for _, role, u, m in sorted(scored, reverse=True):
            if u not in used and m not in used:
                used.update((u, m))
                out.append((role, u, m))
        return out

    def _stored_as(self, plan: TensorPlan) -> bool:
        """The checkpoint holds this planned tensor (quantized weights: as
        weight_packed, or in FP8/INT8 with the same rows)."""
        info = self.found.get(plan.name)
        if info is None:
            return plan.name.endswith(".weight") and f"{plan.name}_packed" in self.found
        if info.dtype in FLOATS:
            return info.shape == plan.shape
        return info.shape[:1] == plan.shape[:1]

    def _layout_hint(self) -> None:
        """A layout preset under which every tensor of the spec is found."""
        from onboard.spec.layouts import LAYOUT_PRESETS

        spec = self.spec
        for layout in LAYOUT_PRESETS:
            if layout == spec.checkpoint.layout:
                continue
            data = spec.model_dump(mode="json")
            data["checkpoint"] = {"layout": layout, "tensor_names": {}}
            plans = plan_tensors(ModelSpec.model_validate(data))
            if all(self._stored_as(p) for p in plans):
                self.add(
                    "note",
                    "layout",
                    "checkpoint.layout",
                    f"every tensor of the spec is found under the {layout!r} "
                    f"layout (the spec says {spec.checkpoint.layout!r})",
                    f"set checkpoint.layout: {layout} in the spec instead of "
                    "tensor_names overrides",
                    spec_fields=["checkpoint.layout"],
                )
                return

    def _override_fix(self, role: str, module: str) -> tuple[str, bool]:
        """The tensor_names override, checked by planning the spec with it."""
        spec = self.spec
        data = spec.model_dump(mode="json")
        data["checkpoint"]["tensor_names"] = {
            **spec.checkpoint.tensor_names,
            role: module,
        }
        override = f"checkpoint: {{tensor_names: {{{role}: '{module}'}}}}"
        try:
            before = {p.name for p in plan_tensors(spec)}
            planned = [
                p
                for p in plan_tensors(ModelSpec.model_validate(data))
                if p.name not in before
            ]
        except Exception:  # the override is not a valid spec: rename instead
            planned = []
        fits = bool(planned) and all(self._stored_as(p) for p in planned)
        if fits:
            return f"add to the spec: {override}", True
        return (
            "rename these tensors in the checkpoint to the spec's names (the "
            f"override {override} would not fit every layer)",
            False,
        )

    def _missing_problem(
        self, pattern: str, role: str | None, param: str, names: list[str]
    ) -> None:
        spec = self.spec
        moe = spec.mlp.moe
        where = describe(pattern, names)
        layers = {abstract(n)[1][0] for n in names if abstract(n)[1]}
        message = "missing from the checkpoint"
        fix = (
            "check the checkpoint is complete (every shard downloaded) and that the "
            f"spec describes it (layout {spec.checkpoint.layout!r}; "
            "checkpoint.tensor_names overrides a role's name)"
        )
        fields: list[str] = []
        if param in QUANT_PARAMS:
            message += (
                f": the quantization_config needs {param} for every module it "
                "quantizes (a quantizer that skips MoE experts or fused modules "
                "leaves their scales out)"
            )
            fix = (
                "re-quantize the checkpoint (`onboard quantize`, llm-compressor); "
                "a module meant to stay in 16 bits goes to quantization_config.ignore"
            )
            fields = []
        elif param == "e_score_correction_bias":
            message += (
                ": the spec says mlp.moe.router.bias_correction: true (DeepSeek-V3 "
                "noaux_tc routing), which needs the router's e_score_correction_bias"
            )
            fix = (
                "set mlp.moe.router.bias_correction: false in the spec (and "
                "topk_method in config.json accordingly), or the checkpoint lacks "
                "the bias: export it with e_score_correction_bias"
            )
            fields = ["mlp.moe.router.bias_correction"]
        elif spec.mtp and layers and min(layers) >= spec.num_hidden_layers:
            message += (
                f": the spec has mtp.num_heads: {spec.mtp.num_heads}, stored at "
                f"model.layers.{spec.num_hidden_layers}+"
            )
            fix = (
                "set mtp: null in the spec (no MTP speculative decoding), or use a "
                "checkpoint that keeps its MTP heads"
            )
            fields = ["mtp"]
        elif role is not None:
            fix, fields = role_hint(spec, role, param, fix, missing=True)
        elif moe is not None and "{expert}" in pattern:
            fields = ["mlp.moe.num_experts"]
        self.add(
            "error",
            "missing-tensor",
            where,
            message,
            fix,
            tensors=names,
            spec_fields=fields,
        )

    def _unexpected_problem(
        self,
        pattern: str,
        role: str | None,
        param: str,
        names: list[str],
        quant: CTConfig | str | None,
    ) -> None:
        spec = self.spec
        where = describe(pattern, names)
        idx = [abstract(n)[1] for n in names]
        layers = {i[0] for i in idx if i}
        severity: Severity = "error"
        message = (
            "in the checkpoint, but the spec expects no such tensor: vLLM's loader "
            "stops on it"
        )
        fix = (
            "if it is a role under another name, map it with checkpoint.tensor_names "
            "in the spec; otherwise remove it from the checkpoint"
        )
        fields: list[str] = ["checkpoint.tensor_names"]
        total = spec.num_hidden_layers + (spec.mtp.num_heads if spec.mtp else 0)
        if any(pattern.endswith(d) for d in DROPPED):
            severity, message = "note", "vLLM's loader drops it by name"
            fix, fields = "", []
        elif param in QUANT_PARAMS and role in HEAD_ROLES:
            message = "quantized, but vLLM builds this layer unquantized"
            fix = "keep the embedding and output heads in 16 bits"
            fields = []
        elif role == "lm_head" and spec.tie_word_embeddings:
            severity = "warning"
            message = (
                "the spec ties the output head to the embedding "
                "(tie_word_embeddings: true), so vLLM skips this tensor"
            )
            fix = (
                "if the checkpoint's head differs from its embedding, set "
                "tie_word_embeddings: false in the spec"
            )
            fields = ["tie_word_embeddings"]
        elif layers and min(layers) >= total:
            if spec.mtp is None:
                message = (
                    f"layers beyond num_hidden_layers ({spec.num_hidden_layers}): "
                    "MTP heads, or more decoder layers than the spec says"
                )
                fix = (
                    f"set mtp: {{num_heads: {max(layers) - total + 1}}} in the spec "
                    "for MTP heads (DeepSeek-V3 stores them at model.layers."
                    "{num_hidden_layers + i}), or fix num_hidden_layers"
                )
            else:
                message = f"layers beyond the spec's {total} (decoder + MTP) layers"
                fix = "fix num_hidden_layers or mtp.num_heads in the spec"
            fields = ["num_hidden_layers", "mtp.num_heads"]
        elif role is not None and role.startswith("mtp_") and layers:
            message = (
                f"MTP head tensors at layers {ranges(layers)}, but the spec puts "
                f"MTP heads after its {spec.num_hidden_layers} decoder layers"
                + ("" if spec.mtp else " and has none (mtp: null)")
            )
            fix = f"set num_hidden_layers: {min(layers)} in the spec" + (
                "" if spec.mtp else f" and mtp: {{num_heads: {len(layers)}}}"
            )
            fields = ["num_hidden_layers", "mtp"]
        elif (
            role in EXPERT_ROLES
            and spec.mlp.moe is not None
            and any(len(i) > 1 and i[1] >= spec.mlp.moe.num_experts for i in idx)
        ):
            top = max(i[1] for i in idx if len(i) > 1)
            message = (
                f"experts beyond mlp.moe.num_experts ({spec.mlp.moe.num_experts}): "
                f"the checkpoint has experts up to {top}"
            )
            fix = f"set mlp.moe.num_experts: {top + 1} in the spec"
            fields = ["mlp.moe.num_experts"]
        elif role is not None:
            fix, fields = role_hint(spec, role, param, fix, missing=False)
        self.add(
            severity,
            "unexpected-tensor",
            where,
            message,
            fix,
            tensors=names,
            spec_fields=fields,
        )


def _config_class(model_type: str) -> type | None:
    """transformers' config class for a model type it ships, else None."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None


def _normalised(cls: type, config: dict) -> dict:
    """The config as transformers' class reads it (defaults filled, aliases mapped)."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()  # rope-validation warnings: we report problems
    try:
        return cls.from_dict(dict(config)).to_dict()
    finally:
        logging.set_verbosity(level)


# ---- small helpers -----------------------------------------------------------------

_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a == b and type(a) is type(b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _same_shape(want: tuple[int, ...], got: tuple[int, ...]) -> bool:
    # A per-tensor scale is (1,) in compressed-tensors, () in some exports.
    return want == got or (want == (1,) and got == ())


def _short(value: Any, limit: int = 80) -> str:
    if value is _MISSING:
        return "(not set)"
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _examples(names: list[str], n: int = 3) -> str:
    shown = ", ".join(names[:n])
    return shown + (f" (+{len(names) - n} more)" if len(names) > n else "")
