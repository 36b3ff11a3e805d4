"""One shard: read each tensor, quantize or copy it, write it at its planned offset."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from onboard.errors import InputError
from onboard.quantize import kernels, st_io
from onboard.quantize.plan import Plan, ShardPlan


def process_shard(
    plan: Plan,
    shard: ShardPlan,
    partial: Path,
    calib: dict[str, float] | None,
    report: Callable[[int], None],
) -> tuple[str, int, str]:
    """Write ``partial/<shard>``; return (name, size, sha256)."""
    scheme = plan.scheme
    tmp = partial / f"{shard.name}.{os.getpid()}.tmp"
    writer = st_io.ShardWriter(tmp, shard.outputs)
    fds: dict[str, int] = {}

    def fd_of(shard_name: str) -> int:
        if shard_name not in fds:
            fds[shard_name] = os.open(plan.model_dir / shard_name, os.O_RDONLY)
        return fds[shard_name]

    def load(name: str) -> tuple[torch.Tensor, tuple]:
        q = plan.quantized[name]
        w = st_io.read_tensor(fd_of(q.shard), q.src)
        try:
            return w, kernels.observe(w, scheme)
        except kernels.NonFiniteWeights:
            raise InputError(
                f"{plan.model_dir / q.shard}: {name} has NaN or infinite values "
                "(a corrupt shard?)"
            ) from None

    done: set[str] = set()
    try:
        for t in shard.tensors:
            if t.name not in plan.quantized:
                writer.copy_from(t.name, fd_of(shard.name), t)
                report(t.nbytes)
                continue
            if t.name in done:
                continue
            # Fused partners (NVFP4) share one global scale: load them together,
            # including any that live in another shard (read, not written, here).
            members = plan.fused_partners(t.name)
            weights = {m: load(m) for m in members}
            gscale = None
            if scheme.global_scale:
                amaxes = [kernels.absmax(stats) for _, stats in weights.values()]
                gscale = kernels.global_scale(amaxes)
            for m, (w, stats) in weights.items():
                q = plan.quantized[m]
                if q.shard != shard.name:
                    continue
                in_gscale = None
                if scheme.calibrated:
                    in_gscale = kernels.input_global_scale(calib[q.module])
                out = kernels.quantize_weight(
                    w, scheme, q.module, gscale, in_gscale, stats
                )
                for name, value in out.items():
                    writer.write(name, value)
                done.add(m)
                report(q.src.nbytes)
            del weights
        sha = writer.finish()
    except BaseException:
        writer.abort()
        tmp.unlink(missing_ok=True)
        raise
    finally:
        for fd in fds.values():
            os.close(fd)
    final = partial / shard.name
    os.replace(tmp, final)
    return shard.name, final.stat().st_size, sha
