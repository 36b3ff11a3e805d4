"""Train a small EAGLE-3 head on a (tiny) checkpoint's own greedy outputs.

Self-distillation, on CPU, in a few minutes: the verifier (run by transformers, or
by the generated Hugging Face reference for an architecture transformers does not
know) continues prompts cut from the bundled calibration text greedily; its hidden
states at the head's auxiliary layers and its output distribution at every position
are the training data. The head is :class:`Eagle3Head`, a plain-torch copy of what
vLLM 0.32 runs for ``method: eagle3`` (``llama_eagle3.py``), trained with
test-time-training steps like ``speculators train`` (each step feeds the head its
own output hidden state and the next true token). It is saved in the speculators
format (config from :mod:`onboard.speculators.heads`, tensor names of speculators'
``Eagle3DraftModel``), which vLLM loads as a draft.

The accuracy check's prompts (``onboard.validate.prompts``) are never used here:
they are the held-out set on which acceptance is measured.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onboard.errors import InputError
from onboard.spec.model import ModelSpec
from onboard.speculators.heads import aux_layer_ids, head_config

PROMPT_TOKENS = 16
NEW_TOKENS = 32
# Half the prompts are windows of the calibration text, half random token ids: the
# text alone is too small to generalise from (measured: 0.74 first-position
# accuracy on its own continuations, 0.31 on the held-out prompts).
NUM_PROMPTS = 256
TTT_STEPS = 2
BATCH = 16
LR = 3e-3
MAX_STEPS = 400
TIME_BUDGET_S = 240.0


@dataclass
class TrainingData:
    """Per sequence: token ids [N, T], the concatenated auxiliary hidden states
    [N, T, n_aux * h] and the verifier's logits [N, T, V] (row t predicts t + 1)."""

    tokens: Any
    aux: Any
    logits: Any
    prompt_tokens: int


def calibration_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """``count`` windows of ``length`` tokens spread over the calibration text."""
    from onboard.quantize.calibration_text import TEXT

    ids = tokenizer(TEXT).input_ids
    if len(ids) < length + 1:
        raise InputError("the calibration text is shorter than one prompt")
    stride = max(1, (len(ids) - length) // count)
    starts = range(0, len(ids) - length, stride)
    return [ids[s : s + length] for s in starts][:count]


def verifier_states(model, tokens, aux: list[int]):
    """Auxiliary hidden states (vLLM's numbering) and logits of ``tokens`` [B, T].

    transformers' hidden_states[i] is the input of layer i, as in vLLM, except the
    last entry, which comes after the final norm; vLLM's id ``num_layers`` is the
    residual stream before it, taken here from the norm's input."""
    import torch

    n = model.config.num_hidden_layers
    captured: dict[str, Any] = {}
    hook = model.model.norm.register_forward_hook(
        lambda _m, args, _out: captured.update(pre_norm=args[0])
    )
    try:
        with torch.inference_mode():
            out = model(tokens, output_hidden_states=True)
    finally:
        hook.remove()
    states = list(out.hidden_states)
    states[n] = captured["pre_norm"]
    return torch.cat([states[i] for i in aux], dim=-1), out.logits.float()


def collect_data(
    model, tokenizer, aux: list[int], num_prompts: int = NUM_PROMPTS, seed: int = 0
) -> TrainingData:
    """Greedy continuations of calibration-text and random-token prompts, and the
    verifier's states on them."""
    import torch

    text = calibration_prompts(tokenizer, num_prompts // 2, PROMPT_TOKENS)
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    # Ids 0-2 are the bundled tokenizers' special tokens.
    noise = torch.randint(
        3, vocab, (num_prompts - len(text), PROMPT_TOKENS), generator=gen
    )
    prompts = torch.cat([torch.tensor(text), noise])
    with torch.inference_mode():
        tokens = model.generate(
            prompts,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    states, logits = verifier_states(model, tokens, aux)
    return TrainingData(tokens, states, logits, PROMPT_TOKENS)


def _rms(x, weight, eps: float):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def make_head_class():
    """The head module class (built lazily: torch is imported on demand)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Eagle3Head(nn.Module):
        """vLLM 0.32's ``Eagle3LlamaForCausalLM`` with one decoder layer,
        ``norm_before_fc``, ``norm_output`` and ``norm_before_residual=False``;
        parameter names are speculators' (``Eagle3DraftModel``)."""

        def __init__(self, layer: dict, n_aux: int, embed, lm_head):
            super().__init__()
            h = layer["hidden_size"]
            self.h, self.eps = h, layer["rms_norm_eps"]
            self.nh, self.nkv = (
                layer["num_attention_heads"],
                layer["num_key_value_heads"],
            )
            self.hd = layer["head_dim"]
            self.theta = layer["rope_parameters"]["rope_theta"]
            inter = layer["intermediate_size"]

            def lin(i, o):
                m = nn.Linear(i, o, bias=False)
                nn.init.normal_(m.weight, std=0.02)
                return m

            def ones(size):
                return nn.Parameter(torch.ones(size))

            self.input_norm = ones(n_aux * h)
            self.fc = lin(n_aux * h, h)
            self.q_proj = lin(2 * h, self.nh * self.hd)
            self.k_proj = lin(2 * h, self.nkv * self.hd)
            self.v_proj = lin(2 * h, self.nkv * self.hd)
            self.o_proj = lin(self.nh * self.hd, h)
            self.gate_proj, self.up_proj = lin(h, inter), lin(h, inter)
            self.down_proj = lin(inter, h)
            self.input_layernorm = ones(h)
            self.hidden_norm = ones(h)
            self.post_attention_layernorm = ones(h)
            self.norm = ones(h)
            # The verifier's embeddings and output head, frozen.
            self.register_buffer("embed_tokens", embed)
            self.register_buffer("lm_head", lm_head)

        def _rope(self, x, positions):
            half = self.hd // 2
            inv = 1.0 / (self.theta ** (torch.arange(0, half).float() / half))
            freqs = positions[..., None].float() * inv
            cos = torch.cat([freqs.cos(), freqs.cos()], -1)[:, None]
            sin = torch.cat([freqs.sin(), freqs.sin()], -1)[:, None]
            x1, x2 = x[..., :half], x[..., half:]
            return x * cos + torch.cat([-x2, x1], -1) * sin

        def combine(self, aux_states):
            return self.fc(_rms(aux_states, self.input_norm, self.eps))

        def step(self, tokens, hidden, positions, cache: list, diagonal_steps: int):
            """One drafting step for every position: logits and the hidden state
            fed to the next step. ``cache`` holds earlier steps' keys and values;
            a position sees step 0 causally and its own entries of later steps."""
            b, t, _ = hidden.shape
            embeds = _rms(self.embed_tokens[tokens], self.input_layernorm, self.eps)
            residual = hidden
            x = torch.cat([embeds, _rms(hidden, self.hidden_norm, self.eps)], -1)
            q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
            k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
            v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
            q, k = self._rope(q, positions), self._rope(k, positions)
            cache.append((k, v))
            keys = torch.cat([c[0] for c in cache], 2)
            values = torch.cat([c[1] for c in cache], 2)
            rep = self.nh // self.nkv
            keys, values = (
                keys.repeat_interleave(rep, 1),
                values.repeat_interleave(rep, 1),
            )
            causal = torch.ones(t, t, dtype=torch.bool).tril()
            diag = torch.eye(t, dtype=torch.bool)
            mask = torch.cat([causal] + [diag] * diagonal_steps, 1)
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            residual = self.o_proj(att.transpose(1, 2).reshape(b, t, -1)) + residual
            mlp_in = _rms(residual, self.post_attention_layernorm, self.eps)
            out = self.down_proj(F.silu(self.gate_proj(mlp_in)) * self.up_proj(mlp_in))
            normed = _rms(out + residual, self.norm, self.eps)
            return normed @ self.lm_head.T, normed  # norm_output: normed goes on

        def export(self) -> dict:
            """Tensors under speculators' names."""
            p = "layers.0."
            named = {
                "embed_tokens.weight": self.embed_tokens,
                "lm_head.weight": self.lm_head,
                "input_norm.weight": self.input_norm,
                "fc.weight": self.fc.weight,
                p + "input_layernorm.weight": self.input_layernorm,
                p + "hidden_norm.weight": self.hidden_norm,
                p + "post_attention_layernorm.weight": self.post_attention_layernorm,
                "norm.weight": self.norm,
            }
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                named[f"{p}self_attn.{name}.weight"] = getattr(self, name).weight
            for name in ("gate_proj", "up_proj", "down_proj"):
                named[f"{p}mlp.{name}.weight"] = getattr(self, name).weight
            return {k: v.detach().contiguous().clone() for k, v in named.items()}

    return Eagle3Head


def unroll(head, data: TrainingData, rows, steps: int):
    """Teacher-forced TTT unrolling over sequences ``rows``: per step, the head's
    logits, the verifier's logits they are trained on, and the valid positions.

    Index t of step 0 reads the verifier's states at t and token t + 1 and predicts
    the verifier's choice after t + 1; step j reads its own output of step j - 1
    and token t + 1 + j. Later steps only count where the tokens they read were the
    verifier's own greedy choices (the generated part)."""
    import torch

    tokens, aux, logits = data.tokens[rows], data.aux[rows], data.logits[rows]
    b, total = tokens.shape
    t = total - 1
    hidden = head.combine(aux[:, :-1])
    positions = torch.arange(1, total).expand(b, t)
    target = logits[:, 1:]
    cache: list = []
    out = []
    for j in range(steps):
        pad = tokens.new_zeros(b, j)
        step_tokens = torch.cat([tokens[:, 1 + j :], pad], 1)
        pred, hidden = head.step(step_tokens, hidden, positions + j, cache, j)
        step_target = torch.cat(
            [target[:, j:], target.new_zeros(b, j, target.shape[-1])], 1
        )
        valid = torch.zeros(t, dtype=torch.bool)
        valid[: t - j] = True
        if j > 0:
            valid[: data.prompt_tokens - 1] = False
        out.append((pred, step_target, valid))
    return out


def first_position_accuracy(head, data: TrainingData) -> float:
    """Share of generated positions where step 0 picks the verifier's token."""
    import torch

    with torch.no_grad():
        pred, target, _ = unroll(head, data, torch.arange(len(data.tokens)), 1)[0]
    sel = slice(data.prompt_tokens - 1, None)
    return float((pred[:, sel].argmax(-1) == target[:, sel].argmax(-1)).float().mean())


def train(
    head,
    data: TrainingData,
    *,
    seed: int,
    max_steps: int,
    budget_s: float,
    ttt_steps: int = TTT_STEPS,
    log=lambda _m: None,
) -> dict[str, Any]:
    """Adam with a cosine decay; KL to the verifier's distribution per step."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / max_steps, 1)))
    )
    start = time.perf_counter()
    step = 0
    loss_value = float("nan")
    while step < max_steps and time.perf_counter() - start < budget_s:
        rows = torch.randint(0, len(data.tokens), (BATCH,), generator=gen)
        loss = 0.0
        for pred, target, valid in unroll(head, data, rows, ttt_steps):
            loss = loss + F.kl_div(
                F.log_softmax(pred[:, valid], -1),
                F.log_softmax(target[:, valid], -1),
                log_target=True,
                reduction="batchmean",
            ) / int(valid.sum())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        loss_value = loss.item()
        if step % 50 == 0:
            log(f"step {step}: loss {loss_value:.3f}")
    return {"steps": step, "seconds": time.perf_counter() - start, "loss": loss_value}


def save_head(head, config: dict, out_dir: Path) -> Path:
    """config.json + model.safetensors, the layout speculators saves and vLLM loads."""
    from safetensors.torch import save_file

    from onboard.fsutil import atomic_directory

    with atomic_directory(out_dir) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        save_file(head.export(), str(tmp / "model.safetensors"))
    return out_dir


def train_eagle3_head(
    spec: ModelSpec,
    model_dir: Path,
    out_dir: Path,
    *,
    num_speculative_tokens: int = 3,
    seed: int = 0,
    max_steps: int = MAX_STEPS,
    budget_s: float = TIME_BUDGET_S,
    untrained_dir: Path | None = None,
    num_prompts: int = NUM_PROMPTS,
    log=lambda _m: None,
) -> dict[str, Any]:
    """Train an EAGLE-3 head for the checkpoint ``model_dir`` (of ``spec``, e.g. the
    tiny checkpoint's spec.yaml) and save it to ``out_dir``; the same head before
    training goes to ``untrained_dir`` when given. Returns the training report."""
    import torch
    from transformers import AutoTokenizer

    from onboard.validate.reference import load_reference

    torch.manual_seed(seed)
    model_dir = Path(model_dir)
    work = Path(out_dir).parent / f".{Path(out_dir).name}-work"
    reference = load_reference(model_dir, spec, None, work)
    model = reference.model
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    aux = aux_layer_ids(spec.num_hidden_layers)
    t0 = time.perf_counter()
    data = collect_data(model, tokenizer, aux, num_prompts, seed=seed)
    collect_s = time.perf_counter() - t0
    log(f"collected {tuple(data.tokens.shape)} tokens in {collect_s:.0f} s")

    config = head_config(
        spec,
        "eagle3",
        num_speculative_tokens,
        verifier=str(model_dir.resolve()),
        draft_vocab=spec.vocab_size,
    )
    layer = config["transformer_layer_config"]
    embed = model.get_input_embeddings().weight.detach().float().clone()
    lm_head = model.get_output_embeddings().weight.detach().float().clone()
    head = make_head_class()(layer, len(aux), embed, lm_head)
    if untrained_dir is not None:
        save_head(head, config, Path(untrained_dir))
    before = first_position_accuracy(head, data)
    result = train(
        head, data, seed=seed, max_steps=max_steps, budget_s=budget_s, log=log
    )
    after = first_position_accuracy(head, data)
    save_head(head, config, Path(out_dir))
    report = {
        "verifier": str(model_dir),
        "aux_layer_ids": aux,
        "training_sequences": int(data.tokens.shape[0]),
        "tokens_per_sequence": int(data.tokens.shape[1]),
        "collect_s": collect_s,
        **result,
        "train_first_position_accuracy_before": before,
        "train_first_position_accuracy_after": after,
    }
    (Path(out_dir) / "training.json").write_text(json.dumps(report, indent=2))
    return report
