"""`onboard quantize --ray`: the units of run.py as Ray tasks across a cluster.

The driver (the `onboard quantize` process) does what it does in a local run: it
plans from the shards' headers, creates the output shards' files (header, full
size) in ``.<out>.partial/``, keeps ``state.json``, and writes config.json, the
index and the manifest at the end. The units (one weight or a fused set, copied
tensors, a finished shard's fsync, hash and rename) run as Ray tasks of one CPU
each, spread over the nodes. Each reads its input from MODEL_DIR and writes at its
planned offsets into the partial directory, so both must be on storage every node
mounts at the same path as the driver (checked on every node before any work).
The same units write the same bytes at the same offsets as local workers do: the
output is byte-identical to a local run's, and a local run resumes a cluster
run's partial directory and the other way round.

Every unit can run twice: it writes fixed bytes at fixed offsets into the shard's
``.tmp`` file, and a shard's finish finds it already renamed. Ray runs the units
of a lost node again elsewhere (``TASK_RETRIES``); a shard is recorded only once
its file is complete, hashed and renamed, so a killed driver or a cluster lost for
good leaves the finished shards in the state for the rerun.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from onboard.errors import InputError

INSTALL_HINT = "pip install 'onboard[ray]'"
CONNECT_TIMEOUT_S = 10.0  # to reach the address at all
JOIN_TIMEOUT_S = 60.0  # for Ray to join the cluster there (ray.init)
PROBE_TIMEOUT_S = 120.0  # for every node to answer the storage check
TASK_RETRIES = 5  # runs of a unit whose node or worker process was lost
GCS_PORT, CLIENT_PORT = 6379, 10001  # `ray start --head` defaults


def import_ray():
    try:
        import ray
    except ImportError:
        raise InputError(
            f"--ray: Ray is not installed here; install it with `{INSTALL_HINT}`"
        ) from None
    return ray


def _host_port(address: str) -> tuple[str, int]:
    """The TCP endpoint of a Ray address: ``ray://HOST[:PORT]`` (Ray Client) or
    ``HOST[:PORT]`` (the head's GCS)."""
    rest, port = address, GCS_PORT
    if address.startswith("ray://"):
        rest, port = address[len("ray://") :], CLIENT_PORT
    rest = rest.rstrip("/")
    host, sep, tail = rest.rpartition(":")
    if not sep or "]" in tail:
        host, tail = rest, ""
    if tail:
        try:
            port = int(tail)
        except ValueError:
            raise InputError(
                f"--ray {address}: expected HOST:PORT or ray://HOST:PORT"
            ) from None
    host = host.strip("[]")
    if not host or not 0 < port < 65536:
        raise InputError(f"--ray {address}: expected HOST:PORT or ray://HOST:PORT")
    return host, port


def _check_reachable(address: str) -> None:
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if isinstance(exc, TimeoutError | socket.timeout):
            reason = f"no answer in {CONNECT_TIMEOUT_S:g} s"
        raise InputError(
            f"--ray {address}: cannot reach the Ray cluster at {host}:{port} "
            f"({reason}). Give the head's address as `ray start --head` printed "
            f"it: HOST:{GCS_PORT} from a node of the cluster, or "
            f"ray://HOST:{CLIENT_PORT} through Ray Client; nothing was written"
        ) from None


@dataclass
class Cluster:
    """A connected Ray cluster that runs a selection's units (``run``)."""

    address: str
    nodes: int
    cpus: int

    def run(
        self, pending: list, show: bool, log: Callable[[str], None]
    ) -> Iterator[tuple[str, int, str]]:
        return _run(self, pending, show, log)


def connect(address: str | None, log: Callable[[str], None]) -> Cluster:
    """Connect to the cluster at ``address``: ``auto`` (``RAY_ADDRESS``, else the
    cluster this machine is a node of), ``HOST:PORT``, ``ray://HOST:PORT``, or
    ``local`` (start a one-node Ray here). Exit 2 with a message where it cannot."""
    # Ray's C++ client logs a warning line per retry on stderr; the error says it.
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    ray = import_ray()
    address = (address or "auto").strip()
    if address == "auto" and os.environ.get("RAY_ADDRESS"):
        address = os.environ["RAY_ADDRESS"]
    if address not in ("auto", "local"):
        _check_reachable(address)
    options = {"logging_level": logging.WARNING, "log_to_driver": False}
    started = time.monotonic()
    try:
        with _time_limit(JOIN_TIMEOUT_S):
            if address == "local":
                ray.init(include_dashboard=False, **options)
            else:
                ray.init(address=address, **options)
    except _TimeLimit:
        # The time it took: Ray's C++ client may hold the interrupt back (its
        # wait for the cluster ID, 30 s, gcs_client.cc).
        raise InputError(
            f"--ray {address}: no Ray cluster answered there in "
            f"{time.monotonic() - started:.0f} s (the port is open: is it the "
            f"head's GCS port, {GCS_PORT} by default, or Ray Client's, "
            f"{CLIENT_PORT}?); nothing was written"
        ) from None
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InputError(
            f"--ray {address}: cannot connect to a Ray cluster: "
            f"{first or type(exc).__name__}; nothing was written"
        ) from None
    nodes = _alive_nodes(ray)
    cpus = int(sum(n["Resources"].get("CPU", 0) for n in nodes))
    if cpus < 1:
        ray.shutdown()
        raise InputError(f"--ray {address}: the cluster has no node with a CPU")
    log(f"ray: {len(nodes)} nodes, {cpus} CPUs ({address})")
    return Cluster(address=address, nodes=len(nodes), cpus=cpus)


class _TimeLimit(BaseException):
    """(A BaseException: Ray's connection loop retries on any Exception.)"""


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block after ``seconds`` (main thread only: a signal).

    A port that accepts connections but is not Ray's keeps ray.init retrying for
    many minutes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _TimeLimit

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _alive_nodes(ray) -> list[dict]:
    return [
        n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) > 0
    ]


# ---- on the nodes ----------------------------------------------------------------

# The job a worker process last ran units of, by key: the selection and its offsets are
# fetched and unpickled once per process, not once per unit.
_WORKER_JOB: dict = {}


def _unit_task(key: str, job_ref: list, item):
    """One unit (run.py's ``_unit``) in a Ray worker; (result, bytes, node id)."""
    import ray

    from onboard.quantize import run as local

    job = _WORKER_JOB.get(key)
    if job is None:
        from onboard.quantize.ct_import import import_compressed_tensors

        import_compressed_tensors()  # (before the selection's unpickling imports it)
        _WORKER_JOB.clear()
        job = ray.get(job_ref[0])
        _WORKER_JOB[key] = job
        import torch

        torch.set_num_threads(1)  # one CPU per task, as Ray schedules them
        local._keep_freed_memory()
    done = 0

    def report(n: int) -> None:
        nonlocal done
        done += n

    result = local._unit(item, report, job)
    return result, done, ray.get_runtime_context().get_node_id()


def _probe(paths: list[str], token_file: str, token: str) -> dict:
    """What one node sees: onboard's version, the input files, the output
    directory (a file the driver wrote there, with its content)."""
    import ray

    import onboard

    try:
        sees_out = Path(token_file).read_text() == token
    except OSError:
        sees_out = False
    return {
        "ip": ray.util.get_node_ip_address(),
        "version": onboard.__version__,
        "missing": [p for p in paths if not os.access(p, os.R_OK)],
        "out": sees_out and os.access(Path(token_file).parent, os.W_OK),
    }


# ---- the driver ------------------------------------------------------------------


def _check_nodes(ray, selection, partial: Path, log) -> None:
    """Every node must run this onboard and see MODEL_DIR and the output directory
    at the driver's paths; refuse (exit 2) naming the node otherwise."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import onboard

    token = uuid.uuid4().hex
    token_file = partial / f".probe-{token}"
    token_file.write_text(token)
    paths = [
        str(selection.model_dir / "config.json"),
        *(str(s.path) for s in selection.shards),
    ]
    probe = ray.remote(_probe)
    try:
        refs = {
            probe.options(
                num_cpus=0,
                max_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    n["NodeID"], soft=False
                ),
            ).remote(paths, str(token_file), token): n["NodeManagerAddress"]
            for n in _alive_nodes(ray)
        }
        ready, late = ray.wait(
            list(refs), num_returns=len(refs), timeout=PROBE_TIMEOUT_S
        )
        problems = []
        for ref in ready:
            try:
                seen = ray.get(ref)
            except ray.exceptions.RayError as exc:
                name = type(exc).__name__
                log(f"warning: ray: node {refs[ref]} failed the check: {name}")
                continue
            where = f"node {seen['ip']}"
            if seen["version"] != onboard.__version__:
                problems.append(
                    f"{where} runs onboard {seen['version']}, this one "
                    f"{onboard.__version__}"
                )
            if missing := seen["missing"]:
                more = f" (and {len(missing) - 1} more)" if missing[1:] else ""
                problems.append(f"{where} cannot read {missing[0]}{more}")
            if not seen["out"]:
                problems.append(f"{where} cannot see or write {partial}")
        for ref in late:
            ray.cancel(ref, force=True)
            log(
                f"warning: ray: node {refs[ref]} did not answer the storage check in "
                f"{PROBE_TIMEOUT_S:g} s"
            )
    finally:
        token_file.unlink(missing_ok=True)
    if problems:
        raise InputError(
            "--ray: "
            + "; ".join(problems)
            + ". MODEL_DIR and the directory of --out must be on storage every "
            "node mounts at the same path, and every node must run the same "
            "onboard; nothing was written"
        )


def _run(cluster: Cluster, pending: list, show: bool, log) -> Iterator:
    """Run every unit of run.py's ``_JOB`` on the cluster; yield (shard, size,
    sha256) as shards are finished, as run.py's local ``_run`` does."""
    from rich.progress import BarColumn, TextColumn

    from onboard.quantize import run as local

    ray = import_ray()
    job = local._JOB
    selection = job["selection"]
    _check_nodes(ray, selection, job["partial"], log)
    key = uuid.uuid4().hex
    job_ref = ray.put(dict(job))
    unit = ray.remote(_unit_task).options(
        num_cpus=1,
        max_retries=TASK_RETRIES,
        retry_exceptions=False,
        scheduling_strategy="SPREAD",
    )
    schedule = local._Schedule(selection, pending)
    total = sum(t.nbytes for t in job["tasks"])
    columns = (
        TextColumn("quantize {task.fields[scheme]} on {task.fields[nodes]} nodes"),
        BarColumn(bar_width=16),
        TextColumn("{task.fields[shards]} shards"),
    )
    by_node: Counter = Counter()
    finished = 0
    nodes, checked = cluster.nodes, time.monotonic()
    started = time.monotonic()
    running: dict = {}
    with local.byte_progress(show, *columns) as bar:
        task = bar.add_task(
            "",
            total=total,
            scheme=selection.scheme.name,
            nodes=nodes,
            shards=f"0/{len(pending)}",
        )
        try:
            while schedule.ready or running:
                # Twice the CPUs in flight: every CPU busy, and a finished shard's
                # flush and hash still go ahead of the remaining tasks.
                while schedule.ready and len(running) < 2 * cluster.cpus:
                    item = schedule.ready.popleft()
                    running[unit.remote(key, [job_ref], item)] = item
                ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                if ready:
                    ready, _ = ray.wait(
                        list(running), num_returns=len(running), timeout=0
                    )
                for ref in ready:
                    item = running.pop(ref)
                    result, nbytes, node = _get(ray, ref, item)
                    by_node[node] += nbytes
                    bar.advance(task, nbytes)
                    if (shard := schedule.done(item, result)) is not None:
                        finished += 1
                        bar.update(task, shards=f"{finished}/{len(pending)}")
                        yield shard
                if time.monotonic() - checked > 5:
                    checked = time.monotonic()
                    alive = _alive_nodes(ray)
                    nodes = len(alive)
                    cluster.cpus = max(
                        1, int(sum(n["Resources"].get("CPU", 0) for n in alive))
                    )
                    bar.update(task, nodes=nodes)
        except BaseException:
            # Stop the units still running: nothing writes into the partial
            # directory once the driver has given up on it.
            for ref in running:
                ray.cancel(ref, force=True)
            raise
    seconds = max(time.monotonic() - started, 1e-9)
    done = sum(by_node.values())
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    log(
        f"ray: {done / 1e9:.3f} GB in {seconds:.1f} s ({done / 1e9 / seconds:.3f} "
        f"GB/s) on {len(by_node)} nodes: "
        + ", ".join(
            f"{node[:8]} ({ips.get(node, '?')}) {n / max(done, 1):.0%}"
            for node, n in sorted(by_node.items())
        )
    )


def _get(ray, ref, item):
    """A unit's result; a failure in words (exit 2) where it is not a bug."""
    from onboard.quantize.run import ResumableError

    what = f"shard {item[1]}" if item[0] == "finish" else f"task {item[1]}"
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, ResumableError | InputError):
            raise type(cause)(str(cause)) from None
        if isinstance(cause, OSError):
            raise ResumableError(
                f"--ray: {what} failed on a node: {cause}. The finished shards "
                "are kept: rerun the same command to resume"
            ) from None
        raise
    except ray.exceptions.RayError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ResumableError(
            f"--ray: the cluster lost {what} {TASK_RETRIES + 1} times "
            f"({type(exc).__name__}: {first}). The finished shards are kept: "
            "rerun the same command to resume"
        ) from None


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
