"""Speed parity: the generated model vs vLLM's hand-written class vs vLLM's
Transformers modeling backend, on the same engine build and the same weights.

    flock /work/notes/engine.lock .venv/bin/python benchmarks/codegen_speed.py \
        [--families deepseek_v3,qwen3_moe] [--rounds 3] [--prompts 8] \
        [--max-tokens 64] [--work DIR] [--json OUT.json] [--profile]

Per family, one random checkpoint written by transformers' own class
(``save_pretrained``, float32) at a size where the model code, not the engine's
per-step overhead, dominates on two cores; then three engines on it, started the
way `onboard validate` starts them (:class:`onboard.runtime.engine.Engine`, so the
same engine arguments, float32, eager):

  generated     the plugin `onboard generate` wrote for ``spec from-hf``'s spec,
                made visible to vLLM with nothing installed (validate's path)
  in-tree       vLLM's own class for the architecture (no plugins loaded:
                validate's hidden ``--reference-vllm-in-tree`` path)
  transformers  vLLM's Transformers modeling backend (``model_impl="transformers"``)

Each engine reports the class it instantiated. Every round starts each engine
alone, warms it up with one request, times the same batch of prompts (greedy,
``ignore_eos``, so every run decodes the same number of tokens) and closes it,
the order rotating from round to round; the time is vLLM's ``LLM.generate`` time
measured inside the engine's worker. Only one engine is alive at a time: resident
engines slowed each other down unevenly. ``--profile`` also records, in round 1,
each engine's top operators by self CPU time (torch.profiler in the worker), so a
gap can be traced to the operators that cause it. Reported: median output tokens/s
per engine and the ratios generated/in-tree and generated/transformers per round and
as medians, with the machine's load average before and after.
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

# Imported in the engine's worker process (CPU time, --profile): the engines
# inherit PYTHONPATH, to which main() adds this directory.
PROFILER = "worker_profiler"

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
        # routes by softmax without bias correction (docs/vllm-cpu-notes.md): a
        # different model.
        path = out_dir / "config.json"
        cfg = json.loads(path.read_text())
        cfg.update(topk_method="noaux_tc", scoring_func="sigmoid")
        path.write_text(json.dumps(cfg, indent=2))
    return out_dir


def prompts(n: int, vocab: int, length: int = 32) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def engines_for(family: str, ckpt: Path, work: Path):
    """label -> (EngineOptions) for the three implementations."""
    from onboard.pipeline.generate import generate_all
    from onboard.runtime.engine import EngineOptions, read_plugin
    from onboard.spec.hf import spec_from_hf_config_file

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


def _start(options, work: Path, name: str, batch, sampling):
    """One engine, started and warmed up; None (with the error) if it failed."""
    from onboard.runtime.engine import Engine, EngineDied, EngineLoadError

    engine = Engine(options, work / name, work / "logs" / f"{name}.log")
    t0 = time.perf_counter()
    engine.start()
    try:
        info = engine.wait_ready()
        engine.generate(batch[:2], **{**sampling, "max_tokens": 4})  # warm-up
    except (EngineLoadError, EngineDied, TimeoutError) as exc:
        engine.close()
        return None, {"error": str(exc)[:2000], "log": str(engine.log_path)}
    return engine, {
        "model_class": info["model_class"],
        "start_s": time.perf_counter() - t0,
        "log": str(engine.log_path),
    }


def bench_family(family: str, args, work: Path) -> dict:
    ckpt = write_checkpoint(family, work / f"{family}-ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    batch = prompts(args.prompts, config["vocab_size"])
    sampling = dict(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    options = engines_for(family, ckpt, work)
    result: dict = {"family": family, "checkpoint": str(ckpt), "engines": {}}
    labels = list(options)
    result["load_before"] = os.getloadavg()
    rounds = []
    # One engine alive at a time: with several engines resident, each pinned by
    # vLLM to the same core, the first-started one ran 10-25% slower whatever its
    # turn (the same model code, profiled alone, matched the in-tree class op for
    # op). So every round starts, times and closes each engine in turn.
    for r in range(args.rounds):
        order = labels[r % len(labels) :] + labels[: r % len(labels)]
        row = {}
        for label in order:
            if "error" in result["engines"].get(label, {}):
                continue
            engine, entry = _start(
                options[label], work, f"{family}-{label}", batch, sampling
            )
            if engine is None:
                result["engines"][label] = entry
                print(f"{family} {label}: failed to start: {entry['error']}")
                continue
            result["engines"].setdefault(label, entry)
            try:
                cpu_before = engine.rpc(f"{PROFILER}:cpu_seconds")
                reply = engine.generate(batch, **sampling)
                cpu_s = engine.rpc(f"{PROFILER}:cpu_seconds") - cpu_before
                if args.profile and r == 0:
                    result["engines"][label]["top_ops"] = profile_batch(
                        engine, batch, sampling
                    )
            finally:
                engine.close()
            tokens = sum(len(o["token_ids"]) for o in reply["outputs"])
            row[label] = {
                "time_s": reply["time_s"],
                "tokens": tokens,
                "tokens_per_s": tokens / reply["time_s"],
                "cpu_s": cpu_s,
                "tokens_per_cpu_s": tokens / cpu_s,
                "token_ids": [o["token_ids"] for o in reply["outputs"]],
            }
        rounds.append({"order": order, **row})
        print(
            f"{family} round {r + 1}: "
            + ", ".join(f"{k} {row[k]['tokens_per_s']:.1f} tok/s" for k in row),
            flush=True,
        )
    result["load_after"] = os.getloadavg()
    labels = [label for label in labels if "error" not in result["engines"][label]]
    result["rounds"] = [
        {k: ({kk: vv for kk, vv in v.items() if kk != "token_ids"} if isinstance(
            v, dict) else v) for k, v in row.items()}
        for row in rounds
    ]  # fmt: skip
    result["summary"] = summarize(rounds, labels)
    # Same weights, greedy: the implementations should give the same tokens (a
    # speed figure for a different model means nothing). On the CPU build the
    # in-tree DeepSeek class does not: its rotary kernel mis-rotates the MLA query's
    # strided rope slice (docs/vllm-cpu-notes.md), which the generated class works
    # around.
    last = rounds[-1] if rounds else {}
    for other in ("in-tree", "transformers"):
        if "generated" in last and other in last:
            result["summary"][f"generated_tokens_equal_{other}"] = (
                last["generated"]["token_ids"] == last[other]["token_ids"]
            )
    return result


def profile_batch(engine, batch, sampling) -> list[dict]:
    """Top operators by self CPU time in the model worker over one more batch
    (torch.profiler, started and stopped in the worker through collective_rpc)."""
    engine.rpc(f"{PROFILER}:start")
    engine.generate(batch, **sampling)
    return engine.rpc(f"{PROFILER}:stop")


def summarize(rounds: list[dict], labels: list[str]) -> dict:
    """Medians per engine, and generated/other ratios taken within each round, by
    wall time (tokens/s) and by the worker's CPU time (tokens per CPU second)."""
    out: dict = {}
    for label in labels:
        for metric in ("tokens_per_s", "tokens_per_cpu_s"):
            speeds = [row[label][metric] for row in rounds if label in row]
            out[f"{label}_{metric}"] = statistics.median(speeds)
    for other in ("in-tree", "transformers"):
        if "generated" not in labels or other not in labels:
            continue
        for metric, suffix in (("tokens_per_s", ""), ("tokens_per_cpu_s", "_cpu")):
            ratios = [
                row["generated"][metric] / row[other][metric]
                for row in rounds
                if "generated" in row and other in row
            ]
            out[f"generated_over_{other}{suffix}"] = statistics.median(ratios)
            out[f"generated_over_{other}{suffix}_per_round"] = ratios
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="deepseek_v3,qwen3_moe")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also record each engine's top operators (torch.profiler) in round 1",
    )
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    paths = [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
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
    print("\n| family | engine | class | median tok/s | median tok/CPU-s |")
    print("| --- | --- | --- | --- | --- |")
    for fam in report["families"]:
        s = fam["summary"]
        for label, entry in fam["engines"].items():
            speed = s.get(f"{label}_tokens_per_s")
            shown = (
                f"{speed:.1f} | {s[f'{label}_tokens_per_cpu_s']:.1f}"
                if speed
                else f"failed: {entry.get('error', '')[:80]} | -"
            )
            print(
                f"| {fam['family']} | {label} | {entry.get('model_class', '-')} "
                f"| {shown} |"
            )
        for other in ("in-tree", "transformers"):
            for suffix, what in (("", "wall"), ("_cpu", "CPU time")):
                key = f"generated_over_{other}{suffix}"
                if key in s:
                    rounds = ", ".join(f"{r:.3f}" for r in s[f"{key}_per_round"])
                    print(
                        f"{fam['family']}: generated/{other} ({what}) median "
                        f"{s[key]:.3f} (rounds {rounds})"
                    )
        for other in ("in-tree", "transformers"):
            if f"generated_tokens_equal_{other}" in s:
                print(
                    f"{fam['family']}: generated tokens == {other} tokens: "
                    f"{s[f'generated_tokens_equal_{other}']}"
                )
        for label, entry in fam["engines"].items():
            for op in entry.get("top_ops", [])[:5]:
                print(
                    f"{fam['family']} {label}: {op['op']} {op['calls']} calls, "
                    f"{op['ms_per_call']:.3f} ms each"
                )
        print(
            f"{fam['family']}: load average before {fam.get('load_before')}, "
            f"after {fam.get('load_after')}"
        )
    print(f"total {report['total_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
