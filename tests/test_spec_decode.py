"""The spec-decode check's decisions that need no engine: which draft it serves
(or why none), the counter arithmetic, and the verdict from outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onboard.runtime.cpu_draft import (
    MAX_KV_WIDTH,
    cpu_features,
    cpu_kv_heads,
    describe,
    full_window_draft,
    lacking_note,
    needs_full_window,
)
from onboard.spec import load_spec
from onboard.speculators.heads import head_config
from onboard.speculators.methods import entry_for, find_draft
from onboard.validate.check_spec_decode import _delta, judge

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dense():
    return load_spec(ROOT / "model_specs" / "dense-gqa.yaml")


def _head(directory: Path, spec, weights: bool = True) -> Path:
    directory.mkdir(parents=True)
    config = head_config(spec, "eagle3", 3)
    (directory / "config.json").write_text(json.dumps(config))
    if weights:
        (directory / "model.safetensors").write_bytes(b"")
    return directory


def test_entry_defaults_when_the_spec_lists_no_such_method(dense):
    assert entry_for(dense, "ngram").num_speculative_tokens == 3
    assert entry_for(dense, "mtp").method == "mtp"


def test_find_draft_needs_weights_that_fit_the_verifier(dense, tmp_path):
    entry = entry_for(dense, "eagle3")
    draft, why = find_draft(dense, entry, None)
    assert draft is None and "no speculators directory" in why
    # A config without weights cannot be served.
    _head(tmp_path / "s" / "eagle3", dense, weights=False)
    draft, why = find_draft(dense, entry, tmp_path / "s")
    assert draft is None and "cannot be served" in why
    # A head trained for another verifier (DeepSeek-V3's hidden size) is refused.
    other = load_spec(ROOT / "model_specs" / "deepseek-v3-style.yaml")
    _head(tmp_path / "s" / "tiny" / "eagle3", other)
    draft, why = find_draft(dense, entry, tmp_path / "s")
    assert draft is None and "fits this verifier" in why
    # The tiny head wins once it fits.
    _head(tmp_path / "t" / "tiny" / "eagle3", dense)
    draft, why = find_draft(dense, entry, tmp_path / "t")
    assert draft == str(tmp_path / "t" / "tiny" / "eagle3") and why is None


def test_a_head_beside_mla_is_served_with_a_full_context_window(dense, tmp_path):
    mla = load_spec(ROOT / "model_specs" / "deepseek-v3-style.yaml")
    assert needs_full_window(mla, "eagle3")
    assert not needs_full_window(mla, "mtp") and not needs_full_window(dense, "eagle3")
    head = _head(tmp_path / "head", mla)
    served, change = full_window_draft(str(head), tmp_path / "served")
    config = json.loads((Path(served) / "config.json").read_text())
    layer = config["transformer_layer_config"]
    assert layer["layer_types"] == ["sliding_attention"]
    # The window covers every position the head can see: the same attention.
    assert layer["sliding_window"] == mla.max_position_embeddings
    original = json.loads((head / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "transformer_layer_config"} == {
        k: v for k, v in original.items() if k != "transformer_layer_config"
    }
    # The weights are the head's own files.
    assert (Path(served) / "model.safetensors").resolve() == (
        head / "model.safetensors"
    ).resolve()
    assert change["draft_checkpoint"] == str(head)
    # A Hub id has nothing local to rewrite.
    assert full_window_draft("org/head", tmp_path / "hub") == ("org/head", {})


def test_heads_trained_beside_mla_fit_the_cpu_engine(dense):
    """One KV head of 128 beside MLA: its 32-token page fits in the verifier's
    16-token MLA page, so vLLM can give it a KV-cache group of its own."""
    mla = load_spec(ROOT / "model_specs" / "deepseek-v3-style.yaml")
    assert cpu_kv_heads(dense) is None
    layer = head_config(mla, "eagle3", 3, num_kv_heads=cpu_kv_heads(mla))[
        "transformer_layer_config"
    ]
    width = layer["num_key_value_heads"] * layer["head_dim"]
    assert width <= MAX_KV_WIDTH
    m = mla.attention.mla
    assert 32 * 2 * width <= 16 * (m.kv_lora_rank + m.qk_rope_head_dim)
    # The full-size head a launch ships keeps its default shape.
    full = head_config(mla, "eagle3", 3)["transformer_layer_config"]
    assert full["num_key_value_heads"] == 8


BLOCK_CLASH = (
    "ValueError: No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: "
    "[MultipleOf(32)])."
)


def test_a_refusal_names_the_cpu_feature_it_lacks():
    no_amx = {"avx2": True, "avx512": False, "avx512_bf16": False, "amx": False}
    amx = dict.fromkeys(no_amx, True)
    assert "needs AMX, which this CPU lacks" in lacking_note(BLOCK_CLASH, no_amx)
    assert lacking_note(BLOCK_CLASH, amx) == ""
    kernel = "requires AMX tile support (Sapphire Rapids or newer)."
    assert "needs AMX" in lacking_note(kernel, no_amx)
    assert lacking_note("Arctic Inference is required", no_amx) == ""
    assert describe(no_amx) == "avx2; no avx512, avx512_bf16, amx"
    # The probe is vLLM's own (torch's cpuinfo), whatever this machine has.
    assert set(cpu_features()) == set(no_amx)


def test_counter_delta():
    before = {"a": 10, "b": [1, 2]}
    after = {"a": 25, "b": [4, 2], "c": 3}
    assert _delta(after, before) == {"a": 15, "b": [3, 0], "c": 3}


def _out(tokens, top):
    return {"token_ids": tokens, "logprobs": top}


def test_verdict_lossless_and_not():
    top = [{1: -0.1, 2: -3.0}, {3: -0.1, 4: -3.0}]
    base = [_out([1, 3], top)]
    counters = {
        "vllm:spec_decode_num_drafts": 10,
        "vllm:spec_decode_num_draft_tokens": 30,
        "vllm:spec_decode_num_accepted_tokens": 12,
        "vllm:spec_decode_num_accepted_tokens_per_pos": [6, 4, 2],
    }
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    ok = judge("spec-decode:ngram", dict(ngram), counters, base, base, 2.0, 1.0, "m")
    assert ok.status == "passed"
    assert ok.metrics["mean_acceptance_length"] == pytest.approx(2.2)
    assert ok.metrics["acceptance_rate_per_position"] == pytest.approx([0.6, 0.4, 0.2])
    assert ok.metrics["speedup"] == pytest.approx(0.5)
    # A token outside the other side's top-k is a loss, whatever the acceptance.
    bad = [_out([1, 9], [top[0], {9: -0.1, 8: -3.0}])]
    failed = judge("spec-decode:ngram", dict(ngram), counters, bad, base, 2, 1, "m")
    assert failed.status == "failed" and "differs" in failed.details
    # No drafts at all: speculation did not run, never a pass.
    none = judge("spec-decode:mtp", {"method": "mtp", "num_speculative_tokens": 1},
                 {}, base, base, 1.0, 1.0, "main")  # fmt: skip
    assert none.status == "failed" and "no drafts" in none.details


def test_mtp_details_show_the_reference_as_decoded_and_the_untrained_heads():
    """What the check prints beside the engine's acceptance for MTP heads (the
    figures come from the reference and the checkpoint's mtp_training.json)."""
    top = [{1: -0.1, 2: -3.0}]
    base = [_out([1], top)]
    counters = {
        "vllm:spec_decode_num_drafts": 10,
        "vllm:spec_decode_num_draft_tokens": 10,
        "vllm:spec_decode_num_accepted_tokens": 6,
        "vllm:spec_decode_num_accepted_tokens_per_pos": [6],
    }

    def acc(every, decoded):
        return {"per_position": [every], "decoded_per_position": [decoded],
                "decoded_mean_acceptance_length": 1 + decoded}  # fmt: skip

    metrics = {
        "method": "mtp",
        "num_speculative_tokens": 1,
        "mtp_heads_run_per_step": [0],
        "mtp_reference_acceptance_as_vllm_runs": acc(0.68, 0.55),
        "mtp_training": {
            "untrained_as_vllm_runs": acc(0.0, 0.0),
            "trained_as_vllm_runs": acc(0.68, 0.55),
        },
    }
    check = judge("spec-decode:mtp", metrics, counters, base, base, 1.0, 1.0, "m")
    assert check.status == "passed"
    assert "acceptance per position 0.60" in check.details  # the engine
    assert "as vLLM runs the heads and drafts" in check.details
    assert "per position 0.55, mean length 1.55; at every slot 0.68" in check.details
    assert "untrained -> trained" in check.details
    assert "0.00 -> 0.55" in check.details
    # Heads not trained by onboard: said so.
    metrics = {"method": "mtp", "num_speculative_tokens": 1, "mtp_training": None}
    check = judge("spec-decode:mtp", metrics, counters, base, base, 1.0, 1.0, "m")
    assert "not trained by onboard" in check.details
