"""Reading a checkpoint's config.json the way every stage must: a JSON object with
finite numbers (Python's json module accepts NaN and Infinity, which no model
config means)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from onboard.errors import InputError


def non_finite_keys(value: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the NaN / infinite numbers in a parsed JSON value."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [prefix or "<root>"]
    if isinstance(value, dict):
        items = ((f"{prefix}.{k}" if prefix else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{prefix}[{i}]", v) for i, v in enumerate(value))
    else:
        return []
    return [path for key, v in items for path in non_finite_keys(v, key)]


def check_config_object(config: Any, source: object) -> dict:
    """``config`` when it is a JSON object of finite numbers; else an InputError
    located at ``source``."""
    if not isinstance(config, dict):
        raise InputError(f"{source}: not a JSON object")
    bad = non_finite_keys(config)
    if bad:
        # NaN would also "contradict" itself in a comparison (NaN != NaN).
        raise InputError(
            f"{source}: {', '.join(bad[:5])} {'is' if len(bad) == 1 else 'are'} NaN "
            "or infinite; no model config means that (a corrupt or hand-edited file?)"
        )
    return config


def read_config_json(path: Path) -> dict:
    """The parsed config.json at ``path``; InputError when it is not a usable one."""
    if Path(path).exists() and not Path(path).is_file():
        raise InputError(f"{path}: not a regular file")
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: missing (not a Hugging Face checkpoint)") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    check_config_object(config, path)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError(f"{path}: model_type: required, as a string")
    return config
