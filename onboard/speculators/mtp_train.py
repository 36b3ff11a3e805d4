"""Train a tiny checkpoint's MTP heads by self-distillation, and measure them.

Random MTP heads accept almost nothing, which proves little about speculative
decoding. :func:`train_mtp_heads` trains them briefly (about a minute of CPU) on
the tiny model's own greedy continuations: the main model, run by the generated
Hugging Face reference (its ``mtp_forward`` is DeepSeek-V3's MTP formula, as vLLM
computes it), continues bundled training prompts greedily; head ``i`` at slot
``t`` learns the main model's greedy choice for token ``t + i + 2``. Only the MTP
parameters train (their output head stays the copy of the model's head); they are
written back into the safetensors shards in place, byte-deterministically for a
given seed, each shard replaced atomically.

:func:`reference_mtp_acceptance` measures each head's own acceptance with the
reference on prompts (the accuracy check's prompts are held out from training), so
that the spec-decode check can show what the engine leaves on the table. It counts
two ways: at every slot, and as a speculative decoder drafts (``decoded_*``: a
round only after each verification), which is what vLLM's counters report: the
generated MTP module computes exactly what ``mtp_forward`` does (checked inside the
engine, docs/checkpoints.md), so the engine's acceptance is the decoded figure.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onboard.errors import InputError
from onboard.fsutil import INDEX_FILE, atomic_write_text, read_weight_map
from onboard.safetensors_header import HeaderError, TensorEntry, read_header
from onboard.spec.model import ModelSpec
from onboard.speculators.calibration import calibration_prompts, greedy_continuations
from onboard.threads import one_thread

PROMPT_TOKENS = 16
NEW_TOKENS = 32
# Half windows of the bundled calibration text, half random token ids (the text
# alone is small; the EAGLE-3 trainer measured the same, onboard/speculators).
NUM_PROMPTS = 256
BATCH = 16
STEPS = 200
# Small: the copy prior is a good start that larger steps destroy (measured).
LR = 1e-4
EVAL_EVERY = 50
REPORT_FILE = "mtp_training.json"
_DTYPES = {"BF16": "bfloat16", "F32": "<f4", "F16": "<f2"}


@dataclass
class HeadAcceptance:
    """Teacher-forced acceptance of greedy drafts on greedy continuations.

    ``heads[j]`` is the head run at draft position ``j`` (``[0, 1]``: each head its
    own step; ``[0, 0]``: the first head reused). ``per_head[j]``: how often
    position ``j``'s draft equals the target's greedy token, on its own;
    ``per_position[j]``: how often positions ``0..j`` all do (what a speculative
    decoder accepts at position ``j``); ``mean_acceptance_length``: 1 + their sum
    (vLLM's definition: tokens per target step). These count every slot.

    A speculative decoder drafts only after each verification: a draft whose
    positions 0..a-1 are accepted is followed by the next draft ``a + 1`` tokens
    later, so runs of easy slots are sampled less often than the slots where
    drafts fail. ``decoded_*`` replay that walk over the same greedy sequences
    (draft at the prompt's last token, advance by accepted + 1): the figures
    vLLM's counters report (``decoded_per_position[j]``: accepted at position j
    over ``decoded_drafts``; ``decoded_mean_acceptance_length``: 1 + their
    sum). Measured: the engine's first-position acceptance equals the decoded
    figure, not the per-slot one (docs/checkpoints.md)."""

    heads: list[int]
    per_head: list[float]
    per_position: list[float]
    mean_acceptance_length: float
    slots: int
    prompts: int
    decoded_per_position: list[float] = field(default_factory=list)
    decoded_mean_acceptance_length: float = 1.0
    decoded_drafts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MTPTrainingReport:
    checkpoint_dir: str
    seed: int
    steps: int
    kept_step: int  # the step whose heads were kept (0: the copy prior)
    seconds: float
    num_prompts: int
    trained_tensors: list[str]
    loss_first: float
    loss_last: float
    before: HeadAcceptance
    after: HeadAcceptance
    # The same, with the heads vLLM runs at each of the spec's k draft positions
    # (engine_schedule): what the spec-decode check's engine figure compares with.
    before_as_vllm_runs: HeadAcceptance
    after_as_vllm_runs: HeadAcceptance
    heldout: str = "the accuracy check's prompts (onboard.runtime.prompts)"
    losses: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- the reference ------------------------------------------------------------------


def load_mtp_reference(checkpoint_dir: Path, spec: ModelSpec, work_dir: Path):
    """The generated Hugging Face reference of the checkpoint (float32), which has
    ``mtp_forward``: generated from the spec even where transformers knows the
    model type (transformers' classes have no MTP heads)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from onboard.reference.overlay import overlay_with_remote_code

    checkpoint_dir = Path(checkpoint_dir)
    if spec.mtp is None:
        raise InputError(f"{spec.name}: the spec has no MTP heads")
    config = json.loads((checkpoint_dir / "config.json").read_text())
    # The generated reference itself (standalone): a renamed family's modular
    # reference is transformers' class, which has no MTP heads.
    overlay = overlay_with_remote_code(
        checkpoint_dir, spec, None, config, work_dir, standalone=True
    )
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            overlay,
            dtype=torch.float32,
            trust_remote_code=True,
            output_loading_info=True,
        )
    finally:
        transformers.logging.set_verbosity(verbosity)
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise InputError(
            f"{checkpoint_dir}: the reference found no tensor for {len(missing)} "
            f"parameters ({', '.join(missing[:6])})"
        )
    model.eval()
    return model


def _layers(model):
    """(base model, its layer list, number of decoder layers) of the reference."""
    base = getattr(model, model.base_model_prefix)
    n = model.config.num_hidden_layers
    for module in base.children():
        if type(module).__name__ == "ModuleList" and len(module) > n:
            return base, module, n
    raise AssertionError("the reference has no MTP layers after its decoder layers")


@contextmanager
def _heads_as(model, heads: Sequence[int]):
    """Run ``mtp_forward`` with ``heads[j]`` at draft position j."""
    from torch import nn

    base, layers, n = _layers(model)
    name = next(k for k, v in base.named_children() if v is layers)
    swapped = nn.ModuleList([*layers[:n], *(layers[n + h] for h in heads)])
    setattr(base, name, swapped)
    try:
        yield
    finally:
        setattr(base, name, layers)


def greedy_sequences(model, prompts: Sequence[Sequence[int]], new_tokens: int):
    """prompt + greedy continuation, per prompt (a list of 1-D tensors): one
    left-padded batch, so that the decode steps run once for all prompts."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(list(p))
        mask[row, width - len(p) :] = 1
    out = greedy_continuations(model, ids, new_tokens, attention_mask=mask)
    return [out[row, width - len(p) :].clone() for row, p in enumerate(prompts)]


def mtp_acceptance(
    model,
    prompts: Sequence[Sequence[int]],
    heads: Sequence[int],
    new_tokens: int = NEW_TOKENS,
) -> HeadAcceptance:
    """Acceptance of the drafts of ``heads`` (one per draft position) on the
    model's greedy continuations of ``prompts``."""
    seqs = greedy_sequences(model, prompts, new_tokens)
    return sequence_acceptance(model, seqs, [len(p) for p in prompts], heads)


def sequence_acceptance(
    model, seqs, prompt_lens: Sequence[int], heads: Sequence[int], hidden=None
) -> HeadAcceptance:
    """Acceptance of ``heads`` on greedy sequences (prompt + continuation).

    A draft round starts at every slot ``t`` whose next token ``t + 1`` is a
    generated one (after a verification step the last token is always the
    target's own): position j's draft, from ``heads[j]``, must equal token
    ``t + j + 2`` of the greedy sequence. Teacher forcing is exact here: when
    positions 0..j-1 are accepted, their draft tokens are the sequence's.
    ``hidden``: the main model's last hidden states of ``seqs``, when known."""
    import torch

    k = len(heads)
    hits = np.zeros(k)
    chained = np.zeros(k)
    accepted = np.zeros(k)
    slots = drafts = 0
    with _heads_as(model, heads), torch.inference_mode():
        for n, (plen, seq) in enumerate(zip(prompt_lens, seqs, strict=True)):
            first, last = plen - 1, len(seq) - 2 - k
            if last < first:
                continue
            with _main_hidden(model, None if hidden is None else hidden[n : n + 1]):
                logits = model.mtp_forward(seq[None])
            ok = torch.stack(
                [
                    logits[j][0, first : last + 1].argmax(-1)
                    == seq[first + j + 2 : last + j + 3]
                    for j in range(k)
                ]
            )
            hits += ok.sum(1).numpy()
            chained += ok.cumprod(0).sum(1).numpy()
            slots += last + 1 - first
            n_drafts, n_accepted = decoded_walk(ok.numpy())
            drafts += n_drafts
            accepted += n_accepted
    per_head = (hits / max(slots, 1)).tolist()
    per_position = (chained / max(slots, 1)).tolist()
    decoded = (accepted / max(drafts, 1)).tolist()
    return HeadAcceptance(
        heads=list(heads),
        per_head=per_head,
        per_position=per_position,
        mean_acceptance_length=1.0 + sum(per_position),
        slots=slots,
        prompts=len(prompt_lens),
        decoded_per_position=decoded,
        decoded_mean_acceptance_length=1.0 + sum(decoded),
        decoded_drafts=drafts,
    )


def decoded_walk(ok: np.ndarray) -> tuple[int, np.ndarray]:
    """(drafts, accepted per position) of a speculative decoder on one greedy
    sequence, from ``ok[j, s]`` (position j's draft of the round at slot s is
    right): a round at slot s accepts its leading right positions, a, and the
    next round starts at slot s + a + 1 (the verifier's own token follows them).
    """
    k, n = ok.shape
    accepted = np.zeros(k)
    drafts = s = 0
    while s < n:
        drafts += 1
        a = 0
        while a < k and ok[a, s]:
            accepted[a] += 1
            a += 1
        s += a + 1
    return drafts, accepted


def acceptance_rates(accepted, drafts: int) -> dict[str, Any]:
    """What the decoded walks found, as vLLM's counters say it: the acceptance
    rate of each draft position, the mean acceptance length, the drafts."""
    rates = (accepted / max(drafts, 1)).tolist()
    return {
        "per_position": rates,
        "mean_acceptance_length": 1.0 + sum(rates),
        "drafts": drafts,
    }


@contextmanager
def _main_hidden(model, hidden):
    """Let ``mtp_forward`` use known main-model hidden states instead of running
    the (frozen) main model again: the costly part of a training step."""
    import types

    if hidden is None:
        yield
        return
    base, _, _ = _layers(model)
    base.forward = lambda *a, **k: types.SimpleNamespace(last_hidden_state=hidden)
    try:
        yield
    finally:
        del base.forward


def copy_prior(model) -> None:
    """Start each head's ``eh_proj`` embedding half as the least-squares map that
    makes the head repeat its input token (enorm(embedding of v) -> the output
    head's row v): greedy continuations of a random model loop, and "the next
    token repeats this one" is the rule that holds on prompts never seen (54 %
    of the novel-launch tiny's continuation tokens). Derived from the model's own
    weights, no data."""
    import torch

    _, layers, n = _layers(model)
    embed = model.get_input_embeddings().weight.detach()
    with torch.no_grad():
        for head in layers[n:]:
            e = _child(head, "enorm")(embed).double()
            out = _child(head, "head").weight.double()
            target = out / out.pow(2).mean(-1, keepdim=True).sqrt()
            w = torch.linalg.lstsq(e, target).solution.T
            proj = _child(head, "eh_proj").weight
            proj[:, : w.shape[1]] = w.to(proj.dtype)


def _calibrate(model, tokens, hidden, teacher) -> float:
    """Scale every head's output norm by the factor (from a fixed grid) with the
    lowest cross-entropy on the training data. The copy prior's logits are far
    too confident where the next token is not a repeat; left so, the first
    training steps only shrink them, and break the prior on the way."""
    import torch
    import torch.nn.functional as F

    _, layers, n = _layers(model)
    norms = [_child(_child(head, "shared_head"), "norm") for head in layers[n:]]
    first = PROMPT_TOKENS - 1
    sample = slice(0, min(64, len(tokens)))
    with _main_hidden(model, hidden[sample]), torch.inference_mode():
        logits = model.mtp_forward(tokens[sample])
    # The norm's weight scales the logits linearly (no bias in the head).
    best, factor = float("inf"), 1.0
    for scale in (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125):
        loss = sum(
            F.cross_entropy(
                scale * lg[:, first:].flatten(0, 1),
                teacher[sample][:, first + i + 1 :].flatten(),
            ).item()
            for i, lg in enumerate(logits)
        )
        if loss < best:
            best, factor = loss, scale
    with torch.no_grad():
        for norm in norms:
            norm.weight.mul_(factor)
    return factor


def _child(head, leaf: str):
    """The head's submodule named ``leaf`` (enorm, eh_proj, shared_head's head)."""
    return next(m for name, m in head.named_modules() if name.split(".")[-1] == leaf)


def reference_mtp_acceptance(
    checkpoint_dir: Path,
    spec: ModelSpec,
    prompts: Sequence[Sequence[int]],
    k: int | None = None,
    *,
    heads: Sequence[int] | None = None,
    new_tokens: int = NEW_TOKENS,
) -> HeadAcceptance:
    """Per-head acceptance of the checkpoint's MTP heads, by the generated
    reference, on ``prompts`` (token ids). By default draft position j runs head
    j (k positions, at most the spec's heads); ``heads=[0, 0]`` measures the first
    head reused at every position (what vLLM's V1 drafter may run)."""
    if spec.mtp is None:
        raise InputError(f"{spec.name}: the spec has no MTP heads")
    if heads is None:
        k = spec.mtp.num_heads if k is None else k
        if not 1 <= k <= spec.mtp.num_heads:
            raise InputError(f"k must be 1..{spec.mtp.num_heads} (the spec's heads)")
        heads = list(range(k))
    with tempfile.TemporaryDirectory(prefix="onboard-mtp-") as tmp, one_thread():
        model = load_mtp_reference(Path(checkpoint_dir), spec, Path(tmp))
        return mtp_acceptance(model, prompts, heads, new_tokens)


def engine_schedule(spec: ModelSpec) -> list[int]:
    """The MTP head vLLM runs at each draft position of the spec's ``mtp``
    speculator (k: its ``num_speculative_tokens``, else the number of heads)."""
    from onboard.spec.mtp import heads_run_by_vllm

    k = next(
        (s.num_speculative_tokens for s in spec.speculators if s.method == "mtp"),
        spec.mtp.num_heads,
    )
    return heads_run_by_vllm(spec, k)


def heldout_prompts(checkpoint_dir: Path, spec: ModelSpec) -> list[list[int]]:
    """The accuracy check's prompts as the validate harness tokenizes them."""
    from onboard.runtime.prompts import PROMPTS
    from onboard.runtime.reference import tokenize_prompts

    ids, _ = tokenize_prompts(Path(checkpoint_dir), PROMPTS, spec.vocab_size)
    return ids


def training_prompts(checkpoint_dir: Path, vocab: int, count: int, seed: int):
    """Windows of the bundled calibration text (never the accuracy check's
    prompts) and random token ids, ``PROMPT_TOKENS`` each: a [count, T] tensor."""
    import torch

    text: list[list[int]] = []
    if (Path(checkpoint_dir) / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
        text = calibration_prompts(tokenizer, count // 2, PROMPT_TOKENS)
        text = [t for t in text if max(t) < vocab]
    gen = torch.Generator().manual_seed(seed)
    # Ids 0-2 are the bundled tokenizer's special tokens.
    noise = torch.randint(3, vocab, (count - len(text), PROMPT_TOKENS), generator=gen)
    if not text:
        return noise
    return torch.cat([torch.tensor(text), noise])


# ---- training --------------------------------------------------------------------


def _trainable(model) -> dict[str, Any]:
    """The MTP parameters that train, by checkpoint name: every MTP head's
    parameter except its output head (a copy of the model's, which it keeps)."""
    _, layers, n = _layers(model)
    prefix = next(name for name, module in model.named_modules() if module is layers)
    out = {}
    for i in range(n, len(layers)):
        for name, param in layers[i].named_parameters():
            if name.startswith("shared_head.") and not name.startswith(
                "shared_head.norm"
            ):
                continue
            out[f"{prefix}.{i}.{name}"] = param
    return out


def head_trainer(
    *,
    steps: int | None = None,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> Callable[[Path, ModelSpec], None]:
    """The ``finish`` step of :func:`onboard.checkpoint.tiny.write_tiny_checkpoint`
    that trains a tiny checkpoint's MTP heads (a spec without heads is left as
    written), before the checkpoint directory appears."""

    def finish(checkpoint_dir: Path, tiny: ModelSpec) -> None:
        if tiny.mtp is not None:
            train_mtp_heads(
                checkpoint_dir,
                tiny,
                steps=STEPS if steps is None else steps,
                seed=seed,
                log=log,
            )

    return finish


def train_mtp_heads(
    checkpoint_dir: Path,
    spec: ModelSpec,
    *,
    steps: int = STEPS,
    seed: int = 0,
    num_prompts: int = NUM_PROMPTS,
    log: Callable[[str], None] | None = None,
) -> MTPTrainingReport:
    """Train the MTP heads of the (tiny) checkpoint in ``checkpoint_dir`` on the
    model's own greedy continuations; write them back into its shards and the
    report into ``mtp_training.json``. Same checkpoint, steps and seed ->
    byte-identical files.

    The heads start from :func:`copy_prior`; ``VAL_PROMPTS`` of the training
    prompts are held aside, and the parameters with the best acceptance on them
    (checked every ``EVAL_EVERY`` steps, the start included) are kept."""
    import torch
    import torch.nn.functional as F

    log = log or (lambda _: None)
    checkpoint_dir = Path(checkpoint_dir)
    if spec.mtp is None:
        raise InputError(f"{spec.name}: the spec has no MTP heads to train")
    if steps < 0:
        raise InputError(f"--mtp-steps must not be negative, got {steps}")
    t0 = time.perf_counter()
    heldout = heldout_prompts(checkpoint_dir, spec)
    heads = list(range(spec.mtp.num_heads))
    schedule = engine_schedule(spec)
    with tempfile.TemporaryDirectory(prefix="onboard-mtp-") as tmp, one_thread():
        torch.manual_seed(seed)
        model = load_mtp_reference(checkpoint_dir, spec, Path(tmp) / "a")
        before, before_vllm = _heldout_acceptance(model, heldout, heads, schedule)
        log(f"MTP heads before training: held-out acceptance {_fmt(before)}")
        log(f"  as vLLM runs them ({schedule}): {_fmt_decoded(before_vllm)}")

        prompts = training_prompts(checkpoint_dir, spec.vocab_size, num_prompts, seed)
        tokens, hidden, teacher = _teacher(model, prompts)
        # Validation prompts: every eighth, so both kinds of prompt are in it.
        val = torch.arange(len(tokens)) % 8 == 7
        train = (~val).nonzero().flatten()
        log(
            f"teacher: {len(tokens)} greedy continuations of {NEW_TOKENS} tokens, "
            f"{int(val.sum())} held aside for validation "
            f"({time.perf_counter() - t0:.1f} s)"
        )

        model.requires_grad_(False)
        copy_prior(model)
        params = _trainable(model)
        for p in params.values():
            p.requires_grad_(True)

        def validate() -> float:
            # What vLLM's counters report for the heads it runs: the decoded
            # first-position acceptance (the mean length breaks ties).
            acc = sequence_acceptance(
                model,
                tokens[val],
                [PROMPT_TOKENS] * int(val.sum()),
                schedule,
                hidden[val],
            )
            rates = acc.decoded_per_position
            return rates[0] + 1e-3 * acc.decoded_mean_acceptance_length

        temperature = _calibrate(model, tokens[train], hidden[train], teacher[train])
        log(f"copy prior: output norm scaled by {temperature:g} (calibrated)")
        best = (validate(), 0, {k: p.detach().clone() for k, p in params.items()})
        log(f"copy prior: validation score {best[0]:.3f}")
        opt = torch.optim.AdamW(params.values(), lr=LR, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 1.0 - s / max(steps, 1)
        )
        order = torch.Generator().manual_seed(seed)
        losses: list[float] = []
        # Train where drafting happens: slots whose next token is a generated one.
        first = PROMPT_TOKENS - 1
        for step in range(steps):
            batch = train[torch.randint(0, len(train), (BATCH,), generator=order)]
            with _main_hidden(model, hidden[batch]):
                logits = model.mtp_forward(tokens[batch])
            # Head i, slot t predicts token t + i + 2: the teacher's row t + i + 1.
            # Cross-entropy on the teacher's greedy token: the likelihood of the
            # draft being accepted (its full distribution, KL, measured worse).
            loss = sum(
                F.cross_entropy(
                    lg[:, first:].flatten(0, 1),
                    teacher[batch][:, first + i + 1 :].flatten(),
                )
                for i, lg in enumerate(logits)
            ) / len(logits)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            if (step + 1) % EVAL_EVERY == 0 or step + 1 == steps:
                score = validate()
                log(
                    f"step {step + 1}/{steps}: loss {losses[-1]:.3f}, validation "
                    f"score {score:.3f}"
                )
                if score >= best[0]:  # ties: the trained heads (better calibrated)
                    best = (
                        score,
                        step + 1,
                        {k: p.detach().clone() for k, p in params.items()},
                    )
        kept = best[1]
        log(f"keeping the heads of step {kept} (validation {best[0]:.3f})")
        trained = {name: t.numpy().astype(np.float32) for name, t in best[2].items()}
        write_tensors(checkpoint_dir, trained)

        # Measured on what is now on disk (bf16 shards round the weights).
        model = load_mtp_reference(checkpoint_dir, spec, Path(tmp) / "b")
        after, after_vllm = _heldout_acceptance(model, heldout, heads, schedule)
    seconds = time.perf_counter() - t0
    log(
        f"MTP heads after training: held-out acceptance {_fmt(after)} ({seconds:.0f} s)"
    )
    log(f"  as vLLM runs them ({schedule}): {_fmt_decoded(after_vllm)}")
    report = MTPTrainingReport(
        checkpoint_dir=str(checkpoint_dir),
        seed=seed,
        steps=steps,
        kept_step=kept,
        seconds=seconds,
        num_prompts=len(tokens),
        trained_tensors=sorted(trained),
        loss_first=losses[0] if losses else float("nan"),
        loss_last=losses[-1] if losses else float("nan"),
        before=before,
        after=after,
        before_as_vllm_runs=before_vllm,
        after_as_vllm_runs=after_vllm,
        losses=losses[:: max(1, steps // 20)],
    )
    # The file is deterministic too: the time it took and the path are left out.
    record = report.to_dict()
    del record["seconds"], record["checkpoint_dir"]
    atomic_write_text(
        checkpoint_dir / REPORT_FILE,
        json.dumps(record, indent=2, sort_keys=True) + "\n",
    )
    return report


def _teacher(model, prompts):
    """The main model's greedy continuations of ``prompts``, its last hidden
    states on them, and its greedy choice at each position (the targets)."""
    import torch

    tokens = greedy_continuations(model, prompts, NEW_TOKENS)
    with torch.inference_mode():
        hidden = _layers(model)[0](tokens).last_hidden_state
        # Row t of the main model's logits: its greedy choice of token t + 1.
        teacher = model.get_output_embeddings()(hidden).argmax(-1)
    # Out of inference mode, so training can take gradients through them.
    return tokens.clone(), hidden.clone(), teacher.clone()


def _heldout_acceptance(model, prompts, heads, schedule):
    """(acceptance of each head at its own position, acceptance of the heads
    vLLM runs) on the same greedy continuations."""
    seqs = greedy_sequences(model, prompts, NEW_TOKENS)
    lens = [len(p) for p in prompts]
    own = sequence_acceptance(model, seqs, lens, heads)
    return own, sequence_acceptance(model, seqs, lens, schedule)


def _fmt_decoded(acc: HeadAcceptance) -> str:
    rates = ", ".join(f"{r:.2f}" for r in acc.decoded_per_position)
    return (
        f"as decoded {rates} per position over {acc.decoded_drafts} drafts, mean "
        f"acceptance length {acc.decoded_mean_acceptance_length:.2f}"
    )


def _fmt(acc: HeadAcceptance) -> str:
    heads = ", ".join(
        f"head {h}: {a:.2f}" for h, a in zip(acc.heads, acc.per_head, strict=True)
    )
    return f"{heads}; mean acceptance length {acc.mean_acceptance_length:.2f}"


# ---- writing tensors back ---------------------------------------------------------


def _entries(path: Path) -> dict[str, TensorEntry]:
    try:
        return read_header(path).by_name()
    except HeaderError as exc:
        raise InputError(f"{path}: {exc}") from None


def _encode(x: np.ndarray, tag: str) -> bytes:
    from onboard.checkpoint.safetensors_io import to_bf16_bits

    if tag == "BF16":
        return to_bf16_bits(x).astype("<u2").tobytes()
    return np.ascontiguousarray(x, dtype=_DTYPES[tag]).tobytes()


def read_tensor(checkpoint_dir: Path, name: str) -> np.ndarray:
    """One tensor of a checkpoint, as float32 (for tests and checks)."""
    from onboard.checkpoint.safetensors_io import from_bf16_bits

    checkpoint_dir = Path(checkpoint_dir)
    path = checkpoint_dir / read_weight_map(checkpoint_dir / INDEX_FILE)[name]
    data = path.read_bytes()
    entry = _entries(path)[name]
    raw = data[entry.start : entry.end]
    if entry.dtype == "BF16":
        x = from_bf16_bits(np.frombuffer(raw, dtype="<u2"))
    else:
        x = np.frombuffer(raw, dtype=_DTYPES[entry.dtype]).astype(np.float32)
    return x.reshape(entry.shape)


def write_tensors(checkpoint_dir: Path, tensors: dict[str, np.ndarray]) -> list[Path]:
    """Replace the data of ``tensors`` (same names, shapes; stored in each tensor's
    own dtype) in the checkpoint's shards. Headers, every other tensor's bytes and
    the index stay as they were; each changed shard is written to a temporary file
    beside it, and the files replace the shards only once all are written."""
    checkpoint_dir = Path(checkpoint_dir)
    weight_map = read_weight_map(checkpoint_dir / INDEX_FILE)
    unknown = sorted(set(tensors) - set(weight_map))
    if unknown:
        raise InputError(
            f"{checkpoint_dir}: the index has no tensor {', '.join(unknown[:5])}"
        )
    by_shard: dict[str, list[str]] = {}
    for name in sorted(tensors):
        by_shard.setdefault(weight_map[name], []).append(name)
    staged: list[tuple[str, Path]] = []
    try:
        for shard, names in sorted(by_shard.items()):
            path = checkpoint_dir / shard
            data = bytearray(path.read_bytes())
            entries = _entries(path)
            for name in names:
                entry = entries[name]
                if tuple(tensors[name].shape) != entry.shape:
                    raise InputError(
                        f"{path}: {name} has shape {list(entry.shape)}, the new "
                        f"tensor {list(tensors[name].shape)}"
                    )
                blob = _encode(tensors[name], entry.dtype)
                assert len(blob) == entry.nbytes, name
                data[entry.start : entry.end] = blob
            fd, tmp = tempfile.mkstemp(dir=checkpoint_dir, prefix=f".{shard}.")
            staged.append((shard, Path(tmp)))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, path.stat().st_mode & 0o777)
        for shard, tmp in staged:
            os.replace(tmp, checkpoint_dir / shard)
    finally:
        for _, tmp in staged:
            tmp.unlink(missing_ok=True)
    return [checkpoint_dir / shard for shard, _ in staged]
