"""The model card `onboard publish` writes, read back with huggingface_hub's own
model-card parser (ModelCard / ModelCardData)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from publish_helpers import SPECS, build_layout

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.publish import prepare_upload
from onboard.publish.card import (
    CardInputs,
    render_card,
    summarise_modules,
    validation_context,
    vllm_support,
)
from onboard.publish.checkpoint import describe_scheme, inspect_checkpoint
from onboard.publish.validation import Verdict
from onboard.quantize import quantize_checkpoint
from onboard.spec import load_spec


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    return build_layout(tmp_path_factory.mktemp("publish"))


@pytest.fixture(scope="module")
def novel_nvfp4(tmp_path_factory) -> Path:
    """An architecture vLLM does not have, quantized to NVFP4 (weights only)."""
    base = tmp_path_factory.mktemp("novel")
    spec = load_spec(SPECS / "novel-launch.yaml")
    bf16 = write_tiny_checkpoint(spec, base / "bf16", seed=0)
    return Path(quantize_checkpoint(bf16, "nvfp4a16", base / "nvfp4a16", workers=1))


def _card(plan) -> ModelCard:
    card = ModelCard(plan.card)
    assert card.content == plan.card
    return card


def test_bf16_card_from_a_passed_validation(layout):
    plan = prepare_upload(layout / "checkpoints" / "bf16", "org/tiny-ds", hashed=False)
    card = _card(plan)
    data = card.data.to_dict()
    # The bf16 checkpoint is the base: no base_model relation; a tiny random
    # checkpoint claims no base model at all.
    assert "base_model" not in data and "base_model_relation" not in data
    assert data["license"] == "mit"
    assert data["library_name"] == "vllm"
    assert data["pipeline_tag"] == "text-generation"
    assert data["tags"] == ["vllm", "onboard", "speculators", "mtp"]
    text = card.text
    assert "tiny, randomly initialised checkpoint" in text
    assert "not a model of deepseek-ai/DeepSeek-V3" in text
    assert "--force" not in text
    # Serving: the checkpoint's own MTP head drives speculative decoding.
    assert (
        "vllm serve org/tiny-ds --speculative-config "
        """'{"method": "mtp", "num_speculative_tokens": 1}'"""
    ) in text
    assert """- ngram: `--speculative-config '{"method": "ngram", "num_""" in text
    assert "- eagle3: needs a draft model, not published with this checkpoint" in text
    # vLLM has DeepseekV3ForCausalLM built in: no plugin instructions.
    assert "pip install ./onboard-generated/plugin" not in text
    # Architecture summary from the spec.
    assert "| attention | MLA, 4 heads, KV latent rank 512" in text
    assert "MoE, 8 experts, top-2" in text
    # The validation table has exactly what validation.json has: accuracy only.
    assert "Overall: **passed** (the validation ran on this checkpoint)" in text
    assert "| greedy sequences identical to the reference | 12 |" in text
    assert "| prompt logprob max abs diff (nats) | 3.719e-05 |" in text
    for absent in (
        "Quantized accuracy",
        "Speculative decoding",
        "Speed on",
        "KV cache",
    ):
        assert absent not in text
    assert "## Quantization" not in text


def test_quantized_card_of_a_real_model_names_its_base(layout, tmp_path):
    # The same FP8 files with the full-size bundled spec beside them: a card for
    # a real launch checkpoint takes base_model from the spec.
    fp8 = shutil.copytree(layout / "checkpoints" / "fp8-dynamic", tmp_path / "fp8")
    shutil.copy(SPECS / "deepseek-v3-style.yaml", fp8 / "spec.yaml")
    plan = prepare_upload(
        fp8,
        "org/DeepSeek-V3-FP8",
        validation=layout / "validation-fp8" / "validation.json",
        force=True,
        hashed=False,
    )
    card = _card(plan)
    data = card.data.to_dict()
    assert data["base_model"] == "deepseek-ai/DeepSeek-V3"
    assert data["base_model_relation"] == "quantized"
    assert {"compressed-tensors", "fp8", "mtp", "speculators"} <= set(data["tags"])
    text = card.text
    assert "tiny, randomly" not in text
    assert "quantized to **fp8-dynamic**" in text
    assert "from [deepseek-ai/DeepSeek-V3](https://huggingface.co/deepseek-ai/" in text
    # The recipe, from config.json's quantization_config.
    assert "| weights | 8-bit float, per-channel, static, symmetric |" in text
    assert "| input activations | 8-bit float, per-token, dynamic, symmetric |" in text
    assert "| method | compressed-tensors 0.17.0 |" in text
    assert "layer 2 (MTP): `eh_proj`" in text
    # Forced: the failure is stated, with the engine's own reason.
    assert "published with `--force`" in text
    assert "| accuracy | failed | vLLM could not load" in text
    assert "Overall: **failed**" in text


def test_explicit_base_model_wins(layout):
    plan = prepare_upload(
        layout / "checkpoints" / "fp8-dynamic",
        "org/x",
        validation=layout / "validation-fp8" / "validation.json",
        force=True,
        base_model="org/tiny-ds",
        hashed=False,
    )
    data = _card(plan).data.to_dict()
    assert data["base_model"] == "org/tiny-ds"
    assert data["base_model_relation"] == "quantized"


def test_new_architecture_card_says_how_to_get_the_plugin(novel_nvfp4):
    ckpt = inspect_checkpoint(novel_nvfp4, hashed=False)
    assert ckpt.scheme == "nvfp4a16"
    assert describe_scheme(ckpt.quantization_config) == "nvfp4a16"
    plan = prepare_upload(novel_nvfp4, "org/novel-nvfp4", force=True, hashed=False)
    card = _card(plan)
    data = card.data.to_dict()
    assert data["license"] == "apache-2.0"
    assert {"nvfp4", "compressed-tensors", "mtp", "speculators"} <= set(data["tags"])
    assert "fp8" not in data["tags"]
    text = card.text
    assert vllm_support("NovelLaunchForCausalLM")[0] is False
    assert "has no built-in `NovelLaunchForCausalLM`" in text
    assert "pip install ./onboard-generated/plugin" in text
    assert """'{"method": "mtp", "num_speculative_tokens": 2}'""" in text
    assert "No validation results were published" in text
    assert "no validation.json for" in text
    weights = "4-bit float, per-group with a per-tensor global scale, group size 16"
    assert f"| weights | {weights}" in text


def test_unknown_license_becomes_other(layout, tmp_path):
    ckpt = shutil.copytree(layout / "checkpoints" / "bf16", tmp_path / "ck")
    spec = (ckpt / "spec.yaml").read_text().replace("license: mit", "license: acme-1.0")
    (ckpt / "spec.yaml").write_text(spec)
    plan = prepare_upload(ckpt, "org/x", force=True, hashed=False)
    data = _card(plan).data.to_dict()
    assert data["license"] == "other" and data["license_name"] == "acme-1.0"


def test_card_is_deterministic(layout):
    args = ("org/tiny-ds",)
    one = prepare_upload(layout / "checkpoints" / "bf16", *args)
    two = prepare_upload(layout / "checkpoints" / "bf16", *args)
    assert one.card == two.card and one.marker == two.marker
    other = prepare_upload(layout / "checkpoints" / "bf16", "org/other")
    assert other.marker != one.marker


def test_speculators_directory_config_is_used(layout, tmp_path):
    # A config written into the new-model layout's speculators/ directory takes
    # precedence over the spec's defaults and may name a published draft model.
    root = shutil.copytree(layout, tmp_path / "out", symlinks=True)
    (root / "speculators").mkdir(exist_ok=True)
    config = {
        "method": "eagle3",
        "model": "org/tiny-ds-eagle3",
        "num_speculative_tokens": 3,
    }
    (root / "speculators" / "eagle3.json").write_text(json.dumps(config))
    ckpt = root / "checkpoints" / "bf16"
    plan = prepare_upload(ckpt, "org/tiny-ds", hashed=False)
    text = _card(plan).text
    flag = json.dumps(config, sort_keys=True)
    assert f"vllm serve org/tiny-ds --speculative-config '{flag}'" in text
    assert "(speculators/eagle3.json)" in text


def test_validation_sections_follow_the_contract_metric_names():
    # Entries named as docs/architecture.md's validation.json contract names them (the
    # quant check's real output: tests/test_publish_quant.py).
    data = {
        "passed": True,
        "target": "b200",
        "checks": [
            {"name": "accuracy", "status": "passed", "metrics": {}, "details": ""},
            {
                "name": "quant:nvfp4",
                "status": "passed",
                "metrics": {"kl_divergence": 0.0123456, "top1_agreement": 0.97},
                "details": "",
            },
            {
                "name": "spec-decode:mtp",
                "status": "passed",
                "metrics": {
                    "mean_acceptance_length": 2.5,
                    "acceptance_rate_per_position": [0.9, 0.6],
                    "speedup": 1.8,
                },
                "details": "",
            },
            {
                "name": "speed",
                "status": "passed",
                "metrics": {"output_tokens_per_s": 1234.5, "tpot_ms": 7.25},
                "details": "",
            },
            {
                "name": "kv-cache",
                "status": "not-run",
                "metrics": {},
                "details": "needs the b200 machine",
            },
        ],
    }
    ctx = validation_context(Verdict(None, data, "", "test"))
    assert ctx["hardware"] == "NVIDIA B200"
    assert ctx["quant"] == [
        (
            "quant:nvfp4",
            "passed",
            [
                ("KL divergence to the 16-bit model (mean, nats)", "0.01235"),
                ("top-1 agreement with the 16-bit model", "0.97"),
            ],
        )
    ]
    assert ctx["spec_decode"][0][2] == [
        ("mean acceptance length", "2.5"),
        ("acceptance rate per position", "0.9, 0.6"),
        ("speed-up over no speculation", "1.8"),
    ]
    # Only what was measured: no TTFT row, no KV-cache table for a not-run check.
    assert ctx["speed"][0][2] == [
        ("output tokens/s", "1234"),
        ("time per output token (ms)", "7.25"),
    ]
    assert ctx["kv_cache"] == []
    assert ("kv-cache", "not-run", "needs the b200 machine") in ctx["overview"]


def test_render_without_spec_uses_config(layout, tmp_path):
    ckpt_dir = shutil.copytree(layout / "checkpoints" / "bf16", tmp_path / "nospec")
    (ckpt_dir / "spec.yaml").unlink()
    ckpt = inspect_checkpoint(ckpt_dir, hashed=False)
    text = render_card(
        CardInputs(ckpt, None, Verdict(None, None, "missing", ""), "org/x", True)
    )
    card = ModelCard(text)
    assert card.data.to_dict()["license"] == "unknown"
    assert "| architecture | DeepseekV3ForCausalLM |" in card.text


def test_module_summary_groups_layers():
    names = ["lm_head"] + [f"model.layers.{i}.mlp.gate" for i in (3, 4, 5, 9)]
    names += [
        f"model.layers.{i}.mlp.experts.{e}.up_proj" for i in (61, 62) for e in range(4)
    ]
    assert summarise_modules(names, 61) == [
        "`lm_head`",
        "layers 3-5, 9: `mlp.gate`",
        "layers 61-62 (MTP): `mlp.experts.*.up_proj` (x4)",
    ]
