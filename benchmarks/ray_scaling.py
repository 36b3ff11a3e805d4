"""Scaling of `onboard quantize --ray` over 1, 2 and 4 Ray nodes on this machine.

    flock /tmp/onboard-cpu.lock .venv/bin/python benchmarks/ray_scaling.py \\
        [--dir DIR] [--nodes 1,2,4] [--schemes fp8-dynamic,nvfp4a16] [--json OUT]

A Ray cluster of N one-CPU worker nodes on 127.0.0.1 (``ray.cluster_utils.Cluster``,
a head with no CPU) quantizes two bf16 Llama checkpoints (benchmarks/
make_checkpoint.py, written to DIR on first use): ``large``, few large tensors
(~190 MB, 8 shards), and ``small``, many small ones (~38 MB, ~1,000 tasks), which
separate the cost per byte from the cost per task. The driver runs in this process
(``quantize_checkpoint(ray=ADDRESS)``), each run a new Ray job as a user's command
is. Per run: the task phase (from the first task to the last shard, the ``ray: ...
GB in ... s`` line) and the whole call (connecting, planning, the node check, the
final files).

Fitted per scheme, by least squares over the runs with N <= the machine's cores
(one core per node, so that nodes do not share a core):

    task phase = start + bytes / (N x per-node bandwidth) + tasks x per-task cost / N

``start`` is the new job's worker processes starting (imports), before any task
ends. The 4-node runs share this machine's 2 cores: measured, and compared with
the model at min(N, cores). Prints a table with each run's residual (measured -
model), the fitted constants and the fit's RMS residual (JSON with --json);
docs/benchmarks.md has a run. `onboard plan --node-gbps` (onboard/serving/
quantize_time.py) uses the fitted per-task cost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from make_checkpoint import write_llama_checkpoint  # noqa: E402

CHECKPOINTS = {
    "large": dict(
        hidden=1024, intermediate=2816, layers=8, vocab=2048, heads=8, kv=4, shards=8
    ),
    "small": dict(
        hidden=128, intermediate=256, layers=128, vocab=1024, heads=4, kv=2, shards=8
    ),
}
PHASE = re.compile(r"ray: ([\d.]+) GB in ([\d.]+) s")


def checkpoint(base: Path, name: str) -> Path:
    path = base / name
    if not (path / "model.safetensors.index.json").exists():
        shutil.rmtree(path, ignore_errors=True)
        write_llama_checkpoint(path, **CHECKPOINTS[name])
    return path


def count_tasks(ckpt: Path, scheme: str) -> tuple[int, int]:
    """(input bytes, tasks) of quantizing ``ckpt`` with ``scheme``."""
    from onboard.quantize import own_spec
    from onboard.quantize.schemes import get_scheme
    from onboard.quantize.selection import make_selection
    from onboard.quantize.worker import make_tasks

    plan = make_selection(ckpt, own_spec(ckpt, None), get_scheme(scheme))
    tasks = make_tasks(plan, [s.name for s in plan.shards])
    # (the shards' finishes are units too)
    return sum(t.nbytes for t in tasks), len(tasks) + len(plan.shards)


def run_once(ckpt: Path, scheme: str, out: Path, address: str) -> tuple[float, float]:
    from onboard.quantize import quantize_checkpoint

    shutil.rmtree(out, ignore_errors=True)
    lines: list[str] = []
    started = time.perf_counter()
    quantize_checkpoint(ckpt, scheme, out, ray=address, log=lines.append)
    wall = time.perf_counter() - started
    phase = next(float(m[2]) for x in lines if (m := PHASE.search(x)))
    shutil.rmtree(out)
    return phase, wall


def fit(rows: list[dict], cores: int) -> dict:
    """Least squares of the task phase on [1, bytes/N, tasks/N]. A bytes term
    that comes out negative (time not growing with bytes: not resolved) is
    dropped and the fit redone on [1, tasks/N]; the RMS residual is the final
    model's."""
    use = [r for r in rows if r["nodes"] <= cores]
    a = np.array([[1.0, r["bytes"] / r["nodes"], r["tasks"] / r["nodes"]] for r in use])
    y = np.array([r["phase_s"] for r in use])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    if coef[1] <= 0:
        sub, *_ = np.linalg.lstsq(a[:, [0, 2]], y, rcond=None)
        coef = np.array([sub[0], 0.0, sub[1]])
    start, per_byte, per_task = (float(c) for c in coef)
    return {
        "start_s": start,
        # None: the bytes term is not resolved (time does not grow with bytes).
        "node_gb_per_s": 1e-9 / per_byte if per_byte > 0 else None,
        "task_s": per_task,
        "runs": len(use),
        "rms_residual_s": float(np.sqrt(np.mean((a @ coef - y) ** 2))),
    }


def predict(model: dict, nbytes: int, tasks: int, nodes: int) -> float:
    bw = model["node_gb_per_s"]
    per_byte = nbytes / 1e9 / bw / nodes if bw else 0.0
    return model["start_s"] + per_byte + tasks * model["task_s"] / nodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/onboard-ray-bench"))
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--schemes", default="fp8-dynamic,nvfp4a16")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import ray  # noqa: F401  (fails here, not in the first run, without Ray)
    from ray.cluster_utils import Cluster

    args.dir.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    schemes = args.schemes.split(",")
    ckpts = {name: checkpoint(args.dir, name) for name in CHECKPOINTS}
    sizes = {(c, s): count_tasks(ckpts[c], s) for c in ckpts for s in schemes}
    rows: list[dict] = []
    for nodes in map(int, args.nodes.split(",")):
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "include_dashboard": False},
        )
        try:
            for _ in range(nodes):
                cluster.add_node(num_cpus=1, object_store_memory=96 << 20)
            for scheme in schemes:
                for name, ckpt in ckpts.items():
                    nbytes, tasks = sizes[name, scheme]
                    for _ in range(args.repeats):
                        phase, wall = run_once(
                            ckpt, scheme, args.dir / "out", cluster.address
                        )
                        row = dict(
                            nodes=nodes,
                            scheme=scheme,
                            checkpoint=name,
                            bytes=nbytes,
                            tasks=tasks,
                            phase_s=round(phase, 2),
                            wall_s=round(wall, 2),
                        )
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            cluster.shutdown()

    models = {s: fit([r for r in rows if r["scheme"] == s], cores) for s in schemes}
    print(f"\n{cores} cores; task phase model per scheme:")
    for s, m in models.items():
        bw = m["node_gb_per_s"]
        per_node = f"{bw:.3f} GB/s" if bw else "(not resolved)"
        print(
            f"  {s}: start {m['start_s']:.2f} s + bytes / (N x {per_node}) + "
            f"tasks x {m['task_s'] * 1e3:.2f} ms / N  "
            f"(RMS residual {m['rms_residual_s']:.2f} s over {m['runs']} runs)"
        )
    print(
        f"\n{'scheme':<12} {'ckpt':<6} {'N':>2} {'GB':>6} {'tasks':>6} "
        f"{'phase s':>8} {'model s':>8} {'resid s':>8} {'wall s':>7}"
    )
    for r in rows:
        m = models[r["scheme"]]
        pred = predict(m, r["bytes"], r["tasks"], min(r["nodes"], cores))
        r["model_s"] = round(pred, 2)
        r["residual_s"] = round(r["phase_s"] - pred, 2)
        print(
            f"{r['scheme']:<12} {r['checkpoint']:<6} {r['nodes']:>2} "
            f"{r['bytes'] / 1e9:>6.3f} {r['tasks']:>6} {r['phase_s']:>8.2f} "
            f"{pred:>8.2f} {r['residual_s']:>8.2f} {r['wall_s']:>7.2f}"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"cores": cores, "models": models, "runs": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
