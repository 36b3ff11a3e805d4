"""Load a checkpoint in vLLM's CPU engine and generate a few tokens (a subprocess:
vLLM's engine needs the __main__ guard). Prints one JSON line: ok, the engine's
error when it refuses (its root cause is in the engine's log, on stderr, with the
kernels it selected).

Usage: python quantize_engine_load.py MODEL_DIR
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main() -> None:
    res: dict = {"model": sys.argv[1]}
    try:
        from vllm import LLM, SamplingParams

        llm = LLM(
            model=sys.argv[1],
            dtype="bfloat16",
            enforce_eager=True,
            max_model_len=128,
            gpu_memory_utilization=0.3,
            skip_tokenizer_init=True,
            seed=0,
        )
        out = llm.generate(
            [{"prompt_token_ids": [5, 17, 42, 99, 7, 3]}],
            SamplingParams(max_tokens=8, temperature=0),
            use_tqdm=False,
        )
        res.update(ok=True, tokens=list(out[0].outputs[0].token_ids))
    except Exception as exc:  # the engine's refusal is the result
        res.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
