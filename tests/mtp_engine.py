"""The generated MTP draft on vLLM's CPU engine: one checkpoint, two engines.

Engine 1 generates greedily without speculation; engine 2 with
``speculative_config={"method": "mtp", "num_speculative_tokens": K}`` through the
generated plugin (installed with ``pip install --target``, its directory on
PYTHONPATH). Engine 2 reports the target and draft classes it instantiated, which
MTP head ran at every draft-model call and the ``spec_step_idx`` of every
``compute_logits`` call (onboard.generate.mtp_probes), and vLLM's spec-decode
counters. Writes a JSON report.

Usage: python mtp_engine.py MODEL_DIR OUT_JSON --k K [--prompts N] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import gc
import json
import random

TOP_K = 5


def prompts(vocab_size: int, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(3, vocab_size) for _ in range(rng.randrange(5, 12))]
        for _ in range(n)
    ]


def run(model: str, token_prompts, max_tokens: int, mla: bool, k: int | None):
    from vllm import LLM, SamplingParams

    from onboard.generate import mtp_probes

    extra = {"attention_backend": "CPU_MLA"} if mla else {}
    if k:
        spec = {"method": "mtp", "num_speculative_tokens": k}
        if mla:
            # The draft picks its own attention backend (vLLM never inherits the
            # target's): float32 MLA needs CPU_MLA there too.
            spec["attention_backend"] = "CPU_MLA"
        extra["speculative_config"] = spec
    llm = LLM(
        model=model,
        **extra,
        dtype="float32",
        enforce_eager=True,
        skip_tokenizer_init=True,
        max_model_len=256,
        max_num_seqs=8,
        gpu_memory_utilization=0.3,
        seed=0,
        disable_log_stats=False,
    )
    try:
        out: dict = {"classes": llm.collective_rpc(mtp_probes.classes)[0]}
        if k:
            out["heads"] = llm.collective_rpc(mtp_probes.watch_heads)[0]
        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, logprobs=TOP_K, ignore_eos=True
        )
        outputs = llm.generate(
            [{"prompt_token_ids": p} for p in token_prompts], params, use_tqdm=False
        )
        out["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
        out["top"] = [
            [
                {str(t): lp.logprob for t, lp in step.items()}
                for step in o.outputs[0].logprobs
            ]
            for o in outputs
        ]
        if k:
            out["calls"] = llm.collective_rpc(mtp_probes.head_calls)[0]
            out["metrics"] = {
                m.name: getattr(m, "values", None) or getattr(m, "value", None)
                for m in llm.get_metrics()
                if m.name.startswith("vllm:spec_decode")
            }
        return out
    finally:
        del llm
        gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    with open(f"{args.model}/config.json") as f:
        config = json.load(f)
    token_prompts = prompts(config["vocab_size"], args.prompts)
    mla = config.get("kv_lora_rank") is not None
    report = {
        "prompts": token_prompts,
        "k": args.k,
        "plain": run(args.model, token_prompts, args.max_tokens, mla, None),
        "mtp": run(args.model, token_prompts, args.max_tokens, mla, args.k),
    }
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
