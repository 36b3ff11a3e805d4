"""`onboard quantize --ray` on a real Ray cluster: a head and two one-CPU worker
nodes on 127.0.0.1 (ray.cluster_utils.Cluster), one for the module. The output
must be byte-identical to a local run's, when a worker node is killed mid-run and
when the driver is killed and the command rerun (its finished shards are not
redone); an unreachable address or a missing Ray exit 2 with a message.

The drivers are `onboard` processes, as users run them; the cluster's processes
inherit this process's environment (PYTHONPATH included), as nodes that run the
same onboard."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from quantize_helpers import write_llama_checkpoint  # noqa: E402

ONBOARD = str(Path(sys.executable).with_name("onboard"))
SCHEME = "nvfp4a16"
SHARDS = 8

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is not installed: `pip install 'onboard[ray]'` (`make venv` does)",
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    # ~50 MB in 8 shards: a few seconds on two one-CPU nodes, so a run can be
    # interrupted between shards.
    return write_llama_checkpoint(
        tmp_path_factory.mktemp("ray") / "bf16",
        hidden=512,
        intermediate=1536,
        layers=8,
        vocab=2048,
        heads=8,
        kv=4,
        shards=SHARDS,
    )


@pytest.fixture(scope="module")
def local_out(ckpt, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("local") / "out"
    run_cli(ckpt, out, "--workers", "1", check=True)
    return files(out)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # A lost node is declared dead after ~1.5 s instead of Ray's default 30 s.
    config = {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 500,
        "health_check_failure_threshold": 3,
    }
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,  # units run on the worker nodes only
            "include_dashboard": False,
            "object_store_memory": 96 << 20,
            "_system_config": config,
        },
    )
    try:
        for _ in range(2):
            add_worker(c)
        yield c
    finally:
        c.shutdown()


def add_worker(c):
    return c.add_node(num_cpus=1, object_store_memory=96 << 20)


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def run_cli(ckpt: Path, out: Path, *args: str, check: bool = False):
    r = subprocess.run(
        [ONBOARD, "quantize", str(ckpt), "--scheme", SCHEME, "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in r.stderr, r.stderr
    if check:
        assert r.returncode == 0, r.stderr
    return r


def start(ckpt: Path, out: Path, address: str) -> subprocess.Popen:
    return subprocess.Popen(
        [ONBOARD, "quantize", ckpt, "--scheme", SCHEME, "--out", out, "--ray", address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_shards(p: subprocess.Popen, state: Path, at_least: int = 1) -> dict:
    """The state's finished shards once there are ``at_least`` (the run going on)."""
    deadline = time.monotonic() + 240
    shards: dict = {}
    while time.monotonic() < deadline and p.poll() is None:
        try:
            shards = json.loads(state.read_text())["shards"]
        except (OSError, ValueError, KeyError):
            shards = {}
        if len(shards) >= at_least:
            return shards
        time.sleep(0.01)
    _, stderr = p.communicate(timeout=60) if p.poll() is not None else ("", "")
    raise AssertionError(f"the run ended before it could be interrupted: {stderr}")


@needs_ray
def test_cluster_output_is_byte_identical(cluster, ckpt, local_out, tmp_path):
    out = tmp_path / "out"
    r = run_cli(ckpt, out, "--ray", cluster.address, check=True)
    assert files(out) == local_out
    assert "ray: 2 nodes, 2 CPUs" in r.stderr, r.stderr
    # Both worker nodes did part of the work.
    assert "on 2 nodes:" in r.stderr, r.stderr
    assert not list(tmp_path.glob(".*"))


@needs_ray
def test_lost_worker_node_mid_run(cluster, ckpt, local_out, tmp_path):
    out = tmp_path / "out"
    p = start(ckpt, out, cluster.address)
    try:
        shards = wait_for_shards(p, tmp_path / ".out.partial" / "state.json")
        assert len(shards) < SHARDS
        victim = next(iter(cluster.worker_nodes))
        cluster.remove_node(victim, allow_graceful=False)
        assert p.poll() is None, "the run ended before the node was lost"
        stdout, stderr = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
        add_worker(cluster)  # two worker nodes again for the next test
    assert p.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert files(out) == local_out


@needs_ray
def test_killed_driver_resumes_skipping_finished_shards(
    cluster, ckpt, local_out, tmp_path
):
    out = tmp_path / "out"
    partial = tmp_path / ".out.partial"
    p = start(ckpt, out, cluster.address)
    wait_for_shards(p, partial / "state.json")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not out.exists()
    state = json.loads((partial / "state.json").read_text())["shards"]
    assert 1 <= len(state) < SHARDS
    # A shard is finished (recorded, its checksum right), or renamed by its finish
    # task before the killed driver recorded it (complete: the local run's bytes;
    # the rerun writes it again), or still a .tmp file (discarded by the rerun):
    # nothing half-written under a shard's name.
    from onboard.quantize.st_io import file_sha256

    for f in partial.iterdir():
        if f.name == "state.json" or f.suffix == ".tmp":
            continue
        if f.name in state:
            assert file_sha256(f) == state[f.name]["sha256"]
        else:
            assert f.read_bytes() == local_out[f.name], f"{f.name}: half-written"
    before = {name: (partial / name).stat() for name in state}

    r = run_cli(ckpt, out, "--ray", cluster.address, check=True)
    assert f"resuming: {len(state)} of {SHARDS} shards already done" in r.stderr
    assert files(out) == local_out
    # The finished shards were kept, not written again.
    for name, st in before.items():
        now = (out / name).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), name


@needs_ray
@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1"])
def test_unreachable_address(ckpt, tmp_path, address):
    out = tmp_path / "out"
    started = time.monotonic()
    r = run_cli(ckpt, out, "--ray", address)
    assert r.returncode == 2, r.stderr
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in r.stderr, r.stderr
    assert time.monotonic() - started < 60
    assert not out.exists() and not list(tmp_path.glob(".*"))


@needs_ray
def test_open_port_that_is_not_ray(ckpt, tmp_path):
    """A port that accepts connections but is no Ray head: ray.init would retry for
    minutes; the join is cut at JOIN_TIMEOUT_S (shortened here; Ray's C++ client
    holds the interrupt back for its 30 s wait for the cluster ID), exit 2, and
    the message says how long it waited."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import sys\n"
            "from onboard.quantize import cluster\n"
            "cluster.JOIN_TIMEOUT_S = 5\n"
            "from onboard.cli import main\n"
            f"sys.argv = ['onboard', 'quantize', {str(ckpt)!r}, '--scheme', "
            f"'fp8-dynamic', '--out', {str(tmp_path / 'out')!r}, "
            f"'--ray', '127.0.0.1:{port}']\n"
            "main()\n"
        )
        started = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
    assert r.returncode == 2, r.stderr
    waited = re.search(r"no Ray cluster answered there in (\d+) s", r.stderr)
    assert waited is not None, r.stderr
    assert 5 <= int(waited.group(1)) <= time.monotonic() - started
    assert "Traceback" not in r.stderr
    assert time.monotonic() - started < 60
    assert not (tmp_path / "out").exists()


def test_ray_missing_names_the_extra(ckpt, tmp_path):
    """Without Ray importable: exit 2, naming the install command."""
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from onboard.cli import main\n"
        f"sys.argv = ['onboard', 'quantize', {str(ckpt)!r}, '--scheme', 'fp8-dynamic',"
        f" '--out', {str(tmp_path / 'out')!r}, '--ray']\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "pip install 'onboard[ray]'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_workers_with_ray_refused(ckpt, tmp_path):
    r = run_cli(ckpt, tmp_path / "out", "--ray", "local", "--workers", "2")
    assert r.returncode == 2 and "--workers is for a local run" in r.stderr, r.stderr
