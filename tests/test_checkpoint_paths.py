"""A checkpoint's index names its shards; a name that is not a plain
``*.safetensors`` file in the checkpoint directory (an absolute path, ``../``, a
directory part, another suffix) is refused with exit 2 by every reader, and
`quantize`, which names its output shards after the input's, writes nothing.

The files such names point at exist and are valid shards (copies of the real
one), so a reader that followed them would succeed: only the name check stops it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onboard.errors import InputError
from onboard.fsutil import BadIndex, read_weight_map, shard_name_problem

sys.path.insert(0, str(Path(__file__).parent))
from quantize_helpers import write_llama_checkpoint  # noqa: E402

ONBOARD = str(Path(sys.executable).parent / "onboard")
SHARD = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A real 2-shard checkpoint and, beside it, the spec inferred from it."""
    from onboard.spec import dump_spec
    from onboard.spec.hf import spec_from_hf_config_file

    root = tmp_path_factory.mktemp("good")
    ckpt = write_llama_checkpoint(
        root / "bf16",
        hidden=128,
        intermediate=256,
        layers=2,
        vocab=256,
        heads=4,
        kv=2,
        shards=2,
    )
    spec = spec_from_hf_config_file(ckpt, name="tiny-llama")
    (root / "spec.yaml").write_text(dump_spec(spec))
    return ckpt


def _malicious(good: Path, base: Path, kind: str) -> tuple[Path, Path, str]:
    """A copy of ``good`` whose index moves shard 2's tensors to a file named by
    ``kind``; returns the checkpoint, the file that name reaches, and the name."""
    ckpt = base / "ckpt"
    shutil.copytree(good, ckpt)
    data = (ckpt / SHARD).read_bytes()
    target = {
        "absolute": base / "victim.safetensors",
        "parent": base / "victim.safetensors",
        "subdir": ckpt / "sub" / SHARD,
        "suffix": ckpt / "model-00002-of-00002.bin",
    }[kind]
    name = {
        "absolute": str(target),
        "parent": "../victim.safetensors",
        "subdir": f"sub/{SHARD}",
        "suffix": target.name,
    }[kind]
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(data)
    index = json.loads((ckpt / INDEX).read_text())
    index["weight_map"] = {
        t: (name if s == SHARD else s) for t, s in index["weight_map"].items()
    }
    (ckpt / INDEX).write_text(json.dumps(index, indent=2))
    return ckpt, target, name


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the sha256 of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


KINDS = ["absolute", "parent", "subdir", "suffix"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_spec", [True, False])
def test_quantize_refuses_and_writes_nothing(good, tmp_path, kind, with_spec):
    ckpt, target, name = _malicious(good, tmp_path, kind)
    if not with_spec:  # the layout is then read from the names (no preflight)
        (ckpt / "spec.yaml").unlink(missing_ok=True)
    before = _tree(tmp_path)
    out = tmp_path / "q"
    r = subprocess.run(
        [ONBOARD, "quantize", str(ckpt), "--scheme", "fp8-dynamic", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    # Located: the index, the entry (shard 2's first tensor) and the name it gives
    # (with a spec, as preflight reports it, under the checkpoint's path).
    assert f"{INDEX}: weight_map['lm_head.weight']: " in r.stderr
    assert str(ckpt) in r.stderr
    assert repr(name) in r.stderr
    # Nothing written anywhere: not the file the name reaches, no output, no
    # partial or lock file beside it.
    assert _tree(tmp_path) == before
    assert not out.exists() and not list(tmp_path.glob(".q.*"))


@pytest.mark.parametrize("kind", ["absolute", "parent"])
def test_spec_check_with_the_checkpoint_exits_2(good, tmp_path, kind):
    ckpt, _, name = _malicious(good, tmp_path, kind)
    spec = good.parent / "spec.yaml"
    ok = subprocess.run(
        [ONBOARD, "spec", "check", str(spec), "--checkpoint", str(good)],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr  # the intact checkpoint passes
    r = subprocess.run(
        [ONBOARD, "spec", "check", str(spec), "--checkpoint", str(ckpt)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert f"error (index) {INDEX}: weight_map['lm_head.weight']: " in r.stdout
    assert repr(name) in r.stdout


@pytest.mark.parametrize("kind", KINDS)
def test_every_reader_refuses(good, tmp_path, kind):
    from onboard.checkpoint.preflight import preflight
    from onboard.publish.checkpoint import inspect_checkpoint
    from onboard.spec import load_spec
    from onboard.speculators.mtp_train import read_tensor
    from onboard.validate.harness import check_inputs

    ckpt, _, name = _malicious(good, tmp_path, kind)
    spec = load_spec(good.parent / "spec.yaml")
    report = preflight(spec, ckpt)
    assert not report.ok
    assert any(repr(name) in p.message for p in report.by_kind("index"))
    # Only the shards on disk were read; the one the index names never was.
    assert report.shards == len(list(ckpt.glob("*.safetensors")))

    with pytest.raises(BadIndex, match="weight_map"):
        check_inputs(spec, ckpt)  # validate, also with --no-preflight
    with pytest.raises(BadIndex, match="weight_map"):
        read_tensor(ckpt, "model.norm.weight")
    with pytest.raises(InputError, match="weight_map") as exc:
        inspect_checkpoint(ckpt)
    assert repr(name) in str(exc.value)


def test_speculators_tune_refuses_before_any_engine(good, tmp_path):
    ckpt, _, name = _malicious(good, tmp_path, "parent")
    r = subprocess.run(
        [
            ONBOARD,
            "speculators",
            "tune",
            str(ckpt),
            "--spec",
            str(good.parent / "spec.yaml"),
            "--methods",
            "ngram",
            "--out",
            str(tmp_path / "tune"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert repr(name) in r.stderr
    assert not (tmp_path / "tune").exists()


@pytest.mark.parametrize(
    "name",
    [
        "/etc/x.safetensors",
        "../x.safetensors",
        "a/x.safetensors",
        "a\\x.safetensors",
        "x.safetensors\0",
        ".x.safetensors",
        "..",
        ".safetensors",
        "x.bin",
        "",
        3,
        None,
    ],
)
def test_names_that_are_not_plain_shard_files(name, tmp_path):
    assert shard_name_problem(name) is not None
    index = tmp_path / INDEX
    index.write_text(json.dumps({"weight_map": {"t": name}}))
    with pytest.raises(BadIndex) as exc:
        read_weight_map(index)
    assert str(exc.value).startswith(f"{index}: weight_map['t']: {name!r}")


def test_plain_names_pass(tmp_path):
    index = tmp_path / INDEX
    names = {"a": "model-00001-of-00002.safetensors", "b": "model.safetensors"}
    index.write_text(json.dumps({"weight_map": names}))
    assert read_weight_map(index) == names
