"""Write a random Llama-style bf16 checkpoint of a chosen size.

    python benchmarks/make_checkpoint.py OUT_DIR [--preset 1gb|small] [--shards N]
        [--transformers]

``1gb`` (the benchmark's checkpoint): hidden 2048, 8 layers, MLP 5632, vocab 32000,
GQA 16/8 heads: 508M parameters, 1.02 GB in bf16, in two shards. By default the
files are onboard's own: the tensors and config.json of a LlamaForCausalLM plus
``spec.yaml``, deterministic from the seed. ``--transformers`` writes the
checkpoint a user has instead: transformers' own LlamaForCausalLM, randomly
initialised and saved with ``save_pretrained`` (its config.json says ``dtype``,
there is no spec.yaml).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PRESETS = {
    "1gb": dict(hidden=2048, intermediate=5632, layers=8, vocab=32000, heads=16, kv=8),
    "small": dict(hidden=512, intermediate=1536, layers=4, vocab=1024, heads=4, kv=2),
}

SPEC = """\
name: bench-llama
architecture: LlamaForCausalLM
model_type: llama
vocab_size: {vocab}
hidden_size: {hidden}
num_hidden_layers: {layers}
max_position_embeddings: 4096
norm: {{type: rmsnorm, eps: 1.0e-05}}
attention: {{type: gqa, num_heads: {heads}, num_kv_heads: {kv}, head_dim: {head_dim}}}
rope: {{theta: 500000.0}}
mlp: {{intermediate_size: {intermediate}}}
checkpoint: {{layout: llama}}
"""


def write_llama_checkpoint(
    out: Path,
    *,
    hidden: int,
    intermediate: int,
    layers: int,
    vocab: int,
    heads: int,
    kv: int,
    shards: int = 2,
    seed: int = 0,
) -> Path:
    import torch
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    head_dim = hidden // heads
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    groups: list[dict[str, torch.Tensor]] = [
        {"model.embed_tokens.weight": w(vocab, hidden)}
    ]
    for i in range(layers):
        p = f"model.layers.{i}."
        groups.append(
            {
                p + "input_layernorm.weight": ones(hidden),
                p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": w(kv * head_dim, hidden),
                p + "self_attn.v_proj.weight": w(kv * head_dim, hidden),
                p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
                p + "post_attention_layernorm.weight": ones(hidden),
                p + "mlp.gate_proj.weight": w(intermediate, hidden),
                p + "mlp.up_proj.weight": w(intermediate, hidden),
                p + "mlp.down_proj.weight": w(hidden, intermediate),
            }
        )
    groups.append(
        {"model.norm.weight": ones(hidden), "lm_head.weight": w(vocab, hidden)}
    )

    # Split the groups into `shards` files of about equal size, in order.
    total = sum(t.nbytes for grp in groups for t in grp.values())
    files: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for grp in groups:
        if size >= total * len(files) / shards and len(files) < shards:
            files.append({})
        files[-1].update(grp)
        size += sum(t.nbytes for t in grp.values())
    weight_map = {}
    for n, tensors in enumerate(files, start=1):
        name = f"model-{n:05d}-of-{len(files):05d}.safetensors"
        save_file(tensors, out / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (out / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "metadata": {"total_size": total},
                "weight_map": dict(sorted(weight_map.items())),
            },
            indent=2,
        )
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "spec.yaml").write_text(
        SPEC.format(
            vocab=vocab,
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv=kv,
            head_dim=head_dim,
            intermediate=intermediate,
        )
    )
    return out


def write_transformers_checkpoint(
    out: Path,
    *,
    hidden: int,
    intermediate: int,
    layers: int,
    vocab: int,
    heads: int,
    kv: int,
    shards: int = 2,
    seed: int = 0,
) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    # save_pretrained cuts a shard once it would exceed this: `shards` files.
    model.save_pretrained(out, max_shard_size=total // shards + (1 << 20))
    return Path(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="1gb")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--transformers", action="store_true", help=(
        "transformers' save_pretrained output (no spec.yaml)"))  # fmt: skip
    args = ap.parse_args()
    write = (
        write_transformers_checkpoint if args.transformers else write_llama_checkpoint
    )
    write(args.out, shards=args.shards, seed=args.seed, **PRESETS[args.preset])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
