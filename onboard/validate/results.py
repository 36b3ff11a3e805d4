"""The validation.json model (contract in docs/architecture.md).

``{"passed", "target", "model_dir", "vllm_model_class", "reference",
"cpu_compat", "checks": [{"name", "status", "passed", "metrics", "details"}]}``.
A check that could not run is ``not-run`` (never passed); the run passes when no
check failed and ``accuracy`` passed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from onboard.fsutil import atomic_write_text

Status = Literal["passed", "failed", "not-run"]


@dataclass
class Check:
    name: str
    status: Status
    metrics: dict[str, Any] = field(default_factory=dict)
    details: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @classmethod
    def not_run(cls, name: str, reason: str, **metrics: Any) -> Check:
        return cls(name, "not-run", dict(metrics), reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "passed": self.passed,
            "metrics": _json_safe(self.metrics),
            "details": self.details,
        }


@dataclass
class ValidationResult:
    target: str
    model_dir: str
    vllm_model_class: str = ""
    reference: str = ""
    checks: list[Check] = field(default_factory=list)
    # onboard's CPU shims the engine ran with (onboard.runtime.compat): what
    # vLLM's CPU build lacks, installed into the engine only.
    cpu_compat: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        if any(c.status == "failed" for c in self.checks):
            return False
        return any(c.name == "accuracy" and c.passed for c in self.checks)

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "target": self.target,
            "model_dir": self.model_dir,
            "vllm_model_class": self.vllm_model_class,
            "reference": self.reference,
            "cpu_compat": list(self.cpu_compat),
            "checks": [c.to_dict() for c in self.checks],
        }

    def write(self, out_dir: Path) -> Path:
        path = Path(out_dir) / "validation.json"
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")
        return path


def load_result(path: str | Path) -> dict[str, Any]:
    """Read a validation.json back (for the report and for later stages)."""
    return json.loads(Path(path).read_text())


def _json_safe(value: Any) -> Any:
    # JSON has no NaN/inf; a metric that is not a number is written as null.
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _json_safe(value.item())
    return value
