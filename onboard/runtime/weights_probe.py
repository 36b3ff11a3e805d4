"""Does a model consume every tensor of a (quantized) checkpoint? Built on CPU,
without an engine.

The probe builds the model with the checkpoint's quantization config as vLLM's
loader does (``initialize_model`` under the engine config; the kernels vLLM's CPU
build cannot run are selected by :mod:`onboard.runtime.kernel_fallbacks`, which
leaves every parameter as vLLM creates it), streams the checkpoint through vLLM's
own weight iterator into the model's ``load_weights``, and watches every in-place
write into a parameter's storage. Per checkpoint tensor it finds the parameter(s)
that took it, with shape and dtype; per parameter, how much of it was written.

A problem is: a tensor no parameter took; a write that reinterprets packed,
FP8 or integer bytes as numbers (or the reverse); a tensor broadcast into, or cut
to fit, a parameter; a parameter left partly or wholly unwritten, except those
vLLM's own loader lets go unfilled (KV-cache scales, empty placeholders,
``input_scale_ub``) and activation scales of a checkpoint that quantizes no
activations. Nothing runs: this proves loading, not the numbers.

Run as ``python -m onboard.runtime.weights_probe JOBS.json OUT.json`` (one process
per plugin: vLLM's plugins load once per process); :func:`probe_weights` does that.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PROBE_TIMEOUT_S = 900.0
# Ops ending in "_" that write no tensor data.
_NOT_WRITES = {
    "requires_grad_", "share_memory_", "retain_grad", "record_stream",
    "resize_", "set_", "detach_", "pin_memory",
}  # fmt: skip


@dataclass
class WeightsLoad:
    """What loading one checkpoint into the model did."""

    model_dir: str
    model_class: str | None = None
    tensors: int = 0
    consumed: int = 0
    # Tensors the model leaves by design, by why (the MTP heads: the draft's).
    left: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    quant_methods: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    @property
    def skipped(self) -> int:
        return sum(self.left.values())

    def summary(self) -> str:
        if self.error is not None:
            return f"the model could not load the checkpoint: {self.error}"
        head = f"{self.consumed}/{self.tensors - self.skipped} tensors consumed"
        if self.left:
            head += " (" + "; ".join(f"{n} {why}" for why, n in self.left.items()) + ")"
        if not self.problems:
            return head + ", every parameter written, shapes and dtypes as stored"
        return head + "; " + "; ".join(self.problems[:6])


# ---- the parent side ----------------------------------------------------------------


def probe_weights(
    model_dirs: list[Path], work_dir: Path, options: Any, spec: Any
) -> list[WeightsLoad]:
    """Probe each checkpoint of ``spec`` in one subprocess, whose vLLM loads
    ``options``' plugin (onboard.runtime.engine.EngineOptions: the generated
    plugin, None for vLLM's own classes) with its engine arguments (e.g. the
    hf_overrides validation gives the engine)."""
    from onboard.runtime.engine import vllm_environment

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    # The engine's arguments (its dtype, attention backend, state dtype, the
    # hf_overrides that run sparse MLA densely on CPU), less speculation.
    kwargs = options.engine_kwargs()
    kwargs.pop("speculative_config", None)
    dense = (kwargs.get("hf_overrides") or {}).get("index_topk") == 0
    jobs = {
        "models": [str(Path(d).resolve()) for d in model_dirs],
        "left_out": left_out(spec, sparse_as_dense=dense),
        "engine_kwargs": kwargs,
    }
    (work_dir / "jobs.json").write_text(json.dumps(jobs))
    out = work_dir / "weights-load.json"
    environment = vllm_environment(options, work_dir)
    log = work_dir / "weights-probe.log"
    with open(log, "wb") as stream:
        proc = subprocess.run(
            [sys.executable, "-m", __name__, str(work_dir / "jobs.json"), str(out)],
            stdout=stream,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=work_dir,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    if not out.is_file():
        tail = log.read_text(errors="replace").splitlines()[-15:]
        error = f"the probe exited with {proc.returncode}: " + " | ".join(tail)
        return [WeightsLoad(str(d), error=error) for d in model_dirs]
    return [WeightsLoad(**entry) for entry in json.loads(out.read_text())]


def left_out(spec: Any, sparse_as_dense: bool = False) -> dict[str, str]:
    """Tensor-name prefix -> why the model leaves such tensors by design: the
    MTP heads (at num_hidden_layers + i in every layout preset), the draft's; a
    layer that reads another layer's KV cache computes no keys or values
    (docs/generate.md, "Cross-layer KV sharing"), though a checkpoint may store
    them; with ``sparse_as_dense`` (the CPU engine's index_topk 0, which runs
    sparse MLA densely) the indexers, which that model does not build."""
    out = {}
    if sparse_as_dense and spec.attention.indexer is not None:
        for layer in range(spec.num_hidden_layers):
            path = spec.tensor_path("indexer_wk").format(layer=layer)
            prefix = path.rsplit(".", 1)[0] + "."
            out[prefix] = "of the indexers (sparse MLA run densely on CPU)"
    n = spec.num_hidden_layers
    for i in range(spec.mtp.num_heads if spec.mtp is not None else 0):
        out[f"model.layers.{n + i}."] = "of the MTP heads left to the draft"
    # MLA: the latent (kv_a_proj) and its norm; kv_b_proj still expands it.
    mla = spec.attention.type == "mla"
    roles = ("kv_a_proj", "kv_a_norm") if mla else ("k_proj", "v_proj", "k_norm")
    for layer in spec.attention.kv_sharing:
        for role in roles:
            path = spec.tensor_path(role).format(layer=layer)
            out[f"{path}."] = "K/V of layers that read another's cache"
    return out


# ---- the probe process ---------------------------------------------------------------


def _dtype_kind(dtype: Any) -> str:
    import torch

    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz):
        return "fp8"
    if dtype.is_floating_point:
        return "float"
    return "int"  # packed FP4 (uint8), E8M0 exponents, int32 indices ...


def _shape_fits(stored: tuple[int, ...], written: tuple[int, ...]) -> bool:
    """The same elements, possibly transposed or regrouped (gpt-oss's experts
    are stored input dim first; its MXFP4 blocks are joined per row)."""
    from math import prod

    return prod(stored) == prod(written)


def _collapse(name: str) -> str:
    return re.sub(r"\.\d+(?=\.)", ".N", name)


class _Storage:
    """Every parameter of the model by its storage, with a byte mask of what the
    load wrote."""

    def __init__(self, model: Any):
        import torch

        self.model = model
        self.by_ptr: dict[int, list[tuple[str, torch.Tensor]]] = defaultdict(list)
        self.masks: dict[int, torch.Tensor] = {}
        self.ptr: dict[str, int] = {}
        self.params: dict[str, torch.Tensor] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            self.add(name, param)

    def add(self, name: str, tensor: Any) -> None:
        import torch

        ptr = tensor.untyped_storage().data_ptr()
        self.by_ptr[ptr].append((name, tensor))
        if ptr not in self.masks:
            size = tensor.untyped_storage().nbytes()
            self.masks[ptr] = torch.zeros(size, dtype=torch.bool)
        self.ptr[name] = ptr
        self.params[name] = tensor

    def refresh(self) -> None:
        """A parameter whose storage a loader replaced (``param.data = ...``)
        counts as written whole."""
        for name, param in list(self.model.named_parameters(remove_duplicate=False)):
            if self.ptr.get(name) != param.untyped_storage().data_ptr():
                self.add(name, param)
                self.masks[self.ptr[name]].fill_(True)

    @staticmethod
    def bytes_of(mask: Any, tensor: Any) -> Any:
        size = tensor.element_size()
        return mask.as_strided(
            (*tensor.shape, size),
            (*(s * size for s in tensor.stride()), 1),
            tensor.storage_offset() * size,
        )

    def owner(self, tensor: Any) -> str | None:
        entries = self.by_ptr.get(tensor.untyped_storage().data_ptr())
        if not entries:
            return None
        start = tensor.storage_offset() * tensor.element_size()
        for name, param in entries:
            lo = param.storage_offset() * param.element_size()
            if lo <= start < lo + max(param.numel() * param.element_size(), 1):
                return name
        return entries[0][0]

    def written(self, name: str) -> float:
        param = self.params[name]
        if param.numel() == 0:
            return 1.0
        return float(self.bytes_of(self.masks[self.ptr[name]], param).float().mean())


def _tracker(storage: _Storage, sources: dict[int, str], state: dict) -> Any:
    """A TorchFunctionMode that records each in-place write into a parameter."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Writes(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[dict] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            is_write = name == "__setitem__" or (
                name.endswith("_")
                and not name.startswith("_")
                and name not in _NOT_WRITES
            )
            if not is_write or not args or not isinstance(args[0], torch.Tensor):
                return out
            dst = args[0]
            param = storage.owner(dst)
            if param is None:
                return out
            index = args[1] if name == "__setitem__" else None
            src = args[2] if name == "__setitem__" else (args[1:2] or [None])[0]
            region = dst[index] if index is not None else dst
            if region.numel() == 0 or not isinstance(src, torch.Tensor):
                return out  # a constant fill is not a checkpoint tensor
            view = _Storage.bytes_of(storage.masks[storage.ptr[param]], dst)
            if index is not None:
                view[index] = True
            else:
                view.fill_(True)
            origin = sources.get(src.untyped_storage().data_ptr())
            self.writes.append(
                {
                    "param": param,
                    "tensor": origin or state["current"],
                    "src_shape": tuple(src.shape),
                    "src_dtype": src.dtype,
                    "dst_shape": tuple(region.shape),
                    "dst_dtype": dst.dtype,
                }
            )
            return out

    return Writes()


def _exempt(model: Any, tensor_names: set[str]) -> set[str]:
    """Parameters vLLM's loader lets go unfilled, and activation scales where the
    checkpoint quantizes no activations (vLLM's W4A16 MoE method registers
    them anyway)."""
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

    activations = any("input_" in n and "scale" in n for n in tensor_names)
    out = set()
    for module_name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if (
                isinstance(method, BaseKVCacheMethod)
                or param.numel() == 0
                or name == "input_scale_ub"
                or (not activations and "input" in name and "scale" in name)
            ):
                out.add(full)
    return out


def _quant_methods(model: Any) -> list[str]:
    found = set()
    for _, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or type(method).__name__.startswith("Unquantized"):
            continue
        scheme = getattr(module, "scheme", None)
        found.add(
            f"{type(module).__name__}: {type(method).__name__}"
            + (f" / {type(scheme).__name__}" if scheme is not None else "")
        )
    return sorted(found)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _probe(model_dir: str, left: dict[str, str], kwargs: dict) -> WeightsLoad:
    import torch
    from safetensors import safe_open
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    from onboard.runtime import kernel_fallbacks

    result = WeightsLoad(model_dir)
    stored: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                piece = handle.get_slice(name)
                stored[name] = (tuple(piece.get_shape()), piece.get_dtype())
    skipped = set()
    for name in stored:
        why = next((w for p, w in left.items() if name.startswith(p)), None)
        if why is not None:
            skipped.add(name)
            result.left[why] = result.left.get(why, 0) + 1
    result.tensors = len(stored)
    fixed = {"enforce_eager": True, "skip_tokenizer_init": True}
    args = {"dtype": "bfloat16", **kwargs, **fixed}
    args["dtype"] = _activation_dtype(EngineArgs(model=model_dir, **args))
    config = EngineArgs(model=model_dir, **args).create_engine_config()
    config.load_config.use_tqdm_on_load = False
    kernel_fallbacks.TAKEN.clear()
    with set_current_vllm_config(config):
        _init_distributed()
        model_config = config.model_config
        with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
            model = initialize_model(vllm_config=config, model_config=model_config)
        result.model_class = f"{type(model).__module__}.{type(model).__qualname__}"
        result.quant_methods = _quant_methods(model)
        storage = _Storage(model)
        state: dict[str, str | None] = {"current": None}
        sources: dict[int, str] = {}
        held: list[torch.Tensor] = []  # keeps storages (and their addresses) alive
        seen: set[str] = set()
        loader = DefaultModelLoader(config.load_config)

        def stream():
            for name, tensor in loader.get_all_weights(model_config, model):
                storage.refresh()
                held.append(tensor)
                sources[tensor.untyped_storage().data_ptr()] = name
                seen.add(name)
                state["current"] = name
                yield name, tensor
            storage.refresh()

        tracker = _tracker(storage, sources, state)
        try:
            with tracker:
                model.load_weights(stream())
        except Exception as exc:  # noqa: BLE001 (the model's fault: reported)
            result.error = f"{type(exc).__name__}: {exc}"[:600]
            result.error += f" (while loading {state['current']})"
        storage.refresh()
        result.fallbacks = sorted(set(kernel_fallbacks.TAKEN))
        exempt = _exempt(model, set(stored))
    if result.error is not None:
        return result
    result.problems = _problems(stored, skipped, seen, tracker.writes, storage, exempt)
    took = {w["tensor"] for w in tracker.writes}
    result.consumed = len((took & set(stored)) - skipped)
    return result


def _activation_dtype(args: Any) -> str:
    """The engine's dtype, unless the checkpoint's quantization method takes
    other activations (vLLM's MXFP4 configs: bfloat16 only), where its first:
    the model is built as vLLM would serve the scheme. Loading compares dtype
    kinds (16/32-bit floats are one), so this changes no verdict."""
    from vllm.model_executor.model_loader.weight_utils import get_quant_config

    model_config = args.create_model_config()
    if model_config.quantization is None:
        return args.dtype
    # The config instance, as VllmConfig asks it (some classes answer per
    # instance, compressed-tensors' among them).
    quant = get_quant_config(model_config, args.create_load_config())
    dtypes = quant.get_supported_act_dtypes()
    if model_config.dtype in dtypes:
        return args.dtype
    return str(dtypes[0]).removeprefix("torch.")


def _problems(
    stored: dict[str, tuple[tuple[int, ...], str]],
    skipped: set[str],
    seen: set[str],
    writes: list[dict],
    storage: _Storage,
    exempt: set[str],
) -> list[str]:
    """Problem lines, each grouped over layers and experts."""
    found: dict[str, set[str]] = defaultdict(set)
    took = {w["tensor"] for w in writes}
    for name in sorted(set(stored) - skipped):
        if name not in seen:
            found["vLLM's weight iterator dropped"].add(_collapse(name))
        elif name not in took:
            found["no parameter took"].add(_collapse(name))
    for w in writes:
        if w["tensor"] in skipped:
            continue
        where = f"{_collapse(w['tensor'] or '?')} -> {_collapse(w['param'])}"
        src, dst = _dtype_kind(w["src_dtype"]), _dtype_kind(w["dst_dtype"])
        # compressed-tensors' INT4 ``weight_shape`` holds a shape's numbers
        # (int64); vLLM's WNA16 MoE keeps them in float32 parameters
        # (w13_weight_shape / w2_weight_shape): converted, exact, not bytes read.
        shape_numbers = (w["tensor"] or "").endswith(".weight_shape")
        if src != dst and not shape_numbers:
            found["stored bytes reinterpreted"].add(
                f"{where} ({w['src_dtype']} into {w['dst_dtype']})"
            )
        if not _shape_fits(w["src_shape"], w["dst_shape"]):
            found["shape changed"].add(
                f"{where} ({list(w['src_shape'])} into {list(w['dst_shape'])})"
            )
    for name in storage.params:
        if name in exempt:
            continue
        fraction = storage.written(name)
        if fraction < 1.0:
            found["parameter not (fully) written"].add(
                f"{_collapse(name)} ({fraction:.0%})"
            )
    return [
        f"{kind}: {', '.join(sorted(items)[:4])}"
        + (f" (+{len(items) - 4} more)" if len(items) > 4 else "")
        for kind, items in found.items()
    ]


def _init_distributed() -> None:
    """One rank of one, once per process (under the first model's config)."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    init_distributed_environment(
        world_size=1,
        rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        local_rank=0,
        backend="gloo",
    )
    initialize_model_parallel(1, 1)


def main(argv: list[str]) -> int:
    jobs_path, out_path = argv
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    jobs = json.loads(Path(jobs_path).read_text())
    from onboard.runtime import kernel_fallbacks
    from onboard.runtime.engine_worker import inspect_classes_here

    kernel_fallbacks.install()
    inspect_classes_here()
    results = []
    for model_dir in jobs["models"]:
        try:
            results.append(_probe(model_dir, jobs["left_out"], jobs["engine_kwargs"]))
        except Exception as exc:  # noqa: BLE001 (building failed: reported)
            error = f"{type(exc).__name__}: {exc}"[:600]
            results.append(WeightsLoad(model_dir, error=f"building the model: {error}"))
    Path(out_path).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
