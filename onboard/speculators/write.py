"""`onboard speculators SPEC --out DIR`: every speculative-decoding file a launch
ships, one set per method the spec lists.

Layout of DIR:
  speculative-config.<method>.json   vLLM --speculative-config (every method)
  <method>/config.json               speculators-format head config (eagle3,
                                     dflash, dspark without a trained `model:`)
  <method>/recipe.sh                 speculators training recipe for the real model
  speculators.json                   summary: methods, files, sizes, notes
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onboard.errors import InputError
from onboard.fsutil import atomic_write_text
from onboard.spec.model import ModelSpec
from onboard.speculators.heads import HEAD_METHODS, head_config
from onboard.speculators.methods import refusals, speculative_config
from onboard.speculators.recipe import recipe_script, sizes


def check_speculators(spec: ModelSpec, source: str = "spec") -> None:
    """Refuse (InputError, exit 2) what the pinned vLLM would reject."""
    problems = refusals(spec, source)
    if problems:
        raise InputError("speculative decoding config refused:\n" + "\n".join(problems))


def _write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_speculators(
    spec: ModelSpec, out_dir: Path, source: str = "spec"
) -> list[Path]:
    """Write the files of every method in ``spec.speculators`` into ``out_dir``;
    return the paths written. Refuses the whole spec first if any method would be
    rejected by vLLM."""
    check_speculators(spec, source)
    if not spec.speculators:
        raise InputError(f"{source}: speculators: the spec lists no method")
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"{out_dir}: cannot create the output directory: {exc}"
        ) from None
    written: list[Path] = []
    summary: dict[str, Any] = {"spec": spec.name, "methods": {}}
    for entry in spec.speculators:
        method, k = entry.method, entry.num_speculative_tokens
        info: dict[str, Any] = {"num_speculative_tokens": k}
        draft = entry.model
        if method in HEAD_METHODS and draft is None:
            head_dir = (out_dir / method).resolve()
            head = head_config(spec, method, k)
            _write_json(head_dir / "config.json", head)
            recipe = head_dir / "recipe.sh"
            atomic_write_text(recipe, recipe_script(spec, method, k, head))
            recipe.chmod(0o755)
            written += [head_dir / "config.json", recipe]
            info.update(head=str(head_dir), sizes=sizes(spec, head))
            info["note"] = (
                f"{head_dir} holds the head's config; run its recipe.sh to train the "
                "weights into it (vLLM needs them to serve)"
            )
            draft = str(head_dir)
        if method == "suffix":
            info["note"] = "needs the arctic-inference package where vLLM runs"
        cfg_path = out_dir / f"speculative-config.{method}.json"
        _write_json(cfg_path, speculative_config(entry, draft))
        written.append(cfg_path)
        info["speculative_config"] = str(cfg_path)
        summary["methods"][method] = info
    _write_json(out_dir / "speculators.json", summary)
    written.append(out_dir / "speculators.json")
    return written
