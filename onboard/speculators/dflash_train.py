"""Train a small DFlash draft on a (tiny) checkpoint's own greedy outputs.

DFlash drafts a whole block in one forward pass: the query is the verifier's last
sampled token (the "bonus" token, at position p) followed by k mask tokens (at
p + 1 ... p + k); the mask slot at p + j predicts the token at p + j. Every draft
layer attends to the block and to the context, whose keys and values are not
computed by the draft's layers: they are projections of the verifier's own
hidden states at the earlier positions (auxiliary layers, concatenated, through
``fc`` and ``hidden_norm``, then each layer's ``k_proj``/``v_proj``, ``k_norm``
and rope). :func:`make_draft_class` is a plain-torch copy of what vLLM 0.32 runs
for ``method: dflash`` (``model_executor/models/qwen3_dflash.py``,
``DFlashQwen3Model.precompute_and_store_context_kv`` and ``forward``;
``v1/spec_decode/dflash.py`` for the query block: ``[bonus, mask x k]`` at
positions ``last + 1 ...``, causal within the block for a speculators config
whose ``sliding_window_non_causal`` is false, which vLLM maps to
``dflash_config.causal = true``).

Self-distillation, as for EAGLE-3 (:mod:`onboard.speculators.eagle3`, whose data
collector this reuses: calibration-text and random-token prompts continued
greedily, the verifier's states at the auxiliary layers and its logits). The
draft starts from a prior built without gradient steps: its first layer repeats
the bonus token (:func:`repeat_prior`), its second is an induction head over the
verifier's states (:func:`induction_prior`: the context positions that held the
bonus token vote for what the verifier predicted there), the vote weight chosen
on validation prompts. Then AdamW on the MLPs and output norm, cross-entropy to
the verifier's greedy tokens p + 1 ... p + k at every anchor p of the generated
part, weighted by position (DFlash's exponential decay). The draft kept is the
one with the best mean acceptance length as a speculative decoder drafts
(:func:`decoded_acceptance`) on the validation prompts (measured: the prior).
The accuracy check's prompts (``onboard.runtime.prompts``) are never used here:
they are the held-out set on which the engine measures acceptance, and
:func:`replay_acceptance` predicts vLLM's counters there exactly.

Saved in the speculators format (config from :mod:`onboard.speculators.heads`,
tensor names of speculators' ``DFlashDraftModel``), which vLLM loads as a draft.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onboard.spec.model import ModelSpec
from onboard.speculators.eagle3 import (
    TrainingData,
    keep_best,
    rms,
    split,
    verifier_data,
)
from onboard.speculators.heads import head_config
from onboard.threads import one_thread

# Fewer than EAGLE-3's 512: the prior needs none; they calibrate, validate and
# feed the gradient steps (collecting 256 takes about 12 s).
NUM_PROMPTS = 256
LR = 1e-3
MAX_STEPS = 200
TIME_BUDGET_S = 240.0
# Draft layers for the tiny checkpoints (speculators' default, 5, is for real
# models): the repeat layer and the induction layer of the prior.
TINY_LAYERS = 2
# DFlash's per-position loss weight exp(-(j - 1) / gamma) (speculators' default).
DECAY_GAMMA = 4.0
# The prior's attention sharpness (q_norm's weight): a match scores about
# 11.3 x this after sdpa's 1/sqrt(128).
PRIOR_SHARPNESS = 2.0
# The induction layer (measured on the dense-gqa tiny's validation prompts):
# attention sharpness, key dimensions, and the vote weights tried (0: repeats).
INDUCTION_SHARPNESS = 16.0
INDUCTION_KEY_DIMS = 64
INDUCTION_WEIGHTS = (0.0, 300.0, 1000.0, 3000.0, 10000.0)
TRAINED_FROM_PRIOR = ("gate_proj", "up_proj", "down_proj", "post_attention_layernorm")


def make_draft_class():
    """The draft module class (built lazily: torch is imported on demand)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class DFlashLayer(nn.Module):
        def __init__(self, h, nh, nkv, hd, inter):
            super().__init__()

            def lin(i, o):
                m = nn.Linear(i, o, bias=False)
                nn.init.normal_(m.weight, std=0.02)
                return m

            self.q_proj, self.k_proj = lin(h, nh * hd), lin(h, nkv * hd)
            self.v_proj, self.o_proj = lin(h, nkv * hd), lin(nh * hd, h)
            self.q_norm = nn.Parameter(torch.ones(hd))
            self.k_norm = nn.Parameter(torch.ones(hd))
            self.gate_proj, self.up_proj = lin(h, inter), lin(h, inter)
            self.down_proj = lin(inter, h)
            self.input_layernorm = nn.Parameter(torch.ones(h))
            self.post_attention_layernorm = nn.Parameter(torch.ones(h))

    class DFlashDraft(nn.Module):
        """vLLM 0.32's ``DFlashQwen3ForCausalLM`` (no sliding window, no sink,
        causal within the block); parameter names are speculators'
        (``DFlashDraftModel``)."""

        def __init__(self, layer: dict, n_aux: int, embed, lm_head, mask_token_id):
            super().__init__()
            h = layer["hidden_size"]
            self.h, self.eps = h, layer["rms_norm_eps"]
            self.nh, self.nkv = (
                layer["num_attention_heads"],
                layer["num_key_value_heads"],
            )
            self.hd = layer["head_dim"]
            self.theta = layer["rope_parameters"]["rope_theta"]
            self.mask_token_id = mask_token_id
            inter = layer["intermediate_size"]
            self.layers = nn.ModuleList(
                DFlashLayer(h, self.nh, self.nkv, self.hd, inter)
                for _ in range(layer["num_hidden_layers"])
            )
            self.fc = nn.Linear(n_aux * h, h, bias=False)
            nn.init.normal_(self.fc.weight, std=0.02)
            self.hidden_norm = nn.Parameter(torch.ones(h))
            self.norm = nn.Parameter(torch.ones(h))
            # The verifier's embeddings and output head, frozen (vLLM shares them).
            self.register_buffer("embed_tokens", embed)
            self.register_buffer("lm_head", lm_head)

        def _rope(self, x, positions):
            half = self.hd // 2
            inv = 1.0 / (self.theta ** (torch.arange(0, half).float() / half))
            freqs = positions[..., None].float() * inv
            # positions [t] -> [1, 1, t, hd], against x [b, heads, t, hd]
            cos = torch.cat([freqs.cos(), freqs.cos()], -1)[None, None]
            sin = torch.cat([freqs.sin(), freqs.sin()], -1)[None, None]
            x1, x2 = x[..., :half], x[..., half:]
            return x * cos + torch.cat([-x2, x1], -1) * sin

        def _heads(self, x, n, norm=None):
            b, t, _ = x.shape
            x = x.view(b, t, n, self.hd)
            if norm is not None:
                x = rms(x, norm, self.eps)
            return x.transpose(1, 2)  # b, n, t, hd

        def forward(self, aux, tokens, anchors, k: int):
            """Logits [B, A, k, V] of the mask slots of one block per anchor.

            ``aux`` [B, T, n_aux*h]: the verifier's states (context), ``tokens``
            [B, T]; block a holds tokens[:, a] (the bonus) then k masks at
            positions a .. a + k, and sees the context positions < a."""
            b, t = tokens.shape
            anchors = torch.as_tensor(anchors)
            a_n, q_per = len(anchors), k + 1
            offsets = torch.arange(q_per)
            qpos = (anchors[:, None] + offsets).flatten()  # A*(k+1)
            qtok = torch.full((b, a_n, q_per), self.mask_token_id, dtype=tokens.dtype)
            qtok[:, :, 0] = tokens[:, anchors]
            x = self.embed_tokens[qtok.flatten(1)]
            ctx_pos = torch.arange(t)
            context = rms(self.fc(aux), self.hidden_norm, self.eps)
            # Query slot (anchor a, offset i) sees context s < a and slots i' <= i
            # of its own block.
            block_id = torch.arange(a_n).repeat_interleave(q_per)
            sees_ctx = ctx_pos[None, :] < anchors.repeat_interleave(q_per)[:, None]
            sees_block = (block_id[:, None] == block_id[None, :]) & (
                offsets.repeat(a_n)[None, :] <= offsets.repeat(a_n)[:, None]
            )
            mask = torch.cat([sees_ctx, sees_block], 1)
            rep = self.nh // self.nkv
            for layer in self.layers:
                xn = rms(x, layer.input_layernorm, self.eps)
                q = self._rope(
                    self._heads(layer.q_proj(xn), self.nh, layer.q_norm), qpos
                )
                kq = self._rope(
                    self._heads(layer.k_proj(xn), self.nkv, layer.k_norm), qpos
                )
                vq = self._heads(layer.v_proj(xn), self.nkv)
                kc = self._rope(
                    self._heads(layer.k_proj(context), self.nkv, layer.k_norm),
                    ctx_pos,
                )
                vc = self._heads(layer.v_proj(context), self.nkv)
                keys = torch.cat([kc, kq], 2).repeat_interleave(rep, 1)
                values = torch.cat([vc, vq], 2).repeat_interleave(rep, 1)
                att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
                x = x + layer.o_proj(att.transpose(1, 2).reshape(b, a_n * q_per, -1))
                mlp_in = rms(x, layer.post_attention_layernorm, self.eps)
                x = x + layer.down_proj(
                    F.silu(layer.gate_proj(mlp_in)) * layer.up_proj(mlp_in)
                )
            logits = rms(x, self.norm, self.eps) @ self.lm_head.T
            return logits.view(b, a_n, q_per, -1)[:, :, 1:]

        def export(self) -> dict:
            """Tensors under speculators' (and vLLM's) names."""
            named = {
                "embed_tokens.weight": self.embed_tokens,
                "lm_head.weight": self.lm_head,
                "fc.weight": self.fc.weight,
                "hidden_norm.weight": self.hidden_norm,
                "norm.weight": self.norm,
            }
            for i, layer in enumerate(self.layers):
                p = f"layers.{i}."
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    named[f"{p}self_attn.{name}.weight"] = getattr(layer, name).weight
                named[p + "self_attn.q_norm.weight"] = layer.q_norm
                named[p + "self_attn.k_norm.weight"] = layer.k_norm
                for name in ("gate_proj", "up_proj", "down_proj"):
                    named[f"{p}mlp.{name}.weight"] = getattr(layer, name).weight
                named[p + "input_layernorm.weight"] = layer.input_layernorm
                named[p + "post_attention_layernorm.weight"] = (
                    layer.post_attention_layernorm
                )
            return {k: v.detach().contiguous().clone() for k, v in named.items()}

    return DFlashDraft


def repeat_prior(draft, *, sharpness: float = PRIOR_SHARPNESS):
    """Set the draft's weights to the rule "every drafted token repeats the bonus
    token", from the verifier's embeddings and output head (least squares, no
    gradient steps).

    Greedy continuations of a random tiny model loop (``314 314 314 ...``); a rule
    of the continuation's own tokens is what predicts them on prompts never seen
    (docs/speculators.md), and a block of repeats is accepted whole on a loop of
    period one. In the first layer every head's query (from the mask token) and
    key (from any other token) lie on the rope dimensions that barely rotate, with
    opposite signs for the mask token, so a mask slot attends to the bonus slot
    (score ``+11.3 * sharpness``), not to the other masks (the negative) nor to the
    context (``fc`` starts at zero: its keys are zero); the value path is the best
    rank-``nkv * hd`` map from the normed embedding of a token to its output-head
    row. The other layers, and every MLP, start as the identity (zero output
    projections). Returns the key direction (the "is a token" reader), which
    :func:`induction_prior` keeps the context clear of."""
    import torch

    h, hd, nh, nkv, eps = draft.h, draft.hd, draft.nh, draft.nkv, draft.eps

    def unitrms(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    embed, out = draft.embed_tokens.double(), draft.lm_head.double()
    normed = unitrms(embed)
    code = out / out.pow(2).mean(-1, keepdim=True).sqrt()
    copy = torch.linalg.lstsq(normed, code).solution  # normed @ copy ~ code
    is_token = torch.ones(len(embed), dtype=torch.float64)
    is_token[draft.mask_token_id] = -1.0
    key_dir = torch.linalg.lstsq(normed, is_token[:, None]).solution[:, 0]
    mask_vec = normed[draft.mask_token_id]
    query_dir = mask_vec / mask_vec.pow(2).sum()
    r = min(nkv * hd, h)
    u, sv, vt = torch.linalg.svd(copy)
    into_value = u[:, :r] * sv[:r].sqrt()  # h x r
    from_value = sv[:r, None].sqrt() * vt[:r]  # r x h
    half = hd // 2
    # Rope pairs (i, i + half) with i >= half / 2 turn by at most theta^(-1/2)
    # per position.
    dims = [*range(half // 2, half), *range(half + half // 2, hd)]
    rep = nh // nkv
    with torch.no_grad():
        draft.fc.weight.zero_()
        for i, layer in enumerate(draft.layers):
            layer.o_proj.weight.zero_()
            layer.down_proj.weight.zero_()
            if i:
                continue
            for lin in (layer.q_proj, layer.k_proj, layer.v_proj):
                lin.weight.zero_()
            layer.q_norm.fill_(sharpness)
            layer.v_proj.weight[:r] = into_value.T.float()
            for g in range(nkv):
                layer.k_proj.weight[[g * hd + j for j in dims]] = key_dir.float()
                rows = from_value[g * hd : (g + 1) * hd]
                for q in range(g * rep, (g + 1) * rep):
                    layer.q_proj.weight[[q * hd + j for j in dims]] = query_dir.float()
                    layer.o_proj.weight[:, q * hd : q * hd + len(rows)] = (
                        rows.T / rep
                    ).float()
    return key_dir


def induction_prior(
    draft,
    tokens,
    aux,
    logits,
    key_dir,
    *,
    weight: float,
    sharpness: float = INDUCTION_SHARPNESS,
    key_dims: int = INDUCTION_KEY_DIMS,
) -> None:
    """Make the draft's second layer an induction head over the context: the
    verifier's states, through ``fc``. Least squares and an eigenproblem on the
    training data (``aux`` [N, T, n_aux*h]: the verifier's states at the
    positions of ``tokens`` [N, T]; ``logits``: its logits, row t predicting
    t + 1), after :func:`repeat_prior`.

    ``fc`` writes two things into subspaces orthogonal to the first layer's key
    direction (so that layer still ignores the context):
      - keys: the states' linear discriminant projection onto ``key_dims``
        dimensions (the directions that best separate which token sits at a
        position from everything else the states carry), read by the second
        layer's ``k_proj`` on the slow rope dimensions;
      - values: the verifier's final normed state (the least-squares preimage of
        its logits, times the last auxiliary state's RMS so that it is linear in
        the states), in the coordinates of the leading singular directions of
        the logits, read back by ``v_proj``/``o_proj`` into a vector whose
        output-head product is the verifier's logits (its greedy next token);
    the query maps the first layer's output (the code of the bonus token) to
    that token's mean discriminant key. So every mask slot attends to the
    context positions that held the bonus token and adds ``weight`` times the
    verifier's prediction there: on a loop, the token after the bonus. Where the
    bonus never occurred the attention spreads and the repeat vote stays. The
    value path needs ``nkv * hd >= hidden_size`` (the tiny draft has as many KV
    heads as query heads)."""
    import torch

    h, hd, nh, nkv = draft.h, draft.hd, draft.nh, draft.nkv
    layer = draft.layers[1]
    out = draft.lm_head.double()
    code = out / out.pow(2).mean(-1, keepdim=True).sqrt()
    vocab = len(out)
    gen = torch.Generator().manual_seed(1)
    start = torch.cat(
        [key_dir[:, None], torch.randn(h, h - 1, generator=gen, dtype=torch.float64)],
        1,
    )
    basis = torch.linalg.qr(start)[0][:, 1:]  # orthonormal, orthogonal to key_dir
    key_basis, value_basis = basis[:, :key_dims], basis[:, key_dims:]
    states = aux[:, :-1].double().flatten(0, 1)
    at = tokens[:, :-1].flatten()
    # Keys: linear discriminant directions of "which token is here".
    counts = torch.bincount(at, minlength=vocab).double()
    seen = counts > 0
    means = torch.zeros(vocab, states.shape[1], dtype=torch.float64)
    means = means.index_add_(0, at, states) / counts.clamp(min=1)[:, None]
    centre = states.mean(0)
    within = states - means[at]
    eye = torch.eye(states.shape[1], dtype=torch.float64)
    sw = within.T @ within / len(states) + 1e-4 * eye
    spread = means[seen] - centre
    sb = (spread * counts[seen, None]).T @ spread / len(states)
    whiten = torch.linalg.inv(torch.linalg.cholesky(sw))
    _, vectors = torch.linalg.eigh(whiten @ sb @ whiten.T)
    discriminant = whiten.T @ vectors[:, -key_dims:]  # states -> key coordinates
    token_keys = (means - centre) @ discriminant
    token_keys[~seen] = 0
    query_map = torch.linalg.lstsq(code[seen], token_keys[seen]).solution
    # Values: the verifier's final normed state, in the logits' leading
    # singular coordinates.
    flat_logits = logits[:, :-1].double().flatten(0, 1)
    final = flat_logits @ torch.linalg.pinv(out).T
    final = final * states[:, -h:].pow(2).mean(-1, keepdim=True).sqrt()
    n_value = value_basis.shape[1]
    _, _, vt = torch.linalg.svd(flat_logits, full_matrices=False)
    into_coords = out.T @ vt[:n_value].T  # h x n_value
    from_coords = vt[:n_value] @ torch.linalg.pinv(out).T  # n_value x h
    target = ((states - centre) @ discriminant) @ key_basis.T + (
        final @ into_coords
    ) @ value_basis.T
    fc = torch.linalg.lstsq(states, target).solution
    half = hd // 2
    dims = [*range(half // 2, half), *range(half + half // 2, hd)][:key_dims]
    mask_vec = torch.nn.functional.normalize(
        draft.embed_tokens[draft.mask_token_id].double(), dim=0
    )
    without_mask = eye[:h, :h] - mask_vec[:, None] * mask_vec
    rep = nh // nkv
    value_map = value_basis @ from_coords  # input -> output, row vectors
    r = min(nkv * hd, h)
    u, sv, vt2 = torch.linalg.svd(value_map)
    into_value = u[:, :r] * sv[:r].sqrt()
    from_value = sv[:r, None].sqrt() * vt2[:r]
    with torch.no_grad():
        draft.fc.weight.copy_(fc.T.float())
        for lin in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj):
            lin.weight.zero_()
        layer.down_proj.weight.zero_()
        layer.q_norm.fill_(sharpness)
        layer.v_proj.weight[:r] = into_value.T.float()
        for g in range(nkv):
            layer.k_proj.weight[[g * hd + j for j in dims]] = key_basis.T.float()
            rows = from_value[g * hd : (g + 1) * hd]
            for q in range(g * rep, (g + 1) * rep):
                layer.q_proj.weight[[q * hd + j for j in dims]] = (
                    query_map.T @ without_mask
                ).float()
                layer.o_proj.weight[:, q * hd : q * hd + len(rows)] = (
                    weight * rows.T / rep
                ).float()


def calibrate(draft, data: TrainingData, rows, k: int) -> float:
    """Scale the output norm by the factor (from a fixed grid) with the lowest
    cross-entropy: the prior's logits are overconfident where it is wrong."""
    import torch

    best, factor = float("inf"), 1.0
    with torch.no_grad():
        weight = draft.norm.clone()
        for scale in (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125):
            draft.norm.copy_(weight * scale)
            loss = _loss(draft, data, rows, k).item()
            if loss < best:
                best, factor = loss, scale
        draft.norm.copy_(weight * factor)
    return factor


def anchors(data: TrainingData, k: int) -> list[int]:
    """Block positions as vLLM drafts them: the bonus token is a generated one
    (the first drafting follows the prefill), and the block ends inside the
    sequence."""
    return list(range(data.prompt_tokens, data.tokens.shape[1] - k))


def _targets(data: TrainingData, rows, blocks: list[int], k: int):
    import torch

    idx = torch.tensor(blocks)[:, None] + torch.arange(1, k + 1)
    return data.tokens[rows][:, idx]  # B, A, k


def _loss(draft, data: TrainingData, rows, k: int):
    import torch
    import torch.nn.functional as F

    blocks = anchors(data, k)
    logits = draft(data.aux[rows], data.tokens[rows], blocks, k)
    target = _targets(data, rows, blocks, k)
    weight = torch.exp(-torch.arange(k) / DECAY_GAMMA)
    ce = F.cross_entropy(logits.flatten(0, 2), target.flatten(), reduction="none").view(
        target.shape
    )
    return (ce * weight).mean() / weight.mean()


def decoded_acceptance(draft, data: list[TrainingData], k: int) -> dict[str, Any]:
    """Acceptance of the draft's greedy blocks on the verifier's greedy
    sequences, as a speculative decoder drafts (``mtp_train.decoded_walk``): a
    block after the prompt, the next one after the accepted drafts and the
    verifier's own token; what vLLM's counters count."""
    import numpy as np
    import torch

    from onboard.speculators.mtp_train import acceptance_rates, decoded_walk

    drafts, accepted = 0, np.zeros(k)
    with torch.no_grad():
        for part in data:
            rows = torch.arange(len(part.tokens))
            blocks = anchors(part, k)
            ok = (
                draft(part.aux, part.tokens, blocks, k).argmax(-1)
                == _targets(part, rows, blocks, k)
            ).numpy()  # B, A, k
            for b in range(len(part.tokens)):
                n, a = decoded_walk(ok[b].T)
                drafts += n
                accepted += a
    return acceptance_rates(accepted, drafts)


def repeat_rule_acceptance(data: TrainingData, k: int) -> dict[str, Any]:
    """The rule "every drafted token repeats the bonus token" on ``data``'s
    greedy sequences, counted as :func:`decoded_acceptance` counts a draft: what
    :func:`repeat_prior` should reach."""
    import numpy as np

    from onboard.speculators.mtp_train import acceptance_rates, decoded_walk

    blocks = anchors(data, k)
    drafts, accepted = 0, np.zeros(k)
    for seq in data.tokens.tolist():
        ok = np.array([[seq[b] == seq[b + j] for b in blocks] for j in range(1, k + 1)])
        n, a = decoded_walk(ok)
        drafts += n
        accepted += a
    return acceptance_rates(accepted, drafts)


def _choose_induction(draft, data, rows, val, key_dir, k: int) -> float:
    """The induction vote weight (0: none, the repeats alone) with the best
    decoded mean acceptance length on the validation prompts."""
    import torch

    induction_prior(
        draft,
        data.tokens[rows],
        data.aux[rows],
        data.logits[rows],
        key_dir,
        weight=1.0,
    )
    o_proj = draft.layers[1].o_proj.weight
    unit = o_proj.detach().clone()
    best = (-1.0, 0.0)
    with torch.no_grad():
        for weight in INDUCTION_WEIGHTS:
            o_proj.copy_(weight * unit)
            length = decoded_acceptance(draft, [val], k)["mean_acceptance_length"]
            if length > best[0]:
                best = (length, weight)
        o_proj.copy_(best[1] * unit)
    return best[1]


def train(
    draft,
    data: TrainingData,
    *,
    k: int,
    seed: int,
    max_steps: int,
    budget_s: float,
    prior: bool = True,
    lr: float = LR,
    log=lambda _m: None,
) -> dict[str, Any]:
    """From :func:`repeat_prior` (calibrated) unless ``prior`` is false: AdamW
    on the weighted cross-entropy with a cosine rate, the validation prompts
    scored by the decoded mean acceptance length and the best weights kept
    (:func:`onboard.speculators.eagle3.keep_best`)."""
    rows, val = split(data)
    induction_weight = None
    if prior:
        key_dir = repeat_prior(draft)
        if len(draft.layers) > 1 and draft.nkv * draft.hd >= draft.h:
            induction_weight = _choose_induction(draft, data, rows, val, key_dir, k)
            log(f"induction layer, vote weight {induction_weight:g}")
        factor = calibrate(draft, data, rows[:64], k)
        log(f"prior, output norm scaled by {factor:g}")

    def score():
        acc = decoded_acceptance(draft, [val], k)
        return acc["mean_acceptance_length"], acc

    # From the prior only the MLPs and the output norm train: a step on the
    # attention routing (or on fc, whose keys the prior keeps at zero) breaks it.
    params = [
        p
        for n, p in draft.named_parameters()
        if not prior or n == "norm" or set(n.split(".")) & set(TRAINED_FROM_PRIOR)
    ]
    run, start, kept = keep_best(
        draft,
        params,
        lambda batch: _loss(draft, data, batch, k),
        score,
        rows,
        seed=seed,
        max_steps=max_steps,
        budget_s=budget_s,
        lr=lr,
        cosine=True,
        log=log,
    )
    return {
        **run,
        "validation_prompts": int(len(val.tokens)),
        "induction_weight": induction_weight,
        "validation_decoded_start": start,
        "validation_repeat_rule": repeat_rule_acceptance(val, k),
        "validation_decoded_kept": kept,
    }


def dflash_config(
    spec: ModelSpec, model_dir: Path, k: int, num_layers: int = TINY_LAYERS
) -> dict[str, Any]:
    """The speculators config of the tiny draft: the spec's DFlash head config
    with the verifier's full vocabulary and ``num_layers`` layers."""
    config = head_config(
        spec,
        "dflash",
        k,
        verifier=str(Path(model_dir).resolve()),
        draft_vocab=spec.vocab_size,
        num_layers=num_layers,
    )
    # As many KV heads as query heads: the induction layer's value path then
    # has full rank (docs/speculators.md).
    layer = config["transformer_layer_config"]
    layer["num_key_value_heads"] = layer["num_attention_heads"]
    return config


def train_dflash_draft(
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
    num_layers: int = TINY_LAYERS,
    log=lambda _m: None,
) -> dict[str, Any]:
    """Train a DFlash draft for the checkpoint ``model_dir`` (of ``spec``, e.g. the
    tiny checkpoint's spec.yaml) and save it to ``out_dir``; its random initial
    weights (the baseline that accepts nothing) go to ``untrained_dir`` when
    given. Returns the training report (also written to OUT/training.json)."""
    k = num_speculative_tokens
    model_dir = Path(model_dir)
    verifier = verifier_data(
        spec, model_dir, out_dir, num_prompts=num_prompts, seed=seed, log=log
    )
    config = dflash_config(spec, model_dir, k, num_layers)
    draft = make_draft_class()(
        config["transformer_layer_config"],
        len(verifier.aux),
        *verifier.frozen_weights(),
        config["mask_token_id"],
    )
    result = verifier.fit(
        draft,
        config,
        out_dir,
        untrained_dir,
        train,
        k=k,
        seed=seed,
        max_steps=max_steps,
        budget_s=budget_s,
        log=log,
    )
    return verifier.report(
        model_dir,
        out_dir,
        result,
        aux_hidden_state_layer_ids=verifier.aux,
        num_layers=num_layers,
        block_size=config["block_size"],
        mask_token_id=config["mask_token_id"],
    )


def load_draft(draft_dir: Path):
    """A saved draft (config.json + model.safetensors) as the plain-torch module,
    and its config."""
    import torch
    from safetensors.torch import load_file

    draft_dir = Path(draft_dir)
    config = json.loads((draft_dir / "config.json").read_text())
    tensors = load_file(str(draft_dir / "model.safetensors"))
    draft = make_draft_class()(
        config["transformer_layer_config"],
        len(config["aux_hidden_state_layer_ids"]),
        tensors["embed_tokens.weight"].float(),
        tensors["lm_head.weight"].float(),
        config["mask_token_id"],
    )
    frozen = ("embed_tokens.weight", "lm_head.weight")
    with torch.no_grad():
        for key in draft.export():
            if key not in frozen:
                _param_for(draft, key).copy_(tensors[key].float())
    return draft, config


def _param_for(draft, key: str):
    """The module parameter that ``export()`` writes under ``key``."""
    parts = key.removesuffix(".weight").split(".")
    if parts[0] != "layers":
        module = getattr(draft, parts[0])
        return module.weight if parts[0] == "fc" else module
    layer, name = draft.layers[int(parts[1])], parts[-1]
    param = getattr(layer, name)
    return param if isinstance(param, type(draft.norm)) else param.weight


def replay_acceptance(
    draft_dir: Path,
    model_dir: Path,
    spec: ModelSpec,
    prompts: list[list[int]],
    k: int,
    max_tokens: int,
) -> dict[str, Any]:
    """What vLLM's counters should say for the draft in ``draft_dir`` on greedy
    requests of ``prompts`` with ``max_tokens`` new tokens: the verifier's
    (reference, float32) greedy continuations, its states at the draft's
    auxiliary layers, the plain-torch draft's block at every position, replayed
    as a speculative decoder drafts (``decoded_walk``: the first block after the
    prefill, the next after each verification; the last one may reach past
    ``max_tokens``, as vLLM counts it). A P-EAGLE head (speculators type
    "peagle") is replayed the same way, by ``peagle.block_predictor``."""
    import numpy as np
    import torch

    from onboard.runtime.reference import load_reference
    from onboard.speculators.calibration import greedy_continuations
    from onboard.speculators.eagle3 import verifier_states
    from onboard.speculators.mtp_train import decoded_walk

    config = json.loads((Path(draft_dir) / "config.json").read_text())
    if config.get("speculators_model_type") == "peagle":
        from onboard.speculators.peagle import block_predictor

        draft, aux_ids = block_predictor(draft_dir)
    else:
        draft, config = load_draft(draft_dir)
        aux_ids = config["aux_hidden_state_layer_ids"]
    work = Path(draft_dir).parent / f".{Path(draft_dir).name}-replay"
    model = load_reference(Path(model_dir), spec, None, work).model.float()
    drafts, accepted = 0, np.zeros(k)
    with torch.no_grad(), one_thread():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            seq = greedy_continuations(model, ids, max_tokens + k - 1)
            aux, _ = verifier_states(model, seq, aux_ids)
            blocks = list(range(len(prompt), len(prompt) + max_tokens - 1))
            pred = draft(aux.float(), seq, blocks, k).argmax(-1)[0]  # A, k
            truth = seq[0, torch.tensor(blocks)[:, None] + torch.arange(1, k + 1)]
            n, a = decoded_walk((pred == truth).numpy().T)
            drafts += n
            accepted += a
    return {
        "num_drafts": drafts,
        "num_accepted_tokens_per_pos": [int(x) for x in accepted],
        "acceptance_rate_per_position": (accepted / max(drafts, 1)).tolist(),
        "mean_acceptance_length": 1.0 + float(accepted.sum()) / max(drafts, 1),
    }
