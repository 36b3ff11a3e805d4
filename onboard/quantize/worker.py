"""Tasks: the units of work spread over the workers, and running one.

A task is one quantized weight, or a fused set of them (NVFP4's shared global
scale), or one or a few tensors copied unchanged. Tasks, not shards, are handed to
workers, so that the workers stay busy until the end instead of one idling while
another finishes the larger shard. Every task writes its tensors at their planned
offsets into the output shards' files, which the parent created (header, full
size) beforehand; a shard is finished (fsynced, hashed, renamed) once every task
writing into it is done.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from onboard.errors import InputError
from onboard.quantize import st_io
from onboard.quantize.selection import Selection

SMALL_COPY = 1 << 20  # unchanged tensors below this size are copied in batches


@dataclass(frozen=True)
class Task:
    names: tuple[str, ...]  # input tensors
    shards: tuple[str, ...]  # output shards it writes into
    quantize: bool  # else: copied unchanged
    nbytes: int  # input bytes (its cost, roughly)


def make_tasks(selection: Selection, pending: list[str]) -> list[Task]:
    """The tasks that write the ``pending`` shards, in the order to run them.

    Shard by shard (a shard's file can be finished while the next is worked on),
    largest first within a shard (the last tasks are short, so the workers end
    together). A fused set spanning shards is read whole, written only where its
    shard is pending.
    """
    todo = set(pending)
    rank = {name: i for i, name in enumerate(pending)}
    infos = {t.name: t for s in selection.shards for t in s.tensors}
    tasks: list[Task] = []
    seen: set[str] = set()
    for shard in selection.shards:
        if shard.name not in todo:
            continue
        small: list[str] = []
        for t in shard.tensors:
            if t.name not in selection.quantized:
                if t.nbytes < SMALL_COPY:
                    small.append(t.name)
                else:
                    tasks.append(Task((t.name,), (shard.name,), False, t.nbytes))
                continue
            if t.name in seen:
                continue
            members = tuple(selection.fused_partners(t.name))
            seen.update(members)
            shards = tuple(
                sorted(
                    {selection.quantized[m].shard for m in members} & todo, key=rank.get
                )
            )
            size = sum(infos[m].nbytes for m in members)
            tasks.append(Task(members, shards, True, size))
        if small:
            size = sum(infos[n].nbytes for n in small)
            tasks.append(Task(tuple(small), (shard.name,), False, size))
    tasks.sort(key=lambda t: (rank[t.shards[-1]], -t.nbytes))
    return tasks


def temp_path(partial: Path, shard: str) -> Path:
    return partial / f"{shard}.tmp"


def run_task(
    selection: Selection,
    task: Task,
    partial: Path,
    offsets: dict[str, dict[str, int]],
    calib: dict[str, float] | None,
    report: Callable[[int], None],
) -> list[tuple[str, str]]:
    """Do ``task``; return the (shard, output tensor) pairs it wrote."""
    from onboard.quantize import kernels

    scheme = selection.scheme
    planned = {s: {t.name: t for t in selection.shard(s).outputs} for s in task.shards}
    fds: dict[Path, int] = {}

    def fd_of(path: Path, flags: int) -> int:
        if path not in fds:
            fds[path] = os.open(path, flags)
        return fds[path]

    def source(name: str) -> tuple[int, st_io.TensorInfo]:
        shard = selection.tensor_shard[name]
        return fd_of(selection.model_dir / shard, os.O_RDONLY), selection.info(name)

    written: list[tuple[str, str]] = []

    def write(shard: str, name: str, value, first_row: int | None = None) -> None:
        fd = fd_of(temp_path(partial, shard), os.O_RDWR)
        st_io.write_tensor(
            fd, offsets[shard][name], planned[shard][name], value, first_row
        )
        if not first_row:  # (once per tensor)
            written.append((shard, name))

    def non_finite(name: str) -> InputError:
        return InputError(
            f"{selection.model_dir / selection.tensor_shard[name]}: {name} has NaN or "
            "infinite values (a corrupt shard?); nothing was written"
        )

    try:
        if not task.quantize:
            shard = task.shards[0]
            dst = fd_of(temp_path(partial, shard), os.O_RDWR)
            for name in task.names:
                src, info = source(name)
                if info.dtype in st_io.FLOAT_INPUTS and info.nbytes:
                    if not kernels.all_finite(st_io.map_tensor(src, info)):
                        raise non_finite(name)
                st_io.copy_tensor(src, info, dst, offsets[shard][name])
                written.append((shard, name))
                report(info.nbytes)
            return written

        def load(name: str):
            fd, info = source(name)
            w = st_io.map_tensor(fd, info)
            if kernels.observes_by_block(scheme, w.dtype):
                return w, None  # observed while quantized (fp8-dynamic)
            try:
                return w, kernels.observe(w, scheme)
            except kernels.NonFiniteWeights:
                raise non_finite(name) from None

        # Fused partners (NVFP4) share one global scale: loaded together,
        # including any in a finished shard (read, not written, here).
        weights = {m: load(m) for m in task.names}
        gscale = None
        if scheme.global_scale:
            gscale = kernels.global_scale(
                [kernels.absmax(stats) for _, stats in weights.values()]
            )
        for m in task.names:
            q = selection.quantized[m]
            if q.shard not in task.shards:
                continue
            w, stats = weights.pop(m)
            in_gscale = None
            if scheme.calibrated:
                in_gscale = kernels.input_global_scale(calib[q.module])
            try:
                out = kernels.quantize_weight(
                    w,
                    scheme,
                    q.module,
                    gscale,
                    in_gscale,
                    stats,
                    sink=lambda name, row, block, s=q.shard: write(s, name, block, row),
                )
            except kernels.NonFiniteWeights:
                raise non_finite(m) from None
            for name, value in out.items():
                write(q.shard, name, value)
            report(q.src.nbytes)
        return written
    finally:
        for fd in fds.values():
            os.close(fd)


def finish_shard(partial: Path, shard: str) -> tuple[str, int, str]:
    """Flush a shard's complete file, move it to its name; (name, size, sha256)."""
    tmp = temp_path(partial, shard)
    final = partial / shard
    if not tmp.exists() and final.exists():
        # Renamed by an earlier attempt of this unit, which did not get to answer
        # (a Ray task retried after its node was lost): the file is complete.
        return shard, final.stat().st_size, st_io.finish_file(final)
    sha = st_io.finish_file(tmp)
    os.replace(tmp, final)
    return shard, final.stat().st_size, sha
