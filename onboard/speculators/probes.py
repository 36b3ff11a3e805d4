"""Functions that run inside vLLM's worker process
(``Engine.rpc("onboard.speculators.probes:<name>")``): what the speculative-decoding
drafter actually is, and which of its draft layers (MTP heads) run at each step.

They get vLLM's worker as their first argument and must stay importable there
(module-level functions, plain-data results).
"""

from __future__ import annotations

COUNTER = "_onboard_layer_calls"


def _qualname(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _drafter(worker):
    return getattr(worker.model_runner, "drafter", None)


def _draft_layers(model):
    """The draft model's per-step layers: the first ``layers`` ModuleDict or
    ModuleList below it (vLLM's MTP models keep one entry per MTP head, keyed by
    its checkpoint layer index; an EAGLE-3 head keeps its decoder layer(s))."""
    from torch import nn

    for name, module in model.named_modules():
        if name.split(".")[-1] != "layers":
            continue
        if isinstance(module, nn.ModuleDict):
            return name, dict(module.items())
        if isinstance(module, nn.ModuleList):
            return name, {str(i): layer for i, layer in enumerate(module)}
    return None, {}


def drafter_info(worker) -> dict:
    """The proposer class, the draft model class it instantiated (None for
    model-free methods such as ngram) and the draft model's per-step layers."""
    runner = worker.model_runner
    drafter = _drafter(worker)
    config = getattr(runner, "speculative_config", None)
    info: dict = {
        "proposer": None if drafter is None else _qualname(drafter),
        "draft_model_class": None,
        "method": getattr(config, "method", None),
        "num_speculative_tokens": getattr(config, "num_speculative_tokens", None),
        "draft_layers": [],
    }
    model = getattr(drafter, "model", None)
    if model is not None:
        info["draft_model_class"] = _qualname(model)
        path, layers = _draft_layers(model)
        info["draft_layers_path"] = path
        info["draft_layers"] = list(layers)
    return info


def count_draft_layer_calls(worker) -> list[str]:
    """Count every forward call of each draft layer from now on (forward hooks);
    returns the layer keys counted."""
    drafter = _drafter(worker)
    model = getattr(drafter, "model", None)
    if model is None:
        return []
    _, layers = _draft_layers(model)
    counts = {key: 0 for key in layers}
    setattr(drafter, COUNTER, counts)
    for key, layer in layers.items():

        def hook(_module, _args, _out, key=key):
            counts[key] += 1

        layer.register_forward_hook(hook)
    return list(counts)


def draft_layer_calls(worker) -> dict[str, int]:
    """The counts since :func:`count_draft_layer_calls` (empty: not counting)."""
    return dict(getattr(_drafter(worker), COUNTER, {}) or {})


TIMINGS = "_onboard_step_timings"
# The model runner's per-step methods timed by :func:`time_steps`: the whole step
# (execute_model + sample_tokens), the target forward inside it, sampling (the
# rejection sampler when drafts are verified) and the drafter.
TIMED = ("execute_model", "sample_tokens", "_model_forward", "_sample",
         "propose_draft_token_ids")  # fmt: skip


def _tokens(args, kwargs) -> int:
    for value in (kwargs.get("input_ids"), kwargs.get("positions"), *args[:2]):
        shape = getattr(value, "shape", None)
        if shape:
            return int(shape[-1])
    return 0


def step_kind(runner, scheduler_output) -> tuple[str, int]:
    """What one scheduled step computes, and how many requests it decodes (its
    sequence-steps): "decode" (every request past its prompt), "prefill" (prompts
    only), "mixed" (both: requests of one batch arrive in the engine core at
    slightly different times, so a later request's prefill can share a step with
    earlier requests' decoding) or "empty"."""
    if scheduler_output is None or not scheduler_output.total_num_scheduled_tokens:
        return "empty", 0
    prefill = bool(scheduler_output.scheduled_new_reqs)
    decoding = 0
    cached = scheduler_output.scheduled_cached_reqs
    computed_tokens = cached.num_computed_tokens
    for req_id, computed in zip(cached.req_ids, computed_tokens, strict=True):
        state = runner.requests.get(req_id)
        if state is not None and computed < state.num_prompt_tokens:
            prefill = True  # the rest of a prompt (chunked or resumed)
        else:
            decoding += 1
    if not prefill:
        return "decode", decoding
    return ("mixed" if decoding else "prefill"), decoding


def time_steps(worker) -> list[str]:
    """From now on, record the wall time of every call of the model runner's
    per-step methods (:data:`TIMED`; the target forward with its token count,
    execute_model with its :func:`step_kind`, the number of draft tokens it
    verifies and the requests it decodes); :func:`step_timings` returns and
    clears them."""
    import time

    runner = worker.model_runner
    records: list[tuple[str, float, int, str, int]] = []
    setattr(runner, TIMINGS, records)
    for name in TIMED:
        method = getattr(runner, name, None)
        if method is None:
            continue

        def timed(*args, _method=method, _name=name, **kwargs):
            kind, tokens, decoding = "", 0, 0
            if _name == "execute_model":
                output = kwargs.get("scheduler_output", args[0] if args else None)
                kind, decoding = step_kind(runner, output)
                drafts = getattr(output, "scheduled_spec_decode_tokens", None) or {}
                tokens = sum(len(ids) for ids in drafts.values())
            t0 = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                if _name == "_model_forward":
                    tokens = _tokens(args, kwargs)
                records.append(
                    (_name, time.perf_counter() - t0, tokens, kind, decoding)
                )

        setattr(runner, name, timed)  # the instance attribute wins over the method
    return [n for n in TIMED if hasattr(runner, n)]


def step_timings(worker) -> list[tuple[str, float, int, str, int]]:
    """The calls recorded since :func:`time_steps` or the last read (then cleared):
    (method, seconds, tokens: the target's for ``_model_forward``, the draft
    tokens verified for ``execute_model``; step kind and requests decoded for
    ``execute_model``)."""
    records = getattr(worker.model_runner, TIMINGS, None)
    if records is None:
        return []
    out = list(records)
    records.clear()
    return out
