"""Functions that run inside vLLM's worker process (``Engine.request({"op": "rpc",
"function": "onboard.speculators.probes:<name>"})``): what the speculative-decoding
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
