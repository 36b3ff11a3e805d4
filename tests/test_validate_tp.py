"""Tensor parallelism: which sizes a spec's head counts and widths allow (the rules
vLLM's parallel layers apply), `spec check`'s note, and the `tensor-parallel` check
on the real CPU engine (TP=2 vs TP=1 through the generated plugin)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onboard.spec import parse_spec_text
from onboard.spec.rules import (
    TPDims,
    allowed_tensor_parallel_sizes,
    tensor_parallel_note,
    tensor_parallel_problems,
)
from onboard.validate.check_tensor_parallel import dims_for_checkpoint
from onboard.validate.check_tensor_parallel import run as run_tp_check
from onboard.validate.harness import RunContext

ONBOARD = str(Path(sys.executable).with_name("onboard"))

SPEC = """\
name: tiny
architecture: TinyForCausalLM
model_type: tiny
vocab_size: 1000
hidden_size: 384
num_hidden_layers: 2
max_position_embeddings: 2048
attention:
  num_heads: {heads}
  num_kv_heads: {kv}
mlp:
  intermediate_size: {width}
"""


def dims(**changes) -> TPDims:
    base = dict(
        num_heads=8,
        num_kv_heads=2,
        intermediate_size=512,
        expert_intermediate_size=None,
        shared_expert_intermediate_size=None,
        num_experts=None,
        vocab_size=1000,
    )
    return TPDims(**{**base, **changes})


def paths(problems) -> list[str]:
    return [".".join(map(str, path)) for path, _ in problems]


def vllm_qkv_splits(heads: int, kv: int, tp: int) -> bool:
    """QKVParallelLinear.__init__'s arithmetic (vLLM 0.32 linear.py), with vLLM's
    own ``divide``: True when it builds, False when ``divide`` raises."""
    from vllm.distributed.utils import divide

    try:
        divide(heads, tp)
        if tp >= kv:
            divide(tp, kv)  # each KV head replicated on tp / kv ranks
        else:
            divide(kv, tp)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
@pytest.mark.parametrize(
    ("heads", "kv"), [(8, 8), (8, 2), (8, 1), (6, 3), (12, 3), (4, 4), (16, 4), (6, 6)]
)
def test_attention_rule_agrees_with_vllms_qkv_parallel_linear(heads, kv, tp):
    problems = tensor_parallel_problems(
        dims(
            num_heads=heads, num_kv_heads=kv, intermediate_size=None, vocab_size=64 * 24
        ),
        tp,
    )
    assert (not problems) == vllm_qkv_splits(heads, kv, tp), problems


def test_kv_heads_are_replicated_when_fewer_than_ranks():
    # 8 query heads, 1 KV head: vLLM keeps a copy of the KV head on every rank.
    assert allowed_tensor_parallel_sizes(dims(num_kv_heads=1)) == [1, 2, 4, 8]
    # 3 KV heads split over neither 2 ranks nor replicate onto 4.
    problems = tensor_parallel_problems(dims(num_heads=6, num_kv_heads=3), 2)
    assert paths(problems) == ["attention.num_kv_heads"]
    assert "3 KV heads neither split evenly over 2 ranks" in problems[0][1]


def test_widths_experts_and_vocab():
    moe = dims(
        intermediate_size=None,
        expert_intermediate_size=96,
        shared_expert_intermediate_size=192,
        num_experts=4,
    )
    assert allowed_tensor_parallel_sizes(moe) == [1, 2, 4]
    problems = tensor_parallel_problems(moe, 8)
    assert paths(problems) == ["mlp.moe.num_experts"]  # 96 and 192 split over 8
    assert problems[0][1] == "4 experts are fewer than 8 ranks"
    odd = tensor_parallel_problems(dims(expert_intermediate_size=100, num_experts=8), 8)
    assert "mlp.moe.expert_intermediate_size" in paths(odd)
    assert paths(tensor_parallel_problems(dims(intermediate_size=510), 4)) == [
        "mlp.intermediate_size"
    ]
    # vLLM pads the vocabulary to 64: 1000 -> 1024 splits over any power of two.
    assert not tensor_parallel_problems(dims(vocab_size=1000, num_heads=16), 16)
    assert paths(tensor_parallel_problems(dims(vocab_size=1000, num_heads=6), 3)) == [
        "attention.num_kv_heads",
        "mlp.intermediate_size",
        "vocab_size",
    ]


def test_spec_check_notes_the_sizes_a_spec_allows(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(SPEC.format(heads=8, kv=2, width=512))
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPEC.format(heads=6, kv=3, width=512))
    res = subprocess.run(
        [ONBOARD, "spec", "check", str(bad)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr  # a note, not an error
    assert (
        f"note: {bad}: tensor_parallel_size 1 fit the spec's sizes; not 2, 4, 8, 16 "
        "(2: attention.num_kv_heads: 3 KV heads neither split evenly over 2 ranks"
    ) in res.stdout
    spec = parse_spec_text(good.read_text(), str(good))
    # 2 KV heads replicate onto 4 and 8 ranks; 8 query heads stop at 8.
    assert tensor_parallel_note(spec) == (
        "tensor_parallel_size 1, 2, 4, 8 fit the spec's sizes; not 16 (16: "
        "attention.num_heads: 8 query heads do not split over 16 ranks "
        "(QKVParallelLinear / the MLA layer divide them evenly))"
    )


def test_the_check_reads_the_checkpoints_sizes_and_says_why_it_cannot_run(tmp_path):
    """The generated model reads config.json (a tiny checkpoint shrinks the
    spec's heads), so the check judges those sizes; it is not-run, never passed,
    naming the field and the sizes that fit."""
    spec = parse_spec_text(SPEC.format(heads=8, kv=2, width=512))
    config = {"num_attention_heads": 6, "num_key_value_heads": 3, "vocab_size": 1000}
    got = dims_for_checkpoint(spec, {**config, "intermediate_size": 512})
    assert (got.num_heads, got.num_kv_heads, got.intermediate_size) == (6, 3, 512)
    model_dir = tmp_path / "ckpt"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config))
    ctx = RunContext(
        spec=spec,
        model_dir=model_dir,
        out_dir=tmp_path / "out",
        work_dir=tmp_path,
        plugin=None,
        hf_dir=None,
        prompts=[[1, 2, 3]],
        prompt_note="",
    )
    check = run_tp_check(ctx, "tensor-parallel")
    assert check.status == "not-run" and not check.passed
    assert check.details == (
        "tensor_parallel_size=2 does not fit ckpt's sizes: attention.num_kv_heads: 3 "
        "KV heads neither split evenly over 2 ranks nor replicate evenly (2 is not a "
        "multiple of 3) (sizes that fit: [1])"
    )
    assert check.metrics == {"tensor_parallel_size": 2, "allowed_sizes": [1]}


# -- real engine ------------------------------------------------------------------


@pytest.mark.engine
def test_tp2_gives_the_tokens_of_tp1_through_the_generated_plugin(tmp_path):
    """A transformers-written Qwen3-MoE (4 query / 2 KV heads, 8 experts): split
    attention, split experts (FusedMoE) and a split vocabulary on two CPU ranks."""
    from hf_tiny import write_hf_checkpoint

    from onboard.spec import dump_spec
    from onboard.spec.hf import spec_from_hf_config_file

    ckpt = write_hf_checkpoint("qwen3_moe", tmp_path / "ckpt")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(
        dump_spec(spec_from_hf_config_file(ckpt / "config.json", name="tiny-q3moe"))
    )
    out = tmp_path / "out"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [ONBOARD, "validate", str(ckpt), "--spec", str(spec_path), "--out", str(out)]
        + ["--checks", "accuracy,tensor-parallel"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    seconds = time.perf_counter() - t0
    assert (out / "validation.json").exists(), proc.stdout + proc.stderr[-4000:]
    result = json.loads((out / "validation.json").read_text())
    tp = next(c for c in result["checks"] if c["name"] == "tensor-parallel")
    print(f"\nvalidate accuracy + tensor-parallel: {seconds:.0f} s; {tp['details']}")
    assert proc.returncode == 0, tp["details"] + proc.stdout[-3000:]
    assert tp["status"] == "passed", tp["details"]
    m = tp["metrics"]
    # 4 query heads split up to 4 ranks; the 2 KV heads replicate onto 4.
    assert m["tensor_parallel_size"] == 2 and m["allowed_sizes"] == [1, 2, 4]
    assert m["vllm_model_class"] == result["vllm_model_class"]
    assert m["vllm_model_class"].startswith("onboard_plugin_tiny_q3moe.")
    assert m["prompts"] >= 8 and m["failed_sequences"] == 0
    # Float32 on both sides: the split changes only summation order.
    assert m["tokens_identical"] >= 0.9
    assert m["prompt_logprob_max_abs_diff"] < 1e-3
    assert m["greedy_logprob_max_abs_diff"] < 1e-3
    log = (out / "logs" / "engine-tp2.log").read_text()
    assert "tensor_parallel_size=2" in log
