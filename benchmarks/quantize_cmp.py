"""Is `onboard quantize` byte for byte llm-compressor's data-free output?

    .venv/bin/python benchmarks/quantize_cmp.py [--dir DIR]
        [--checkpoint transformers|onboard] [--schemes w4a16 w4a16-asym w8a8-int8]

On the quantization benchmark's 1 GB checkpoint (benchmarks/quantize_bench.py,
written on first use in DIR), per scheme: `onboard quantize` and llm-compressor's
``model_free_ptq`` (.venv-llmc) each write their output; then every safetensors
shard of the two is compared with ``cmp`` (the whole file: header and data), and,
where the files differ, tensor by tensor (names, dtypes, shapes and data bytes),
so that a difference in the header (tensor order, metadata) is told apart from a
difference in the numbers. config.json's ``quantization_config`` is compared
without its version string. Prints one line per scheme and shard, and exits 1 if
any tensor's bytes differ.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from quantize_bench import CHECKPOINTS, IGNORE, LLMC, ONBOARD, PY  # noqa: E402


def read(path: Path) -> tuple[dict, dict[str, tuple[str, list[int], bytes]]]:
    """A safetensors file's ``__metadata__`` and its tensors, name -> (dtype,
    shape, raw bytes), read directly (no framework: the bytes are the
    comparison)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    metadata = header.pop("__metadata__", None)
    base = 8 + n
    return metadata, {
        name: (t["dtype"], t["shape"], raw[base + start : base + end])
        for name, t in header.items()
        for start, end in [t["data_offsets"]]
    }


def config_differences(mine: Path, theirs: Path) -> list[str]:
    """The keys of config.json's quantization_config that differ (the version
    string aside; a group's name is compared by its content)."""
    a, b = (
        json.loads((d / "config.json").read_text())["quantization_config"]
        for d in (mine, theirs)
    )
    a["config_groups"] = list(a["config_groups"].values())
    b["config_groups"] = list(b["config_groups"].values())
    fa, fb = flatten(a), flatten(b)
    keys = (fa.keys() | fb.keys()) - {"version"}
    return [
        f"{k}: {fa.get(k)!r} vs {fb.get(k)!r}"
        for k in sorted(keys)
        if fa.get(k) != fb.get(k)
    ]


def flatten(value, path: str = "") -> dict:
    if isinstance(value, dict) and value:
        return {
            k: v
            for key, item in value.items()
            for k, v in flatten(item, f"{path}.{key}" if path else key).items()
        }
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return {
            k: v
            for i, item in enumerate(value)
            for k, v in flatten(item, f"{path}[{i}]").items()
        }
    return {path: value}


def compare(mine: Path, theirs: Path) -> tuple[list[str], int]:
    """Lines describing each shard's comparison, and the number of tensors whose
    bytes differ (or that one side lacks)."""
    lines, differing = [], 0
    shards = sorted(
        {p.name for p in [*mine.glob("*.safetensors"), *theirs.glob("*.safetensors")]}
    )
    for name in shards:
        a, b = mine / name, theirs / name
        if not (a.exists() and b.exists()):
            lines.append(
                f"  {name}: only in {'onboard' if a.exists() else 'llm-compressor'}"
            )
            differing += 1
            continue
        same_file = subprocess.run(["cmp", "-s", str(a), str(b)]).returncode == 0
        if same_file:
            lines.append(f"  {name}: cmp identical ({a.stat().st_size:,} bytes)")
            continue
        (ma, ta), (mb, tb) = read(a), read(b)
        # The data sections (everything after each file's header), with cmp.
        skip = ":".join(
            str(8 + int.from_bytes(p.open("rb").read(8), "little")) for p in (a, b)
        )
        same_data = (
            subprocess.run(["cmp", "-s", "-i", skip, str(a), str(b)]).returncode == 0
        )
        names = ta.keys() | tb.keys()
        bad = sorted(k for k in names if ta.get(k) != tb.get(k))
        differing += len(bad)
        why = f"differing: {', '.join(bad[:5])}" if bad else "header aside"
        if not bad and ma != mb:
            why = f"__metadata__ {ma} vs {mb}"
        lines.append(
            f"  {name}: files differ ({a.stat().st_size:,} vs {b.stat().st_size:,} "
            f"bytes); {len(names) - len(bad)} of {len(names)} tensors identical "
            f"(name, dtype, shape, data bytes; {why}); data section after the "
            f"header: {'cmp identical' if same_data else 'differs'}"
        )
    return lines, differing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/onboard-quantize-bench"))
    ap.add_argument("--checkpoint", choices=CHECKPOINTS, default="transformers")
    ap.add_argument(
        "--schemes", nargs="+", default=["w4a16", "w4a16-asym", "w8a8-int8"]
    )
    args = ap.parse_args()
    ckpt = args.dir / CHECKPOINTS[args.checkpoint]
    if not (ckpt / "model.safetensors.index.json").exists():
        maker = [str(PY), str(ROOT / "benchmarks" / "make_checkpoint.py"), str(ckpt)]
        subprocess.run(
            maker + (["--transformers"] if args.checkpoint == "transformers" else []),
            check=True,
        )
    out = args.dir / "cmp"
    failed = 0
    for scheme in args.schemes:
        mine, theirs = out / f"onboard-{scheme}", out / f"llmc-{scheme}"
        for d in (mine, theirs):
            shutil.rmtree(d, ignore_errors=True)
        subprocess.run(
            [
                str(ONBOARD),
                "quantize",
                str(ckpt),
                "--scheme",
                scheme,
                "--out",
                str(mine),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [
                str(LLMC),
                str(ROOT / "benchmarks" / "llmc_quantize.py"),
                str(ckpt),
                str(theirs),
                scheme,
                "model_free",
                IGNORE,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        lines, differing = compare(mine, theirs)
        config = config_differences(mine, theirs)
        print(
            f"{scheme} on the {args.checkpoint} checkpoint: "
            + (f"{differing} tensors differ" if differing else "every tensor identical")
            + "; quantization_config (version aside): "
            + ("; ".join(config) if config else "equal")
        )
        print("\n".join(lines))
        failed += differing
        for d in (mine, theirs):
            shutil.rmtree(d, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
