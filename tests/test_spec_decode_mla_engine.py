"""An EAGLE-3 head beside an MLA verifier on the real vLLM CPU engine, on the
backends every x86-64 CPU has: the spec-decode check passes (lossless, drafts
made), whether or not the CPU has AMX.

vLLM's AMX MLA backend (bfloat16, 32-token blocks) is what let the head run
beside an MLA verifier before; without AMX the engine refused the pair ("No
common block size for 16"). The check now runs the verifier on the reference MLA
backend even where AMX exists (the main engine pins ``CPU_MLA``, vLLM's own
switch away from AMX MLA) and serves the head with a full-context sliding window
(onboard.runtime.cpu_draft). The test reads the attention groups the engine
built, so on an AMX host it shows the same no-AMX configuration it shows here.

Two engine starts (main, with speculation) on a DeepSeek-V3 checkpoint written by
transformers, through the generated model (vLLM's in-tree class carries the CPU
rope bug of docs/validation.md, which fails accuracy), with an untrained head
(acceptance is not judged).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from validate_fixtures import DEEPSEEK_V3_SPEC, write_deepseek_v3, write_spec

from onboard.runtime.cpu_draft import cpu_kv_heads
from onboard.spec import load_spec
from onboard.speculators.eagle3 import make_head_class, save_head
from onboard.speculators.heads import aux_layer_ids, head_config
from onboard.validate import validate

pytestmark = pytest.mark.engine


def write_untrained_head(spec, model_dir: Path, out_dir: Path) -> Path:
    torch.manual_seed(0)
    config = head_config(
        spec,
        "eagle3",
        3,
        verifier=str(model_dir),
        draft_vocab=spec.vocab_size,
        num_kv_heads=cpu_kv_heads(spec),  # as train_eagle3_head shapes it
    )
    weights = load_file(model_dir / "model.safetensors")
    head = make_head_class()(
        config["transformer_layer_config"],
        len(aux_layer_ids(spec.num_hidden_layers)),
        weights["model.embed_tokens.weight"].float(),
        weights["lm_head.weight"].float(),
    )
    return save_head(head, config, out_dir)


@pytest.fixture(scope="module")
def eagle3(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3-mla")
    model = write_deepseek_v3(root / "tiny-deepseek-v3")
    spec_path = write_spec(root / "spec.yaml", DEEPSEEK_V3_SPEC)
    write_untrained_head(load_spec(spec_path), model, root / "speculators" / "eagle3")
    result = validate(
        model,
        spec_path,
        "cpu",
        root / "out",
        checks="accuracy,spec-decode:eagle3",
        speculators_dir=root / "speculators",
        log=print,
    )
    check = result.check("spec-decode:eagle3")
    print(check.status, check.details)
    return result, check, root


def test_eagle3_beside_mla_passes_on_the_backends_every_cpu_has(eagle3):
    result, check, _ = eagle3
    assert check.status == "passed", check.details
    assert result.passed, result.check("accuracy").details
    m = check.metrics
    assert m["lossless"]["passed"] and m["num_drafts"] > 0
    assert m["drafter"]["draft_model_class"].endswith("Eagle3LlamaForCausalLM")
    # The main engine's settings (float32), no bfloat16 baseline engine.
    assert m["dtype"] == "float32"
    assert m["baseline"].startswith("the main engine")
    groups = m["attention_groups"]
    verifier = [g for g in groups if not g["draft"]]
    draft = [g for g in groups if g["draft"]]
    # The verifier on the reference MLA backend with its 16-token blocks (never
    # AMX_MLA, even on an AMX host), the head on CPU attention in a KV-cache
    # group of its own with blocks of a multiple of 32.
    assert verifier and {g["backend"] for g in verifier} == {"CPU_MLA"}
    assert {g["kernel_block_size"] for g in verifier} == {16}
    assert [g["backend"] for g in draft] == ["CPU_ATTN"]
    assert draft[0]["kernel_block_size"] % 32 == 0
    assert draft[0]["kv_cache_group"] not in {g["kv_cache_group"] for g in verifier}
    assert set(m["cpu_features"]) == {"avx2", "avx512", "avx512_bf16", "amx"}
    assert "sliding window" in m["draft_attention"]


def test_the_served_head_is_the_trained_one_with_a_full_window(eagle3):
    _, check, root = eagle3
    served = Path(check.metrics["speculative_config"]["model"])
    head = root / "speculators" / "eagle3"
    assert check.metrics["draft_checkpoint"] == str(head)
    assert (served / "model.safetensors").resolve() == (
        head / "model.safetensors"
    ).resolve()
    layer = json.loads((served / "config.json").read_text())["transformer_layer_config"]
    assert layer["sliding_window"] >= 256  # the engine's max_model_len
