"""Benchmark `onboard quantize` against llm-compressor and a plain read+write.

    .venv/bin/python benchmarks/quantize_bench.py [--dir DIR] [--runs 3] [--warmup 1]
        [--checkpoints transformers onboard] [--schemes SCHEME ...] [--only NAME ...]
        [--json OUT.json]

On two ~1 GB bf16 checkpoints of the same Llama architecture in two shards
(benchmarks/make_checkpoint.py, made on first use in DIR): ``transformers``, as a
user has it (transformers' model saved with ``save_pretrained``: no spec.yaml,
``dtype`` in config.json) and ``onboard``, onboard's own (with its spec.yaml).
Each command is run on each checkpoint as a user runs it, as a fresh process
(imports included), the commands in turn (A B C ... A B C ...), ``--runs`` rounds
after ``--warmup`` untimed ones; the ratios are paired within a round and a
checkpoint.
Per command: median wall seconds, GB/s (input bytes / wall seconds), the largest
process's peak RSS (timed rounds), and the peak of the whole process tree's
proportional set size (PSS, sampled every 50 ms in the warm-up rounds, not the
timed ones: the sampler's reads of every process's smaps slow a command of
several processes more than one of a single process; forked pages count once),
which is what the memory bound of docs/quantize.md is about.

Commands (named CHECKPOINT/COMMAND, e.g. transformers/onboard-nvfp4a16):
  onboard-<scheme>          .venv/bin/onboard quantize ... --scheme <scheme>
  llmc-model_free-<scheme>  llm-compressor's model_free_ptq (.venv-llmc)
  llmc-oneshot-<scheme>     llm-compressor's oneshot + save_pretrained (.venv-llmc)
  plain-read-write          safetensors load_file + save_file of every shard
for each of ``--schemes`` (default fp8-dynamic and nvfp4a16; any scheme
llm-compressor has a preset for: benchmarks/llmc_quantize.py). Every command
writes its own output directory, removed before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from llmc_quantize import PRESETS  # noqa: E402  (the schemes both tools have)

PY = ROOT / ".venv" / "bin" / "python"
LLMC = ROOT / ".venv-llmc" / "bin" / "python"
ONBOARD = ROOT / ".venv" / "bin" / "onboard"

PLAIN = """
import sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True)
for f in sorted(src.glob("*.safetensors")):
    save_file(load_file(f), dst / f.name, metadata={"format": "pt"})
"""
# The two checkpoints, by the directory each is written to under --dir.
CHECKPOINTS = {"transformers": "hf-bf16", "onboard": "bf16"}
# The modules onboard keeps in 16 bits on this Llama checkpoint, for llm-compressor.
IGNORE = json.dumps(["lm_head", "model.embed_tokens"])


def commands(ckpt: Path, out: Path, schemes: list[str]) -> dict[str, list[str]]:
    cmds = {}
    for scheme in schemes:
        cmds[f"onboard-{scheme}"] = [
            str(ONBOARD), "quantize", str(ckpt), "--scheme", scheme,
            "--out", str(out / f"onboard-{scheme}"),
        ]  # fmt: skip
        for method in ("model_free", "oneshot"):
            name = f"llmc-{method}-{scheme}"
            cmds[name] = [
                str(LLMC), str(ROOT / "benchmarks" / "llmc_quantize.py"), str(ckpt),
                str(out / name), scheme, method, IGNORE,
            ]  # fmt: skip
    cmds["plain-read-write"] = [
        str(PY), "-c", PLAIN, str(ckpt), str(out / "plain-read-write")
    ]  # fmt: skip
    return cmds


def tree_pss(root: psutil.Process) -> int:
    total = 0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            pass
    return total


def run_once(cmd: list[str], out_dir: Path, sample_memory: bool = False) -> dict:
    """One run of ``cmd``: its wall seconds and the largest process's peak RSS;
    with ``sample_memory``, also the peak PSS of its whole process tree, sampled
    every 50 ms. The sampler reads every process's smaps (a few ms each, on the
    same cores), which slows a command of several processes more than one of a
    single process: so the timed rounds run without it, and the tree's memory is
    taken in the untimed warm-up rounds."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for stray in out_dir.parent.glob(f".{out_dir.name}.*"):
        shutil.rmtree(stray, ignore_errors=True)
    # Start with no dirty pages: otherwise the previous command's output (up to
    # 1 GB) is written back during this one and slows it by up to 25% (measured).
    os.sync()
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Drained by a thread (a full pipe would block the command); its end of file
    # comes once every process holding the pipe has exited, so the next command
    # does not start beside this one's lingering children (llm-compressor's).
    errors: list[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()))
    reader.start()
    peak_pss = peak_rss = 0
    if sample_memory:
        ps = psutil.Process(proc.pid)
        while proc.poll() is None:
            peak_pss = max(peak_pss, tree_pss(ps))
            time.sleep(0.05)
    else:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        peak_rss = usage.ru_maxrss * 1024  # the largest process (KiB)
    wall = time.monotonic() - start
    reader.join()
    err = errors[0].decode(errors="replace")
    # Removed at once, so that every command starts with the same page cache (not
    # with the outputs of the commands before it in the round).
    shutil.rmtree(out_dir, ignore_errors=True)
    return {
        "wall_s": wall,
        "peak_tree_pss": peak_pss,
        "peak_rss": peak_rss,
        "rc": proc.returncode,
        "stderr_tail": err[-2000:] if proc.returncode else "",
    }


def paired_ratios(
    results: dict[str, list[dict]], schemes: list[str]
) -> dict[str, list[float | None]]:
    """Round by round, per checkpoint and scheme: llm-compressor's fastest path /
    onboard, onboard / plain."""

    def wall(name: str, r: int) -> float | None:
        runs = results.get(name, [])
        if r < len(runs) and runs[r]["rc"] == 0:
            return runs[r]["wall_s"]
        return None

    rounds = max((len(v) for v in results.values()), default=0)
    kinds = dict.fromkeys(name.partition("/")[0] for name in results)
    ratios: dict[str, list[float | None]] = {}
    for kind in kinds:
        for scheme in schemes:
            speedup, vs_plain = [], []
            for r in range(rounds):
                mine = wall(f"{kind}/onboard-{scheme}", r)
                llmc = [
                    w
                    for m in ("model_free", "oneshot")
                    if (w := wall(f"{kind}/llmc-{m}-{scheme}", r)) is not None
                ]
                plain = wall(f"{kind}/plain-read-write", r)
                speedup.append(round(min(llmc) / mine, 2) if mine and llmc else None)
                vs_plain.append(round(mine / plain, 2) if mine and plain else None)
            ratios[f"{kind} {scheme}: llm-compressor fastest / onboard"] = speedup
            ratios[f"{kind} {scheme}: onboard / plain read+write"] = vs_plain
    return ratios


def make_report(
    results: dict[str, list[dict]],
    memory: dict[str, int],
    sizes: dict[str, dict],
    schemes: list[str],
) -> dict:
    table = []
    for name, runs in results.items():
        size = sizes[name.partition("/")[0]]["bytes"]
        ok = [x for x in runs if x["rc"] == 0]
        if not ok:
            table.append({"command": name, "failed": True})
            continue
        wall = statistics.median(x["wall_s"] for x in ok)
        table.append(
            {
                "command": name,
                "runs": len(ok),
                "median_s": round(wall, 2),
                "min_s": round(min(x["wall_s"] for x in ok), 2),
                "max_s": round(max(x["wall_s"] for x in ok), 2),
                "gb_per_s": round(size / 1e9 / wall, 3),
                "peak_tree_pss_gib": round(memory.get(name, 0) / 2**30, 2),
                "peak_rss_gib": round(max(x["peak_rss"] for x in ok) / 2**30, 2),
            }
        )
    return {
        "checkpoints": sizes,
        "cores": len(os.sched_getaffinity(0)),
        "load_average_at_end": os.getloadavg(),
        "results": table,
        "rounds": {
            name: [
                {
                    "wall_s": round(x["wall_s"], 2),
                    "rc": x["rc"],
                    "load_before": round(x["load_before"], 2),
                }
                for x in runs
            ]
            for name, runs in results.items()
        },
        "ratios": paired_ratios(results, schemes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/onboard-quantize-bench"))
    ap.add_argument("--runs", type=int, default=3)
    # An untimed first round per command: the page cache holds the input and the
    # imported libraries afterwards, as it does for every timed round after it;
    # the process tree's memory is sampled in it (see run_once).
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--preset", default="1gb", help="checkpoint size (1gb, small)")
    ap.add_argument(
        "--checkpoints", nargs="+", choices=CHECKPOINTS, default=list(CHECKPOINTS)
    )
    ap.add_argument(
        "--schemes", nargs="+", choices=PRESETS, default=["fp8-dynamic", "nvfp4a16"]
    )
    ap.add_argument("--only", nargs="*", help="command names to run (default: all)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if args.warmup < 1:
        ap.error("--warmup must be at least 1 (the memory is sampled there)")

    out = args.dir / "out"
    out.mkdir(parents=True, exist_ok=True)
    cmds: dict[str, list[str]] = {}
    sizes: dict[str, dict] = {}
    for kind in args.checkpoints:
        ckpt = args.dir / CHECKPOINTS[kind]
        if not (ckpt / "model.safetensors.index.json").exists():
            print(f"writing the {kind} checkpoint to {ckpt}", file=sys.stderr)
            maker = [str(PY), str(ROOT / "benchmarks" / "make_checkpoint.py"),
                     str(ckpt), "--preset", args.preset]  # fmt: skip
            subprocess.run(maker + (["--transformers"] if kind == "transformers"
                                    else []), check=True)  # fmt: skip
        files = sorted(ckpt.glob("*.safetensors"))
        sizes[kind] = {
            "dir": str(ckpt),
            "bytes": sum(f.stat().st_size for f in files),
            "shard_bytes": [f.stat().st_size for f in files],
            "spec_yaml": (ckpt / "spec.yaml").exists(),
        }
        for name, cmd in commands(ckpt, out / kind, args.schemes).items():
            cmds[f"{kind}/{name}"] = cmd
    if args.only:
        cmds = {k: v for k, v in cmds.items() if k.partition("/")[2] in args.only}

    memory: dict[str, int] = {}
    for r in range(args.warmup):
        for name, cmd in cmds.items():
            res = run_once(cmd, out / name, sample_memory=True)
            memory[name] = max(memory.get(name, 0), res["peak_tree_pss"])
            print(
                f"warm-up {r + 1} {name}: {res['wall_s']:.1f} s, tree PSS "
                f"{res['peak_tree_pss'] / 2**30:.2f} GiB",
                file=sys.stderr,
            )
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)

    results: dict[str, list[dict]] = {name: [] for name in cmds}
    for r in range(args.runs):
        for name, cmd in cmds.items():
            load = os.getloadavg()[0]
            res = run_once(cmd, out / name)
            res["load_before"] = load
            results[name].append(res)
            status = "ok" if res["rc"] == 0 else f"FAILED rc={res['rc']}"
            print(
                f"round {r + 1} {name}: {res['wall_s']:.2f} s, peak RSS "
                f"{res['peak_rss'] / 2**30:.2f} GiB, {status}",
                file=sys.stderr,
            )
            if res["rc"]:
                print(res["stderr_tail"], file=sys.stderr)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        if args.json:  # after every round: a cut-short run keeps what it measured
            report = make_report(results, memory, sizes, args.schemes)
            args.json.write_text(json.dumps(report))

    report = make_report(results, memory, sizes, args.schemes)
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    print(
        "\n| command | median s | min-max s | GB/s | peak RSS GiB (largest process)"
        " | peak tree PSS GiB (warm-up) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for row in report["results"]:
        if row.get("failed"):
            print(f"| {row['command']} | failed | | | | |")
            continue
        print(
            f"| {row['command']} | {row['median_s']} | {row['min_s']}-{row['max_s']} "
            f"| {row['gb_per_s']} | {row['peak_rss_gib']} | "
            f"{row['peak_tree_pss_gib']} |"
        )


if __name__ == "__main__":
    main()
