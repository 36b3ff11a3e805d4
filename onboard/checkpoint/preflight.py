"""Checkpoint preflight: does a checkpoint on disk fit the spec, before any engine?

``preflight(spec, checkpoint_dir)`` reads metadata only: ``config.json``, the
safetensors index and, of every shard, the 8-byte header length and the JSON header
(tensor names, dtypes, shapes, byte ranges). No tensor data is read (but the
linear-attention layers' A_log, one value per head), so a 1T-parameter checkpoint
is checked in seconds. It compares:

1. files: the index against the shards on disk (missing, unlisted, truncated or
   corrupt shards, tensors the index misplaces);
2. ``config.json`` against :func:`onboard.spec.hf.hf_config_from_spec` for every
   forward-relevant key, with vLLM's known traps spelled out (``topk_method`` for
   the router's bias correction, ``n_group: null``);
3. tensors against :func:`onboard.checkpoint.tiny.plan_tensors` (the spec's own
   names and shapes, MTP heads included): missing, unexpected (with the
   ``checkpoint.tensor_names`` override when a renamed role explains them), shape
   mismatches with the spec fields behind each dimension, dtype surprises;
4. quantized checkpoints (compressed-tensors): for each Linear module, exactly the
   parameters compressed-tensors writes for its scheme (``weight_packed``,
   ``weight_scale``, ``weight_global_scale``, ``input_scale``, ...), with shapes and
   dtypes; modules the config ignores stay unquantized; fused partners agree.

Every mismatch is a :class:`Problem` with the fix. Problems about many tensors of
one pattern (all layers, all experts) are reported once, with the index ranges.

Each concern is a module that adds to one shared problem list
(:class:`~onboard.checkpoint.preflight_report.PreflightRun`): ``preflight_files``
(index, shards, headers), ``preflight_config`` (config.json), ``preflight_tensors``,
``preflight_names`` and ``preflight_linear`` (the spec's tensors; the decay
parameters of linear-attention layers), ``preflight_quant`` and
``preflight_ct`` (quantized checkpoints). This module runs them in order and keeps
every public name importable from here.
"""

from __future__ import annotations

import time
from pathlib import Path

from onboard.checkpoint.preflight_config import (
    CONFIG_DTYPES,
    check_config,
    config_class,
    read_config,
)
from onboard.checkpoint.preflight_files import (
    SPEC_HINT_MISMATCHES,
    TensorInfo,
    read_header,
    read_shards,
    suggest_own_spec,
)
from onboard.checkpoint.preflight_names import DROPPED
from onboard.checkpoint.preflight_quant import (
    EXPERT_ROLES,
    FUSED_SETS,
    HEAD_ROLES,
    LINEAR_ROLES,
    QUANT_PARAMS,
    QUANTIZABLE_ROLES,
)
from onboard.checkpoint.preflight_report import (
    PreflightReport,
    PreflightRun,
    Problem,
    Severity,
)
from onboard.checkpoint.preflight_tensors import SHARING_UNUSED_ROLES, check_tensors
from onboard.errors import InputError
from onboard.safetensors_header import DTYPE_BITS, MAX_HEADER, HeaderError
from onboard.spec.model import ModelSpec
from onboard.targets.cpu_kernels import CPU_MLA_LATENT

__all__ = [
    "CONFIG_DTYPES",
    "CPU_MLA_LATENT",
    "DROPPED",
    "DTYPE_BITS",
    "EXPERT_ROLES",
    "FUSED_SETS",
    "HEAD_ROLES",
    "LINEAR_ROLES",
    "MAX_HEADER",
    "QUANTIZABLE_ROLES",
    "QUANT_PARAMS",
    "SHARING_UNUSED_ROLES",
    "SPEC_HINT_MISMATCHES",
    "HeaderError",
    "PreflightReport",
    "Problem",
    "Severity",
    "TensorInfo",
    "preflight",
    "read_header",
]


def _as_language_model(run: PreflightRun) -> None:
    """A multimodal wrapper's checkpoint as the generated model loads it: the
    language model's tensors under `model.`, the skipped modules' left out
    (checkpoint.language_model_prefix, skipped_prefixes)."""
    ckpt = run.spec.checkpoint
    if ckpt.language_model_prefix is None:
        return
    prefix = ckpt.language_model_prefix + "."
    skipped = tuple(p + "." for p in ckpt.skipped_prefixes)
    found = {}
    for name, info in run.found.items():
        if name.startswith(skipped):
            continue
        if name.startswith(prefix):
            name = "model." + name[len(prefix) :]
        found[name] = info
    run.found = found


def preflight(
    spec: ModelSpec,
    checkpoint_dir: Path,
    *,
    config_keys: bool = True,
    in_tree: bool = False,
) -> PreflightReport:
    """Compare a checkpoint's headers and config.json with the spec (no weights read).

    Bad input (not a directory) raises InputError; everything about the checkpoint
    itself is a :class:`Problem` in the report. ``config_keys=False`` leaves out
    the comparison of config.json's keys as transformers' config classes read them
    (their import costs seconds; `quantize` copies those keys unchanged): files,
    config values, architecture and tensors are still checked. ``in_tree``: the
    checkpoint is served by vLLM's in-tree model of the family rather than the
    generated one, so the keys only vLLM's own model reads must be set (see
    :func:`onboard.arch.config_keys.unset_keys`).
    """
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise InputError(f"{root}: not a checkpoint directory")
    run = PreflightRun(spec, root, in_tree=in_tree)
    t0 = time.perf_counter()
    # Computing the spec's config.json needs transformers' config classes, whose
    # import (it pulls in torch) costs seconds once per process: timed apart.
    if config_keys:
        config_class(spec.model_type)
    t1 = time.perf_counter()
    # The order of the checks is the order of the report's problems.
    read_config(run)
    read_shards(run)
    _as_language_model(run)
    t2 = time.perf_counter()
    if run.config is not None:
        check_config(run, keys=config_keys)
    t3 = time.perf_counter()
    check_tensors(run)
    suggest_own_spec(run)
    t4 = time.perf_counter()
    report = run.report
    report.timings = {
        "imports": t1 - t0,
        "headers": t2 - t1,
        "config": t3 - t2,
        "tensors": t4 - t3,
    }
    return report
