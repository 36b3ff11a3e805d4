"""MLA with cross-layer KV sharing on the released vLLM's CPU engine.

The tiny spec tests/fixtures/mla_share/spec.yaml (layers reading an earlier MLA
layer's latent cache) is generated, and its plugin patches vLLM 0.32 at import
(``mla_kv_sharing.py``, docs/generate.md). One engine serves the intact tiny
checkpoint:

* the accuracy check against the reference passes (greedy tokens as the
  reference's) and the kv-cache check finds the engine's own KV bytes per token
  equal to the arithmetic with sharing (a sharing layer owns no cache);
* the same engine checked against the reference of a checkpoint whose MLA tensor
  is perturbed (the sharing layer's own ``kv_b_proj``; the target's
  ``kv_a_proj_with_mqa``, whose latent both layers read) fails the accuracy check:
  the check sees each of them.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "tests" / "fixtures" / "mla_share" / "spec.yaml"
# MLA: (kv_lora_rank 512 + qk_rope_head_dim 64) x 4 B (float32) per owning layer.
LAYER_BYTES = (512 + 64) * 4


def _perturbed(src: Path, dst: Path, name: str) -> Path:
    from onboard.speculators.mtp_train import read_tensor, write_tensors

    shutil.copytree(src, dst)
    old = read_tensor(dst, name)
    rng = np.random.default_rng(0)
    write_tensors(dst, {name: rng.normal(0.0, 0.5, old.shape).astype(old.dtype)})
    return dst


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict:
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.pipeline.generate import generate_all
    from onboard.runtime.compat import shims_for
    from onboard.runtime.engine import EngineOptions, read_plugin
    from onboard.runtime.prompts import PROMPTS
    from onboard.runtime.reference import (
        load_reference,
        run_reference,
        tokenize_prompts,
    )
    from onboard.spec import load_spec
    from onboard.validate import check_kv_cache
    from onboard.validate.harness import MAX_MODEL_LEN, RunContext, run_accuracy

    root = tmp_path_factory.mktemp("mla-share")
    spec = load_spec(SPEC)
    good = write_tiny_checkpoint(spec, root / "good")
    tiny = load_spec(good / "spec.yaml")
    (layer, target), *_ = sorted(tiny.attention.kv_sharing.items())
    attn = "model.layers.{}.self_attn.{}.weight"
    bad = {
        "kv_b_proj": _perturbed(
            good, root / "bad-kv-b", attn.format(layer, "kv_b_proj")
        ),
        "kv_a_proj": _perturbed(
            good, root / "bad-kv-a", attn.format(target, "kv_a_proj_with_mqa")
        ),
    }
    generate_all(tiny, root / "gen")
    plugin = read_plugin(root / "gen" / "plugin")
    prompts, note = tokenize_prompts(good, PROMPTS, tiny.vocab_size)

    def reference_of(model_dir: Path, label: str):
        work = root / f"work-{label}"
        work.mkdir()
        reference = load_reference(model_dir, tiny, root / "gen" / "hf", work)
        return work, reference, [run_reference(reference.model, p, 32) for p in prompts]

    work, reference, outputs = reference_of(good, "good")
    options = EngineOptions(
        good,
        plugin,
        max_model_len=MAX_MODEL_LEN,
        uses_mla=True,
        compat=shims_for(tiny),
    )
    ctx = RunContext(
        spec=tiny,
        model_dir=good,
        out_dir=root / "out",
        work_dir=work,
        plugin=plugin,
        hf_dir=root / "gen" / "hf",
        prompts=prompts,
        prompt_note=note,
        options=options,
        reference=reference,
        reference_outputs=outputs,
    )
    results = {"pairs": (layer, target), "layers": tiny.num_hidden_layers}
    with ctx.extra_engine("main", options) as engine:
        ctx.engine = engine
        results["accuracy"] = run_accuracy(ctx, "accuracy")
        results["kv-cache"] = check_kv_cache.run(ctx, "kv-cache")
        for role, model_dir in bad.items():
            work, reference, outputs = reference_of(model_dir, role)
            other = dataclasses.replace(
                ctx, work_dir=work, reference=reference, reference_outputs=outputs
            )
            results[f"accuracy-{role}"] = run_accuracy(other, "accuracy")
    for key, check in results.items():
        if hasattr(check, "status"):
            print(f"\n{key}: {check.status}\n{check.details}")
    return results


@pytest.mark.engine
def test_tokens_match_the_reference_and_kv_bytes_are_the_sharing_arithmetic(checks):
    accuracy, kv = checks["accuracy"], checks["kv-cache"]
    assert accuracy.status == "passed", accuracy.details
    assert accuracy.metrics["greedy_failed_sequences"] == 0
    assert accuracy.metrics["generated_class_instantiated"]
    assert kv.status == "passed", kv.details
    m = kv.metrics
    layer, target = checks["pairs"]
    assert m["shared_layer_pairs"] == [[layer, target]]
    owners = checks["layers"] - 1
    assert m["bytes_per_token"] == m["plan_bytes_per_token"] == owners * LAYER_BYTES
    assert m["bytes_per_token_without_sharing"] == checks["layers"] * LAYER_BYTES
    reads = {r["layer"]: r["engine_reads_layer"] for r in m["layers"]}
    assert reads[layer] == target


@pytest.mark.engine
@pytest.mark.parametrize("role", ["kv_b_proj", "kv_a_proj"])
def test_a_perturbed_mla_tensor_fails_the_accuracy_check(checks, role):
    check = checks[f"accuracy-{role}"]
    assert check.status == "failed", check.details
    assert check.metrics["greedy_failed_sequences"] > 0
