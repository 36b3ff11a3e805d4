"""torch.profiler around a batch inside a vLLM worker, driven by collective_rpc
(``benchmarks/codegen_speed.py --profile``): ``start`` then ``stop`` return the
operators that took the most self CPU time in between."""

from __future__ import annotations

import torch

_running: dict[str, torch.profiler.profile] = {}


def start(worker) -> bool:
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    profiler.__enter__()
    _running["profiler"] = profiler
    return True


def stop(worker, top: int = 12) -> list[dict]:
    profiler = _running.pop("profiler")
    profiler.__exit__(None, None, None)
    events = sorted(
        profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True
    )
    return [
        {
            "op": e.key,
            "calls": e.count,
            "self_ms": round(e.self_cpu_time_total / 1000, 2),
            "ms_per_call": round(e.self_cpu_time_total / 1000 / max(e.count, 1), 4),
        }
        for e in events[:top]
    ]


def cpu_seconds(worker) -> float:
    """CPU time (user + system) this worker process has used so far: unlike wall
    time, barely moved by other processes sharing the cores."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
