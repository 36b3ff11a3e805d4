"""Functions run inside vLLM's worker (``LLM.collective_rpc``) to see the MTP draft.

They are pickled by reference, so they live in this importable module. The head
counter wraps the draft model's ``compute_logits`` and hooks each head's module, so
a generate call records, per draft model call, which head ran and which
``spec_step_idx`` vLLM passed.
"""

from __future__ import annotations

_CALLS: dict[str, list] = {"heads": [], "logits_steps": []}


def _draft_model(worker):
    drafter = getattr(worker.model_runner, "drafter", None)
    return getattr(drafter, "model", None)


def classes(worker) -> dict[str, str | None]:
    """The target and draft classes the engine instantiated."""

    def name(model) -> str | None:
        if model is None:
            return None
        cls = type(model)
        return f"{cls.__module__}.{cls.__qualname__}"

    return {
        "target": name(worker.model_runner.get_model()),
        "draft": name(_draft_model(worker)),
    }


def watch_heads(worker) -> list[str]:
    """Start recording which MTP head runs; returns the heads' layer indices."""
    model = _draft_model(worker)
    layers = model.model.layers
    _CALLS["heads"].clear()
    _CALLS["logits_steps"].clear()
    for idx, layer in layers.items():
        layer.register_forward_pre_hook(
            lambda _module, _args, idx=idx: _CALLS["heads"].append(int(idx))
        )
    compute_logits = model.compute_logits

    def recording(hidden_states, spec_step_idx: int = 0):
        _CALLS["logits_steps"].append(spec_step_idx)
        return compute_logits(hidden_states, spec_step_idx)

    model.compute_logits = recording
    return list(layers.keys())


def head_calls(worker) -> dict[str, list[int]]:
    """What ran since :func:`watch_heads`: head layer per draft forward, and the
    ``spec_step_idx`` of every ``compute_logits`` call."""
    return {key: list(value) for key, value in _CALLS.items()}
