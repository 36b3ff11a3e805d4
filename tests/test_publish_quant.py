"""End to end: the bundled FP8 checkpoint published on the strength of its
passed ``quant:fp8-dynamic`` check, without ``--force``.

The layout is `onboard new-model`'s (``checkpoints/bf16``, ``checkpoints/fp8-dynamic``,
``validation/validation.json``) for the bundled DeepSeek-V3-style spec. Its
validation.json is the recorded passed run of the bf16 checkpoint
(tests/fixtures/publish/deepseek-v3-style-bf16.validation.json) plus the
``quant:fp8-dynamic`` check with the metrics the quant check measured on this
checkpoint in tests/test_quant_check_acceptance.py (30 November 2026; that run's
own file went with its temporary directory), and the sha256 of the rebuilt FP8
shards, which is what lets the check cover them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hub_server import HubServer
from huggingface_hub import ModelCard, hf_hub_download
from publish_helpers import FIXTURES, SPECS, TOKEN

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.errors import InputError
from onboard.publish import PublishFailed, prepare_upload, publish
from onboard.publish.card import fmt
from onboard.quantize import quantize_checkpoint
from onboard.quantize.st_io import file_sha256
from onboard.spec import load_spec

REPO = "onboard-test/tiny-deepseek-fp8-checked"
# Measured by the quant check on this checkpoint (docs/quantize.md, "Acceptance").
QUANT_CHECK = {
    "name": "quant:fp8-dynamic",
    "status": "passed",
    "passed": True,
    "metrics": {
        "path": "dequantized-reference",
        "engine_error": "ValueError: Unsupported FP8 MoE backend: NONE",
        "kl_divergence": 0.0615,
        "kl_divergence_max": 0.820,
        "top1_agreement": 0.901,
        "positions": 382,
        "untouched_tensors": {"embeddings": 1, "lm_head": 1, "norms": 13,
                              "routers": 4},
    },
    "details": "fp8-dynamic checkpoint, run by the reference on "
    "compressed-tensors-dequantized weights",
}  # fmt: skip


def _place(root: Path) -> Path:
    data = json.loads((FIXTURES / "deepseek-v3-style-bf16.validation.json").read_text())
    data["model_dir"] = str(root / "checkpoints" / "bf16")
    check = json.loads(json.dumps(QUANT_CHECK))
    fp8 = root / "checkpoints" / "fp8-dynamic"
    check["metrics"]["checkpoint"] = str(fp8)
    check["metrics"]["shards_sha256"] = {
        p.name: file_sha256(p) for p in sorted(fp8.glob("*.safetensors"))
    }
    data["checks"].append(check)
    path = root / "validation" / "validation.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("publish-quant") / "out"
    spec = load_spec(SPECS / "deepseek-v3-style.yaml")
    bf16 = write_tiny_checkpoint(spec, root / "checkpoints" / "bf16", seed=0)
    quantize_checkpoint(bf16, "fp8-dynamic", root / "checkpoints" / "fp8-dynamic")
    (root / "spec.yaml").write_text((SPECS / "deepseek-v3-style.yaml").read_text())
    _place(root)
    return root


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with HubServer(TOKEN, part_size=1 << 20, page_size=4) as server:
        yield server


def _publish(hub: HubServer, layout: Path, **kwargs):
    return publish(
        layout / "checkpoints" / "fp8-dynamic",
        REPO,
        endpoint=hub.url,
        base_model="onboard-test/tiny-deepseek",
        backoff=0.01,
        **kwargs,
    )


def test_fp8_with_a_passed_quant_check_publishes_without_force(layout, hub, tmp_path):
    report = _publish(hub, layout)
    plan, out = report.upload, report.outcome
    assert not plan.forced
    assert out is not None and out.pr_num == 1
    assert out.verified == len(plan.files)
    ckpt = layout / "checkpoints" / "fp8-dynamic"
    remote = hub.files(REPO, "refs/pr/1")
    local = {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()}
    local["README.md"] = plan.card.encode()
    assert set(remote) == set(local) | {".gitattributes"}
    for name, data in local.items():
        assert remote[name] == data, name

    card = ModelCard.load(
        hf_hub_download(
            REPO, "README.md", revision="refs/pr/1", endpoint=hub.url,
            cache_dir=tmp_path,
        )
    )  # fmt: skip
    meta = card.data.to_dict()
    assert meta["base_model"] == "onboard-test/tiny-deepseek"
    assert meta["base_model_relation"] == "quantized"
    assert {"fp8", "compressed-tensors", "vllm"} <= set(meta["tags"])
    assert "--force" not in card.text
    m = QUANT_CHECK["metrics"]
    for label, key in (
        ("KL divergence to the 16-bit model (mean, nats)", "kl_divergence"),
        ("KL divergence, largest at one position (nats)", "kl_divergence_max"),
        ("top-1 agreement with the 16-bit model", "top1_agreement"),
    ):
        assert f"| {label} | {fmt(m[key])} |" in card.text


def test_failure_mid_upload_then_second_run_completes(layout, hub, tmp_path):
    record = json.loads(
        (layout / "checkpoints" / "fp8-dynamic" / "onboard-quantize.json").read_text()
    )
    oid2 = record["shards"]["model-00002-of-00002.safetensors"]["sha256"]
    hub.inject("PUT", rf"/lfs-upload/.*/{oid2}/\d+$", status=500,
               read_bytes=50_000, times=-1)  # fmt: skip
    with pytest.raises(PublishFailed, match="run the same command again"):
        _publish(hub, layout, retries=0)
    assert not hub.pull_requests(REPO)
    hub.clear_faults()
    report = _publish(hub, layout)
    assert report.outcome.pr_num == 1 and not report.upload.forced
    assert len(hub.pull_requests(REPO)) == 1
    assert (
        hub.files(REPO, "refs/pr/1")["model-00002-of-00002.safetensors"]
        == (
            layout / "checkpoints" / "fp8-dynamic" / "model-00002-of-00002.safetensors"
        ).read_bytes()
    )


def test_quant_check_of_other_shards_does_not_cover(layout, tmp_path):
    data = json.loads((layout / "validation" / "validation.json").read_text())
    check = next(c for c in data["checks"] if c["name"] == "quant:fp8-dynamic")
    check["metrics"]["shards_sha256"]["model-00001-of-00002.safetensors"] = "0" * 64
    other = tmp_path / "validation.json"
    other.write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        prepare_upload(
            layout / "checkpoints" / "fp8-dynamic", "org/x", validation=other,
            hashed=False,
        )  # fmt: skip
    assert "validated other shards than this checkpoint's" in str(info.value)
