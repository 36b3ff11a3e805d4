"""P-EAGLE on the tiny checkpoints: an EAGLE-3 head that drafts its k tokens in
one forward pass, as vLLM 0.32 runs it.

What vLLM runs (``method: eagle3`` with ``parallel_drafting: true``; a
speculators "peagle" config is read as that, ``Eagle3LlamaForCausalLM``, and
its ``mask_token_id`` becomes the proposer's ``pard_token``): after each
verification the head's query holds the bonus slot (the verifier's last
states and the embedding of the token it sampled: EAGLE-3's first step) and
k - 1 mask slots at the next positions, each fed the mask token's embedding
and ``fc(mask_hidden)`` in place of verifier states
(``v1/spec_decode/llm_base_proposer.py:855-931``, ``mask_hidden`` loaded at
``llama_eagle3.py:431-441``); one causal pass over the context (the head's own
keys of the verified positions) and the block drafts slot j's token for
position j. :func:`parallel_unroll` is that pass, in plain torch, at every
position of a sequence at once.

The prior (no gradient steps): the bonus slot is EAGLE-3's induction head
(``eagle3.induction_prior``); every mask slot copies the bonus slot's token,
"the bonus token again", which is what greedy continuations of a random tiny
model do on a loop of period one. A mask slot's query cannot see the bonus
token (it is the same vector at every mask slot), so it finds the bonus slot by
position: the most recent slot that is not a mask. Two directions of the head's
own embedding table (P-EAGLE trains its embeddings; vLLM keeps a head's
distinct ``embed_tokens``, ``llm_base_proposer.py:1436-1466``) make that exact:
every real token has the component ``ALPHA`` on ``u1`` and none on ``u2``, the
mask token ``-ALPHA`` on ``u1`` and the rest of its norm on ``u2``. A slowly
turning rope pair then carries a query from ``u2`` (mask slots only, exactly
zero elsewhere) and a key from ``u1`` (positive for real tokens, negative for
masks): the score ``RECENCY * cos(theta * distance)`` falls with the distance,
so each mask slot attends to the bonus slot (``RECENCY`` sets the margin to the
next real slot) and copies its value, the code of the bonus token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onboard.speculators import eagle3

# The real tokens' constant component on u1 (their embeddings have unit RMS).
ALPHA = 1.0
# Score margin between the bonus slot and the real slot before it, for the first
# mask slot (larger for the later ones): softmax weight 1 - e^-12 on the bonus.
MARGIN = 12.0
# The recency pair turns by at most this per position (a distance of pi / it,
# over 400 positions, stays on the falling side of the cosine).
RECENCY_TURN = 0.008
# Gradient steps after the prior, on the MLP, output norm and mask_hidden only
# (a step on the attention would break the exact zeros above).
BUDGET_S = 30.0


def separate_mask(head, mask_id: int) -> None:
    """Rewrite the head's embedding table (unit-RMS rows) so that the mask token
    is the only one with a component on ``head.u2`` and real tokens have exactly
    ``ALPHA`` on ``head.u1`` (the module docstring); the two directions are the
    normalized embeddings' two weakest ones, so the tokens lose little."""
    import torch

    embed = head.embed_tokens.double()
    h = embed.shape[1]
    normed = embed / embed.norm(dim=1, keepdim=True)
    _, _, vt = torch.linalg.svd(normed, full_matrices=False)
    u1, u2 = vt[-1], vt[-2]
    rest = normed - torch.outer(normed @ u1, u1) - torch.outer(normed @ u2, u2)
    rest = rest / rest.norm(dim=1, keepdim=True)
    table = (h - ALPHA**2) ** 0.5 * rest + ALPHA * u1
    table[mask_id] = -ALPHA * u1 + (h - ALPHA**2) ** 0.5 * u2
    with torch.no_grad():
        head.embed_tokens.copy_(table.float())
    head.u1, head.u2 = u1, u2


def recency_prior(head) -> None:
    """After ``eagle3.induction_prior`` on the table of :func:`separate_mask`:
    on one rope pair the prior leaves free (the fast half), a query from ``u2``
    and a key from ``u1``, scaled so that the first mask slot prefers the bonus
    slot to the real slot before it by ``MARGIN``."""
    import torch

    h, hd = head.h, head.hd
    half = hd // 2
    # The fastest pair turning by at most RECENCY_TURN per position.
    turns = [head.theta ** (-i / half) for i in range(half)]
    pair = next(i for i, t in enumerate(turns) if t <= RECENCY_TURN)
    theta = turns[pair]
    # cos(theta) - cos(2 theta) ~ 1.5 theta^2; scores are divided by sqrt(hd).
    strength = MARGIN / (1.5 * theta**2) * hd**0.5
    query = (h - ALPHA**2) ** 0.5  # a mask slot's u2 component
    scale = strength**0.5
    with torch.no_grad():
        for g in range(head.nkv):
            head.k_proj.weight[g * hd + pair, :h] = (scale / ALPHA * head.u1).float()
        for i in range(head.nh):
            head.q_proj.weight[i * hd + pair, :h] = (scale / query * head.u2).float()


def parallel_unroll(head, data, rows, k: int):
    """vLLM's P-EAGLE pass with the bonus slot at every position: per depth j
    (0 .. k - 1) the logits of the slot that drafts token t + 2 + j for the
    bonus slot at index t (which reads the states at t and token t + 1), the
    verifier's logits there and the valid positions, as ``eagle3.unroll``."""
    import torch

    tokens, aux, logits = data.tokens[rows], data.aux[rows], data.logits[rows]
    b, total = tokens.shape
    t = total - 1
    positions = torch.arange(1, total).expand(b, t)
    target = logits[:, 1:]
    hidden = head.combine(aux[:, :-1])
    cache: list = []
    pred, _ = head.step(tokens[:, 1:], hidden, positions, cache, 0)
    keys, values = cache[0]  # rope applied: [b, nkv, t, hd]
    rep = head.nh // head.nkv
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    out = [(pred, target, torch.ones(t, dtype=torch.bool))]
    mask_tokens = torch.full((b, t), head.mask_token_id)
    mask_hidden = head.combine(head.mask_hidden).expand(b, t, -1)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for j in range(1, k):
        slots = [
            head.project(mask_tokens, mask_hidden, positions + i)
            for i in range(1, j + 1)
        ]
        q = slots[-1][0]
        scores = [(q @ keys.transpose(-1, -2)).masked_fill(~causal, float("-inf"))]
        for _, mk, _ in slots:
            mk = mk.repeat_interleave(rep, 1)
            scores.append((q * mk).sum(-1, keepdim=True))
        weights = torch.softmax(torch.cat(scores, -1) / head.hd**0.5, -1)
        att = weights[..., :t] @ values
        for i, (_, _, mv) in enumerate(slots):
            att = att + weights[..., t + i : t + i + 1] * mv.repeat_interleave(rep, 1)
        logits_j, _ = head.finish(att, mask_hidden)
        step_target = torch.cat(
            [target[:, j:], target.new_zeros(b, j, target.shape[-1])], 1
        )
        valid = torch.zeros(t, dtype=torch.bool)
        valid[: t - j] = True
        out.append((logits_j, step_target, valid))
    return out


def train(head, data, *, k: int, **run) -> dict[str, Any]:
    """The prior (induction at the bonus slot, the bonus token at the mask slots),
    the output norm calibrated over all k depths, then AdamW on the MLP, output
    norm and ``mask_hidden``, keeping the weights with the best decoded mean
    acceptance length on the validation prompts (``run``: ``keep_best``'s seed,
    max_steps, budget_s and log)."""
    rows, val = eagle3.split(data)
    separate_mask(head, head.mask_token_id)
    eagle3.induction_prior(head, data.tokens[rows], data.aux[rows])
    recency_prior(head)
    factor = eagle3.calibrate(head, data, rows[:64], parallel_unroll, k)
    run["log"](f"prior: induction + repeat the bonus token, output norm x {factor:g}")

    def score() -> tuple[float, dict]:
        acc = eagle3.decoded_acceptance(head, [val], k, parallel_unroll)
        return acc["mean_acceptance_length"], acc

    def loss(batch):
        return eagle3._ce_loss(head, data, batch, k, parallel_unroll)

    mlp = [head.gate_proj.weight, head.up_proj.weight, head.down_proj.weight]
    trained = [*mlp, head.norm, head.mask_hidden]
    return eagle3.from_prior(head, trained, loss, score, rows, val, factor, **run)


def train_peagle_head(
    spec, model_dir: Path, out_dir: Path, *, budget_s: float = BUDGET_S, **kwargs
) -> dict[str, Any]:
    """Train a P-EAGLE head for the checkpoint ``model_dir`` and save it to
    ``out_dir`` (``eagle3.train_eagle3_head`` with this module's prior and
    parallel drafting)."""
    return eagle3.train_eagle3_head(
        spec,
        model_dir,
        out_dir,
        budget_s=budget_s,
        method="p_eagle",
        train_fn=train,
        **kwargs,
    )


def load_head(head_dir: Path):
    """(head, config) of a saved P-EAGLE head, in plain torch."""
    from safetensors.torch import load_file

    config = json.loads((Path(head_dir) / "config.json").read_text())
    tensors = load_file(str(Path(head_dir) / "model.safetensors"))
    n_aux = len(config["eagle_aux_hidden_state_layer_ids"])
    head = eagle3.make_head_class()(
        config["transformer_layer_config"],
        n_aux,
        tensors["embed_tokens.weight"],
        tensors["lm_head.weight"],
        parallel=True,
    )
    head.mask_token_id = config["mask_token_id"]
    head.load_exported(tensors)
    return head, config


def block_predictor(head_dir: Path):
    """(predict, auxiliary layer ids) of a saved P-EAGLE head, in the form
    ``dflash_train.replay_acceptance`` replays: ``predict(aux, seq, blocks, k)``
    gives the logits [1, len(blocks), k, V] of the block drafted after the
    bonus token at each position of ``blocks``."""
    import torch

    head, config = load_head(head_dir)

    def predict(aux, seq, blocks, k):
        data = eagle3.TrainingData(seq, aux, torch.zeros(*seq.shape, 1), 0)
        out = parallel_unroll(head, data, torch.arange(len(seq)), k)
        # The bonus token at position b is read by the slot of index b - 1.
        index = torch.tensor(blocks) - 1
        return torch.stack([pred[:, index] for pred, _, _ in out], 2)

    return predict, config["eagle_aux_hidden_state_layer_ids"]
