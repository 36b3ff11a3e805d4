"""The speculators stage of `onboard new-model` without training (the EAGLE-3 head
is trained in tests/test_spec_decode_engine.py): the configs of the full-size spec
and of the tiny checkpoint, with the final paths, and nothing left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.errors import InputError
from onboard.pipeline import stage_speculators
from onboard.pipeline.runner import Context
from onboard.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def _spec(tmp: Path, speculators: list[dict]) -> Path:
    data = yaml.safe_load((ROOT / "model_specs" / "deepseek-v3-style.yaml").read_text())
    data["speculators"] = speculators
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(tmp: Path, speculators: list[dict]) -> Path:
    spec = load_spec(_spec(tmp, speculators))
    out = tmp / "out"
    write_tiny_checkpoint(spec, out / "checkpoints" / "bf16", seed=0)
    stage_speculators.run(Context(spec=spec, out=out, full=False, console=Console()))
    return out / "speculators"


def test_stage_writes_full_and_tiny_configs(tmp_path):
    listed = [
        {"method": "mtp", "num_speculative_tokens": 1},
        {"method": "ngram", "num_speculative_tokens": 3},
    ]
    out = _run(tmp_path, listed)
    for root in (out, out / "tiny"):
        summary = json.loads((root / "speculators.json").read_text())
        assert sorted(summary["methods"]) == ["mtp", "ngram"]
        ngram = json.loads((root / "speculative-config.ngram.json").read_text())
        assert ngram["method"] == "ngram" and ngram["num_speculative_tokens"] == 3
    # No temporary path survives in the files, no temporary directory beside.
    for path in out.rglob("*.json"):
        assert ".tmp" not in path.read_text(), path
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".speculators")]


def test_stage_final_paths_in_a_directory_named_with_quotes(tmp_path):
    # JSON escapes a double quote or backslash in the path: the temporary path is
    # still found and rewritten to the final one.
    root = tmp_path / "a b \"dq\" 'q' back\\slash $(x)"
    root.mkdir()
    out = _run(root, [{"method": "dflash", "num_speculative_tokens": 3}])
    for config in (out, out / "tiny"):
        flag = json.loads((config / "speculative-config.dflash.json").read_text())
        assert flag["model"] == str(config.resolve() / "dflash")
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".speculators")]


def test_stage_refuses_before_writing(tmp_path):
    # eagle3 with a draft of another hidden size is refused by the full spec's
    # rules: nothing is written.
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(
        json.dumps(
            {
                "speculators_model_type": "eagle3",
                "transformer_layer_config": {"hidden_size": 64},
            }
        )
    )
    with pytest.raises(InputError, match="hidden states of size 64"):
        _run(tmp_path, [{"method": "eagle3", "model": str(head)}])
    assert not (tmp_path / "out" / "speculators").exists()
