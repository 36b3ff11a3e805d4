"""Speed parity: the generated model vs vLLM's hand-written class vs vLLM's
Transformers modeling backend, on the same engine build and the same weights.

    flock /work/notes/engine.lock .venv/bin/python benchmarks/codegen_speed.py \
        [--families deepseek_v3,qwen3_moe] [--rounds 3] [--prompts 8] \
        [--max-tokens 64] [--work DIR] [--json OUT.json]

Per family, one random checkpoint written by transformers' own class
(``save_pretrained``, float32) at a size where the model code, not the engine's
per-step overhead, dominates on two cores; then three engines on it, started the
way `onboard validate` starts them (:class:`onboard.validate.engine.Engine`, so the
same engine arguments, float32, eager):

  generated     the plugin `onboard generate` wrote for ``spec from-hf``'s spec,
                made visible to vLLM with nothing installed (validate's path)
  in-tree       vLLM's own class for the architecture (no plugins loaded:
                validate's hidden ``--reference-vllm-in-tree`` path)
  transformers  vLLM's Transformers modeling backend (``model_impl="transformers"``)

Each engine reports the class it instantiated. After one warm-up request per
engine, every round runs the same batch of prompts (greedy, ``ignore_eos``, so
every run decodes the same number of tokens) on each engine in turn, the order
rotating from round to round; the time is vLLM's ``LLM.generate`` time measured
inside the engine's worker. Reported: median output tokens/s per engine and the
ratios generated/in-tree and generated/transformers per round and as medians,
with the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Big enough that the layers' matmuls dominate a decode step on two cores, small
# enough to write, load and run three times each within a few minutes.
SIZES = dict(
    vocab_size=8192,
    hidden_size=1024,
    num_hidden_layers=4,
    num_attention_heads=16,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)


def _configs() -> dict:
    from transformers import DeepseekV3Config, LlamaConfig, Qwen3MoeConfig

    return {
        "qwen3_moe": Qwen3MoeConfig(
            **SIZES,
            intermediate_size=2048,
            moe_intermediate_size=512,
            num_key_value_heads=4,
            head_dim=64,
            num_experts=16,
            num_experts_per_tok=4,
            norm_topk_prob=True,
            mlp_only_layers=[],
        ),
        # The CPU MLA decode kernel needs kv_lora_rank 512 + qk_rope_head_dim 64.
        "deepseek_v3": DeepseekV3Config(
            **SIZES,
            intermediate_size=2048,
            moe_intermediate_size=512,
            num_key_value_heads=16,
            q_lora_rank=384,
            kv_lora_rank=512,
            qk_nope_head_dim=64,
            qk_rope_head_dim=64,
            v_head_dim=64,
            n_routed_experts=16,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            num_nextn_predict_layers=0,
        ),
        "llama": LlamaConfig(
            **SIZES,
            intermediate_size=4096,
            num_key_value_heads=4,
            head_dim=64,
        ),
    }


def write_checkpoint(family: str, out_dir: Path) -> Path:
    """Random float32 weights, written by transformers' own class."""
    if (out_dir / "config.json").exists():
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM

    config = _configs()[family]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    if family == "deepseek_v3":
        # transformers 5 writes neither; without them vLLM's in-tree DeepSeek
        # routes by softmax without bias correction (DESIGN.md): a different model.
        path = out_dir / "config.json"
        cfg = json.loads(path.read_text())
        cfg.update(topk_method="noaux_tc", scoring_func="sigmoid")
        path.write_text(json.dumps(cfg, indent=2))
    return out_dir


def prompts(n: int, vocab: int, length: int = 32) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def engines_for(family: str, ckpt: Path, work: Path, log_dir: Path):
    """label -> (EngineOptions) for the three implementations."""
    from onboard.generate import generate_all
    from onboard.spec.hf import spec_from_hf_config_file
    from onboard.validate.engine import EngineOptions, read_plugin

    spec = spec_from_hf_config_file(
        ckpt / "config.json", name=f"bench-{family.replace('_', '-')}"
    )
    gen = work / f"{family}-gen"
    if not gen.exists():
        generate_all(spec, gen)
    common = dict(
        model_dir=ckpt, max_model_len=256, uses_mla=spec.attention.type == "mla"
    )
    return {
        "generated": EngineOptions(plugin=read_plugin(gen / "plugin"), **common),
        "in-tree": EngineOptions(plugin=None, **common),
        "transformers": EngineOptions(
            plugin=None, extra={"model_impl": "transformers"}, **common
        ),
    }


def bench_family(family: str, args, work: Path) -> dict:
    from onboard.validate.engine import Engine, EngineDied, EngineLoadError

    ckpt = write_checkpoint(family, work / f"{family}-ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    batch = prompts(args.prompts, config["vocab_size"])
    sampling = dict(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    log_dir = work / "logs"
    result: dict = {"family": family, "checkpoint": str(ckpt), "engines": {}}
    running: dict[str, Engine] = {}
    try:
        # Started one after another: two cores, and start-up is not what we time.
        for label, options in engines_for(family, ckpt, work, log_dir).items():
            engine = Engine(
                options, work / f"{family}-{label}", log_dir / f"{family}-{label}.log"
            )
            t0 = time.perf_counter()
            engine.start()
            entry = result["engines"][label] = {"log": str(engine.log_path)}
            try:
                info = engine.wait_ready()
                engine.generate(batch[:2], **{**sampling, "max_tokens": 4})  # warm-up
            except (EngineLoadError, EngineDied, TimeoutError) as exc:
                entry["error"] = str(exc)[:2000]
                print(f"{family} {label}: failed to start: {exc}", flush=True)
                engine.close()
                continue
            entry.update(
                model_class=info["model_class"], start_s=time.perf_counter() - t0
            )
            print(f"{family} {label}: {info['model_class']}", flush=True)
            running[label] = engine
        labels = list(running)
        result["load_before"] = os.getloadavg()
        rounds = []
        for r in range(args.rounds):
            order = labels[r % len(labels) :] + labels[: r % len(labels)]
            row = {}
            for label in order:
                reply = running[label].generate(batch, **sampling)
                tokens = sum(len(o["token_ids"]) for o in reply["outputs"])
                row[label] = {
                    "time_s": reply["time_s"],
                    "tokens": tokens,
                    "tokens_per_s": tokens / reply["time_s"],
                    "token_ids": [o["token_ids"] for o in reply["outputs"]],
                }
            rounds.append({"order": order, **row})
            print(
                f"{family} round {r + 1}: "
                + ", ".join(f"{k} {row[k]['tokens_per_s']:.1f} tok/s" for k in order),
                flush=True,
            )
        result["load_after"] = os.getloadavg()
    finally:
        for engine in running.values():
            engine.close()
    result["rounds"] = [
        {k: ({kk: vv for kk, vv in v.items() if kk != "token_ids"} if isinstance(
            v, dict) else v) for k, v in row.items()}
        for row in rounds
    ]  # fmt: skip
    result["summary"] = summarize(rounds, labels)
    if rounds and "generated" in labels and "in-tree" in labels:
        # Same weights, same engine, greedy: the two vLLM implementations should
        # give the same tokens (a speed figure for a different model means nothing).
        last = rounds[-1]
        result["summary"]["generated_tokens_equal_in_tree"] = (
            last["generated"]["token_ids"] == last["in-tree"]["token_ids"]
        )
    return result


def summarize(rounds: list[dict], labels: list[str]) -> dict:
    out: dict = {}
    for label in labels:
        speeds = [row[label]["tokens_per_s"] for row in rounds]
        out[f"{label}_tokens_per_s"] = statistics.median(speeds)
    for other in ("in-tree", "transformers"):
        if "generated" in labels and other in labels:
            ratios = [
                row["generated"]["tokens_per_s"] / row[other]["tokens_per_s"]
                for row in rounds
            ]
            out[f"generated_over_{other}"] = statistics.median(ratios)
            out[f"generated_over_{other}_per_round"] = ratios
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="deepseek_v3,qwen3_moe")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    work = args.work or Path(tempfile.mkdtemp(prefix="codegen-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report = {
        "command": " ".join(sys.argv),
        "cores": len(os.sched_getaffinity(0)),
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "families": [],
    }
    for family in args.families.split(","):
        report["families"].append(bench_family(family, args, work))
    report["total_s"] = time.perf_counter() - started
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print_table(report)
    return 0


def print_table(report: dict) -> None:
    print("\n| family | engine | class | median tok/s |")
    print("| --- | --- | --- | --- |")
    for fam in report["families"]:
        for label, entry in fam["engines"].items():
            speed = fam["summary"].get(f"{label}_tokens_per_s")
            shown = (
                f"{speed:.1f}" if speed else f"failed: {entry.get('error', '')[:80]}"
            )
            print(
                f"| {fam['family']} | {label} | {entry.get('model_class', '-')} "
                f"| {shown} |"
            )
        s = fam["summary"]
        for other in ("in-tree", "transformers"):
            if f"generated_over_{other}" in s:
                rounds = ", ".join(
                    f"{r:.3f}" for r in s[f"generated_over_{other}_per_round"]
                )
                print(
                    f"{fam['family']}: generated/{other} median "
                    f"{s[f'generated_over_{other}']:.3f} (rounds {rounds})"
                )
        if "generated_tokens_equal_in_tree" in s:
            print(
                f"{fam['family']}: generated tokens == in-tree tokens: "
                f"{s['generated_tokens_equal_in_tree']}"
            )
        print(
            f"{fam['family']}: load average before {fam.get('load_before')}, "
            f"after {fam.get('load_after')}"
        )
    print(f"total {report['total_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
