"""onboard quantize as a user runs it: killed mid-run and rerun, and its memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from quantize_helpers import write_llama_checkpoint  # noqa: E402

ONBOARD = str(Path(sys.executable).parent / "onboard")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    # ~190 MB in 8 shards: long enough to be killed between shards.
    return write_llama_checkpoint(
        tmp_path_factory.mktemp("resume") / "bf16",
        hidden=1024,
        intermediate=2816,
        layers=8,
        vocab=2048,
        heads=8,
        kv=4,
        shards=8,
    )


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def start(ckpt: Path, out: Path, workers: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            ONBOARD,
            "quantize",
            ckpt,
            "--scheme",
            "nvfp4a16",
            "--out",
            out,
            "--workers",
            str(workers),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_killed_run_resumes_to_identical_output(ckpt, tmp_path, workers):
    out = tmp_path / "out"
    state = tmp_path / ".out.partial" / "state.json"
    p = start(ckpt, out, workers)
    children: list[psutil.Process] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None:
        try:
            done = len(json.loads(state.read_text())["shards"])
        except (OSError, ValueError, KeyError):
            done = 0
        children = psutil.Process(p.pid).children(recursive=True) or children
        if done >= 1:
            break
        time.sleep(0.01)
    assert p.poll() is None, "the run ended before it could be interrupted"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    psutil.wait_procs(children, timeout=10)
    assert not any(c.is_running() and c.status() != "zombie" for c in children)
    # Interrupted: nothing at the output path, the partial directory kept.
    assert not out.exists()
    assert state.exists() and 1 <= len(json.loads(state.read_text())["shards"]) < 8

    resumed = subprocess.run(
        [ONBOARD, "quantize", ckpt, "--scheme", "nvfp4a16", "--out", out],
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    fresh = tmp_path / "fresh"
    r = subprocess.run(
        [ONBOARD, "quantize", ckpt, "--scheme", "nvfp4a16", "--out", fresh],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert files(out) == files(fresh)
    assert not list(tmp_path.glob(".*"))


def test_damaged_partial_shard_is_redone(ckpt, tmp_path):
    out = tmp_path / "out"
    p = start(ckpt, out, 1)
    state = tmp_path / ".out.partial" / "state.json"
    while p.poll() is None:
        try:
            shards = json.loads(state.read_text())["shards"]
        except (OSError, ValueError, KeyError):
            shards = {}
        if shards:
            break
        time.sleep(0.01)
    assert p.poll() is None
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(0.5)
    name = next(iter(shards))
    with open(tmp_path / ".out.partial" / name, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * 16)
    r = subprocess.run(
        [ONBOARD, "quantize", ckpt, "--scheme", "nvfp4a16", "--out", out],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and f"redoing {name}" in r.stderr, r.stderr
    fresh = tmp_path / "fresh"
    subprocess.run(
        [ONBOARD, "quantize", ckpt, "--scheme", "nvfp4a16", "--out", fresh],
        check=True,
        capture_output=True,
    )
    assert files(out) == files(fresh)


def tree_pss(pid: int) -> int:
    total = 0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def test_peak_memory_of_the_process_tree_is_bounded(ckpt, tmp_path):
    """Peak proportional memory (PSS, so forked pages count once) of the whole tree
    stays under workers x largest shard + 1 GB."""
    workers = 2
    p = start(ckpt, tmp_path / "out", workers)
    peak = 0
    while p.poll() is None:
        peak = max(peak, tree_pss(p.pid))
        time.sleep(0.02)
    assert p.returncode == 0, p.stderr.read()
    largest = max(f.stat().st_size for f in ckpt.glob("*.safetensors"))
    bound = workers * largest + (1 << 30)
    print(f"peak tree PSS {peak / 2**20:.0f} MiB, bound {bound / 2**20:.0f} MiB")
    assert 0 < peak < bound


def test_resume_after_a_spec_change_starts_fresh(ckpt, tmp_path):
    """A partial output made for other inputs is never reused: killed after its
    first shard, rerun with keep_unquantized changed, quantize starts over and
    writes what a fresh run with the new spec writes (index, ignore list and
    shards agree)."""
    spec = (ckpt / "spec.yaml").read_text()
    changed = tmp_path / "changed.yaml"
    changed.write_text(spec + "keep_unquantized: [o_proj]\n")
    out = tmp_path / "out"
    state = tmp_path / ".out.partial" / "state.json"
    p = start(ckpt, out, 1)
    while p.poll() is None:
        try:
            if json.loads(state.read_text())["shards"]:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.01)
    assert p.poll() is None, "the run ended before it could be interrupted"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(0.5)  # the worker dies with its parent

    def run(dest: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [ONBOARD, "quantize", ckpt, "--scheme", "nvfp4a16", "--out", dest,
             "--spec", changed],
            capture_output=True,
            text=True,
        )  # fmt: skip

    resumed = run(out)
    assert resumed.returncode == 0, resumed.stderr
    assert "starting fresh" in resumed.stderr and "keep_unquantized" in resumed.stderr
    assert "resuming" not in resumed.stderr
    fresh = tmp_path / "fresh"
    assert run(fresh).returncode == 0
    assert files(out) == files(fresh)
    ignore = json.loads((out / "config.json").read_text())["quantization_config"][
        "ignore"
    ]
    assert "model.layers.0.self_attn.o_proj" in ignore
