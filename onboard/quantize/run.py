"""Run a plan: shards in parallel worker processes, resumable, atomically published.

Output goes to ``.<out>.partial/`` beside the output directory, which is renamed to
``<out>`` only once every shard, the index, config.json and the manifest are in
place: a directory named ``<out>`` is always complete. Each finished shard is
fsynced, renamed into the partial directory and recorded in its ``state.json``
(size and sha256) before the next one is trusted, so a killed run resumes at the
first unfinished shard; a state written for other inputs or options is discarded.
Workers are forked (sharing the imported libraries and the plan), use one torch
thread per core they are given, and die with their parent.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import multiprocessing as mp
import os
import queue
import shutil
import signal
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from pathlib import Path

from onboard.errors import InputError
from onboard.fsutil import atomic_write_text
from onboard.quantize import st_io
from onboard.quantize.plan import INDEX_FILE, Plan, ShardPlan
from onboard.quantize.schemes import quantization_config

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

# The plan and calibration of the running job, inherited by forked workers.
_JOB: dict = {}
_PROGRESS: mp.Queue | None = None


def default_workers(plan: Plan, pending: list[ShardPlan]) -> int:
    """One worker per core, no more than shards, and within memory.

    A worker holds at most a few copies of its largest tensor, far below a shard;
    (workers x largest shard + 1 GB) is the bound promised, so it is what we fit.
    """
    cores = len(os.sched_getaffinity(0))
    largest = max((s.nbytes for s in pending), default=1)
    avail = _available_memory()
    by_memory = max(1, (avail - RESERVED_BYTES) // max(largest, 1))
    return int(max(1, min(cores, len(pending), by_memory)))


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def fingerprint(plan: Plan, options: dict) -> dict:
    """What a resumed run must share with the interrupted one."""
    return {
        "format_version": FORMAT_VERSION,
        "scheme": plan.scheme.name,
        "options": options,
        "inputs": [
            [s.name, s.path.stat().st_size, s.path.stat().st_mtime_ns]
            for s in plan.shards
        ],
        "config_mtime_ns": (plan.model_dir / "config.json").stat().st_mtime_ns,
    }


def execute(
    plan: Plan,
    out_dir: Path,
    *,
    options: dict,
    workers: int | None,
    calibration: Callable[[], dict[str, float]] | None,
    progress: bool,
    log: Callable[[str], None],
) -> Path:
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
                plan, out_dir, partial, options, workers, calibration, progress, log
            )
        finally:
            lock_path.unlink(missing_ok=True)
    return result


def _execute_locked(
    plan, out_dir, partial, options, workers, calibration, progress, log
):
    fp = fingerprint(plan, options)
    state = _load_state(partial, fp, log)
    if state is None:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        state = {"fingerprint": fp, "calibration": None, "shards": {}}
        _save_state(partial, state)

    if plan.scheme.calibrated and state["calibration"] is None:
        assert calibration is not None
        state["calibration"] = calibration()
        _save_state(partial, state)
    _JOB.clear()
    _JOB.update(plan=plan, partial=partial, calib=state["calibration"])

    pending = [s for s in plan.shards if s.name not in state["shards"]]
    if len(pending) < len(plan.shards):
        log(
            f"resuming: {len(plan.shards) - len(pending)} of {len(plan.shards)} "
            "shards already done"
        )
    if pending:
        n = workers or default_workers(plan, pending)
        for name, size, sha in _run_shards(pending, n, progress):
            state["shards"][name] = {"size": size, "sha256": sha}
            _save_state(partial, state)

    _finish(plan, partial, state)
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
    if state.get("fingerprint") != fp:
        log(f"discarding {partial}: it was started with other inputs or options")
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


def _report(nbytes: int) -> None:
    if _PROGRESS is not None:
        _PROGRESS.put(nbytes)


def _shard_job(index: int) -> tuple[str, int, str]:
    from onboard.quantize.worker import process_shard

    plan: Plan = _JOB["plan"]
    shard = plan.shards[index]
    return process_shard(plan, shard, _JOB["partial"], _JOB["calib"], _report)


def _run_shards(pending: list[ShardPlan], workers: int, show: bool):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    global _PROGRESS
    plan: Plan = _JOB["plan"]
    indices = [plan.shards.index(s) for s in pending]
    total = sum(s.nbytes for s in pending)
    columns = (
        TextColumn("quantize {task.fields[scheme]}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    console = Console(stderr=True)
    with Progress(*columns, console=console, disable=not show, transient=False) as bar:
        task = bar.add_task("", total=total, scheme=plan.scheme.name)
        if workers <= 1:
            import torch

            from onboard.quantize.worker import process_shard

            before = torch.get_num_threads()
            torch.set_num_threads(len(os.sched_getaffinity(0)))
            _PROGRESS = None
            try:
                for i in indices:
                    yield process_shard(
                        plan,
                        plan.shards[i],
                        _JOB["partial"],
                        _JOB["calib"],
                        lambda n: bar.advance(task, n),
                    )
            finally:
                torch.set_num_threads(before)
            return
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        with ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(q, threads)
        ) as pool:
            futures = {pool.submit(_shard_job, i) for i in indices}
            try:
                while futures:
                    done, futures = wait(
                        futures, timeout=0.1, return_when=FIRST_EXCEPTION
                    )
                    _drain(q, bar, task)
                    for f in done:
                        yield f.result()
            except BaseException:
                # Stop the other shards now: kill the workers, keep the partial dir.
                procs = list((getattr(pool, "_processes", None) or {}).values())
                pool.shutdown(wait=False, cancel_futures=True)
                for p in procs:
                    p.kill()
                raise
            _drain(q, bar, task)


def _drain(q, bar, task) -> None:
    while True:
        try:
            bar.advance(task, q.get_nowait())
        except queue.Empty:
            return


# ---- the files around the shards ----------------------------------------------


def _finish(plan: Plan, partial: Path, state: dict) -> None:
    config = dict(plan.config)
    config["quantization_config"] = quantization_config(plan.scheme, plan.ignore)
    _write_json(partial / "config.json", config)
    weight_map = {}
    total = 0
    for shard in plan.shards:
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
    skip = {s.name for s in plan.shards} | {INDEX_FILE, "config.json"}
    for src in sorted(plan.model_dir.iterdir()):
        if src.name in skip or src.name.startswith(".") or not src.is_file():
            continue  # subdirectories (e.g. original/ consolidated weights) too
        if src.suffix in WEIGHT_SUFFIXES:
            continue  # other copies of the weights would be stale
        shutil.copyfile(src, partial / src.name)
    _write_json(
        partial / MANIFEST_FILE,
        {
            "format_version": FORMAT_VERSION,
            "scheme": plan.scheme.name,
            "options": state["fingerprint"]["options"],
            "quantized_modules": len(plan.quantized),
            "kept_tensors": dict(sorted(plan.kept.items())),
            "calibration": state["calibration"],
            "shards": {k: state["shards"][k] for k in sorted(state["shards"])},
        },
    )
    (partial / STATE_FILE).unlink()


def _write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    path.chmod(0o644)  # a published file, not the temporary file's 0600
