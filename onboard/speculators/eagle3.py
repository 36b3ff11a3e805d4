"""Train a small EAGLE-3 head on a (tiny) checkpoint's own greedy outputs.

Self-distillation, on CPU, in a few minutes: the verifier (run by transformers, or
by the generated Hugging Face reference for an architecture transformers does not
know) continues prompts cut from the bundled calibration text, and random token
ids, greedily; its hidden states at the head's auxiliary layers and its output
distribution at every position are the training data. The head is
:class:`Eagle3Head`, a plain-torch copy of what vLLM 0.32 runs for ``method:
eagle3`` (``llama_eagle3.py``). It is saved in the speculators format (config from
:mod:`onboard.speculators.heads`, tensor names of speculators'
``Eagle3DraftModel``), which vLLM loads as a draft.

Greedy continuations of a random tiny model loop, and what predicts them on prompts
never seen is a rule of the continuation's own tokens, not anything a head learns
from a few thousand tokens in minutes (gradient training alone fits its data to
0.7-0.8 and reaches 0.2-0.3 held out). So the head starts from
:func:`induction_prior`, weights derived by least squares that make its one
attention layer an induction head ("the token that followed the last earlier
occurrence of this one"); then short test-time-training steps (each step feeds
the head its own output hidden state and the next true token, as ``speculators
train`` does), and the head kept is the one with the best first-position
acceptance *as a speculative decoder drafts* (:func:`decoded_acceptance`) on
validation prompts held aside from training.

The accuracy check's prompts (``onboard.runtime.prompts``) are never used here:
they are the held-out set on which acceptance is measured.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onboard.spec.model import ModelSpec
from onboard.speculators.calibration import calibration_prompts, greedy_continuations
from onboard.speculators.heads import aux_layer_ids, head_config
from onboard.threads import one_thread

PROMPT_TOKENS = 16
NEW_TOKENS = 32
# Windows of the calibration text and random token ids. 512 rather than 256: the
# prior's least-squares map from the verifier's states to their token generalises
# better (held-out token recovery 0.69 -> 0.81; collecting takes ~15 s).
NUM_PROMPTS = 512
TTT_STEPS = 2
BATCH = 16
# Small: the prior is a good start that larger steps destroy (measured: lr 1e-3
# moved the validation acceptance 0.60 -> 0.54-0.59).
LR = 1e-4
MAX_STEPS = 400
TIME_BUDGET_S = 240.0
EVAL_EVERY = 50
# Every VAL_EVERY-th training prompt is held aside to choose the kept head.
VAL_EVERY = 8
# The prior's settings (measured on validation prompts of the DeepSeek-V3-style
# tiny): attention sharpness, weight of the repeat vote, scale of fc's residual.
PRIOR_SHARPNESS = 1.0
PRIOR_REPEAT = 0.25
PRIOR_FC_SCALE = 0.5


@dataclass
class TrainingData:
    """Per sequence: token ids [N, T], the concatenated auxiliary hidden states
    [N, T, n_aux * h] and the verifier's logits [N, T, V] (row t predicts t + 1)."""

    tokens: Any
    aux: Any
    logits: Any
    prompt_tokens: int


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
    tokens = greedy_continuations(model, prompts, NEW_TOKENS)
    states, logits = verifier_states(model, tokens, aux)
    return TrainingData(tokens, states, logits, PROMPT_TOKENS)


def rms(x, weight, eps: float):
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

        def __init__(
            self, layer: dict, n_aux: int, embed, lm_head, parallel: bool = False
        ):
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
            # P-EAGLE (``parallel``): the verifier states of the mask slots, which
            # vLLM feeds through ``combine`` (llm_base_proposer.py:1401-1414).
            self.mask_hidden = (
                nn.Parameter(torch.zeros(n_aux * h)) if parallel else None
            )

        def _rope(self, x, positions):
            half = self.hd // 2
            inv = 1.0 / (self.theta ** (torch.arange(0, half).float() / half))
            freqs = positions[..., None].float() * inv
            cos = torch.cat([freqs.cos(), freqs.cos()], -1)[:, None]
            sin = torch.cat([freqs.sin(), freqs.sin()], -1)[:, None]
            x1, x2 = x[..., :half], x[..., half:]
            return x * cos + torch.cat([-x2, x1], -1) * sin

        def combine(self, aux_states):
            return self.fc(rms(aux_states, self.input_norm, self.eps))

        def project(self, tokens, hidden, positions):
            """Queries, keys (rope applied) and values of the slots fed ``tokens``
            and ``hidden`` [b, t, h] at ``positions``: [b, heads, t, hd]."""
            b, t, _ = hidden.shape
            embeds = rms(self.embed_tokens[tokens], self.input_layernorm, self.eps)
            x = torch.cat([embeds, rms(hidden, self.hidden_norm, self.eps)], -1)
            q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
            k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
            v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
            return self._rope(q, positions), self._rope(k, positions), v

        def finish(self, att, residual):
            """From the attention output [b, heads, t, hd]: logits and the normed
            output state (norm_output: what goes on to the next step)."""
            b, _, t, _ = att.shape
            residual = self.o_proj(att.transpose(1, 2).reshape(b, t, -1)) + residual
            mlp_in = rms(residual, self.post_attention_layernorm, self.eps)
            out = self.down_proj(F.silu(self.gate_proj(mlp_in)) * self.up_proj(mlp_in))
            normed = rms(out + residual, self.norm, self.eps)
            return normed @ self.lm_head.T, normed

        def step(self, tokens, hidden, positions, cache: list, diagonal_steps: int):
            """One drafting step for every position: logits and the hidden state
            fed to the next step. ``cache`` holds earlier steps' keys and values;
            a position sees step 0 causally and its own entries of later steps."""
            t = hidden.shape[1]
            q, k, v = self.project(tokens, hidden, positions)
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
            return self.finish(att, hidden)

        def export(self) -> dict:
            """Tensors under speculators' names (``mask_hidden`` in the shape of
            speculators' PEagleDraftModel)."""
            named = self._exported_views()
            if self.mask_hidden is not None:
                named["mask_hidden"] = self.mask_hidden.view(1, 1, -1)
            return {k: v.detach().contiguous().clone() for k, v in named.items()}

        def load_exported(self, tensors: dict) -> None:
            """The inverse of :meth:`export` (a saved head back into this one)."""
            with torch.no_grad():
                for name, target in self._exported_views().items():
                    target.copy_(tensors[name].view_as(target))

        def _exported_views(self) -> dict:
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
            if self.mask_hidden is not None:
                named["mask_hidden"] = self.mask_hidden
            return named

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


def induction_prior(
    head,
    tokens,
    aux,
    *,
    sharpness: float = PRIOR_SHARPNESS,
    repeat: float = PRIOR_REPEAT,
    fc_scale: float = PRIOR_FC_SCALE,
) -> None:
    """Set the head's weights to a one-layer induction head, from the verifier's
    embeddings and output head plus a least-squares fit on ``aux`` [N, T, n_aux*h]
    (the verifier's states at the positions of ``tokens`` [N, T]).

    What vLLM feeds the head at position s: the embedding of token s + 1 and
    fc(states at s). The prior makes
      - fc recover token s itself (least squares to its output-head row "code"),
        scaled down: its residual adds a weak "the token two back" vote;
      - the keys at s: the code of token s (from the hidden half), plus a weaker
        one of token s + 1 (a repeat vote, which always matches the position
        itself); the query at t: the code of the fed token t + 1 (from the
        embedding half). Both sit on the rope dimensions that barely rotate over
        a few hundred positions, so they match by content;
      - the value at s: the code of its fed token s + 1 (through v_proj, o_proj).
    So position t attends to the earlier positions holding the token it was fed and
    predicts the token that followed them; the MLP starts at zero."""
    import torch

    h, hd, nh, nkv, eps = head.h, head.hd, head.nh, head.nkv, head.eps

    def unitrms(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    embed, out = head.embed_tokens.double(), head.lm_head.double()
    code = out / out.pow(2).mean(-1, keepdim=True).sqrt()
    # unitrms(embedding of v) @ copy ~ code of v (the input norm's weight is 1).
    copy = torch.linalg.lstsq(unitrms(embed), code).solution
    states = unitrms(aux.double().flatten(0, 1))
    recover = torch.linalg.lstsq(states, code[tokens.flatten()]).solution
    # The value path has rank nkv * hd: the best rank-r factors of ``copy``.
    r = min(nkv * hd, h)
    u, sv, vt = torch.linalg.svd(copy)
    into_value = u[:, :r] * sv[:r].sqrt()  # h x r
    from_value = sv[:r, None].sqrt() * vt[:r]  # r x h
    half = hd // 2
    # Rope pairs (i, i + half) with i >= half / 2 turn by at most
    # theta^(-1/2) per position: 1 rad after 100 positions at theta 1e4.
    dims = [*range(half // 2, half), *range(half + half // 2, hd)]
    d = len(dims)
    gen = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(h, h, generator=gen, dtype=torch.float64))[0]
    # A match scores about sharpness * sqrt(d) after sdpa's 1/sqrt(hd).
    scale = sharpness * (hd / d) ** 0.5
    rep = nh // nkv
    with torch.no_grad():
        for lin in (head.q_proj, head.k_proj, head.v_proj, head.o_proj):
            lin.weight.zero_()
        head.down_proj.weight.zero_()
        head.fc.weight.copy_(fc_scale * recover.T)
        head.v_proj.weight[:r, :h] = into_value.T.float()
        for g in range(nkv):
            lo = (g * d) % max(h - d + 1, 1)
            proj = basis[lo : lo + d]  # d x h: this kv head's view of the code
            keys = [g * hd + j for j in dims]
            head.k_proj.weight[keys, h:] = (scale * proj).float()
            head.k_proj.weight[keys, :h] = (repeat * scale * proj @ copy.T).float()
            rows = from_value[g * hd : (g + 1) * hd]
            for i in range(g * rep, (g + 1) * rep):
                head.q_proj.weight[[i * hd + j for j in dims], :h] = (
                    proj @ copy.T
                ).float()
                head.o_proj.weight[:, i * hd : i * hd + len(rows)] = (
                    rows.T / rep
                ).float()


def _ce_loss(head, data: TrainingData, rows, steps: int, unroll_fn=None):
    """Mean cross-entropy of each TTT step (or, with ``unroll_fn`` =
    ``peagle.parallel_unroll``, each parallel depth) against the verifier's greedy
    token, at the slots where drafting happens (the fed token is a generated
    one)."""
    import torch.nn.functional as F

    loss = 0.0
    for pred, target, valid in (unroll_fn or unroll)(head, data, rows, steps):
        sel = valid.clone()
        sel[: data.prompt_tokens - 1] = False
        loss = loss + F.cross_entropy(
            pred[:, sel].flatten(0, 1), target[:, sel].argmax(-1).flatten()
        )
    return loss / steps


def calibrate(head, data: TrainingData, rows, unroll_fn=None, steps: int = 1) -> float:
    """Scale the output norm by the factor (from a fixed grid) with the lowest
    cross-entropy: the prior's logits are far too confident where it is wrong, and
    the first training steps would otherwise only shrink them, breaking it."""
    import torch

    best, factor = float("inf"), 1.0
    with torch.no_grad():
        weight = head.norm.clone()
        for scale in (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125):
            head.norm.copy_(weight * scale)
            loss = _ce_loss(head, data, rows, steps, unroll_fn).item()
            if loss < best:
                best, factor = loss, scale
        head.norm.copy_(weight * factor)
    return factor


def decoded_acceptance(
    head, data: list[TrainingData], k: int, unroll_fn=None
) -> dict[str, Any]:
    """Acceptance of the head's greedy drafts of ``k`` tokens on the verifier's
    greedy sequences, as a speculative decoder drafts (what vLLM's counters
    count): a round at the prompt's last token, the next one after the accepted
    drafts and the verifier's own token (``mtp_train.decoded_walk``). Teacher
    forcing is exact: a position counts only when the earlier ones were accepted,
    so the tokens the head read were the sequence's."""
    import numpy as np
    import torch

    from onboard.speculators.mtp_train import acceptance_rates, decoded_walk

    drafts, accepted = 0, np.zeros(k)
    with torch.no_grad():
        for part in data:
            out = (unroll_fn or unroll)(head, part, torch.arange(len(part.tokens)), k)
            first = part.prompt_tokens - 1
            last = part.tokens.shape[1] - 2 - k
            for b in range(len(part.tokens)):
                ok = np.stack(
                    [
                        (
                            out[j][0][b, first : last + 1].argmax(-1)
                            == part.tokens[b, first + 2 + j : last + 3 + j]
                        ).numpy()
                        for j in range(k)
                    ]
                )
                n, a = decoded_walk(ok)
                drafts += n
                accepted += a
    return acceptance_rates(accepted, drafts)


def split(data: TrainingData) -> tuple[Any, TrainingData]:
    """(training rows, validation data): every ``VAL_EVERY``-th prompt held aside
    (both kinds of prompt are in it)."""
    import torch

    val = torch.arange(len(data.tokens)) % VAL_EVERY == VAL_EVERY - 1
    held = TrainingData(
        data.tokens[val], data.aux[val], data.logits[val], data.prompt_tokens
    )
    return (~val).nonzero().flatten(), held


def train(
    head,
    data: TrainingData,
    *,
    seed: int,
    max_steps: int,
    budget_s: float,
    k: int = 3,
    ttt_steps: int = TTT_STEPS,
    log=lambda _m: None,
) -> dict[str, Any]:
    """From :func:`induction_prior` (calibrated): AdamW, cross-entropy to the
    verifier's greedy token per TTT step; every ``EVAL_EVERY`` steps (and at the
    start) the validation prompts are scored by the decoded first-position
    acceptance at ``k`` (the mean length breaks ties), and the best weights are
    kept (on a tie, the later)."""

    rows, val = split(data)
    induction_prior(head, data.tokens[rows], data.aux[rows])
    factor = calibrate(head, data, rows[:64])
    log(f"induction prior, output norm scaled by {factor:g}")

    def score() -> tuple[float, dict]:
        acc = decoded_acceptance(head, [val], k)
        rates = acc["per_position"]
        return rates[0] + 1e-3 * acc["mean_acceptance_length"], acc

    return from_prior(
        head,
        list(head.parameters()),
        lambda batch: _ce_loss(head, data, batch, ttt_steps),
        score,
        rows,
        val,
        factor,
        seed=seed,
        max_steps=max_steps,
        budget_s=budget_s,
        log=log,
    )


def from_prior(head, params, loss_of, score, rows, val, factor, **kw) -> dict:
    """:func:`keep_best` at ``LR`` from a calibrated prior (output norm scaled by
    ``factor``), and the training result: the run, the validation figures of
    the prior and of the kept weights."""
    run, start, kept = keep_best(head, params, loss_of, score, rows, lr=LR, **kw)
    return {
        **run,
        "output_norm_scale": factor,
        "validation_prompts": int(len(val.tokens)),
        "validation_decoded_prior": start,
        "validation_decoded_kept": kept,
    }


def keep_best(
    module,
    params: list,
    loss_of: Callable[[Any], Any],
    score: Callable[[], tuple[float, dict]],
    rows,
    *,
    seed: int,
    max_steps: int,
    budget_s: float,
    lr: float,
    cosine: bool = False,
    log=lambda _m: None,
) -> tuple[dict[str, Any], dict, dict]:
    """AdamW on ``params`` with ``loss_of(batch)`` over batches of ``rows``
    (``cosine``: the rate decays over ``max_steps``). ``score()`` (value,
    acceptance) is taken at the start, every ``EVAL_EVERY`` steps and once more
    where the budget ends between two; ``module`` ends with the best weights (on
    a tie, the later). Returns the run (steps, seconds, last loss, the kept
    step), the acceptance at the start and the kept one."""
    import torch

    def snapshot():
        return {n: p.detach().clone() for n, p in module.named_parameters()}

    first, first_acc = score()
    best = (first, 0, snapshot(), first_acc)
    log(f"start: validation decoded acceptance {_rates(first_acc)}")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    start = time.perf_counter()
    step, loss_value = 0, float("nan")

    def evaluate() -> None:
        nonlocal best
        value, acc = score()
        log(f"step {step}: loss {loss_value:.3f}, validation {_rates(acc)}")
        if value >= best[0]:
            best = (value, step, snapshot(), acc)

    while step < max_steps and time.perf_counter() - start < budget_s:
        batch = rows[torch.randint(0, len(rows), (BATCH,), generator=gen)]
        if cosine:
            for group in opt.param_groups:
                group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / max_steps))
        loss = loss_of(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        loss_value = loss.item()
        if step % EVAL_EVERY == 0:
            evaluate()
    if step % EVAL_EVERY:  # the budget ended between two evaluations
        evaluate()
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(best[2][name])
    log(f"keeping step {best[1]}: validation {_rates(best[3])}")
    report = {
        "steps": step,
        "seconds": time.perf_counter() - start,
        "loss": loss_value,
        "kept_step": best[1],
    }
    return report, first_acc, best[3]


def _rates(acc: dict) -> str:
    rates = ", ".join(f"{r:.2f}" for r in acc["per_position"])
    return f"{rates} over {acc['drafts']} drafts"


def save_head(head, config: dict, out_dir: Path) -> Path:
    """config.json + model.safetensors, the layout speculators saves and vLLM loads."""
    from safetensors.torch import save_file

    from onboard.fsutil import atomic_directory

    with atomic_directory(out_dir) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        save_file(head.export(), str(tmp / "model.safetensors"))
    return out_dir


@dataclass
class Verifier:
    """The verifier a draft learns from: the reference model, its auxiliary
    layers, the data a draft of it trains on (:func:`collect_data`) and the
    seconds collecting took."""

    model: Any
    aux: list[int]
    data: TrainingData
    collect_s: float

    def frozen_weights(self):
        """Float32 copies of the input embedding and the LM head, which a draft
        shares with its verifier and does not train."""
        return (
            self.model.get_input_embeddings().weight.detach().float().clone(),
            self.model.get_output_embeddings().weight.detach().float().clone(),
        )

    def fit(self, draft, config: dict, out_dir: Path, untrained_dir, train_fn, **kw):
        """Save ``draft`` untrained (to ``untrained_dir``, when given), train it
        with ``train_fn`` on one thread (reproducible, and fair to a shared
        machine), save it to ``out_dir``; the training result."""
        if untrained_dir is not None:
            save_head(draft, config, Path(untrained_dir))
        with one_thread():
            result = train_fn(draft, self.data, **kw)
        save_head(draft, config, Path(out_dir))
        return result

    def report(self, model_dir: Path, out_dir: Path, result: dict, **fields) -> dict:
        """The training report, also written to OUT/training.json."""
        report = {
            "verifier": str(model_dir),
            **fields,
            "training_sequences": int(self.data.tokens.shape[0]),
            "tokens_per_sequence": int(self.data.tokens.shape[1]),
            "collect_s": self.collect_s,
            **result,
        }
        (Path(out_dir) / "training.json").write_text(json.dumps(report, indent=2))
        return report


def verifier_data(
    spec: ModelSpec,
    model_dir: Path,
    out_dir: Path,
    *,
    num_prompts: int,
    seed: int,
    log=lambda _m: None,
) -> Verifier:
    """The verifier of ``model_dir`` (its reference model, loaded in a work
    directory beside ``out_dir``) with the data collected from it."""
    import torch
    from transformers import AutoTokenizer

    from onboard.runtime.reference import load_reference

    torch.manual_seed(seed)
    work = Path(out_dir).parent / f".{Path(out_dir).name}-work"
    model = load_reference(Path(model_dir), spec, None, work).model
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    aux = aux_layer_ids(spec.num_hidden_layers)
    t0 = time.perf_counter()
    data = collect_data(model, tokenizer, aux, num_prompts, seed=seed)
    collect_s = time.perf_counter() - t0
    log(f"collected {tuple(data.tokens.shape)} tokens in {collect_s:.0f} s")
    return Verifier(model, aux, data, collect_s)


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
    method: str = "eagle3",
    train_fn: Callable[..., dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Train an EAGLE-3 head (``method`` "p_eagle": a P-EAGLE head, which
    ``peagle`` trains with its own ``train_fn``) for the checkpoint
    ``model_dir`` (of ``spec``, e.g. the tiny checkpoint's spec.yaml) and save
    it to ``out_dir``; the head's random initial weights (before the prior and
    training: the baseline that accepts nothing) go to ``untrained_dir`` when
    given. Returns the training report."""
    from onboard.runtime.cpu_draft import cpu_kv_heads

    model_dir = Path(model_dir)
    verifier = verifier_data(
        spec, model_dir, out_dir, num_prompts=num_prompts, seed=seed, log=log
    )
    config = head_config(
        spec,
        method,
        num_speculative_tokens,
        verifier=str(model_dir.resolve()),
        draft_vocab=spec.vocab_size,
        # A head small enough for vLLM's CPU engine to serve beside an MLA verifier.
        num_kv_heads=cpu_kv_heads(spec),
    )
    layer = config["transformer_layer_config"]
    parallel = method == "p_eagle"
    head = make_head_class()(
        layer, len(verifier.aux), *verifier.frozen_weights(), parallel=parallel
    )
    if parallel:
        head.mask_token_id = config["mask_token_id"]
    before = first_position_accuracy(head, verifier.data)
    result = verifier.fit(
        head,
        config,
        out_dir,
        untrained_dir,
        train_fn or train,
        seed=seed,
        max_steps=max_steps,
        budget_s=budget_s,
        k=num_speculative_tokens,
        log=log,
    )
    return verifier.report(
        model_dir,
        out_dir,
        result,
        aux_layer_ids=verifier.aux,
        train_first_position_accuracy_before=before,
        train_first_position_accuracy_after=first_position_accuracy(
            head, verifier.data
        ),
    )
