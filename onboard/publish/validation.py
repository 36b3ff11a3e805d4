"""Find the validation.json that covers a checkpoint and judge whether it may be
published.

A checkpoint is covered when the validation run was made on it (its recorded
``model_dir`` is this directory), or, for a quantized checkpoint, when the run has
a passed ``quant:<scheme>`` check for its scheme (of these very shards, when the
check recorded their checksums), or, for the 16-bit checkpoint of a
`new-model` directory, when the run is that directory's own. It may be published
when the run passed and its coverage check passed; ``--force`` publishes anyway and
the card says why it was forced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onboard.errors import InputError
from onboard.publish.checkpoint import Checkpoint


@dataclass
class Verdict:
    path: Path | None
    data: dict[str, Any] | None
    problem: str  # empty when the checkpoint may be published
    covered_by: str  # how the run covers the checkpoint

    @property
    def ok(self) -> bool:
        return not self.problem


def find_validation(checkpoint_dir: Path, explicit: Path | None) -> Path | None:
    """``--validation`` if given, else ``ROOT/validation/validation.json`` for a
    checkpoint at ``ROOT/checkpoints/<variant>`` (the new-model layout)."""
    if explicit is not None:
        if not Path(explicit).is_file():
            raise InputError(f"--validation: {explicit}: no such file")
        return Path(explicit)
    root = layout_root(checkpoint_dir)
    if root is not None and (root / "validation" / "validation.json").is_file():
        return root / "validation" / "validation.json"
    return None


def layout_root(checkpoint_dir: Path) -> Path | None:
    """The new-model output directory holding this checkpoint, if it is in one."""
    parent = Path(checkpoint_dir).resolve().parent
    return parent.parent if parent.name == "checkpoints" else None


def load_validation(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})") from None
    problems = []
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object (see docs/architecture.md)")
    if not isinstance(data.get("passed"), bool):
        problems.append("`passed` must be true or false")
    checks = data.get("checks")
    if not isinstance(checks, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) for c in checks
    ):
        problems.append("`checks` must be a list of objects with a `name`")
    if problems:
        raise InputError(f"{path}: not a validation.json: " + "; ".join(problems))
    return data


def judge(checkpoint: Checkpoint, path: Path | None) -> Verdict:
    if path is None:
        return Verdict(
            None,
            None,
            f"no validation.json for {checkpoint.dir} (run `onboard validate`, "
            "or pass --validation PATH)",
            "",
        )
    data = load_validation(path)
    checks = {c["name"]: c for c in data["checks"]}
    failed = [n for n, c in checks.items() if c.get("status") == "failed"]
    covered_by, gap = _coverage(checkpoint, path, data, checks)
    if not data["passed"]:
        why = f"failed checks: {', '.join(failed)}" if failed else "accuracy not passed"
        return Verdict(path, data, f"{path}: validation did not pass ({why})", "")
    if gap:
        return Verdict(path, data, f"{path}: {gap}", "")
    return Verdict(path, data, "", covered_by)


def _coverage(
    checkpoint: Checkpoint,
    path: Path,
    data: dict[str, Any],
    checks: dict[str, dict[str, Any]],
) -> tuple[str, str]:
    """(how the run covers the checkpoint, or why it does not)."""
    here = checkpoint.dir.resolve()
    recorded = data.get("model_dir")
    if isinstance(recorded, str) and recorded:
        candidate = Path(recorded)
        if not candidate.is_absolute():
            candidate = path.parent / candidate
        if candidate.resolve() == here:
            return "the validation ran on this checkpoint", ""
    scheme = checkpoint.scheme
    if scheme is not None:
        name = f"quant:{scheme}"
        check = checks.get(name)
        if check is None:
            return "", (
                f"validated {recorded!r}, and has no {name} check for this "
                f"{scheme} checkpoint"
            )
        if check.get("status") != "passed":
            return "", f"the {name} check is {check.get('status')!r}, not passed"
        # The check records the checksums of the shards it validated (onboard
        # validate's quant check does); they must be this checkpoint's.
        validated = (check.get("metrics") or {}).get("shards_sha256")
        record = (checkpoint.quantize_record or {}).get("shards") or {}
        mine = {n: (v or {}).get("sha256") for n, v in record.items()}
        if isinstance(validated, dict) and mine and validated != mine:
            return "", (
                f"the {name} check validated other shards than this checkpoint's "
                f"({checkpoint.dir}; compare the shards' sha256 with its "
                "onboard-quantize.json)"
            )
        return f"the {name} check", ""
    root = layout_root(checkpoint.dir)
    if (
        root is not None
        and path.resolve() == (root / "validation" / "validation.json").resolve()
    ):
        return "the new-model run's validation of this checkpoint", ""
    return "", f"validated {recorded!r}, not this checkpoint ({checkpoint.dir})"
