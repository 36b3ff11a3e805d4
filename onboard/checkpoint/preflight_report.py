"""The preflight's report and the state its checks share.

Every check (``preflight_files``, ``preflight_config``, ``preflight_tensors``,
``preflight_names``, ``preflight_quant``) reads a :class:`PreflightRun` and adds to
its one problem list through :meth:`PreflightRun.add`, so the report keeps the
order in which the checks run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from onboard.arch import build_plan

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec


class TensorInfo(NamedTuple):
    """One tensor of the checkpoint, as its shard's header declares it."""

    dtype: str
    shape: tuple[int, ...]
    shard: str


Severity = Literal["error", "warning", "note"]


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
    """What :func:`~onboard.checkpoint.preflight.preflight` found; ``ok`` when no
    problem is an error."""

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


@dataclass
class Expect:
    """What the spec (and the quantization config) expects of one tensor."""

    shape: tuple[int, ...] | None
    dtypes: frozenset[str] | None  # None: the checkpoint's float dtype
    role: str | None
    param: str
    weight_shape: tuple[int, ...] | None = None  # of the quantized weight
    scheme: str = ""  # the config group that quantizes it


class PreflightRun:
    """One preflight: the spec and its plan, what was read from the checkpoint,
    the report."""

    def __init__(self, spec: ModelSpec, root: Path, *, in_tree: bool = False):
        self.spec = spec
        # Served by vLLM's in-tree model of the family rather than the generated
        # one (which reads some keys a checkpoint may leave out).
        self.in_tree = in_tree
        # config.json keys the checkpoint may leave out for the generated model.
        self.unset_ok: frozenset[str] = frozenset()
        self.plan = build_plan(spec)
        self.root = root
        self.report = PreflightReport(root)
        self.config: dict | None = None
        self.found: dict[str, TensorInfo] = {}
        self.lost: set[str] = set()  # indexed into shards that are missing/unreadable
        self.dtype: str | None = None  # config.json's float dtype, as a tag
        self.with_qparams: set[str] | None = None  # modules with quant tensors

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


def examples(names: list[str], n: int = 3) -> str:
    """The first ``n`` names and how many more there are."""
    shown = ", ".join(names[:n])
    return shown + (f" (+{len(names) - n} more)" if len(names) > n else "")
