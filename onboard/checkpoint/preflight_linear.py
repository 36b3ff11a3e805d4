"""Preflight of linear-attention layers: the decay's two known conversion mistakes.

vLLM's Gated DeltaNet decays each value head's state by exp(g) per token, with
``g = -exp(A_log) * softplus(a + dt_bias)``: ``A_log`` is the log of the decay
rates A, and ``dt_bias`` is the time-step bias, added once. Converted checkpoints
have shipped with each of these wrong, and both load without an error:

* the A_log -> A conversion missing: the rates themselves stored (a tensor ``A``
  instead of ``A_log``, or, Mamba-style, ``A = -exp(A_log)`` under the name
  ``A_log``: every value negative, where log-rates of rates around 1..16 are
  mostly positive). The decays then come out near 1: the state never forgets.
* a doubled time-step bias: the bias folded into the projection that gives ``a``
  (a bias on ``in_proj_ba`` / ``in_proj_a``, or a ``dt_proj`` with a bias) while
  ``dt_bias`` is kept, so ``a + dt_bias`` adds it twice (vLLM's projections have
  no bias; the loader would refuse or drop it).

The value check reads the ``A_log`` tensors only (one value per value head and
layer: a few kilobytes even for the largest models).
"""

from __future__ import annotations

import numpy as np

from onboard.checkpoint.preflight_report import PreflightRun, examples
from onboard.checkpoint.preflight_spec import abstract, describe, split_name
from onboard.components.linear_attention import MIXER_ROLE
from onboard.safetensors_header import HeaderError, read_header

# Parameters beside the mixer's own that would carry the time-step bias again.
_SECOND_DT_BIAS = ("in_proj_ba.bias", "in_proj_a.bias", "dt_proj.bias")


def check_linear_attention(
    run: PreflightRun, missing: list[str], unexpected: list[str]
) -> tuple[list[str], list[str]]:
    """Report the decay's conversion mistakes; the tensors reported here are
    taken out of ``missing`` and ``unexpected`` (returned)."""
    plan = run.plan
    if plan.linear is None:
        return missing, unexpected
    mixer_role = MIXER_ROLE[plan.linear.kind]
    mixers = {
        plan.tensors.checkpoint_name(mixer_role, layer=layer.index)
        for layer in plan.layers
        if layer.mixer.linear
    }
    taken: set[str] = set()
    rates = [n for n in unexpected if split_name(n)[0] in mixers and n.endswith(".A")]
    if rates:
        lost = [f"{split_name(n)[0]}.A_log" for n in rates]
        taken |= set(rates) | set(lost)
        run.add(
            "error",
            "linear-decay",
            describe(abstract(rates[0])[0], rates),
            "the checkpoint stores the decay rates A where the layer loads A_log "
            "= log(A): the A_log -> A conversion is missing (vLLM computes the "
            "decay from -exp(A_log))",
            "store A_log = log(-A) for A stored as negative rates (Mamba's A = "
            "-exp(A_log)), log(A) for positive ones",
            tensors=rates,
        )
    doubled = [
        n
        for n in unexpected
        if any(n == f"{m}.{p}" for m in mixers for p in _SECOND_DT_BIAS)
    ]
    if doubled:
        taken |= set(doubled)
        run.add(
            "error",
            "linear-decay",
            examples(doubled, 2),
            "a time-step bias on the projection that gives a, beside dt_bias: "
            "softplus(a + dt_bias) would add the time-step bias twice (vLLM's "
            "projections have none)",
            "fold it into dt_bias once (dt_bias + the projection's bias) and drop "
            "the projection's bias, or drop dt_bias if the projection's bias "
            "already is it",
            tensors=doubled,
        )
    _check_log_rates(run, mixers)
    return (
        [n for n in missing if n not in taken],
        [n for n in unexpected if n not in taken],
    )


def _check_log_rates(run: PreflightRun, mixers: set[str]) -> None:
    """Every A_log value negative: the rates A = -exp(A_log) under A_log's name."""
    values = []
    names = sorted(f"{m}.A_log" for m in mixers if f"{m}.A_log" in run.found)
    for name in names:
        read = _read_values(run, name)
        if read is None:
            return  # unreadable here: the file checks report why
        values.append(read)
    if not values or max(float(v.max()) for v in values) >= 0:
        return
    low = min(float(v.min()) for v in values)
    high = max(float(v.max()) for v in values)
    run.add(
        "error",
        "linear-decay",
        describe(abstract(names[0])[0], names),
        f"every A_log value is negative ({low:.3g} .. {high:.3g}): A_log holds "
        "the log of the decay rates, mostly positive for rates around 1..16; "
        "negative everywhere is what the rates A = -exp(A_log) themselves, or a "
        "flipped sign, look like: the A_log -> A conversion is missing or wrong, "
        "and vLLM would decay the states far too slowly",
        "store A_log = log(A) of the positive decay rates (from Mamba's "
        "A = -exp(A_log): log(-A))",
        tensors=names,
    )


_NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def _read_values(run: PreflightRun, name: str) -> np.ndarray | None:
    info = run.found[name]
    try:
        entry = read_header(run.root / info.shard).by_name()[name]
    except (HeaderError, KeyError):
        return None
    with open(run.root / info.shard, "rb") as f:
        f.seek(entry.start)
        raw = f.read(entry.nbytes)
    if entry.dtype == "BF16":
        bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    if entry.dtype not in _NUMPY:
        return None
    return np.frombuffer(raw, dtype=_NUMPY[entry.dtype]).astype(np.float32)
