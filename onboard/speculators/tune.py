"""`onboard speculators tune`: pick the draft length k per method from measurements.

vLLM fixes k per engine, so every k costs an engine start (about a minute here).
Per method the tuner starts one engine per k = 1..K (K = 4) and shares one engine
without speculation; in each it probes the step cost, then times the same greedy
requests for two batch bands (batch 8: eight prompts in one call; batch 1: four
prompts one at a time) and reads vLLM's spec-decode counters.

Cost model (what is predicted from what; ``predict`` is the pure function):

- per sequence, a decode step emits 1 + the accepted draft tokens; over n
  sequences of N new tokens (the first from the prefill) the sequence-steps S
  are counted from the scheduler's steps (the requests each step decodes:
  probes.step_kind), and ``L = n (N - 1) / S``. Not ``S = n (N - 1) -
  accepted`` from the counters: vLLM counts the tokens a request's last step
  accepts past max_tokens, which would undercount S by up to k - 1 steps per
  request (25% on the batch-1 probe of MTP k = 3, whose L is high), by a
  different amount in the probe and the rounds;
- the probe, a run of its own in each engine, PROBE_REPEATS times, alternating
  with the timed rounds (so that probe and rounds see the same load on a shared
  machine), on prompts of its own (:func:`probe_prompts`: windows of the
  bundled calibration text, one per timed prompt and as many tokens long; the
  timed prompts are not probed, so the prediction does not reuse the measurement
  it is compared with): the band's requests once with max_tokens 1 (the prefill:
  ``P``, wall seconds per call) and once with PROBE_TOKENS = N new tokens (a
  step's cost grows with the context, and a shorter probe has more of a batch's
  ragged tail: a 16-token probe was 5-14% off the rounds); the difference is the
  wall time of the decode steps, everything included (worker, engine-core
  scheduling, IPC, output processing), divided by the probe's own sequence-steps
  per sequence gives ``s``, the wall seconds per decode step; the medians over
  the repeats count. ``t1`` and ``P0`` are the
  baseline engine's, ``s(k)`` and ``P(k)`` k's own engine's. Probed per k in k's
  own engine, not interpolated across engines: an engine instance's speed varies
  by about 15% on a shared 2-core machine (vLLM pins its thread to core 0);
  probe and timed rounds share one instance. The worker's own time per decode
  step (execute_model + sample_tokens, timed inside vLLM by probes.time_steps)
  and the rest of the wall step (outside the worker) are reported as detail;
- acceptance: tokens per sequence-step ``L(k) = n (N - 1) / S(k)``, the steps
  k will take, predicted by replaying vLLM's schedule over the baseline
  engine's greedy continuations of the timed prompts
  (onboard.speculators.simulate; greedy speculation is lossless, so they are
  every k's continuations too): drafts only at each verification frontier, the
  leading right draft tokens accepted. n-gram drafts come from a replica of
  vLLM's proposer, MTP drafts from the generated reference's heads (the ones
  vLLM runs); both reproduce the engines' counters and steps exactly. A
  per-position rate taken from one k does not carry over to another (longer
  accepted runs skip the easy slots between drafts). Methods without a
  reference drafter (EAGLE-3 and the other draft models) keep the k = K
  engine's rates:
  ``L(k) = 1 + f * sum(p_1..p_k)``, ``p_i`` accepted at position i over drafts,
  ``f`` drafts over sequence-steps, scaled by L(K) measured over L(K) by that
  formula (the counters' tokens past max_tokens taken out);
- predicted time per call of N new tokens: ``P0 + (N - 1) t1`` without
  speculation, ``P(k) + (N - 1) s(k) / L(k)`` with k drafts; predicted speed-up
  their ratio (``t1 * L(k) / s(k)`` when the prefill is negligible); measured
  speed-up: the baseline's median wall-clock over the speculative engine's, over
  REPEATS rounds of the same requests (the spread of the rounds is reported
  beside it). Wall-clock is the engine's own ``LLM.generate`` time, in probe and
  rounds alike.

Detail columns: the prediction with the k = K engine's rates (the model before
the simulation) and the first model (step cost linear in k, calibrated on the
k = 1 and k = K wall-clocks: ``predict_linear``). The best k is the measured
best; when no k beats 1.0 the tuner declines speculation for that band, with the
numbers.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onboard.fsutil import atomic_write_text
from onboard.runtime.engine import Engine, EngineOptions, Plugin, engine_state_options
from onboard.spec.model import ModelSpec, Speculator
from onboard.speculators.acceptance import PREFIX
from onboard.speculators.simulate import Counters
from onboard.threads import one_thread

K_VALUES = (1, 2, 3, 4)
NEW_TOKENS = 32
BANDS = {"batch-8": (8, 1), "batch-1": (1, 4)}  # band: (batch size, calls)
TOLERANCE = 0.15
# Timed rounds per band and engine; the median counts (see measure).
REPEATS = 7
# New tokens per request in the step-cost probe (as many as the timed rounds: a
# decode step's cost grows with the context, and a short probe has a larger share
# of a batch's ragged tail), and its repeats (see measure).
PROBE_TOKENS = NEW_TOKENS
PROBE_REPEATS = 7
# Greedy tokens kept per request (the walk's last step may accept drafts past
# max_tokens: onboard.speculators.simulate).
GREEDY_TOKENS = NEW_TOKENS + K_VALUES[-1] - 1
# Bumped when Run or how it is measured changes: a saved measurement of another
# version is retaken.
FORMAT = 5
PROBES = "onboard.speculators.probes"


@dataclass
class Run:
    """One band on one engine: wall-clock and spec-decode counter deltas."""

    seconds: float
    sequences: int
    calls: int
    # Sequence-steps per round: the decode steps summed over the requests, counted
    # from the scheduler's steps (not from the counters: see the module doc).
    seq_steps: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    # Every timing round's wall-clock (``seconds`` is their median).
    rounds: tuple[float, ...] = ()
    # The probe (medians over PROBE_REPEATS): wall seconds per decode step (per
    # sequence-step, as S counts them) and of the prefill per call, the probe's
    # own tokens per step, and wall seconds per engine decode step.
    probe_wall_step_s: float | None = None
    probe_prefill_s: float | None = None
    probe_tokens_per_step: float | None = None
    probe_engine_step_s: float | None = None
    probe_walls: tuple[float, ...] = ()
    # Per probe repeat and per timed round: wall seconds, steps (all, decode,
    # decode with drafts), the worker's seconds (so other cost models can be
    # checked offline from WORK/<engine>.json).
    probe_raw: tuple[dict[str, float], ...] = ()
    rounds_raw: tuple[dict[str, float], ...] = ()
    # Median worker time of one decode step (execute_model + sample_tokens) in
    # the probe, and in the timed rounds (detail: wall minus worker is the time
    # outside the worker).
    probe_step_s: float | None = None
    round_step_s: float | None = None
    # Per decode step in the timed rounds, median seconds of its parts (target
    # forward, sampling / rejection sampling, drafter) and target token counts.
    parts_s: dict[str, float] = dataclasses.field(default_factory=dict)
    forward_tokens: tuple[int, ...] = ()
    # The engine's greedy continuation of every request of the band
    # (GREEDY_TOKENS each): the baseline's feed the acceptance simulation, a
    # speculative engine's must equal them (lossless).
    greedy: tuple[tuple[int, ...], ...] = ()

    @property
    def tokens_per_step(self) -> float:
        """L measured: new tokens (after the prefill's) per sequence-step."""
        return self.sequences * (NEW_TOKENS - 1) / self.seq_steps

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median round: the timing noise."""
        return (
            (max(self.rounds) - min(self.rounds)) / self.seconds if self.rounds else 0
        )


def step_time_baseline(base: Run) -> float:
    return base.seconds / base.calls / (NEW_TOKENS - 1)


def step_time_spec(run: Run) -> float:
    return run.seconds / run.calls / (run.seq_steps / run.sequences)


def tokens_per_step(kmax: Run, k: int) -> tuple[float, float]:
    """(L(k), f): the mean tokens per step a draft length ``k`` is predicted to
    emit from the k = K run's per-position acceptance, and the share of steps
    that had a draft: ``1 + f * sum(p_1..p_k)``, scaled by the k = K run's
    measured L over that formula's L(K). The counters include the tokens a
    request's last step accepts past max_tokens (onboard.speculators.simulate),
    which take no step; the scale takes their share out."""
    rates = [c / kmax.drafts if kmax.drafts else 0.0 for c in kmax.accepted_per_pos]
    f = kmax.drafts / kmax.seq_steps if kmax.seq_steps else 0.0
    counted = 1 + f * sum(rates)
    return (1 + f * sum(rates[:k])) * kmax.tokens_per_step / counted, f


def predict(
    base: Run,
    probe: Run,
    kmax: Run,
    k: int,
    simulated: Counters | None = None,
    source: str = "",
) -> dict:
    """Predicted speed-up of draft length ``k`` from the probes: the baseline's
    wall seconds per plain step ``t1`` and prefill ``P0``, k's own engine's wall
    seconds per decode step ``s(k)`` and prefill ``P(k)``, and the tokens per step
    ``L(k)``: from the ``simulated`` counters of k (vLLM's schedule replayed over
    the greedy continuations, onboard.speculators.simulate) when given, else from
    the k = K run's acceptance per position. Per call of N new tokens:
    ``(P0 + (N - 1) t1) / (P(k) + (N - 1) s(k) / L(k))``."""
    t1, s = base.probe_wall_step_s, probe.probe_wall_step_s
    kmax_length, kmax_f = tokens_per_step(kmax, k)
    if simulated is None:
        length, f = kmax_length, kmax_f
        rates = [c / kmax.drafts if kmax.drafts else 0.0 for c in kmax.accepted_per_pos]
        rates = rates[:k]
    else:
        length = simulated.tokens_per_step
        f = simulated.drafts / simulated.steps if simulated.steps else 0.0
        rates = [c / simulated.drafts if simulated.drafts else 0.0
                 for c in simulated.accepted_per_pos]  # fmt: skip
    base_call = base.probe_prefill_s + (NEW_TOKENS - 1) * t1
    call = probe.probe_prefill_s + (NEW_TOKENS - 1) * s / length
    kmax_call = probe.probe_prefill_s + (NEW_TOKENS - 1) * s / kmax_length
    return {
        "predicted_speedup": base_call / call,
        "predicted_tokens_per_step": length,
        "acceptance_source": source or ("simulated" if simulated else "k=K rates"),
        "predicted_acceptance_per_position": rates,
        "simulated_drafts": None if simulated is None else simulated.drafts,
        # Detail: L(k) and the speed-up from the k = K engine's rates (the model
        # before the simulation).
        "kmax_tokens_per_step": kmax_length,
        "kmax_predicted_speedup": base_call / kmax_call,
        "predicted_step_s": s,
        "predicted_call_s": call,
        "baseline_step_s": t1,
        "baseline_call_s": base_call,
        "prefill_s": probe.probe_prefill_s,
        "baseline_prefill_s": base.probe_prefill_s,
        "step_cost_ratio": s / t1,
        "draft_step_share": f,
        # Detail: the worker's part of an engine decode step and the rest.
        "probe_step_s": probe.probe_step_s,
        "probe_engine_step_s": probe.probe_engine_step_s,
        "outside_worker_s": (probe.probe_engine_step_s or 0.0)
        - (probe.probe_step_s or 0.0),
    }


# vLLM 0.32's adaptive verification (enable_adaptive_verification) exists in the
# V2 model runner only: predicted here, never measured on the CPU engine.
ADAPTIVE_NOT_MEASURED = (
    "not measured on the cpu engine: vLLM 0.32 implements adaptive verification "
    "in its V2 model runner only (v1/worker/gpu/spec_decode/"
    "adaptive_verification.py); the V1 runner the CPU build runs refuses it "
    "('Model Runner V1 does not support: adaptive draft verification', "
    "vllm/config/vllm.py:2980-2981, raised at 3198-3202), the V2 runner requires "
    "Triton (vllm/config/vllm.py:724-728), which the CPU build has without a CPU "
    "backend, and full CUDA graphs (vllm/config/vllm.py:3013-3018)"
)
# The methods whose V2 drafter vLLM 0.32 can verify adaptively: every model
# draft (DraftModelSpeculator, v1/worker/gpu/spec_decode/speculator.py:170-176).
# Not ngram (a V1 proposer, or V2's ngram_gpu, which is no model draft) nor
# p_eagle (parallel drafting for EAGLE runs on V1 only, vllm/config/vllm.py:
# 2936-2943).
ADAPTIVE_METHODS = ("mtp", "eagle3", "dflash", "dflash2", "dspark", "draft_model")


def adaptive_costs(base: Run, runs: dict[int, Run], kmax: int) -> list[float]:
    """``c(b)``, b = 0..K: wall seconds of a decode step that verifies b drafts
    per request while the drafter drafts K (adaptive verification trims the
    verification, not the drafting): k = b's probed step with its drafter's
    time swapped for the k = K drafter's (worker time, the timed rounds' median
    ``propose_draft_token_ids``); b = 0 is a plain step plus that drafting."""

    def drafter(run: Run) -> float:
        return run.parts_s.get("propose_draft_token_ids", 0.0)

    d = drafter(runs[kmax])
    return [base.probe_wall_step_s + d] + [
        runs[b].probe_wall_step_s - drafter(runs[b]) + d for b in range(1, kmax + 1)
    ]


def predict_adaptive(base: Run, runs: dict[int, Run], kmax: int, batch: int) -> dict:
    """Predicted effect of vLLM's adaptive verification with K = ``kmax`` drafts,
    beside fixed k, for a band of ``batch`` requests.

    vLLM's rule (adaptive_verification.py:282-350, ``get_num_tokens``): per
    step, score every draft slot by its survival probability (the running
    product of the slot confidences), and admit the best B slots of the batch,
    B = argmax (requests + sum of the B best survivals) / (draft cost +
    verification cost of requests + B tokens). Its confidences come from the
    draft (a trained head, or an online estimator on the draft logits); how
    sharp they are decides the gain, so two bounds are predicted, from the
    k = K engine's acceptance per position ``p_i`` (the survival of slot i):

    - ``uninformed``: every request's confidences are the mean survivals, so the
      rule admits the same number of slots every step (a fixed verification
      length, chosen by vLLM's own ratio, drafting K): no better than the best
      fixed k, up to the drafting of K instead of k;
    - ``oracle``: the confidences know which drafts the verifier will accept
      (survival 1 for the accepted run, 0 after), so each step verifies its
      accepted drafts and no more; a request accepts i drafts with probability
      ``p_i - p_(i+1)``, requests independently (the batch's total by
      convolution).

    Step costs ``c(b)`` from :func:`adaptive_costs`, interpolated linearly for a
    batch's fractional slots per request; tokens per step scaled as
    :func:`tokens_per_step` scales them (the counters' tokens past max_tokens);
    the call time as :func:`predict`'s: ``P(K) + (N - 1) c / L``."""
    import numpy as np

    kr = runs[kmax]
    costs = adaptive_costs(base, runs, kmax)
    rates = [c / kr.drafts if kr.drafts else 0.0 for c in kr.accepted_per_pos]
    f = kr.drafts / kr.seq_steps if kr.seq_steps else 0.0
    scale = kr.tokens_per_step / (1 + f * sum(rates))

    def cost(slots: float) -> float:
        per_request = slots / batch
        lo = min(int(per_request), kmax - 1)
        return costs[lo] + (per_request - lo) * (costs[lo + 1] - costs[lo])

    base_call = base.probe_prefill_s + (NEW_TOKENS - 1) * base.probe_wall_step_s

    def bound(accepted_per_request: float, step_s: float, **detail) -> dict:
        length = (1 + f * accepted_per_request) * scale
        step = f * step_s + (1 - f) * costs[0]
        call = kr.probe_prefill_s + (NEW_TOKENS - 1) * step / length
        return {
            "predicted_tokens_per_step": length,
            "predicted_step_s": step,
            "predicted_speedup": base_call / call,
            **detail,
        }

    # Uninformed: the slots of every request rank alike (p_1 x batch, p_2 x ...).
    survivals = np.repeat(rates, batch)
    gained = np.concatenate([[0.0], np.cumsum(survivals)])
    ratio = [(batch + gained[b]) / cost(b) for b in range(len(gained))]
    chosen = int(np.argmax(ratio))
    uninformed = bound(
        gained[chosen] / batch,
        cost(chosen),
        verified_drafts_per_request=chosen / batch,
    )
    # Oracle: the batch's accepted drafts A (a distribution), B = the best
    # prefix of them by vLLM's ratio (more slots add cost, no tokens).
    one = np.diff(np.concatenate([[1.0], rates, [0.0]]) * -1)  # P(i accepted)
    one = np.clip(one, 0.0, None)
    total = np.array([1.0])
    for _ in range(batch):
        total = np.convolve(total, one)
    admitted = [max(range(a + 1), key=lambda b: (batch + b) / cost(b))
                for a in range(len(total))]  # fmt: skip
    oracle = bound(
        float(np.dot(total, admitted)) / batch,
        float(np.dot(total, [cost(b) for b in admitted])),
        verified_drafts_per_request=float(np.dot(total, admitted)) / batch,
    )
    return {
        "k": kmax,
        "step_costs_s": costs,
        "acceptance_rate_per_position": rates,
        "uninformed": uninformed,
        "oracle": oracle,
        "measured_speedup": None,
        "not_measured": ADAPTIVE_NOT_MEASURED,
    }


def predict_linear(base: Run, k1: Run, kmax: Run, kmax_value: int, k: int) -> dict:
    """The first model, kept for comparison: step cost linear in k, calibrated on
    the k = 1 and k = K runs' wall-clock (it missed k = 2 by about 20%:
    docs/benchmarks.md)."""
    t1 = step_time_baseline(base)
    s1, sk = step_time_spec(k1), step_time_spec(kmax)
    delta = (sk - s1) / (kmax_value - 1)
    length, _ = tokens_per_step(kmax, k)
    return {
        "predicted_speedup": t1 * length / (s1 + (k - 1) * delta),
        "draft_cost_ratio": delta / t1,
        "k1_step_cost_ratio": s1 / t1,
    }


def _counters(engine: Engine) -> dict[str, Any]:
    return {k: v for k, v in engine.metrics().items() if k.startswith(PREFIX)}


def group_steps(records) -> list[dict[str, Any]]:
    """Group the worker's timed calls (probes.step_timings, in completion order:
    the forward ends inside execute_model, sampling and drafting inside
    sample_tokens) into steps: {method: seconds, "tokens": target tokens,
    "drafts": draft tokens verified, "kind" and "decoding" (requests decoded):
    probes.step_kind}."""
    steps: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for name, seconds, tokens, kind, decoding in records:
        if name in ("_model_forward", "execute_model") and "execute_model" in current:
            current = {}  # a step without sampling (nothing scheduled): not a step
        current[name] = current.get(name, 0.0) + seconds
        if name == "_model_forward":
            current["tokens"] = tokens
        if name == "execute_model":
            current["kind"] = kind
            current["drafts"] = tokens
            current["decoding"] = decoding
        if name == "sample_tokens":
            steps.append(current)
            current = {}
    return steps


def decode_steps(records) -> list[dict[str, Any]]:
    """The decode steps among the records: every scheduled request past its
    prompt. Not "all but the first step": the requests of one call reach the
    engine core at slightly different times, so the prefill of a batch can take
    two steps, the second one also decoding the first requests ("mixed")."""
    return only_decode(group_steps(records))


def only_decode(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The grouped steps that decoded every scheduled request (kind "decode")."""
    return [s for s in steps if s.get("kind") == "decode"]


def sequence_steps(steps: list[dict[str, Any]]) -> int:
    """The sequence-steps of grouped steps: the requests each one decoded (mixed
    steps included), as the scheduler ran them."""
    return sum(x.get("decoding", 0) for x in steps)


def _median(values) -> float:
    return statistics.median(values) if values else 0.0


def _step_s(step: dict[str, float]) -> float:
    return step.get("execute_model", 0.0) + step.get("sample_tokens", 0.0)


def _timed(engine: Engine, chunks, max_tokens: int) -> float:
    """Wall seconds of the chunks' generate calls, as the engine times them."""
    return sum(
        engine.generate(chunk, temperature=0.0, max_tokens=max_tokens, ignore_eos=True)[
            "time_s"
        ]
        for chunk in chunks
    )


def _delta(after, before, key, times: int = 1) -> int:
    a, b = after.get(PREFIX + key) or 0, before.get(PREFIX + key) or 0
    return round((a - b) / times)


def probe_once(engine: Engine, chunks, sequences: int) -> dict[str, float]:
    """One step-cost probe of a band (a run of its own on the probe prompts, not a
    timed round): the prefill alone (max_tokens 1), then PROBE_TOKENS new tokens;
    the wall
    seconds per decode step and per prefill call (see the module doc), with the
    raw figures."""
    calls = len(chunks)
    step_timings = f"{PROBES}:step_timings"
    engine.rpc(step_timings)  # clear
    prefill = _timed(engine, chunks, 1)
    prefill_steps = group_steps(engine.rpc(step_timings))
    before = _counters(engine)
    full = _timed(engine, chunks, PROBE_TOKENS)
    steps = group_steps(engine.rpc(step_timings))
    after = _counters(engine)
    seq_steps = sequence_steps(steps)
    decode = full - prefill
    return {
        "wall_step_s": decode * sequences / calls / seq_steps,
        "prefill_call_s": prefill / calls,
        "tokens_per_step": sequences * (PROBE_TOKENS - 1) / seq_steps,
        "engine_step_s": decode / max(1, len(steps) - len(prefill_steps)),
        "worker_step_s": _median([_step_s(x) for x in only_decode(steps)]),
        "prefill_s": prefill,
        "full_s": full,
        "seq_steps": seq_steps,
        "accepted": _delta(after, before, "num_accepted_tokens"),
        "drafts": _delta(after, before, "num_drafts"),
        "prefill_steps": len(prefill_steps),
        "prefill_worker_s": sum(_step_s(x) for x in prefill_steps),
        **_step_counts(steps),
    }


def _step_counts(steps) -> dict[str, float]:
    decode = only_decode(steps)
    return {
        "steps": len(steps),
        "decode_steps": len(decode),
        "drafted_steps": sum(1 for x in decode if x.get("drafts")),
        "worker_s": sum(_step_s(x) for x in steps),
        "decode_worker_s": sum(_step_s(x) for x in decode),
        "drafted_worker_s": sum(_step_s(x) for x in decode if x.get("drafts")),
    }


COUNTED = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def band_chunks(prompts: list[list[int]]) -> dict[str, list[list[list[int]]]]:
    """Each band's calls (lists of prompts): batch 8 takes the first eight
    prompts in one call, batch 1 the next four one at a time."""
    chunks, start = {}, 0
    for band, (batch, calls) in BANDS.items():
        chunks[band] = [prompts[start + i * batch : start + (i + 1) * batch]
                        for i in range(calls)]  # fmt: skip
        start += batch * calls
    return chunks


def probe_prompts(
    model_dir: Path, prompts: list[list[int]], vocab_size: int
) -> list[list[int]]:
    """The step-cost probe's own prompts: one per timed prompt, as many tokens
    long, cut from the bundled calibration text (onboard.quantize.calibration_text,
    which contains none of onboard.runtime.prompts), so that the probe runs the
    same shape of work as the timed rounds without timing their prompts (a
    prediction from the very runs it is compared with would be circular). A
    checkpoint without a tokenizer gets other seeded random ids."""
    import numpy as np

    lengths = [len(p) for p in prompts]
    ids: list[int] = []
    prefix: list[int] = []  # what the tokenizer puts before every text (BOS)
    if (Path(model_dir) / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        from onboard.quantize.calibration_text import TEXT

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        prefix = tokenizer("").input_ids
        ids = tokenizer(TEXT).input_ids[len(prefix) :]
        if not all(0 <= i < vocab_size for i in ids + prefix):
            ids, prefix = [], []
    if len(ids) < sum(lengths):
        rng = np.random.default_rng(1)
        ids, prefix = rng.integers(0, vocab_size, size=sum(lengths)).tolist(), []
    # Windows spread over the text, one after another (no two overlap).
    stride = len(ids) // len(lengths)
    windows = [
        prefix + ids[i * stride : i * stride + n - len(prefix)]
        for i, n in enumerate(lengths)
    ]
    if any(len(w) != n for w, n in zip(windows, lengths, strict=True)) or (
        {tuple(w) for w in windows} & {tuple(p) for p in prompts}
    ):
        raise AssertionError("probe prompts must be as long as, and not, the timed")
    return windows


def measure(
    engine: Engine, prompts: list[list[int]], probes_on: list[list[int]]
) -> dict[str, Run]:
    """Time every band on one engine (after one warm-up call).

    PROBE_REPEATS probes (:func:`probe_once`, on ``probes_on``: the band's
    prompts' counterparts from :func:`probe_prompts`) and REPEATS timed rounds of
    NEW_TOKENS on ``prompts``, alternating (probe, round, probe, round, ...) so
    that both see the same load on a shared machine; medians count, the rounds'
    spread is kept. The counters are read around every round (greedy rounds
    repeat the same tokens; the probes' counts stay out). One more call per
    band keeps the greedy continuations (GREEDY_TOKENS)."""
    engine.generate(prompts[:2], temperature=0.0, max_tokens=4)
    engine.rpc(f"{PROBES}:time_steps")
    runs = {}
    probe_chunks = band_chunks(probes_on)
    for band, chunks in band_chunks(prompts).items():
        batch, calls = BANDS[band]
        greedy = tuple(
            tuple(out["token_ids"])
            for chunk in chunks
            for out in engine.generate(
                chunk, temperature=0.0, max_tokens=GREEDY_TOKENS, ignore_eos=True
            )["outputs"]
        )
        probes, rounds, steps, rounds_raw, seq_steps = [], [], [], [], []
        counted = dict.fromkeys(COUNTED, 0)
        per_pos: list[int] = []
        for i in range(max(REPEATS, PROBE_REPEATS)):
            if i < PROBE_REPEATS:
                probes.append(probe_once(engine, probe_chunks[band], batch * calls))
            if i >= REPEATS:
                continue
            engine.rpc(f"{PROBES}:step_timings")  # clear
            before = _counters(engine)
            rounds.append(_timed(engine, chunks, NEW_TOKENS))
            all_steps = group_steps(engine.rpc(f"{PROBES}:step_timings"))
            after = _counters(engine)
            for key in COUNTED:
                counted[key] += _delta(after, before, key)
            pos_after = list(after.get(PREFIX + "num_accepted_tokens_per_pos") or [])
            pos_before = list(
                before.get(PREFIX + "num_accepted_tokens_per_pos") or []
            ) or [0] * len(pos_after)
            per_pos = [
                (per_pos[j] if j < len(per_pos) else 0) + a - b
                for j, (a, b) in enumerate(zip(pos_after, pos_before, strict=True))
            ]
            steps += only_decode(all_steps)
            seq_steps.append(sequence_steps(all_steps))
            rounds_raw.append({"seconds": rounds[-1], **_step_counts(all_steps)})
        runs[band] = Run(
            seconds=_median(rounds),
            sequences=batch * calls,
            calls=calls,
            seq_steps=round(_median(seq_steps)),
            drafts=round(counted["num_drafts"] / REPEATS),
            draft_tokens=round(counted["num_draft_tokens"] / REPEATS),
            accepted=round(counted["num_accepted_tokens"] / REPEATS),
            accepted_per_pos=tuple(round(c / REPEATS) for c in per_pos),
            rounds=tuple(rounds),
            probe_wall_step_s=_median([x["wall_step_s"] for x in probes]),
            probe_prefill_s=_median([x["prefill_call_s"] for x in probes]),
            probe_tokens_per_step=_median([x["tokens_per_step"] for x in probes]),
            probe_engine_step_s=_median([x["engine_step_s"] for x in probes]),
            probe_walls=tuple(x["wall_step_s"] for x in probes),
            probe_step_s=_median([x["worker_step_s"] for x in probes]),
            probe_raw=tuple(probes),
            rounds_raw=tuple(rounds_raw),
            round_step_s=_median([_step_s(x) for x in steps]),
            parts_s={
                part: _median([x.get(part, 0.0) for x in steps])
                for part in ("_model_forward", "_sample", "propose_draft_token_ids")
            },
            forward_tokens=tuple(sorted({int(x.get("tokens", 0)) for x in steps})),
            greedy=greedy,
        )
    return runs


def _start(options: EngineOptions, work: Path, label: str, log) -> Engine:
    engine = Engine(options, work / f"engine-{label}", work / f"engine-{label}.log")
    engine.start()
    info = engine.wait_ready()
    log(f"{label}: engine ready in {info['start_s']:.0f} s")
    return engine


def measure_engine(
    options: EngineOptions, work: Path, label: str, prompts, probes_on, log
) -> dict[str, Run]:
    """The bands measured on one engine (``label``); saved to WORK/<label>.json
    as soon as they are, and read back from there by a rerun with the same
    engine settings (a method's engines can then span several shorter runs)."""
    saved = work / f"{label}.json"
    config = json.loads(json.dumps(options.engine_kwargs(), default=str))
    if saved.is_file():
        data = json.loads(saved.read_text())
        if data.get("engine") == config and data.get("format") == FORMAT:
            log(f"{label}: measured before ({saved})")
            return {band: _run_from(r) for band, r in data["bands"].items()}
    engine = _start(options, work, label, log)
    try:
        runs = measure(engine, prompts, probes_on)
    finally:
        engine.close()
    bands = {band: dataclasses.asdict(r) for band, r in runs.items()}
    data = {"format": FORMAT, "engine": config, "bands": bands}
    atomic_write_text(saved, json.dumps(data) + "\n")
    return runs


def _run_from(data: dict[str, Any]) -> Run:
    tuples = ("accepted_per_pos", "rounds", "forward_tokens", "probe_walls",
              "probe_raw", "rounds_raw")  # fmt: skip
    fields = {k: tuple(v) if k in tuples else v for k, v in data.items()}
    fields["greedy"] = tuple(tuple(g) for g in data.get("greedy", ()))
    return Run(**fields)


def tune_method(
    spec: ModelSpec,
    entry: Speculator,
    config_for_k,
    base: dict[str, Run],
    options: EngineOptions,
    work: Path,
    prompts: list[list[int]],
    probes_on: list[list[int]],
    log=lambda _m: None,
    simulated: dict[str, dict[int, Counters]] | None = None,
) -> dict[str, Any]:
    """Measure k = 1..K for one method and compare with the predictions
    (``simulated``: the counters predicted per band and k, from
    :func:`simulate_acceptance`; None: the k = K engine's rates)."""
    runs: dict[int, dict[str, Run]] = {}
    for k in (K_VALUES[0], K_VALUES[-1], *K_VALUES[1:-1]):
        extra = {**options.extra, "speculative_config": config_for_k(k)}
        runs[k] = measure_engine(
            dataclasses.replace(options, extra=extra),
            work,
            f"{entry.method}-k{k}",
            prompts,
            probes_on,
            log,
        )
    kmax = K_VALUES[-1]
    result: dict[str, Any] = {
        "default_k": entry.num_speculative_tokens,
        "bands": {},
        # The raw measurements, so that a cost model can be checked offline.
        "runs": {
            "baseline": {b: dataclasses.asdict(r) for b, r in base.items()},
            **{
                f"k{k}": {b: dataclasses.asdict(r) for b, r in by_band.items()}
                for k, by_band in runs.items()
            },
        },
    }
    for band in BANDS:
        rows = []
        for k in K_VALUES:
            run = runs[k][band]
            sim = simulated[band][k] if simulated else None
            row = predict(base[band], run, runs[kmax][band], k, sim)
            linear = predict_linear(
                base[band], runs[K_VALUES[0]][band], runs[kmax][band], kmax, k
            )
            measured = base[band].seconds / run.seconds
            row.update(
                k=k,
                measured_speedup=measured,
                error=row["predicted_speedup"] / measured - 1,
                kmax_error=row["kmax_predicted_speedup"] / measured - 1,
                linear_predicted_speedup=linear["predicted_speedup"],
                linear_error=linear["predicted_speedup"] / measured - 1,
                draft_cost_ratio=linear["draft_cost_ratio"],
                k1_step_cost_ratio=linear["k1_step_cost_ratio"],
                # k = K: its own counters give L(K), only its step cost is probed.
                calibration=k == kmax and simulated is None,
                seconds=run.seconds,
                baseline_seconds=base[band].seconds,
                spread=run.spread,
                baseline_spread=base[band].spread,
                round_step_s=run.round_step_s,
                parts_s=run.parts_s,
                mean_acceptance_length=1 + run.accepted / run.drafts
                if run.drafts
                else 1.0,
                acceptance_rate_per_position=[
                    c / run.drafts if run.drafts else 0.0 for c in run.accepted_per_pos
                ],
                num_drafts=run.drafts,
                num_draft_tokens=run.draft_tokens,
                num_accepted_tokens=run.accepted,
                measured_tokens_per_step=run.tokens_per_step,
                # Greedy speculation is lossless: the same continuation as the
                # baseline's (what the simulation replays).
                lossless=run.greedy == base[band].greedy,
            )
            rows.append(row)
        best = max(rows, key=lambda r: r["measured_speedup"])
        predicted_best = max(rows, key=lambda r: r["predicted_speedup"])
        if entry.method in ADAPTIVE_METHODS:
            adaptive = predict_adaptive(
                base[band], {k: runs[k][band] for k in K_VALUES}, kmax, BANDS[band][0]
            )
        else:
            adaptive = {
                "not_offered": f"vLLM 0.32 has no adaptive verification for "
                f"{entry.method} (it verifies model drafts of the V2 runner only: "
                "v1/worker/gpu/spec_decode/speculator.py:170-176)"
            }
        result["bands"][band] = {
            "adaptive": adaptive,
            "rows": rows,
            "predicted_best_k": predicted_best["k"]
            if predicted_best["predicted_speedup"] > 1.0
            else None,
            "best_k": best["k"] if best["measured_speedup"] > 1.0 else None,
            "best_measured_speedup": best["measured_speedup"],
            "within_tolerance": all(abs(r["error"]) <= TOLERANCE for r in rows),
            "decision": (
                f"use k={best['k']} ({best['measured_speedup']:.2f}x)"
                if best["measured_speedup"] > 1.0
                else "decline speculation: no k is faster than decoding without it "
                f"(best k={best['k']}: {best['measured_speedup']:.2f}x)"
            ),
        }
    return result


def simulate_acceptance(
    method: str,
    spec: ModelSpec,
    model_dir: Path,
    config_for_k,
    base: dict[str, Run],
    prompts: list[list[int]],
    max_model_len: int | None,
    log=lambda _m: None,
) -> tuple[dict[str, dict[int, Counters]] | None, str]:
    """The spec-decode counters every k will report per band, from the baseline
    engine's greedy continuations (onboard.speculators.simulate), and where they
    come from: n-gram by the replica of vLLM's proposer, MTP by the generated
    reference's heads (the ones vLLM runs); (None, why) for a method without a
    reference drafter here (its prediction keeps the k = K engine's rates)."""
    from onboard.speculators import simulate

    chunks = band_chunks(prompts)
    by_band = {band: [p for c in chunks[band] for p in c] for band in BANDS}
    if any(len(base[band].greedy) != len(by_band[band]) for band in BANDS):
        return None, "k=K rates (no greedy continuations saved)"
    out: dict[str, dict[int, Counters]] = {band: {} for band in BANDS}
    if method == "ngram":
        for k in K_VALUES:
            lo, hi = simulate.ngram_window(config_for_k(k))
            for band in BANDS:
                out[band][k] = simulate.ngram_counters(
                    by_band[band], base[band].greedy, NEW_TOKENS, k, lo, hi,
                    max_model_len,
                )  # fmt: skip
        return out, "simulated: vLLM's n-gram proposer replayed"
    if method == "mtp" and spec.mtp is not None:
        import tempfile

        from onboard.spec.mtp import heads_run_by_vllm
        from onboard.speculators import mtp_train

        t0 = time.perf_counter()
        with (
            tempfile.TemporaryDirectory(prefix="onboard-tune-") as tmp,
            one_thread(),
        ):
            model = mtp_train.load_mtp_reference(model_dir, spec, Path(tmp))
            for k in K_VALUES:
                heads = heads_run_by_vllm(spec, k)
                for band in BANDS:
                    out[band][k] = simulate.mtp_counters(
                        model, by_band[band], base[band].greedy, NEW_TOKENS, heads
                    )
        log(f"mtp: reference drafts replayed in {time.perf_counter() - t0:.0f} s")
        return out, "simulated: the reference's MTP heads replayed"
    return None, "k=K rates (no reference drafter for this method)"


def tune(
    model_dir: Path,
    spec: ModelSpec,
    methods: list[str],
    out_dir: Path,
    *,
    speculators_dir: Path | None = None,
    plugin: Plugin | None = None,
    log=lambda _m: None,
) -> dict[str, Any]:
    """Tune every method; write OUT/tune.json and OUT/tune.md; return the report."""
    from onboard.errors import InputError
    from onboard.runtime.cpu_draft import full_window_draft, needs_full_window
    from onboard.runtime.prompts import PROMPTS
    from onboard.runtime.reference import tokenize_prompts
    from onboard.speculators.methods import (
        DRAFT_METHODS,
        entry_for,
        find_draft,
        speculative_config,
    )

    model_dir = Path(model_dir).resolve()
    out_dir = Path(out_dir)
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    prompts, _ = tokenize_prompts(model_dir, PROMPTS, spec.vocab_size)
    probes_on = probe_prompts(model_dir, prompts, spec.vocab_size)
    mla = spec.attention.type == "mla"
    report: dict[str, Any] = {
        "model_dir": str(model_dir),
        "new_tokens": NEW_TOKENS,
        "probe_tokens": PROBE_TOKENS,
        "probe_prompts": "windows of onboard.quantize.calibration_text, one per "
        "timed prompt and as long",
        "bands": {b: {"batch": v[0], "calls": v[1]} for b, v in BANDS.items()},
        "methods": {},
    }
    base: dict[str, Run] | None = None
    t_start = time.perf_counter()
    for method in methods:
        entry = entry_for(spec, method)
        draft = None
        if method in DRAFT_METHODS:
            draft, why = find_draft(spec, entry, speculators_dir)
            if draft is None:
                raise InputError(f"--methods {method}: {why}")
            if needs_full_window(spec, method):
                draft, _ = full_window_draft(draft, work / f"draft-{method}")
        options = EngineOptions(
            model_dir=model_dir,
            plugin=plugin,
            **engine_state_options(spec),
        )
        if base is None:
            base = measure_engine(
                options, work, "baseline-default", prompts, probes_on, log
            )

        def config_for_k(k, entry=entry, draft=draft, method=method):
            cfg = speculative_config(
                entry.model_copy(update={"num_speculative_tokens": k}), draft
            )
            if method == "mtp" and mla:
                cfg["attention_backend"] = "CPU_MLA"
            return cfg

        simulated, source = simulate_acceptance(
            method, spec, model_dir, config_for_k, base, prompts,
            options.engine_kwargs().get("max_model_len"), log,
        )  # fmt: skip
        report["methods"][method] = tune_method(
            spec, entry, config_for_k, base, options, work, prompts,
            probes_on, log, simulated,
        )  # fmt: skip
        report["methods"][method]["dtype"] = "float32"
        report["methods"][method]["acceptance_source"] = source
    report["seconds"] = time.perf_counter() - t_start
    atomic_write_text(out_dir / "tune.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(out_dir / "tune.md", render(report))
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"# Draft-length tuning: {report['model_dir']}", ""]
    for method, result in report["methods"].items():
        for band, data in result["bands"].items():
            lines += [
                f"## {method}, {band} (default k={result['default_k']})",
                "",
                f"Acceptance predicted from: {result.get('acceptance_source', '')}.",
                "",
                "| k | acceptance per position, measured (predicted) | mean "
                "acceptance length | tokens per step L, predicted / measured | "
                "probed step: wall ms (x plain); worker / outside ms per engine "
                "step | predicted speed-up | measured speed-up (round spread "
                "spec / base) | error | error with k=K rates | linear model "
                "error |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for r in data["rows"]:
                rates = ", ".join(f"{x:.2f}" for x in r["acceptance_rate_per_position"])
                if r.get("predicted_acceptance_per_position") is not None:
                    rates += " (" + ", ".join(
                        f"{x:.2f}" for x in r["predicted_acceptance_per_position"]
                    ) + ")"  # fmt: skip
                mark = " (acceptance measured)" if r["calibration"] else ""
                worker = r.get("probe_step_s") or 0.0
                outside = r.get("outside_worker_s") or 0.0
                lines.append(
                    f"| {r['k']}{mark} | {rates} | {r['mean_acceptance_length']:.2f} "
                    f"| {r['predicted_tokens_per_step']:.3f} / "
                    f"{r.get('measured_tokens_per_step', 0):.3f} "
                    f"| {1000 * r['predicted_step_s']:.1f} "
                    f"({r['step_cost_ratio']:.2f}); {1000 * worker:.1f} / "
                    f"{1000 * outside:.1f} | {r['predicted_speedup']:.2f}x | "
                    f"{r['measured_speedup']:.2f}x ({r.get('spread', 0):.0%} / "
                    f"{r.get('baseline_spread', 0):.0%}) | {r['error']:+.0%} | "
                    f"{r.get('kmax_error', 0):+.0%} | "
                    f"{r.get('linear_error', 0):+.0%} |"
                )
            r0 = data["rows"][0]
            lines += [
                "",
                f"A plain step takes {1000 * r0['baseline_step_s']:.1f} ms "
                f"(probed wall). Decision: {data['decision']}.",
                "",
                *render_adaptive(data.get("adaptive")),
            ]
    return "\n".join(lines)


def render_adaptive(adaptive: dict | None) -> list[str]:
    """The adaptive-verification prediction of a band (beside the fixed-k rows)."""
    if not adaptive:
        return []
    if "not_offered" in adaptive:
        return [f"Adaptive verification: {adaptive['not_offered']}.", ""]
    lines = [
        "Adaptive verification (vLLM's enable_adaptive_verification, "
        f"k={adaptive['k']} drafted), predicted:",
        "",
        "| confidences | drafts verified per request | tokens per step | step ms "
        "| predicted speed-up |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in ("uninformed", "oracle"):
        b = adaptive[name]
        lines.append(
            f"| {name} | {b['verified_drafts_per_request']:.2f} | "
            f"{b['predicted_tokens_per_step']:.3f} | "
            f"{1000 * b['predicted_step_s']:.1f} | {b['predicted_speedup']:.2f}x |"
        )
    lines += ["", f"Measured: {adaptive['not_measured']}.", ""]
    return lines
