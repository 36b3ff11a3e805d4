"""What `onboard publish` lets out of a checkpoint directory, and when it refuses:
incomplete checkpoints (index vs shards), files outside the allow-list, and
missing, failed or unrelated validation results."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from publish_helpers import FIXTURES, build_layout, copy_checkpoint

from onboard.errors import InputError
from onboard.publish import prepare_upload
from onboard.publish.checkpoint import inspect_checkpoint
from onboard.publish.validation import judge


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    return build_layout(tmp_path_factory.mktemp("publish"))


@pytest.fixture
def bf16(layout, tmp_path) -> Path:
    return copy_checkpoint(layout / "checkpoints" / "bf16", tmp_path / "bf16")


def _problems(directory: Path) -> str:
    with pytest.raises(InputError) as info:
        inspect_checkpoint(directory)
    return str(info.value)


def test_complete_checkpoint_files_and_checksums(layout):
    ckpt = inspect_checkpoint(layout / "checkpoints" / "fp8-dynamic")
    names = [f.path for f in ckpt.files]
    assert names == sorted(names)
    assert set(names) == {
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "onboard-quantize.json",
        "spec.yaml",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert ckpt.scheme == "fp8-dynamic"
    assert ckpt.skipped == []
    # Checksums agree with what the quantizer recorded for its shards.
    record = json.loads((ckpt.dir / "onboard-quantize.json").read_text())
    by_name = {f.path: f for f in ckpt.files}
    for shard, want in record["shards"].items():
        assert by_name[shard].sha256 == want["sha256"]
        assert by_name[shard].size == want["size"]
    bf16 = inspect_checkpoint(layout / "checkpoints" / "bf16")
    assert bf16.scheme is None and bf16.variant == "bf16"


def test_allow_list_skips_caches_temporaries_and_strangers(bf16):
    (bf16 / ".cache").mkdir()
    (bf16 / ".cache" / "token").write_text("secret")
    (bf16 / "__pycache__").mkdir()
    (bf16 / ".DS_Store").write_bytes(b"\0")
    (bf16 / "model-00001-of-00002.safetensors.tmp").write_bytes(b"partial")
    (bf16 / "notes.txt").write_text("private notes")
    (bf16 / "README.md").write_text("# old card")
    (bf16 / "optimizer.pt").write_bytes(b"\0" * 16)
    ckpt = inspect_checkpoint(bf16)
    skipped = dict(ckpt.skipped)
    assert set(skipped) == {
        ".cache",
        "__pycache__",
        ".DS_Store",
        "model-00001-of-00002.safetensors.tmp",
        "notes.txt",
        "README.md",
        "optimizer.pt",
    }
    assert skipped["README.md"] == "replaced by the generated model card"
    assert skipped["model-00001-of-00002.safetensors.tmp"] == "temporary file"
    uploaded = {f.path for f in ckpt.files}
    assert not uploaded & set(skipped)


def test_missing_shard_is_refused(bf16):
    (bf16 / "model-00002-of-00002.safetensors").unlink()
    text = _problems(bf16)
    assert (
        "model-00002-of-00002.safetensors: listed in model.safetensors.index.json"
        in text
    )
    assert "missing" in text


def test_truncated_shard_is_refused(bf16):
    shard = bf16 / "model-00001-of-00002.safetensors"
    os.truncate(shard, shard.stat().st_size - 100)
    text = _problems(bf16)
    assert "model-00001-of-00002.safetensors: truncated" in text
    # The quantize record is not there for bf16; the header arithmetic caught it.


def test_trailing_bytes_are_refused(bf16):
    with (bf16 / "model-00002-of-00002.safetensors").open("ab") as f:
        f.write(b"\0" * 8)
    assert "has trailing bytes" in _problems(bf16)


def test_index_and_shard_tensors_must_agree(bf16):
    index_path = bf16 / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    moved = next(
        n
        for n, s in index["weight_map"].items()
        if s.endswith("1-of-00002.safetensors")
    )
    index["weight_map"][moved] = "model-00002-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    text = _problems(bf16)
    assert (
        "model-00002-of-00002.safetensors: 1 tensors the index maps here are missing"
        in text
    )
    assert "model-00001-of-00002.safetensors: 1 tensors not in the index" in text


def test_stray_shard_is_refused(bf16):
    (bf16 / "model-00003-of-00003.safetensors").write_bytes(
        (bf16 / "model-00002-of-00002.safetensors").read_bytes()
    )
    assert "model-00003-of-00003.safetensors: not listed in" in _problems(bf16)


def test_not_safetensors_is_refused(bf16):
    shard = bf16 / "model-00002-of-00002.safetensors"
    shard.write_bytes(struct.pack("<Q", 20) + b"{not json at all!!!}")
    assert "model-00002-of-00002.safetensors: not a safetensors file" in _problems(bf16)


def test_no_tokenizer_is_refused(bf16):
    (bf16 / "tokenizer.json").unlink()
    assert "no tokenizer" in _problems(bf16)


def test_link_out_of_the_checkpoint_is_refused(bf16, tmp_path):
    secret = tmp_path / "elsewhere.json"
    secret.write_text("{}")
    (bf16 / "tokenizer_config.json").unlink()
    (bf16 / "tokenizer_config.json").symlink_to(secret)
    assert "outside the checkpoint" in _problems(bf16)


def test_quantized_shards_must_match_the_quantize_record(layout, tmp_path):
    fp8 = copy_checkpoint(layout / "checkpoints" / "fp8-dynamic", tmp_path / "fp8")
    shard = fp8 / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, one bit of weight data flipped
    shard.write_bytes(bytes(data))
    assert "differs from what onboard quantize wrote" in _problems(fp8)


def test_missing_config_is_refused(bf16):
    (bf16 / "config.json").unlink()
    assert "config.json: missing" in _problems(bf16)


# -- validation ------------------------------------------------------------------


def test_layout_validation_covers_the_bf16_checkpoint(layout):
    ckpt = inspect_checkpoint(layout / "checkpoints" / "bf16", hashed=False)
    verdict = judge(ckpt, layout / "validation" / "validation.json")
    assert verdict.ok, verdict.problem
    assert verdict.covered_by == "the validation ran on this checkpoint"


def test_layout_validation_does_not_cover_a_quantized_checkpoint(layout):
    # The new-model run validated the bf16 checkpoint; the fp8 one needs its own
    # quant:fp8-dynamic check (or a run on it) before it may be published.
    with pytest.raises(InputError) as info:
        prepare_upload(layout / "checkpoints" / "fp8-dynamic", "org/name", hashed=False)
    text = str(info.value)
    assert "no quant:fp8-dynamic check" in text
    assert "--force" in text


def test_failed_validation_is_refused(layout):
    # A real result: vLLM's CPU build has no FP8 MoE kernel for this model.
    with pytest.raises(InputError) as info:
        prepare_upload(
            layout / "checkpoints" / "fp8-dynamic",
            "org/name",
            validation=layout / "validation-fp8" / "validation.json",
            hashed=False,
        )
    assert "validation did not pass (failed checks: accuracy)" in str(info.value)


def test_missing_validation_is_refused(layout, tmp_path):
    alone = copy_checkpoint(layout / "checkpoints" / "bf16", tmp_path / "alone")
    with pytest.raises(InputError) as info:
        prepare_upload(alone, "org/name", hashed=False)
    assert f"no validation.json for {alone}" in str(info.value)


def test_validation_of_another_checkpoint_is_refused(layout, tmp_path):
    alone = copy_checkpoint(layout / "checkpoints" / "bf16", tmp_path / "alone")
    with pytest.raises(InputError) as info:
        prepare_upload(
            alone,
            "org/name",
            validation=layout / "validation" / "validation.json",
            hashed=False,
        )
    assert "not this checkpoint" in str(info.value)


def test_passed_quant_check_covers_a_quantized_checkpoint(layout, tmp_path):
    # `onboard validate` does not run quant:<scheme> checks yet: this adds one, as
    # docs/architecture.md specifies it, to a real passed run, to test the coverage
    # rule.
    data = json.loads((FIXTURES / "deepseek-v3-style-bf16.validation.json").read_text())
    data["checks"].append(
        {
            "name": "quant:fp8-dynamic",
            "status": "passed",
            "passed": True,
            "metrics": {},
            "details": "",
        }
    )
    path = tmp_path / "validation.json"
    path.write_text(json.dumps(data))
    ckpt = inspect_checkpoint(layout / "checkpoints" / "fp8-dynamic", hashed=False)
    verdict = judge(ckpt, path)
    assert verdict.ok and verdict.covered_by == "the quant:fp8-dynamic check"
    data["checks"][-1]["status"] = "not-run"
    path.write_text(json.dumps(data))
    verdict = judge(ckpt, path)
    assert "'not-run', not passed" in verdict.problem


def test_force_publishes_and_the_card_says_so(layout):
    plan = prepare_upload(
        layout / "checkpoints" / "fp8-dynamic",
        "org/name",
        validation=layout / "validation-fp8" / "validation.json",
        force=True,
        hashed=False,
    )
    assert plan.forced
    assert "published with `--force`" in plan.card
    assert "validation did not pass (failed checks: accuracy)" in plan.card
    assert "(published with --force)" in plan.description


def test_malformed_validation_is_bad_input(layout, tmp_path):
    bad = tmp_path / "validation.json"
    bad.write_text('{"checks": "nope"}')
    with pytest.raises(InputError) as info:
        prepare_upload(
            layout / "checkpoints" / "bf16", "org/name", validation=bad, hashed=False
        )
    assert "not a validation.json" in str(info.value)
    with pytest.raises(InputError, match="no such file"):
        prepare_upload(
            layout / "checkpoints" / "bf16",
            "org/name",
            validation=tmp_path / "absent.json",
            hashed=False,
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"repo_id": "no-slash"}, "--repo: expected ORG/NAME"),
        ({"repo_id": "a/b/c"}, "--repo: expected ORG/NAME"),
        ({"revision": "refs/pr/1"}, "--revision: expected a branch name"),
        ({"revision": "has space"}, "--revision: expected a branch name"),
        ({"endpoint": "ftp://x"}, "--endpoint: expected an http(s) URL"),
        ({"base_model": "x"}, "--base-model: expected ORG/NAME"),
    ],
)
def test_bad_arguments_are_located(layout, kwargs, message):
    args = {"repo_id": "org/name", **kwargs}
    with pytest.raises(
        InputError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        prepare_upload(layout / "checkpoints" / "bf16", hashed=False, **args)


def test_place_validation_keeps_the_recorded_result(layout):
    # The fixtures are real runs; only model_dir is pointed at the test checkpoint.
    placed = json.loads((layout / "validation" / "validation.json").read_text())
    recorded = json.loads(
        (FIXTURES / "deepseek-v3-style-bf16.validation.json").read_text()
    )
    assert placed["checks"] == recorded["checks"]
    assert placed["model_dir"] == str(layout / "checkpoints" / "bf16")
