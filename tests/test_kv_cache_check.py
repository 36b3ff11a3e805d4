"""The `kv-cache` check: the engine's KV-cache accounting against the spec's.

Without an engine: the comparison on engine reports shaped like the engine
worker's, agreeing and disagreeing. With the engine (one per model, through
`onboard validate --checks kv-cache`): the bundled novel-launch spec's tiny
checkpoint (cross-layer KV sharing) and dense-gqa's (none) pass, with the numbers
the spec's arithmetic gives. Those run in `make test-all`: `make test` already
holds the same engine numbers equal to the plan's for every bundled spec
(tests/test_serving.py), and the comparison itself is tested here without an engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.serving.kv import kv_report
from onboard.spec import load_spec
from onboard.validate.check_kv_cache import compare, kv_dtype, layer_index

ROOT = Path(__file__).resolve().parents[1]
ONBOARD = str(Path(sys.executable).with_name("onboard"))
SPEC_CLASS = {"full": "FullAttentionSpec", "sliding": "SlidingWindowSpec"}


def _novel_tiny():
    from onboard.spec.shrink import shrink_spec

    return shrink_spec(load_spec(ROOT / "model_specs/novel-launch.yaml"))


def engine_report(spec, dtype: str = "float32") -> dict:
    """What the engine worker reports for ``spec`` when vLLM does as the plan
    says (names as vLLM gives them: model.layers.N.self_attn.attn)."""
    plan = kv_report(spec, dtype)
    name = "model.layers.{}.self_attn.attn".format
    layers = {
        name(x.index): {
            "type": SPEC_CLASS[x.kind],
            "page_size_bytes": 16 * x.bytes_per_token,
            "block_size": 16,
            "bytes_per_token": 16 * x.bytes_per_token / 16,
        }
        for x in plan.owning_layers
    }
    shared = {
        name(x.index): name(x.shares) for x in plan.layers if x.shares is not None
    }
    per_token = sum(v["bytes_per_token"] for v in layers.values())
    return {
        "layers": layers,
        "shared_layers": shared,
        "bytes_per_token": per_token,
        "bytes_per_token_without_sharing": per_token
        + sum(layers[t]["bytes_per_token"] for t in shared.values()),
        "num_blocks": 100,
        "block_size": 16,
    }


def test_agreeing_report_passes_with_the_sharing_numbers():
    spec = _novel_tiny()
    check = compare(engine_report(spec), kv_report(spec, "float32"))
    assert check.status == "passed", check.details
    m = check.metrics
    # 8 layers, 3 of them read an earlier layer's cache: 5 own one.
    # 2 (K, V) x 2 KV heads x 128 x 4 bytes = 2,048 bytes per layer and token.
    assert m["bytes_per_token"] == 5 * 2048 == m["plan_bytes_per_token"]
    assert m["bytes_per_token_without_sharing"] == 8 * 2048
    assert m["shared_layer_pairs"] == [[5, 1], [6, 2], [7, 3]]
    assert m["saved_fraction"] == pytest.approx(3 / 8)
    assert "agree exactly" in check.details


def test_each_disagreement_fails_naming_the_layer():
    spec = _novel_tiny()
    plan = kv_report(spec, "float32")
    # A layer that should read layer 1's cache owns one instead.
    report = engine_report(spec)
    del report["shared_layers"]["model.layers.5.self_attn.attn"]
    report["layers"]["model.layers.5.self_attn.attn"] = dict(
        report["layers"]["model.layers.1.self_attn.attn"]
    )
    report["bytes_per_token"] += 2048
    check = compare(report, plan)
    assert check.status == "failed"
    assert "layer 5: the spec says it reads layer 1's cache, the engine says None" in (
        check.details
    )
    assert "layer 5: 2048 bytes/token in the engine, 0 by the spec" in check.details
    assert "bytes per token: engine 12288, spec arithmetic 10240" in check.details
    # Another cache kind, or half the bytes (a bf16 cache planned as float32).
    report = engine_report(spec)
    report["layers"]["model.layers.0.self_attn.attn"]["type"] = "FullAttentionSpec"
    assert (
        "layer 0: the engine gave it a FullAttentionSpec"
        in compare(report, plan).details
    )
    assert compare(engine_report(spec, "bfloat16"), plan).status == "failed"


def test_engine_dtype_and_layer_names():
    assert kv_dtype({"dtype": "float32"}) == "float32"
    assert kv_dtype({"dtype": "bfloat16", "kv_cache_dtype": "fp8_e4m3"}) == "fp8"
    assert layer_index("model.layers.12.self_attn.attn") == 12
    assert layer_index("layers.3.attn") == 3
    assert layer_index("lm_head") is None


# -- real engine -------------------------------------------------------------------


def _validate_kv(tmp_path_factory, spec_name: str) -> dict:
    root = tmp_path_factory.mktemp(spec_name)
    ckpt = write_tiny_checkpoint(
        load_spec(ROOT / "model_specs" / f"{spec_name}.yaml"), root / "ckpt"
    )
    proc = subprocess.run(
        [ONBOARD, "validate", str(ckpt), "--spec", str(ckpt / "spec.yaml")]
        + ["--out", str(root / "out"), "--checks", "kv-cache"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    path = root / "out" / "validation.json"
    assert path.exists(), proc.stdout + proc.stderr
    result = json.loads(path.read_text())
    check = next(c for c in result["checks"] if c["name"] == "kv-cache")
    print(f"\n{spec_name} kv-cache: {check['details']}")
    return check


@pytest.mark.engine
@pytest.mark.acceptance
def test_novel_launch_engine_agrees_with_the_spec_and_saves_three_eighths(
    tmp_path_factory,
):
    check = _validate_kv(tmp_path_factory, "novel-launch")
    assert check["status"] == "passed", check["details"]
    m = check["metrics"]
    assert m["bytes_per_token"] == m["plan_bytes_per_token"] == 10240
    assert (
        m["bytes_per_token_without_sharing"]
        == m["plan_bytes_per_token_without_sharing"]
        == 16384
    )
    assert m["shared_layer_pairs"] == [[5, 1], [6, 2], [7, 3]]
    assert m["saved_fraction"] == pytest.approx(0.375)
    engine_reads = {r["layer"]: r["engine_reads_layer"] for r in m["layers"]}
    assert {k: v for k, v in engine_reads.items() if v is not None} == {
        5: 1,
        6: 2,
        7: 3,
    }


@pytest.mark.engine
@pytest.mark.acceptance
def test_dense_gqa_engine_agrees_with_the_spec_without_sharing(tmp_path_factory):
    check = _validate_kv(tmp_path_factory, "dense-gqa")
    assert check["status"] == "passed", check["details"]
    m = check["metrics"]
    # 2 layers x 2 (K, V) x 2 KV heads x 128 x 4 bytes (float32).
    assert m["bytes_per_token"] == m["bytes_per_token_without_sharing"] == 4096
    assert m["shared_layer_pairs"] == [] and m["saved_fraction"] == 0.0
