"""Functions that run inside vLLM's own worker process.

The engine worker ships them with ``LLM.apply_model`` (they get the model) or
``LLM.collective_rpc`` (they get vLLM's worker); they are pickled by reference, so
they must live in an importable module, not in the worker's ``__main__``.
"""

from __future__ import annotations

from pathlib import Path


def model_class_name(model) -> str:
    cls = type(model)
    return f"{cls.__module__}.{cls.__qualname__}"


def kv_cache_info(worker) -> dict:
    """The KV-cache layout the engine allocated, from its own per-layer specs."""
    runner = worker.model_runner
    layers = {}
    for name, spec in runner.get_kv_cache_spec().items():
        layers[name] = {
            "type": type(spec).__name__,
            "page_size_bytes": int(spec.page_size_bytes),
            "block_size": int(spec.block_size),
        }
        if hasattr(spec, "shapes"):
            # A recurrent state (MambaSpec): one per sequence, not per token; its
            # page is padded to the attention page.
            layers[name] |= {
                "state_bytes": int(spec.state_content_size_bytes),
                "shapes": [list(shape) for shape in spec.shapes],
                "dtypes": [str(d).removeprefix("torch.") for d in spec.dtypes],
                "speculative_blocks": int(spec.num_speculative_blocks),
            }
        else:
            layers[name]["bytes_per_token"] = spec.page_size_bytes / spec.block_size
    return {
        "layers": layers,
        "shared_layers": dict(getattr(runner, "shared_kv_cache_layers", {})),
    }


def attention_groups(worker) -> list[dict]:
    """Each attention group the engine built: its backend, the KV-cache group it
    reads, that group's block size and the kernel block size the backend runs,
    its layer count, and whether its layers are the speculative drafter's."""
    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    draft_layers = set(getattr(drafter, "_draft_attn_layer_names", ()))
    out = []
    for per_group in runner.attn_groups:
        for group in per_group:
            block = int(group.kv_cache_spec.block_size)
            out.append(
                {
                    "backend": group.backend.get_name(),
                    "kv_cache_group": group.kv_cache_group_id,
                    "block_size": block,
                    "kernel_block_size": int(group.kernel_block_size or block),
                    "layers": len(group.layer_names),
                    "draft": bool(draft_layers & set(group.layer_names)),
                }
            )
    return out


def diagnose_weights(model_dir: str, worker) -> dict:
    """Feed the checkpoint to a fresh model's ``load_weights``, one tensor at a time.

    Runs in an engine built with ``load_format="dummy"`` after a real load failed,
    so that vLLM has set up its config, distributed state and plugins. The engine's
    own model cannot be reused: on CPU its linear layers were repacked after
    loading (their ``weight`` is empty). A second instance of the same class is
    built instead, on the meta device (no memory; on CPU if the class cannot be
    built there), under its own layer-name prefix. Every checkpoint tensor it
    rejects or ignores, and every parameter no tensor reached, is listed, so that
    one bad name does not hide the others."""
    import torch

    for device in ("meta", "cpu"):
        try:
            report = _diagnose_on(model_dir, worker, torch.device(device))
        except Exception:
            if device == "cpu":
                raise
            continue
        errors = " ".join(report["unmatched_checkpoint_tensors"].values())
        if device == "meta" and "meta" in errors:
            continue  # a loader that cannot work on meta tensors: retry for real
        report["device"] = device
        return report
    raise AssertionError("unreachable")


def _diagnose_on(model_dir: str, worker, device) -> dict:
    from safetensors import safe_open
    from vllm.model_executor.model_loader.utils import initialize_model

    with device:
        model = initialize_model(worker.vllm_config, prefix="onboard_diagnosis")
    unmatched: dict[str, str] = {}
    loaded: set[str] = set()
    tracked = True
    count = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                count += 1
                tensor = handle.get_tensor(name)
                try:
                    got = model.load_weights([(name, tensor)])
                except Exception as exc:
                    unmatched[name] = short(f"{type(exc).__name__}: {exc}")
                    continue
                if got is None:
                    tracked = False
                elif not got:
                    unmatched[name] = "skipped by the model's load_weights"
                else:
                    loaded |= set(got)
    params = [name for name, _ in model.named_parameters()]
    return {
        "checkpoint_tensors": count,
        "model_parameters": len(params),
        "unmatched_checkpoint_tensors": unmatched,
        "unloaded_model_parameters": (
            sorted(set(params) - loaded) if tracked else None
        ),
    }


def short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
