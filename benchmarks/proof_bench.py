"""How long `onboard spec from-hf` takes to infer and prove a family, imports
included, against transformers alone running the same tiny model.

For each family the config is its config class's defaults shrunk as
scripts/hf_families.py shrinks them (4 layers, hidden 128; MLA at the CPU kernel's
576-wide latent), written to a file as a user's config.json. Two commands, each a
fresh process, timed in turn by `farm-bench --vs` (A B A B ..., ratios paired):

- A: `onboard spec from-hf CONFIG --output SPEC` (infer, search what the config
  does not state, prove, write);
- B, the anchor: this file with ``--anchor CONFIG``: import torch and
  transformers, build the family's model from the config, run one forward on two
  24-token prompts (the least a proof against transformers does).

The goal (docs/benchmarks.md) is 60 s or less per family on 2 cores.

    .venv/bin/python benchmarks/proof_bench.py --runs 3
    .venv/bin/python benchmarks/proof_bench.py --families olmoe,glm4_moe --runs 5
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

# Dense and MoE, GQA and MLA, families found by their tensors, by the proof, and
# verified ones.
FAMILIES = (
    "llama",
    "qwen3_moe",
    "deepseek_v3",
    "glm4_moe",
    "olmoe",
    "olmo2",
    "hunyuan_v1_moe",
    "smollm3",
    "exaone4",
    "dots1",
)
GOAL_S = 60.0


def anchor(config_path: Path) -> None:
    """transformers alone: the family's model from the config, one forward."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = json.loads(config_path.read_text())
    cls = CONFIG_MAPPING[config["model_type"]]
    model = AutoModelForCausalLM.from_config(cls.from_dict(config), dtype=torch.float32)
    ids = torch.randint(0, int(config["vocab_size"]), (2, 24))
    with torch.no_grad():
        model.eval()(ids)


def _median(report: str, row: str) -> float:
    match = re.search(rf"^{re.escape(row)}\s+\S+\s+(\S+)", report, re.MULTILINE)
    if match is None:
        raise SystemExit(f"farm-bench printed no {row!r} row:\n{report}")
    return float(match.group(1))


def bench(model_type: str, runs: int, work: Path) -> dict:
    from hf_families import small_config

    config_path = work / f"{model_type}.json"
    config_path.write_text(json.dumps(small_config(model_type), indent=2))
    spec_path = work / f"{model_type}.yaml"
    onboard = str(Path(sys.executable).with_name("onboard"))
    proof = f"{onboard} spec from-hf {config_path} --output {spec_path}"
    base = f"{sys.executable} {Path(__file__).resolve()} --anchor {config_path}"
    # from-hf refuses to overwrite its output: each run removes it first.
    command = ["sh", "-c", f"rm -f {spec_path} && exec {proof}"]
    proc = subprocess.run(
        ["farm-bench", "-n", str(runs), "--timeout", str(runs * 200),
         "--vs", base, "--", *command],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    report = proc.stdout + proc.stderr
    if not spec_path.is_file():
        raise SystemExit(f"{model_type}: from-hf wrote no spec:\n{report}")
    return {
        "model_type": model_type,
        "from_hf_s": _median(report, "A wall s"),
        "anchor_s": _median(report, "B wall s"),
        "ratio": _median(report, "A/B wall"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--anchor", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.anchor is not None:
        anchor(args.anchor)
        return 0
    if shutil.which("farm-bench") is None:
        raise SystemExit("farm-bench is not on PATH")
    rows = []
    with tempfile.TemporaryDirectory(prefix="proof-bench-") as tmp:
        for model_type in args.families.split(","):
            rows.append(bench(model_type, args.runs, Path(tmp)))
            r = rows[-1]
            print(
                f"{r['model_type']:<16} from-hf {r['from_hf_s']:6.1f} s   "
                f"transformers alone {r['anchor_s']:5.1f} s   "
                f"ratio {r['ratio']:5.2f}   goal {GOAL_S:.0f} s: "
                + ("met" if r["from_hf_s"] <= GOAL_S else "NOT met"),
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
