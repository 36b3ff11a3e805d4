"""The Hugging Face reference side of the accuracy check.

Written by `onboard validate --emit`. Loads the model with transformers (its own
class when transformers knows the model type, else the generated reference code
shipped in ``hf/``, through ``trust_remote_code``), and for each prompt vLLM
answered (vllm_accuracy.json): the reference's log-softmax at every token vLLM
reported at each prompt position, plus the reference's own top-1 there, and the
reference's greedy continuation with its top-k logprobs. onboard judges the two
files on ingest (`onboard validate --target T --ingest DIR`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path


def load_model(manifest: dict, here: Path, dtype: str, device: str | None):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model = manifest["model"]
    kwargs = {"dtype": getattr(torch, dtype), "trust_remote_code": True}
    # device_map (accelerate) spreads a large model over the GPUs; on CPU the
    # model loads plainly.
    if device and device != "cpu":
        kwargs["device_map"] = device
    elif not device and torch.cuda.is_available():
        kwargs["device_map"] = "auto"
    try:
        AutoConfig.from_pretrained(model)
        source, kind = model, "transformers"
    except Exception:  # transformers does not know the type: the shipped reference
        source, kind = overlay(model, here / "hf", manifest["hf_auto_map"]), "generated"
    m = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    m.eval()
    cls = type(m)
    return m, f"{kind} {cls.__module__}.{cls.__qualname__} ({dtype})"


def overlay(model: str, code: Path, auto_map: dict) -> str:
    """The checkpoint's files linked beside the generated code, config.json with
    auto_map: the checkpoint itself is never modified."""
    if os.path.isdir(model):
        src = Path(model)
    else:
        from huggingface_hub import snapshot_download

        src = Path(snapshot_download(model))
    dst = Path(tempfile.mkdtemp(prefix="onboard-ref-"))
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f.resolve())
    for f in code.glob("*.py"):
        shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    config["auto_map"] = auto_map
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return str(dst)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--vllm", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default=os.environ.get("REF_DEVICE"))
    args = parser.parse_args()
    here = Path(args.manifest).resolve().parent
    manifest = json.load(open(args.manifest))
    engine = json.load(open(args.vllm))
    model, description = load_model(manifest, here, args.dtype, args.device)
    device = next(model.parameters()).device
    k, steps = manifest["top_k"], manifest["max_new_tokens"]
    out = []
    with torch.inference_mode():
        for prompt in engine["prompts"]:
            ids = prompt["prompt_token_ids"]
            res = model(input_ids=torch.tensor([ids], device=device), use_cache=True)
            lp = torch.log_softmax(res.logits[0].float(), dim=-1)
            rows = [None]
            for i, reported in enumerate(prompt["prompt_logprobs"][1:], start=1):
                row = lp[i - 1]
                top = int(torch.argmax(row))
                tokens = {int(t) for t in (reported or {})} | {top}
                rows.append(
                    {
                        "tokens": {str(t): float(row[t]) for t in sorted(tokens)},
                        "top1": [top, float(row[top])],
                    }
                )
            past, step_lp = res.past_key_values, lp[-1]
            tokens, tops = [], []
            for step in range(steps):
                values, indices = torch.topk(step_lp, k)
                pairs = zip(indices.tolist(), values.tolist(), strict=True)
                tops.append({str(t): v for t, v in pairs})
                token = int(torch.argmax(step_lp))
                tokens.append(token)
                if step + 1 == steps:
                    break
                res = model(
                    input_ids=torch.tensor([[token]], device=device),
                    past_key_values=past,
                    use_cache=True,
                )
                past = res.past_key_values
                step_lp = torch.log_softmax(res.logits[0, -1].float(), dim=-1)
            out.append({"prompt_rows": rows, "token_ids": tokens, "top_logprobs": tops})
    with open(args.out, "w") as f:
        json.dump({"description": description, "prompts": out}, f)
    print(f"wrote {args.out}: {len(out)} prompts ({description})")


if __name__ == "__main__":
    main()
