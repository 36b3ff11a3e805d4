"""Speculative decoding on a tiny checkpoint: per method, acceptance length and
wall-clock speed-up over no speculation for k = 1..4 (batch 8 and batch 1), the
spec's default k beside the tuned one. A thin wrapper over
`onboard speculators tune` (onboard/speculators/tune.py) that prints the rows for
docs/benchmarks.md.

Run (one engine per k and method, one to two minutes each on two cores; hold
the engine lock; methods one at a time into the same --out, whose work/ keeps every
engine's measurement, so that a last run with all methods starts no engine, and a
run cut by its time limit continues where it stopped):

    flock /work/notes/engine.lock timeout 600 .venv/bin/python \\
        benchmarks/speculators_bench.py --model-dir DIR/checkpoints/bf16 \\
        --methods ngram --out /tmp/spec-bench --speculators DIR/speculators
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def summary(report: dict) -> list[str]:
    rows = [
        "| method | band | default k: acceptance length, speed-up | tuned k: "
        "acceptance length, speed-up | predicted / measured speed-up (k=1..4) | "
        "prediction error (k=1..4) | tokens per step L predicted / measured "
        "(k=1..4) | L from | largest round spread | decision |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method, result in report["methods"].items():
        for band, data in result["bands"].items():
            by_k = {r["k"]: r for r in data["rows"]}
            default = by_k.get(result["default_k"])
            best = max(data["rows"], key=lambda r: r["measured_speedup"])
            errors = ", ".join(f"{r['error']:+.0%}" for r in data["rows"])
            speedups = ", ".join(
                f"{r['predicted_speedup']:.2f}/{r['measured_speedup']:.2f}"
                for r in data["rows"]
            )
            lengths = ", ".join(
                f"{r['predicted_tokens_per_step']:.2f}/"
                f"{r.get('measured_tokens_per_step', 0):.2f}"
                for r in data["rows"]
            )
            source = result.get("acceptance_source", "").split(":")[0]
            spread = max(
                max(r.get("spread", 0), r.get("baseline_spread", 0))
                for r in data["rows"]
            )

            def cell(r):
                if r is None:
                    return "n/a"
                return (
                    f"k={r['k']}: {r['mean_acceptance_length']:.2f}, "
                    f"{r['measured_speedup']:.2f}x"
                )

            rows.append(
                f"| {method} | {band} | {cell(default)} | {cell(best)} | {speedups} | "
                f"{errors} | {lengths} | {source} | {spread:.0%} | "
                f"{data['decision']} |"
            )
    return rows


def main() -> None:
    from onboard.spec import load_spec
    from onboard.speculators.tune import tune

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--spec", type=Path, help="default: MODEL_DIR/spec.yaml")
    parser.add_argument("--methods", default="ngram")
    parser.add_argument("--speculators", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    spec = load_spec(args.spec or args.model_dir / "spec.yaml")
    report = tune(
        args.model_dir,
        spec,
        [m.strip() for m in args.methods.split(",")],
        args.out,
        speculators_dir=args.speculators,
        log=print,
    )
    lines = summary(report)
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({"seconds": report["seconds"]}))


if __name__ == "__main__":
    main()
