"""One model, three runs, one process: the generated plugin on vLLM's CPU engine,
vLLM's own in-tree class for the same architecture, and transformers.

Used by tests/test_generate.py (one subprocess per model, so the engine import is
paid once). The plugin reaches vLLM the way a user's install does: its directory
(``pip install --target``) is on PYTHONPATH, and vLLM finds the
``vllm.general_plugins`` entry point itself. Writes a JSON report:

    {"runs": {"generated" | "in_tree" | "transformers":
              {"class": "module.Class", "tokens": [[...]], "top": [[{id: logprob}]]}}}

Usage: python engine_compare.py MODEL_DIR OUT_JSON [--prompts N] [--max-tokens N]
       [--no-in-tree] [--no-transformers] [--also OTHER_MODEL_DIR ...]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys

TOP_K = 5


def prompts(vocab_size: int, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    # Skip the lowest ids (special tokens in the bundled tokenizers).
    return [
        [rng.randrange(3, vocab_size) for _ in range(rng.randrange(5, 12))]
        for _ in range(n)
    ]


def model_class(model) -> str:
    """Runs inside the engine: the class vLLM actually instantiated."""
    return f"{type(model).__module__}.{type(model).__qualname__}"


def engine_run(
    model: str, token_prompts: list[list[int]], max_tokens: int, mla: bool
) -> dict:
    from vllm import LLM, SamplingParams

    # With AMX, vLLM picks the AMX MLA backend, which takes bf16 weights only;
    # the float32 comparison needs the reference CPU MLA backend.
    extra = {"attention_backend": "CPU_MLA"} if mla else {}
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
    )
    try:
        # Pickled by reference: the engine process imports this module by name.
        import engine_compare

        classes = llm.apply_model(engine_compare.model_class)
        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, logprobs=TOP_K, ignore_eos=True
        )
        outputs = llm.generate(
            [{"prompt_token_ids": p} for p in token_prompts], params, use_tqdm=False
        )
        tokens, top = [], []
        for out in outputs:
            seq = out.outputs[0]
            tokens.append(list(seq.token_ids))
            top.append(
                [
                    {str(t): lp.logprob for t, lp in step.items()}
                    for step in seq.logprobs
                ]
            )
        return {"class": classes[0], "tokens": tokens, "top": top}
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def transformers_run(
    model: str, token_prompts: list[list[int]], max_tokens: int
) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    hf.eval()
    tokens, top = [], []
    with torch.no_grad():
        for p in token_prompts:
            out = hf.generate(
                torch.tensor([p]),
                max_new_tokens=max_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=0,
                eos_token_id=None,
            )
            new = out.sequences[0, len(p) :].tolist()
            tokens.append(new)
            steps = []
            for scores in out.scores:
                logprobs = torch.log_softmax(scores[0].float(), dim=-1)
                values, ids = logprobs.topk(TOP_K)
                steps.append(
                    {
                        str(i): v
                        for i, v in zip(ids.tolist(), values.tolist(), strict=True)
                    }
                )
            top.append(steps)
    cls = type(hf)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "tokens": tokens,
        "top": top,
    }


def use_in_tree_class(architecture: str) -> None:
    """Point the registry back at vLLM's own class (the plugin replaced it)."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.registry import _VLLM_MODELS

    module, cls = _VLLM_MODELS[architecture]
    ModelRegistry.register_model(
        architecture, f"vllm.model_executor.models.{module}:{cls}"
    )
    # vLLM keeps the class it resolved for a checkpoint path and architecture
    # (model_loader/utils.py, _MODEL_ARCH_BY_HASH): in this process the next
    # engine of the same checkpoint would build the plugin's class again.
    from vllm.model_executor.model_loader import utils as loader_utils

    loader_utils._MODEL_ARCH_BY_HASH.clear()
    # Engine processes that load plugins themselves must not load ours again.
    os.environ["VLLM_PLUGINS"] = ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--no-in-tree", action="store_true")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        help="another checkpoint of the same architecture to run through the "
        "generated plugin (reported as runs['also:<dir name>'])",
    )
    args = parser.parse_args()
    # As onboard's engine worker runs vLLM: the engine core in this process (one
    # vLLM import per engine, not three), the plugin's class inspected here.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from onboard.runtime.engine_worker import inspect_classes_here

    inspect_classes_here()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p
    )

    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    token_prompts = prompts(config["vocab_size"], args.prompts)
    report: dict = {"prompts": token_prompts, "runs": {}}
    mla = config.get("kv_lora_rank") is not None
    report["runs"]["generated"] = engine_run(
        args.model, token_prompts, args.max_tokens, mla
    )
    for other in args.also:
        name = os.path.basename(os.path.normpath(other))
        report["runs"][f"also:{name}"] = engine_run(
            other, token_prompts, args.max_tokens, mla
        )
    if not args.no_in_tree:
        use_in_tree_class(config["architectures"][0])
        report["runs"]["in_tree"] = engine_run(
            args.model, token_prompts, args.max_tokens, mla
        )
    if not args.no_transformers:
        report["runs"]["transformers"] = transformers_run(
            args.model, token_prompts, args.max_tokens
        )
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
