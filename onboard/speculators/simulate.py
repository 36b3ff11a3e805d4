"""What vLLM's spec-decode counters will read for a draft length k, without an
engine: replay vLLM's schedule over the greedy continuations of the prompts.

Greedy speculative decoding is lossless, so every k produces the continuation the
engine without speculation produces. vLLM drafts only at the verification
frontier: after the prefill and after every verification step, the drafter
proposes up to k tokens following the last known token; the step accepts their
leading run that equals the greedy continuation (a), emits a + 1 tokens, and the
next draft starts there. So the acceptance at a position depends on k (longer
accepted runs skip the easy slots in between), which a per-position rate taken
from one k cannot carry over to another.

How the pinned vLLM 0.32 counts near the end of a request (read from
``vllm/v1/core/sched/scheduler.py``): the scheduler does not trim a draft to the
request's remaining ``max_tokens`` (only to ``max_model_len``), and
``num_accepted_tokens`` counts the accepted draft tokens before the output is cut
at ``max_tokens``. The last step of a request can therefore accept tokens past its
end; the walk compares them with the greedy continuation's tokens past the end
too (``greedy`` must hold ``new_tokens + k - 1`` tokens).

The n-gram drafter is replicated here (:func:`ngram_propose`, vLLM's
``ngram_proposer._find_longest_matched_ngram_and_propose_tokens``); a model
draft's correctness per slot comes from a reference forward
(``onboard.speculators.mtp_train.sequence_acceptance`` for MTP).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Counters:
    """vLLM's spec-decode counters over a set of requests (the names of
    ``vllm:spec_decode_*``): drafts (steps that verified a draft), draft tokens,
    accepted tokens, accepted per position; ``steps``: the decode steps the
    requests took (sequence-steps, summed over requests); ``sequences`` and
    ``new_tokens`` per request."""

    sequences: int
    new_tokens: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    steps: int = 0

    @property
    def tokens_per_step(self) -> float:
        """L: new tokens (after the prefill's) per sequence-step, ``n (N - 1) /
        steps`` (not from ``accepted``, which counts tokens past a request's end)."""
        return (
            self.sequences * (self.new_tokens - 1) / self.steps if self.steps else 0.0
        )

    def add(self, other: Counters) -> Counters:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))

        def pad(x):
            return list(x) + [0] * (width - len(x))

        return Counters(
            sequences=self.sequences + other.sequences,
            new_tokens=self.new_tokens,
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted=self.accepted + other.accepted,
            accepted_per_pos=[
                a + b
                for a, b in zip(
                    pad(self.accepted_per_pos), pad(other.accepted_per_pos), strict=True
                )
            ],
            steps=self.steps + other.steps,
        )


def walk(
    prompt: Sequence[int],
    greedy: Sequence[int],
    new_tokens: int,
    k: int,
    propose: Callable[[list[int], int], list[int]],
) -> Counters:
    """vLLM's schedule over one request: ``prompt``, its greedy continuation
    ``greedy`` (at least ``new_tokens + k - 1`` tokens), ``max_tokens =
    new_tokens``; ``propose(context, frontier)`` gives the draft (at most k tokens,
    possibly none) after ``context`` (prompt + the tokens emitted so far), whose
    last token is ``greedy[frontier]``."""
    if len(greedy) < new_tokens + k - 1:
        raise ValueError(
            f"the greedy continuation has {len(greedy)} tokens; the walk needs "
            f"{new_tokens + k - 1} (max_tokens + k - 1: the last step may accept "
            "drafts past the end)"
        )
    seq = list(prompt) + list(greedy)
    out = Counters(sequences=1, new_tokens=new_tokens, accepted_per_pos=[0] * k)
    u = 0  # greedy[u] is the last emitted token (the prefill emits greedy[0])
    while u + 1 < new_tokens:
        draft = list(propose(seq[: len(prompt) + u + 1], u))[:k]
        out.steps += 1
        a = 0
        while a < len(draft) and draft[a] == greedy[u + 1 + a]:
            a += 1
        if draft:
            out.drafts += 1
            out.draft_tokens += len(draft)
            out.accepted += a
            for j in range(a):
                out.accepted_per_pos[j] += 1
        u += a + 1
    return out


def simulate(
    prompts: Sequence[Sequence[int]],
    greedy: Sequence[Sequence[int]],
    new_tokens: int,
    k: int,
    propose_for: Callable[[int], Callable[[list[int], int], list[int]]],
) -> Counters:
    """The counters over all requests; ``propose_for(i)`` is request i's drafter."""
    total = Counters(sequences=0, new_tokens=new_tokens, accepted_per_pos=[0] * k)
    for i, (prompt, cont) in enumerate(zip(prompts, greedy, strict=True)):
        total = total.add(walk(prompt, cont, new_tokens, k, propose_for(i)))
    return total


# ---- n-gram -------------------------------------------------------------------------


def ngram_propose(
    tokens: Sequence[int],
    k: int,
    min_n: int,
    max_n: int,
    max_model_len: int | None = None,
) -> list[int]:
    """vLLM 0.32's n-gram (prompt lookup) draft after ``tokens``: the longest
    suffix of n tokens (min_n <= n <= max_n) that occurred earlier in ``tokens``
    (an occurrence may overlap the suffix but must end before the last token);
    of its occurrences the earliest; the draft is the up to k tokens that followed
    it (fewer when the context ends first); none when no suffix of min_n tokens
    recurs, or no room is left below ``max_model_len``.

    Written plainly (vLLM runs a KMP search over the reversed tokens in numba;
    tests compare the two on random sequences)."""
    total = len(tokens)
    if total < min_n:
        return []
    if max_model_len is not None:
        k = min(k, max_model_len - total)
    if k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = list(tokens[total - n :])
        for start in range(0, total - n):  # ends at start + n <= total - 1
            if list(tokens[start : start + n]) == suffix:
                follow = start + n
                return list(tokens[follow : follow + min(k, total - follow)])
    return []


def ngram_counters(
    prompts: Sequence[Sequence[int]],
    greedy: Sequence[Sequence[int]],
    new_tokens: int,
    k: int,
    min_n: int,
    max_n: int,
    max_model_len: int | None = None,
) -> Counters:
    """The counters an n-gram engine with draft length k reports."""

    def propose(context, _u):
        return ngram_propose(context, k, min_n, max_n, max_model_len)

    return simulate(prompts, greedy, new_tokens, k, lambda _i: propose)


def ngram_window(config: dict) -> tuple[int, int]:
    """(min n, max n) of an n-gram ``--speculative-config``, with vLLM's defaults
    (``SpeculativeConfig``: both unset -> 5 and 5; one unset -> the other's)."""
    lo, hi = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
    if lo is None and hi is None:
        return 5, 5
    return (hi if lo is None else lo), (lo if hi is None else hi)


# ---- model drafts (MTP) ------------------------------------------------------------


def mtp_counters(
    model,
    prompts: Sequence[Sequence[int]],
    greedy: Sequence[Sequence[int]],
    new_tokens: int,
    heads: Sequence[int],
) -> Counters:
    """The counters of an MTP engine running ``heads`` (one per draft position:
    ``onboard.spec.mtp.heads_run_by_vllm``), from the generated reference
    ``model`` (``mtp_train.load_mtp_reference``): its ``mtp_forward`` over prompt
    + greedy continuation gives every slot's drafts, ``sequence_acceptance``'s
    decoded walk the counters (each sequence cut to ``new_tokens + k - 1``
    generated tokens, so that its last round is the request's last step)."""
    import torch

    from onboard.speculators.mtp_train import sequence_acceptance

    k = len(heads)
    if any(len(g) < new_tokens + k - 1 for g in greedy):
        raise ValueError(f"the walk needs {new_tokens + k - 1} greedy tokens")
    seqs = [
        torch.tensor(list(p) + list(g[: new_tokens + k - 1]))
        for p, g in zip(prompts, greedy, strict=True)
    ]
    acc = sequence_acceptance(model, seqs, [len(p) for p in prompts], list(heads))
    per_pos = [round(rate * acc.decoded_drafts) for rate in acc.decoded_per_position]
    return Counters(
        sequences=len(prompts),
        new_tokens=new_tokens,
        drafts=acc.decoded_drafts,
        draft_tokens=acc.decoded_drafts * k,
        accepted=sum(per_pos),
        accepted_per_pos=per_pos,
        steps=acc.decoded_drafts,  # every step drafts
    )
