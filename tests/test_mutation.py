"""Mutation testing of validation (tests/mutants.py): subtle faults written into
a generated model must each fail `onboard validate`.

`make test` checks where each fault applies (no engine) and runs a sample on
the dense bundled spec; `make test-all` runs every fault on every bundled spec
and requires every one caught (the mutation score in docs/validation.md).
"""

from __future__ import annotations

import ast
import difflib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import mutants  # noqa: E402

from onboard.generate import generate_files, write_trees  # noqa: E402
from onboard.spec import load_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = sorted(p.stem for p in (ROOT / "model_specs").glob("*.yaml"))

# The faults each bundled spec's generated model can carry: pinned, so that a
# template change that moves a fault's pattern fails here instead of quietly
# shrinking the suite.
APPLICABLE = {
    "deepseek-v3-style": {"router_bias_dropped"},
    "dense-gqa": set(),
    "glm-5-style": {"router_bias_dropped", "indexer_head_weights_reversed"},
    "gpt-oss-style": {"sinks_dropped", "sliding_window_dropped"},
    "kimi-k3-style": {"router_bias_dropped", "linear_decay_negated"},
    "mistral-large-4-style": {"kv_sharing_target", "indexer_head_weights_reversed"},
    "novel-launch": {
        "router_bias_dropped",
        "kv_sharing_target",
        "sliding_window_dropped",
    },
    # Modular: vLLM's Qwen3NextForCausalLM, its norm weights bridged at load.
    "qwen3-next-style": {"norm_bridge_dropped"},
}
# Modular, whose code is vLLM's (the faults below are not in it), and the faults
# of their standalone files (mutants.py --standalone).
MODULAR = {"qwen3-next-style": {"linear_decay_negated"}}
EVERY_MODEL = {"rope_layout", "softmax_scale", "norm_eps"}
GATE_UP = set(BUNDLED) - {"gpt-oss-style"}  # (its experts fuse gate and up)
CASES = [(name, False) for name in BUNDLED] + [(name, True) for name in MODULAR]


def expected_faults(name: str, standalone: bool) -> set[str]:
    if name in MODULAR and not standalone:
        return APPLICABLE[name]
    out = EVERY_MODEL | (MODULAR[name] if name in MODULAR else APPLICABLE[name])
    return out | ({"gate_up_swapped"} if name in GATE_UP else set())


@pytest.mark.parametrize("name, standalone", CASES)
def test_each_fault_applies_where_its_pattern_is_and_changes_one_line(
    name, standalone, tmp_path
):
    spec = load_spec(ROOT / "model_specs" / f"{name}.yaml")
    write_trees(generate_files(spec, standalone), tmp_path)
    text = mutants.model_file(tmp_path).read_text()
    applied = set()
    for fault in mutants.FAULTS:
        mutated = fault.inject(text)
        if mutated is None:
            continue
        applied.add(fault.name)
        ast.parse(mutated)  # still a module that imports
        changed = [
            line
            for line in difflib.unified_diff(text.splitlines(), mutated.splitlines())
            if line[:1] in "+-" and line[:3] not in ("+++", "---")
        ]
        # One line changed, or one added: a fault is one small mistake.
        assert len(changed) in (1, 2), (fault.name, changed)
        assert len([c for c in changed if c.startswith("+")]) == 1, fault.name
    assert applied == expected_faults(name, standalone)


@pytest.mark.engine
def test_a_sample_of_faults_fails_validation_on_the_dense_model(tmp_path):
    """One fault on the dense bundled spec, the softmax scale 5% off: the
    unmutated model passes, the mutant fails its accuracy check (not by
    crashing). Every fault on every bundled spec: make test-all."""
    report = mutants.run(
        ROOT / "model_specs" / "dense-gqa.yaml", tmp_path, faults=["softmax_scale"]
    )
    print("\n" + mutants.table([report]))
    assert report["unmutated"]["passed"], report["unmutated"]
    assert set(report["faults"]) == {"softmax_scale"}
    for name, fault in report["faults"].items():
        assert not fault["passed"] and fault["status"] == "failed", (name, fault)


@pytest.mark.engine
@pytest.mark.acceptance
@pytest.mark.parametrize("name, standalone", CASES)
def test_every_fault_fails_validation(name, standalone, tmp_path):
    spec = ROOT / "model_specs" / f"{name}.yaml"
    report = mutants.run(spec, tmp_path, standalone=standalone)
    print("\n" + mutants.table([report]))
    assert report["unmutated"]["passed"], report["unmutated"]
    assert set(report["faults"]) == expected_faults(name, standalone)
    for fault, result in report["faults"].items():
        assert not result["passed"] and result["status"] == "failed", (fault, result)
