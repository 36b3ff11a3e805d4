"""vLLM's side of the accuracy check, against a running `vllm serve`.

Written by `onboard validate --emit`; needs only the Python standard library and
transformers (for the tokenizer). For each bundled prompt (token ids, at most
``max_prompt_tokens``), one /v1/completions request: greedy, ``max_new_tokens``
tokens, the top-k logprobs of every generated token and of every prompt position.
The Hugging Face side (reference_logprobs.py) runs after the server has stopped.
"""

from __future__ import annotations

import argparse
import json
import random
import urllib.request


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


def tokenize(manifest: dict) -> tuple[list[list[int]], str]:
    limit = manifest["max_prompt_tokens"]
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(manifest["model"], trust_remote_code=True)
        ids = [tok(p).input_ids[:limit] for p in manifest["prompts"]]
        if all(ids) and max(max(i) for i in ids) < manifest["vocab_size"]:
            return ids, "bundled prompts, the model's tokenizer"
    except Exception as exc:  # no tokenizer: fixed pseudo-random ids, like onboard
        print(f"tokenizer unavailable ({type(exc).__name__}: {exc})")
    rng = random.Random(0)
    ids = [
        [rng.randrange(manifest["vocab_size"]) for _ in range(rng.randint(8, 24))]
        for _ in manifest["prompts"]
    ]
    return ids, "fixed pseudo-random token-id prompts"


def token_id(text: str) -> int:
    # return_tokens_as_token_ids renders tokens as "token_id:<id>".
    return int(text.rsplit(":", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    manifest = json.load(open(args.manifest))
    with urllib.request.urlopen(args.base_url + "/v1/models", timeout=60) as r:
        served = json.loads(r.read())["data"][0]["id"]
    prompts, note = tokenize(manifest)
    k = manifest["top_k"]
    out = []
    for ids in prompts:
        reply = post(
            args.base_url + "/v1/completions",
            {
                "model": served,
                "prompt": ids,
                "max_tokens": manifest["max_new_tokens"],
                "temperature": 0.0,
                "logprobs": k,
                "prompt_logprobs": k,
                "ignore_eos": True,
                "return_tokens_as_token_ids": True,
            },
        )
        choice = reply["choices"][0]
        prompt_lp = [
            None if row is None else {t: v["logprob"] for t, v in row.items()}
            for row in choice["prompt_logprobs"]
        ]
        lp = choice["logprobs"]
        out.append(
            {
                "prompt_token_ids": ids,
                "prompt_logprobs": prompt_lp,
                "token_ids": [token_id(t) for t in lp["tokens"]],
                "top_logprobs": [
                    {str(token_id(t)): v for t, v in step.items()}
                    for step in lp["top_logprobs"]
                ],
            }
        )
    with open(args.out, "w") as f:
        json.dump({"served_model": served, "prompts_note": note, "prompts": out}, f)
    print(f"wrote {args.out}: {len(out)} prompts")


if __name__ == "__main__":
    main()
