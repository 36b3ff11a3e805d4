"""What quantize refuses, as `onboard spec check --checkpoint` does, and that a
refusal leaves nothing behind: no output, no partial directory, no stray file.

Non-finite weights (in a tensor to quantize or in one copied unchanged: the
embedding, the output head), non-finite or malformed config.json values, and a
config that is not the spec's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from quantize_helpers import write_llama_checkpoint  # noqa: E402

ONBOARD = str(Path(sys.executable).parent / "onboard")
BF16_NAN, BF16_INF = b"\xc0\x7f", b"\x80\x7f"  # little-endian 0x7FC0, 0x7F80


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    return write_llama_checkpoint(
        tmp_path_factory.mktemp("refusals") / "bf16",
        hidden=256,
        intermediate=512,
        layers=2,
        vocab=512,
        heads=4,
        kv=2,
        shards=2,
    )


def copy(clean: Path, dest: Path, *, spec_yaml: bool = True) -> Path:
    shutil.copytree(clean, dest)
    if not spec_yaml:
        (dest / "spec.yaml").unlink()
    return dest


def poke(model_dir: Path, tensor: str, value: bytes, element: int = 7) -> None:
    """Overwrite one element of ``tensor`` in its shard file."""
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    path = model_dir / index["weight_map"][tensor]
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        start = json.loads(f.read(n))[tensor]["data_offsets"][0]
        f.seek(8 + n + start + 2 * element)
        f.write(value)


def quantize(model_dir: Path, out: Path, scheme: str = "fp8-dynamic"):
    return subprocess.run(
        [ONBOARD, "quantize", model_dir, "--scheme", scheme, "--out", out],
        capture_output=True,
        text=True,
    )


def assert_refused(r, out: Path, *words: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    for word in words:
        assert word in r.stderr, r.stderr
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}*")), list(out.parent.iterdir())


@pytest.mark.parametrize(
    "tensor, value",
    [
        ("model.embed_tokens.weight", BF16_NAN),  # copied unchanged
        ("lm_head.weight", BF16_INF),  # copied unchanged
        ("model.layers.1.mlp.down_proj.weight", BF16_NAN),  # quantized
    ],
)
@pytest.mark.parametrize("scheme", ["fp8-dynamic", "nvfp4a16"])
def test_non_finite_weights_are_refused(clean, tmp_path, tensor, value, scheme):
    src = copy(clean, tmp_path / "src")
    poke(src, tensor, value)
    r = quantize(src, tmp_path / "out", scheme)
    assert_refused(r, tmp_path / "out", tensor, "NaN or infinite")


@pytest.mark.parametrize("spec_yaml", [True, False])
@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda c: {**c, "rms_norm_eps": float("nan")}, ["rms_norm_eps", "NaN"]),
        (lambda c: {**c, "rope_theta": float("inf")}, ["rope_theta"]),
        (lambda c: [], ["not a JSON object"]),
        (lambda c: {k: v for k, v in c.items() if k != "model_type"}, ["model_type"]),
    ],
    ids=["nan-eps", "inf-rope", "list", "no-model-type"],
)
def test_bad_config_values_are_refused(clean, tmp_path, spec_yaml, edit, words):
    src = copy(clean, tmp_path / "src", spec_yaml=spec_yaml)
    path = src / "config.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    r = quantize(src, tmp_path / "out")
    assert_refused(r, tmp_path / "out", *words)


def test_a_config_that_is_not_the_specs_is_refused(clean, tmp_path):
    """With a spec.yaml: quantize runs preflight, which refuses a model_type the
    spec does not have (`spec check --checkpoint` refuses it too)."""
    src = copy(clean, tmp_path / "src")
    path = src / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": "xyz"}))
    check = subprocess.run(
        [ONBOARD, "spec", "check", src / "spec.yaml", "--checkpoint", src],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 2
    r = quantize(src, tmp_path / "out")
    assert_refused(r, tmp_path / "out", "model_type", "does not match its spec")


def test_a_clean_checkpoint_still_quantizes(clean, tmp_path):
    r = quantize(clean, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "config.json").exists()
