"""Observe the FP4 schemes' weights while torch imports.

``onboard quantize`` spends about a second importing torch and compressed-tensors
on one core before it can quantize anything, while the other cores idle. The
observer of the FP4 schemes (kernels.observe's fast path: the largest magnitude
per group, taken on the bit patterns with the sign cleared, whose integer order is
the order of the magnitudes) needs nothing but the weight's bits. So a process
forked before those imports computes it with numpy, per 16 values (a group of
16 m values is the largest of m of them), for the weights the plan will quantize,
into memory shared with the parent; it stops after the weight it is on when the
parent is ready for the workers (:meth:`Prescan.finish`). The workers take the
finished weights' maxima from there and observe the others themselves; the values
are the same either way (tests/test_quantize_prescan.py).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from onboard.quantize import st_io
from onboard.quantize.worker import die_with_parent

# The schemes whose observer is the absolute maximum per group of a multiple of 16
# (NVFP4: 16, MXFP4: 32; tests/test_quantize_prescan.py checks this against the
# compressed-tensors presets). Named here because the point is to start before
# compressed-tensors (and torch) are imported.
SCHEMES = ("nvfp4", "nvfp4a16", "mxfp4")
GROUP = 16
# At most this much shared memory for the maxima (1/16 of the weights' bytes): a
# second of one core covers about 1 GB of weights, 64 MB of maxima.
MAX_BYTES = 128 << 20
_ROWS_BYTES = 1 << 21  # input bytes per numpy pass (stays in cache)
_SIGN_CLEARED = 0x7FFF


@dataclass(frozen=True)
class _Entry:
    path: Path
    tensor: st_io.TensorInfo
    offset: int  # of its maxima in the shared memory


class Prescan:
    """The forked observer; :meth:`finish` stops it and returns what it did."""

    def __init__(self, entries: list[_Entry], memory: mmap.mmap, pid: int):
        self.entries, self.memory, self.pid = entries, memory, pid
        self._done: dict | None = None

    def finish(self, stop: bool = True) -> dict[str, object]:
        """Stop the observer after its current weight (``stop=False``: let it
        observe them all); {tensor name: maxima per 16 values, a (rows, cols / 16)
        tensor of the weight's dtype} of the weights it finished. The tensors view
        the shared memory (forked workers inherit it, no copy). Called again, the
        same."""
        if self._done is None:
            self._done = self._collect(stop)
        return self._done

    def _collect(self, stop: bool) -> dict[str, object]:
        import torch

        from onboard.quantize.kernels import TORCH_DTYPES

        if stop:
            self.memory[len(self.memory) - 1] = 1
        _, status = os.waitpid(self.pid, 0)
        flags = len(self.memory) - 1 - len(self.entries)
        done = {}
        for i, e in enumerate(self.entries):
            if not (status == 0 and self.memory[flags + i] == 1):
                continue
            rows, cols = e.tensor.shape
            count = rows * cols // GROUP
            bits = torch.frombuffer(
                self.memory, dtype=torch.int16, count=count, offset=e.offset
            )
            done[e.tensor.name] = bits.view(TORCH_DTYPES[e.tensor.dtype]).reshape(
                rows, cols // GROUP
            )
        return done


def start(weights: list[tuple[Path, st_io.TensorInfo]]) -> Prescan | None:
    """Fork the observer over ``weights`` (plan.weights_to_quantize): the 16-bit
    2-D ones whose rows are whole groups, in order, as many as MAX_BYTES of maxima
    hold. None where there is nothing to observe or no fork."""
    entries, offset = [], 0
    for path, t in weights:
        if t.dtype not in ("BF16", "F16") or len(t.shape) != 2 or t.shape[1] % GROUP:
            continue
        size = t.nbytes // GROUP
        if offset + size > MAX_BYTES:
            break
        entries.append(_Entry(path, t, offset))
        offset += size
    if not entries or not hasattr(os, "fork"):
        return None
    # Maxima, then a done flag per weight, then the stop flag.
    memory = mmap.mmap(-1, offset + len(entries) + 1)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            die_with_parent()
            _observe(entries, memory)
            code = 0
        finally:
            os._exit(code)  # no interpreter teardown in a forked child
    return Prescan(entries, memory, pid)


def _observe(entries: list[_Entry], memory: mmap.mmap) -> None:
    import numpy as np

    flags = len(memory) - 1 - len(entries)
    stop = len(memory) - 1
    files: dict[Path, mmap.mmap] = {}
    for i, e in enumerate(entries):
        if memory[stop]:
            return
        if e.path not in files:
            with open(e.path, "rb") as f:
                files[e.path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        rows, cols = e.tensor.shape
        bits = np.frombuffer(
            files[e.path], np.uint16, rows * cols, e.tensor.start
        ).reshape(rows, cols)
        out = np.frombuffer(memory, np.uint16, rows * cols // GROUP, e.offset)
        out = out.reshape(rows, cols // GROUP)
        step = max(1, _ROWS_BYTES // (2 * cols))
        cleared = np.empty((min(step, rows), cols), np.uint16)
        for r in range(0, rows, step):
            n = min(step, rows - r)
            a = np.bitwise_and(bits[r : r + n], _SIGN_CLEARED, out=cleared[:n])
            # The maximum of 16 by halving: four vectorised passes, faster than
            # a reduction over a 16-long axis.
            a = a.reshape(n, cols // GROUP, GROUP)
            while a.shape[-1] > 2:
                half = a.shape[-1] // 2
                a = np.maximum(a[..., :half], a[..., half:])
            np.maximum(a[..., 0], a[..., 1], out=out[r : r + n])
        del bits, out
        memory[flags + i] = 1
