"""MTP self-distillation of tiny checkpoints (onboard.speculators.mtp_train).

No engine: the generated Hugging Face reference is the teacher and the judge.
The bundled novel-launch spec's tiny checkpoint (two MTP heads) is trained as
`onboard checkpoint tiny` does; its heads' acceptance on the accuracy check's
prompts (never trained on) is measured before and after. Determinism and the
atomic write use a few steps on the DeepSeek-V3-style tiny checkpoint.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.errors import InputError
from onboard.spec import load_spec
from onboard.speculators.mtp_train import (
    REPORT_FILE,
    decoded_walk,
    engine_schedule,
    heldout_prompts,
    read_tensor,
    reference_mtp_acceptance,
    train_mtp_heads,
    write_tensors,
)

ROOT = Path(__file__).resolve().parents[1]
ONBOARD = str(Path(sys.executable).with_name("onboard"))


def _files(ckpt: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(ckpt.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def novel_trained(tmp_path_factory):
    """`onboard checkpoint tiny novel-launch.yaml` (trains the MTP heads)."""
    out = tmp_path_factory.mktemp("novel") / "ckpt"
    proc = subprocess.run(
        [ONBOARD, "checkpoint", "tiny", str(ROOT / "model_specs/novel-launch.yaml")]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print("\n" + proc.stdout)
    return out, proc.stdout


def test_training_makes_the_first_head_accept_half_the_held_out_tokens(novel_trained):
    ckpt, output = novel_trained
    report = json.loads((ckpt / REPORT_FILE).read_text())
    before, after = report["before"], report["after"]
    print(f"before: {before}\nafter: {after}")
    # Random heads accept (almost) nothing; trained, the first accepts >= half.
    assert before["per_head"][0] <= 0.05
    assert after["per_head"][0] >= 0.5
    assert after["per_head"][1] > before["per_head"][1] + 0.2
    assert after["mean_acceptance_length"] > before["mean_acceptance_length"] + 0.5
    assert after["slots"] >= 300 and after["prompts"] == 12
    # As vLLM runs them (head 0 at both draft positions) and counts them (drafts
    # only after each verification): what the engine's counters show, 0.40
    # measured (docs/checkpoints.md), below the every-slot figure.
    ran, ran_before = report["after_as_vllm_runs"], report["before_as_vllm_runs"]
    assert ran["heads"] == ran_before["heads"] == [0, 0]
    assert ran_before["decoded_per_position"][0] <= 0.05
    assert ran["decoded_per_position"][0] >= 0.35
    assert ran["decoded_per_position"][0] < after["per_position"][0]
    assert ran["decoded_drafts"] < ran["slots"]
    assert report["loss_last"] < report["loss_first"]
    # Progress was shown, with both figures.
    assert "before training" in output and "after training" in output
    # Only MTP tensors (not their output-head copies) were trained.
    n = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
    assert report["trained_tensors"]
    assert all(
        name.startswith((f"model.layers.{n}.", f"model.layers.{n + 1}."))
        and "shared_head.head" not in name
        for name in report["trained_tensors"]
    )


def test_reference_acceptance_by_head_choice(novel_trained):
    """The function the spec-decode check calls: the first head reused at the
    second draft position (what vLLM's drafter may run) is measured too."""
    ckpt, _ = novel_trained
    spec = load_spec(ckpt / "spec.yaml")
    prompts = [[1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]]
    own = reference_mtp_acceptance(ckpt, spec, prompts, 2)
    reused = reference_mtp_acceptance(ckpt, spec, prompts, heads=[0, 0])
    assert own.heads == [0, 1] and reused.heads == [0, 0]
    # 32 generated tokens: drafts start at 30 slots (the last two lack targets).
    assert own.slots == reused.slots == 30
    assert own.per_head[0] == reused.per_head[0]  # same head, same drafts
    assert reused.per_position[1] <= reused.per_position[0]
    assert own.mean_acceptance_length == 1 + sum(own.per_position)
    # As a speculative decoder drafts (only after each verification): a round
    # at least every k + 1 slots, at most one per slot.
    for acc in (own, reused):
        assert 30 / 3 <= acc.decoded_drafts <= 30
        assert acc.decoded_mean_acceptance_length == pytest.approx(
            1 + sum(acc.decoded_per_position)
        )
        assert acc.decoded_per_position[1] <= acc.decoded_per_position[0]
    with pytest.raises(InputError, match="k must be 1..2"):
        reference_mtp_acceptance(ckpt, spec, prompts, 3)


def test_decoded_walk_drafts_only_after_each_verification():
    # k=1: right at slots 0, 1, 3, 6 -> rounds at 0 (accepted, skip 1), 2, 3
    # (accepted, skip 4), 5, 6 (accepted).
    drafts, accepted = decoded_walk(np.array([[1, 1, 0, 1, 0, 0, 1]], dtype=bool))
    assert drafts == 5 and accepted.tolist() == [3]
    # k=2: a round accepts its leading right positions only; a full round skips
    # k + 1 slots.
    ok = np.array([[1, 1, 0, 1, 1], [1, 0, 1, 1, 1]], dtype=bool)
    drafts, accepted = decoded_walk(ok)
    assert drafts == 2 and accepted.tolist() == [2, 2]  # rounds at 0 and 3
    ok = np.array([[0, 1, 1], [1, 1, 1]], dtype=bool)
    drafts, accepted = decoded_walk(ok)
    assert drafts == 2 and accepted.tolist() == [1, 1]  # rounds at 0 and 1
    # Every slot right, k=1: half the slots are drafted, all accepted; a per-slot
    # rate of 0.5 in runs (easy, hard, ...) is a decoded rate below it.
    drafts, accepted = decoded_walk(np.ones((1, 10), dtype=bool))
    assert drafts == 5 and accepted.tolist() == [5]
    runs = np.array([[1, 1, 1, 1, 0, 0, 0, 0]], dtype=bool)
    drafts, accepted = decoded_walk(runs)
    assert accepted[0] / drafts == 2 / 6 < runs.mean()


def test_engine_schedule_is_the_spec_k_of_head_0():
    novel = load_spec(ROOT / "model_specs/novel-launch.yaml")
    deepseek = load_spec(ROOT / "model_specs/deepseek-v3-style.yaml")
    assert engine_schedule(novel) == [0, 0]  # k=2, vLLM reuses head 0
    assert engine_schedule(deepseek) == [0]


def test_same_seed_same_bytes_and_only_mtp_tensors_change(tmp_path):
    spec = load_spec(ROOT / "model_specs/deepseek-v3-style.yaml")
    untrained = write_tiny_checkpoint(spec, tmp_path / "untrained", seed=1)
    tiny = load_spec(untrained / "spec.yaml")
    runs = []
    for name in ("a", "b"):
        shutil.copytree(untrained, tmp_path / name)
        train_mtp_heads(tmp_path / name, tiny, steps=6, seed=1, num_prompts=16)
        runs.append(_files(tmp_path / name))
    a, b = runs
    u = _files(untrained)
    assert a == b  # byte for byte, report included
    assert set(a) == set(u) | {REPORT_FILE}
    # Same tensors, shapes, offsets: the index is untouched.
    assert a["model.safetensors.index.json"] == u["model.safetensors.index.json"]
    report = json.loads(a[REPORT_FILE])
    assert report["steps"] == 6 and report["seed"] == 1
    index = json.loads(a["model.safetensors.index.json"])["weight_map"]
    changed = [
        name
        for name in index
        if not np.array_equal(
            read_tensor(tmp_path / "a", name), read_tensor(untrained, name)
        )
    ]
    n = tiny.num_hidden_layers
    assert changed and set(changed) <= set(report["trained_tensors"])
    assert all(name.startswith(f"model.layers.{n}.") for name in changed)
    assert f"model.layers.{n}.eh_proj.weight" in changed  # the copy prior at least


def test_write_tensors_is_all_or_nothing(tmp_path):
    spec = load_spec(ROOT / "model_specs/novel-launch.yaml")
    ckpt = write_tiny_checkpoint(spec, tmp_path / "ckpt", dtype="float32")
    before = _files(ckpt)
    index = json.loads(before["model.safetensors.index.json"])["weight_map"]
    shards = sorted(set(index.values()))
    first = next(n for n, s in index.items() if s == shards[0])
    second = next(n for n, s in index.items() if s == shards[1])
    good = read_tensor(ckpt, first) + 1.0
    # The second shard's tensor has the wrong shape: the first shard, already
    # staged, must not be replaced either, and no temporary file stays behind.
    with pytest.raises(InputError, match="has shape"):
        write_tensors(ckpt, {first: good, second: np.zeros((3, 3), np.float32)})
    assert _files(ckpt) == before
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(before)
    with pytest.raises(InputError, match="no tensor nope"):
        write_tensors(ckpt, {"nope": good})
    # A good write changes exactly that tensor, in place, float32 exactly.
    write_tensors(ckpt, {first: good})
    assert np.array_equal(read_tensor(ckpt, first), good)
    after = _files(ckpt)
    assert after[shards[1]] == before[shards[1]]
    assert len(after[shards[0]]) == len(before[shards[0]])


def test_a_corrupted_mtp_tensor_lowers_the_reference_acceptance(
    novel_trained, tmp_path
):
    """The reference side of tests/test_mtp_corruption.py (no engine): zeroing
    head 0's eh_proj takes its acceptance from the trained figure to ~nothing."""
    ckpt, _ = novel_trained
    spec = load_spec(ckpt / "spec.yaml")
    n = spec.num_hidden_layers
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    name = f"model.layers.{n}.eh_proj.weight"
    write_tensors(bad, {name: np.zeros_like(read_tensor(bad, name))})
    prompts = heldout_prompts(ckpt, spec)[:4]
    good = reference_mtp_acceptance(ckpt, spec, prompts, 2)
    broken = reference_mtp_acceptance(bad, spec, prompts, 2)
    print(f"\ntrained: {good.per_position}, corrupted: {broken.per_position}")
    assert good.per_position[0] >= 0.3
    assert broken.per_position[0] <= good.per_position[0] / 2
    assert broken.mean_acceptance_length < good.mean_acceptance_length - 0.2
