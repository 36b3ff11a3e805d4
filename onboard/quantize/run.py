"""Run a selection: tasks in parallel worker processes, resumable, atomically published.

Output goes to ``.<out>.partial/`` beside the output directory, which is renamed to
``<out>`` only once every shard, the index, config.json and the manifest are in
place: a directory named ``<out>`` is always complete. The shards' files are
written as ``<shard>.tmp`` by tasks (worker.py: one weight, or a fused set, or
copied tensors each) that any worker takes as it becomes free; once every task of
a shard is done, the shard is fsynced, hashed, renamed into the partial directory
and recorded in its ``state.json`` (size and sha256), so a killed run resumes with
the unfinished shards; a state written for other inputs or options is discarded.
Workers are forked (sharing the imported libraries and the selection), use one torch
thread per core they are given, and die with their parent. On a Ray cluster
(cluster.py) the same units run as Ray tasks on the cluster's nodes instead, and
everything else here is shared: the state, the resume and the files around the
shards.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import multiprocessing as mp
import os
import queue
import shutil
import signal
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING

from onboard.errors import InputError
from onboard.fsutil import atomic_write_text
from onboard.quantize import st_io
from onboard.quantize.schemes import quantization_config
from onboard.quantize.selection import INDEX_FILE, Selection, ShardSelection
from onboard.threads import torch_threads

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn

STATE_FILE = "state.json"
MANIFEST_FILE = "onboard-quantize.json"
FORMAT_VERSION = 1
RESERVED_BYTES = 1 << 30
WEIGHT_SUFFIXES = {
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".h5",
}  # the "+ 1 GB" of the memory bound, for the parent & libs

# The selection and calibration of the running job, inherited by forked workers.
_JOB: dict = {}
_PROGRESS: mp.Queue | None = None


def default_workers(pending: list[ShardSelection], tasks: int) -> int:
    """One worker per core, no more than tasks, and within memory.

    A worker holds at most a few copies of its largest tensor, far below a shard;
    (workers x largest shard + 1 GB) is the bound promised, so it is what we fit.
    """
    cores = len(os.sched_getaffinity(0))
    largest = max((s.nbytes for s in pending), default=1)
    avail = _available_memory()
    by_memory = max(1, (avail - RESERVED_BYTES) // max(largest, 1))
    return int(max(1, min(cores, tasks, by_memory)))


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def fingerprint(selection: Selection, options: dict) -> dict:
    """What a resumed run must share with the interrupted one.

    Everything the output depends on: onboard's version, the scheme and options,
    config.json, each input shard's identity (size, modification time and its
    header: names, dtypes, shapes, offsets) and the selection's decisions (which
    tensors are quantized, fused, kept, ignored: what the spec's layout and
    keep_unquantized decide). Tensor data is not hashed: that would read the whole
    checkpoint before the first shard is written.
    """
    import onboard

    decisions = {
        "quantized": sorted(selection.quantized),
        "fused": sorted(sorted(names) for names in selection.fused.values()),
        "kept": sorted(selection.kept.items()),
        "ignore": selection.ignore,
        "outputs": {
            s.name: [[t.name, t.dtype, list(t.shape)] for t in s.outputs]
            for s in selection.shards
        },
    }
    return {
        "format_version": FORMAT_VERSION,
        "onboard_version": onboard.__version__,
        "scheme": selection.scheme.name,
        "options": options,
        "config_sha256": _sha256_json(selection.config),
        "inputs": [
            [
                s.name,
                s.path.stat().st_size,
                s.path.stat().st_mtime_ns,
                _sha256_json([[t.name, t.dtype, t.shape, t.start] for t in s.tensors]),
            ]
            for s in selection.shards
        ],
        "plan_sha256": _sha256_json(decisions),
    }


def _sha256_json(value) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def execute(
    selection: Selection,
    out_dir: Path,
    *,
    options: dict,
    workers: int | None,
    calibration: Callable[[], dict[str, float]] | None,
    progress: bool,
    log: Callable[[str], None],
    cluster=None,
) -> Path:
    """Run ``selection`` into ``out_dir``: with local worker processes, or, given a
    connected ``cluster`` (cluster.py), as Ray tasks across its nodes."""
    out_dir = Path(out_dir)
    partial = out_dir.with_name(f".{out_dir.name}.partial")
    lock_path = out_dir.with_name(f".{out_dir.name}.lock")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(
                f"{out_dir}: another `onboard quantize` is writing it"
            ) from None
        try:
            result = _execute_locked(
                selection,
                out_dir,
                partial,
                options,
                workers,
                calibration,
                progress,
                log,
                cluster,
            )
        except ResumableError:
            raise  # (the finished shards stay for the rerun)
        except InputError:
            # A refusal (a non-finite weight, say): no partial output stays behind.
            shutil.rmtree(partial, ignore_errors=True)
            raise
        finally:
            lock_path.unlink(missing_ok=True)
    return result


class ResumableError(InputError):
    """The run stopped for a reason outside the input (a Ray cluster lost): exit 2,
    the finished shards kept for the rerun."""


def _execute_locked(
    selection, out_dir, partial, options, workers, calibration, progress, log, cluster
):
    fp = fingerprint(selection, options)
    state = _load_state(partial, fp, log)
    if state is None:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        state = {"fingerprint": fp, "calibration": None, "shards": {}}
        _save_state(partial, state)

    if selection.scheme.calibrated and state["calibration"] is None:
        assert calibration is not None
        state["calibration"] = calibration()
        _save_state(partial, state)
    pending = [s for s in selection.shards if s.name not in state["shards"]]
    if len(pending) < len(selection.shards):
        log(
            f"resuming: {len(selection.shards) - len(pending)} of "
            f"{len(selection.shards)} "
            "shards already done"
        )
    if pending:
        from onboard.quantize.worker import make_tasks, temp_path

        tasks = make_tasks(selection, [s.name for s in pending])
        offsets = {
            s.name: st_io.create_file(temp_path(partial, s.name), s.outputs)
            for s in pending
        }
        _JOB.clear()
        _JOB.update(
            selection=selection,
            partial=partial,
            calib=state["calibration"],
            tasks=tasks,
            offsets=offsets,
        )
        if cluster is not None:
            shards = cluster.run(pending, progress, log)
        else:
            n = workers or default_workers(pending, len(tasks))
            shards = _run(pending, n, progress)
        for name, size, sha in shards:
            state["shards"][name] = {"size": size, "sha256": sha}
            _save_state(partial, state)

    _finish(selection, partial, state)
    os.replace(partial, out_dir)
    return out_dir


def _load_state(partial: Path, fp: dict, log) -> dict | None:
    path = partial / STATE_FILE
    if not path.exists():
        if partial.exists():
            log(f"discarding {partial}: no state")
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        log(f"discarding {partial}: unreadable state")
        return None
    old = state.get("fingerprint")
    if old != fp:
        changed = sorted(
            k
            for k in fp.keys() | (old if isinstance(old, dict) else {}).keys()
            if not isinstance(old, dict) or old.get(k) != fp.get(k)
        )
        log(
            f"discarding {partial}: it was started with other inputs or options "
            f"({', '.join(map(_FINGERPRINT_WORDS.get, changed, changed))}); "
            "starting fresh"
        )
        return None
    # A shard counts as done only if its file is there and intact.
    for name, rec in list(state["shards"].items()):
        f = partial / name
        if (
            not f.exists()
            or f.stat().st_size != rec["size"]
            or st_io.file_sha256(f) != rec["sha256"]
        ):
            log(f"redoing {name}: its partial output is damaged")
            del state["shards"][name]
    for stray in partial.glob("*.tmp"):
        stray.unlink()
    return state


_FINGERPRINT_WORDS = {
    "format_version": "state format",
    "onboard_version": "onboard version",
    "scheme": "scheme",
    "options": "options",
    "config_sha256": "config.json",
    "inputs": "input shards",
    "plan_sha256": "what is quantized: spec layout or keep_unquantized",
}


def _save_state(partial: Path, state: dict) -> None:
    atomic_write_text(partial / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))


# ---- workers -------------------------------------------------------------------


def _init_worker(progress_queue, threads: int) -> None:
    global _PROGRESS
    _PROGRESS = progress_queue
    # Die with the parent: an orphan must not keep writing into the partial dir.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() == 1:
        os._exit(1)
    import torch

    torch.set_num_threads(threads)
    _keep_freed_memory()


def _keep_freed_memory(keep: bool = True) -> None:
    """Have malloc reuse freed memory instead of returning it to the system.

    torch's intermediates of a weight (scales, observer groups: a few MB each) are
    above glibc's mmap threshold: each is mapped fresh and its pages are faulted
    in and zeroed on first touch, ~1 ns per byte, as much as the arithmetic on
    them. Served from the heap and kept there, they are reused warm instead; the
    peak memory stays the same. (``keep=False``: glibc's default figures.)
    """
    try:
        libc = ctypes.CDLL(None)
        limit = 32 << 20 if keep else 128 << 10  # (32 MB: the most glibc takes)
        libc.mallopt(_M_MMAP_THRESHOLD, limit)
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30 if keep else 128 << 10)
    except (OSError, AttributeError):
        pass  # not glibc


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _report(nbytes: int) -> None:
    if _PROGRESS is not None:
        _PROGRESS.put(nbytes)


def _job(item: tuple[str, int | str]):
    """One unit for a worker: ("task", index) or ("finish", shard name)."""
    return _unit(item, _report)


def _unit(
    item: tuple[str, int | str], report: Callable[[int], None], job: dict | None = None
):
    """Run one unit of ``job`` (default: this process's ``_JOB``)."""
    from onboard.quantize.worker import finish_shard, run_task

    job = _JOB if job is None else job
    kind, what = item
    if kind == "finish":
        return finish_shard(job["partial"], what)
    return run_task(
        job["selection"],
        job["tasks"][what],
        job["partial"],
        job["offsets"],
        job["calib"],
        report,
    )


class _Schedule:
    """Which unit runs next: a finished shard's flush and hash first, then the
    tasks in order; and which shards are complete."""

    def __init__(self, selection: Selection, pending: list[ShardSelection]):
        tasks = _JOB["tasks"]
        self.ready: deque = deque(("task", i) for i in range(len(tasks)))
        self.left = {s.name: 0 for s in pending}
        for t in tasks:
            for shard in t.shards:
                self.left[shard] += 1
        self.expected = {s.name: {t.name for t in s.outputs} for s in pending}
        self.written: dict[str, set[str]] = {s.name: set() for s in pending}

    def done(self, item, result) -> tuple[str, int, str] | None:
        """Record a finished unit; a shard's (name, size, sha256) once it is."""
        if item[0] == "finish":
            return result
        for shard, name in result:
            self.written[shard].add(name)
        for shard in _JOB["tasks"][item[1]].shards:
            self.left[shard] -= 1
            if self.left[shard] == 0:
                missing = self.expected[shard] - self.written[shard]
                if missing:
                    raise AssertionError(f"{shard}: never wrote {sorted(missing)[:5]}")
                self.ready.appendleft(("finish", shard))
        return None


def byte_progress(show: bool, *lead: ProgressColumn) -> Progress:
    """A rich progress bar on stderr over the bytes quantized: the ``lead``
    columns, then bytes done, speed and time left (here and on a Ray cluster)."""
    from rich.console import Console
    from rich.progress import (
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (*lead, DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    return Progress(
        *columns, console=Console(stderr=True), disable=not show, transient=False
    )


def _run(pending: list[ShardSelection], workers: int, show: bool):
    """Run every task; yield (shard, size, sha256) as shards are finished."""
    from rich.progress import BarColumn, TextColumn

    global _PROGRESS
    selection: Selection = _JOB["selection"]
    total = sum(t.nbytes for t in _JOB["tasks"])
    schedule = _Schedule(selection, pending)
    label = TextColumn("quantize {task.fields[scheme]}")
    with byte_progress(show, label, BarColumn()) as bar:
        task = bar.add_task("", total=total, scheme=selection.scheme.name)
        if workers <= 1:
            _PROGRESS = None
            _keep_freed_memory()
            try:
                with torch_threads(len(os.sched_getaffinity(0))):
                    while schedule.ready:
                        item = schedule.ready.popleft()
                        result = _unit(item, lambda n: bar.advance(task, n))
                        if (shard := schedule.done(item, result)) is not None:
                            yield shard
            finally:
                _keep_freed_memory(False)
            return
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        with ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(q, threads)
        ) as pool:
            running: dict = {}
            try:
                while schedule.ready or running:
                    # No more units queued than workers: a shard finished meanwhile
                    # goes ahead of the remaining tasks.
                    while schedule.ready and len(running) < workers:
                        item = schedule.ready.popleft()
                        running[pool.submit(_job, item)] = item
                    done, _ = wait(running, timeout=0.1, return_when=FIRST_COMPLETED)
                    _drain(q, bar, task)
                    for f in done:
                        item = running.pop(f)
                        if (shard := schedule.done(item, f.result())) is not None:
                            yield shard
            except BaseException:
                # Stop the other units now: kill the workers, keep the partial dir.
                procs = list((getattr(pool, "_processes", None) or {}).values())
                manager = getattr(pool, "_executor_manager_thread", None)
                pool.shutdown(wait=False, cancel_futures=True)
                for p in procs:
                    p.kill()
                # Let the pool's manager thread see the dead workers and close its
                # wake-up pipe now: left running, it races the interpreter's exit
                # hook writing to that pipe (OSError: Bad file descriptor, a
                # traceback after the error message; seen under load).
                if manager is not None:
                    manager.join(timeout=30)
                raise
            _drain(q, bar, task)


def _drain(q, bar, task) -> None:
    while True:
        try:
            bar.advance(task, q.get_nowait())
        except queue.Empty:
            return


# ---- the files around the shards ----------------------------------------------


def _finish(selection: Selection, partial: Path, state: dict) -> None:
    config = dict(selection.config)
    config["quantization_config"] = quantization_config(
        selection.scheme, selection.ignore
    )
    _write_json(partial / "config.json", config)
    weight_map = {}
    total = 0
    for shard in selection.shards:
        for t in shard.outputs:
            weight_map[t.name] = shard.name
            total += t.nbytes
    _write_json(
        partial / INDEX_FILE,
        {
            "metadata": {"total_size": total},
            "weight_map": dict(sorted(weight_map.items())),
        },
    )
    skip = {s.name for s in selection.shards} | {INDEX_FILE, "config.json"}
    for src in sorted(selection.model_dir.iterdir()):
        if src.name in skip or src.name.startswith(".") or not src.is_file():
            continue  # subdirectories (e.g. original/ consolidated weights) too
        if src.suffix in WEIGHT_SUFFIXES:
            continue  # other copies of the weights would be stale
        shutil.copyfile(src, partial / src.name)
    _write_json(
        partial / MANIFEST_FILE,
        {
            "format_version": FORMAT_VERSION,
            "scheme": selection.scheme.name,
            "options": state["fingerprint"]["options"],
            "quantized_modules": len(selection.quantized),
            "kept_tensors": dict(sorted(selection.kept.items())),
            "calibration": state["calibration"],
            "shards": {k: state["shards"][k] for k in sorted(state["shards"])},
        },
    )
    (partial / STATE_FILE).unlink()


def _write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    path.chmod(0o644)  # a published file, not the temporary file's 0600
