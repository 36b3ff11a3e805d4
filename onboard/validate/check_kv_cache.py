"""The `kv-cache` check: the engine's own KV-cache accounting against the spec's.

The main engine reports, when it is ready, the KV-cache spec vLLM gave each
attention layer (``engine_probes.kv_cache_info``: page bytes / block size per
layer, and the layers that read another layer's cache), and each linear-attention
layer's state spec (its shapes, dtypes and bytes per sequence). The same numbers
follow from the spec alone (``onboard.serving.kv.kv_report``, the serving plan's
arithmetic) at the engine's dtypes. The check passes when they agree exactly:
per layer (bytes per token, cache kind, which layer a KV-sharing layer reads;
state bytes per sequence and shapes) and in total, with and without sharing.
Metrics: ``bytes_per_token`` and ``bytes_per_token_without_sharing`` (the
engine's), ``state_bytes_per_sequence`` (the engine's, linear-attention layers),
``saved_fraction``, the plan's numbers and the shared layer pairs.
"""

from __future__ import annotations

import re
from typing import Any

from onboard.serving.kv import KV_DTYPE_BYTES, KVReport, kv_report
from onboard.validate.results import Check

# vLLM's KV-cache spec class per cache kind of the plan.
_SPEC_CLASS = {
    "full": "FullAttentionSpec",
    "sliding": "SlidingWindowSpec",
    "chunked": "ChunkedLocalAttentionSpec",
    "mla": "MLAAttentionSpec",
}
_STATE_SPEC_CLASS = "MambaSpec"
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def run(ctx, name: str) -> Check:
    if ctx.engine is None or ctx.engine.info is None:
        return Check.not_run(name, "the engine did not load the model (see accuracy)")
    engine_kv = ctx.engine.info.get("kv_cache") or {}
    if "error" in engine_kv or "layers" not in engine_kv:
        return Check.not_run(
            name,
            "the engine did not report its KV-cache layout: "
            f"{engine_kv.get('error', 'no kv_cache in its ready message')}",
        )
    kwargs = ctx.options.engine_kwargs() if ctx.options else {}
    dtype = kv_dtype(kwargs)
    state = kwargs.get("mamba_ssm_cache_dtype")
    speculative = (kwargs.get("speculative_config") or {}).get(
        "num_speculative_tokens", 0
    )
    spec = ctx.spec
    if ctx.path.get("path") == "dense-equivalent":
        # The engine runs sparse MLA densely: no index-key cache beside the latent.
        spec = spec.model_copy(
            update={"attention": spec.attention.model_copy(update={"indexer": None})}
        )
    plan = kv_report(
        spec,
        dtype,
        model_dtype=model_dtype(kwargs),
        state_dtype=None if state in (None, "auto") else state,
        num_speculative=speculative,
    )
    return compare(engine_kv, plan, name)


def kv_dtype(engine_kwargs: dict[str, Any]) -> str:
    """The dtype the engine's KV cache is stored in (the plan's name for it)."""
    cache = str(engine_kwargs.get("kv_cache_dtype", "auto"))
    if cache.startswith("fp8"):
        return "fp8"
    dtype = str(engine_kwargs.get("dtype", "bfloat16")).removeprefix("torch.")
    return dtype if dtype in KV_DTYPE_BYTES else "bfloat16"


def model_dtype(engine_kwargs: dict[str, Any]) -> str:
    """The engine's model dtype (the linear-attention convolution state's)."""
    dtype = str(engine_kwargs.get("dtype", "bfloat16")).removeprefix("torch.")
    return dtype if dtype in KV_DTYPE_BYTES else "bfloat16"


def layer_index(name: str) -> int | None:
    """Decoder layer index of a vLLM attention layer name (model.layers.3.…)."""
    found = _LAYER_INDEX.search(name)
    return int(found.group(1)) if found else None


def _whole(x: float) -> float | int:
    # vLLM's page bytes / block size: a whole number unless something is off.
    return int(x) if float(x).is_integer() else x


def _prefix_caching(engine_kv: dict[str, Any]) -> str:
    """How the engine caches prefixes of a model with linear-attention layers."""
    if not engine_kv.get("enable_prefix_caching"):
        return "Prefix caching is off: every prompt recomputes its states."
    return (
        f"Prefix caching on, mamba_cache_mode {engine_kv.get('mamba_cache_mode')}: "
        "the states are kept at block boundaries "
        f"({engine_kv.get('block_size')} tokens), so a cached prefix is reused in "
        "whole blocks."
    )


def _compare_states(
    states: dict[int, dict[str, Any]], plan: KVReport, problems: list[str]
) -> list[dict[str, Any]]:
    """Each linear-attention layer's state in the engine against the plan's."""
    rows = []
    for state in plan.states:
        got = states.pop(state.index, None)
        where = f"layer {state.index}"
        want_shapes = [sorted(state.conv_shape), sorted(state.recurrent_shape)]
        row = {
            "layer": state.index,
            "kind": state.kind,
            "plan_state_bytes": state.bytes,
            "engine_state_bytes": got["state_bytes"] if got else 0,
            "plan_shapes": [list(state.conv_shape), list(state.recurrent_shape)],
            "engine_shapes": got["shapes"] if got else None,
            "engine_dtypes": got["dtypes"] if got else None,
            "engine_page_bytes": got["page_size_bytes"] if got else None,
        }
        rows.append(row)
        if got is None:
            problems.append(f"{where}: the engine keeps no state for it")
            continue
        if got["type"] != _STATE_SPEC_CLASS:
            problems.append(f"{where}: the engine gave it a {got['type']}")
        # The convolution state's orientation is vLLM's layout choice.
        if [sorted(s) for s in got["shapes"]] != want_shapes:
            problems.append(
                f"{where}: state shapes {got['shapes']} in the engine, "
                f"{row['plan_shapes']} by the spec's arithmetic"
            )
        if got["state_bytes"] != state.bytes:
            problems.append(
                f"{where}: {got['state_bytes']} state bytes per sequence in the "
                f"engine, {state.bytes} by the spec's arithmetic"
            )
    for index in sorted(states):
        problems.append(f"the engine keeps a state for layer {index}, the spec not")
    return rows


def compare(engine_kv: dict[str, Any], plan: KVReport, name: str = "kv-cache"):
    """Check the engine's KV-cache report against the plan's, layer by layer."""
    problems: list[str] = []
    owned: dict[int, dict[str, Any]] = {}
    states: dict[int, dict[str, Any]] = {}
    for layer_name, layer in engine_kv["layers"].items():
        index = layer_index(layer_name)
        if index is None or index in owned or index in states:
            problems.append(f"engine layer {layer_name!r}: no distinct layer index")
            continue
        (states if "state_bytes" in layer else owned)[index] = layer
    shared: dict[int, int] = {}
    for reader, target in engine_kv["shared_layers"].items():
        i, j = layer_index(reader), layer_index(target)
        if i is None or j is None:
            problems.append(f"engine sharing {reader!r} -> {target!r}: no layer index")
            continue
        shared[i] = j

    rows = []
    for layer in plan.layers:
        got = owned.pop(layer.index, None)
        row = {
            "layer": layer.index,
            "kind": layer.kind,
            "plan_bytes_per_token": layer.bytes_per_token,
            "engine_bytes_per_token": _whole(got["bytes_per_token"]) if got else 0,
            "engine_spec": got["type"] if got else None,
            "plan_reads_layer": layer.shares,
            "engine_reads_layer": shared.pop(layer.index, None),
        }
        rows.append(row)
        where = f"layer {layer.index}"
        if row["plan_reads_layer"] != row["engine_reads_layer"]:
            problems.append(
                f"{where}: the spec says it reads layer {layer.shares}'s cache, the "
                f"engine says {row['engine_reads_layer']}"
            )
        if row["engine_bytes_per_token"] != layer.bytes_per_token:
            problems.append(
                f"{where}: {row['engine_bytes_per_token']} bytes/token in the engine, "
                f"{layer.bytes_per_token} by the spec's arithmetic"
            )
        if got and got["type"] != _SPEC_CLASS[layer.kind]:
            problems.append(
                f"{where}: the engine gave it a {got['type']}, the spec a "
                f"{layer.kind} layer ({_SPEC_CLASS[layer.kind]})"
            )
    for index in sorted(owned):
        problems.append(f"the engine has a KV cache for layer {index}, the spec not")
    state_page = max((s["page_size_bytes"] for s in states.values()), default=None)
    state_rows = _compare_states(states, plan, problems)
    for index, target in sorted(shared.items()):
        problems.append(f"the engine says layer {index} reads layer {target}'s cache")

    engine_total = _whole(engine_kv["bytes_per_token"])
    engine_unshared = _whole(engine_kv["bytes_per_token_without_sharing"])
    totals = [
        ("bytes per token", engine_total, plan.bytes_per_token),
        (
            "bytes per token without sharing",
            engine_unshared,
            plan.bytes_per_token_without_sharing,
        ),
    ]
    for label, got_total, want in totals:
        if got_total != want:
            problems.append(f"{label}: engine {got_total}, spec arithmetic {want}")
    pairs = [[x.index, x.shares] for x in plan.layers if x.shares is not None]
    saved = 1.0 - engine_total / engine_unshared if engine_unshared else 0.0
    metrics = {
        "bytes_per_token": engine_total,
        "bytes_per_token_without_sharing": engine_unshared,
        "saved_bytes_per_token": engine_unshared - engine_total,
        "saved_fraction": saved,
        "plan_bytes_per_token": plan.bytes_per_token,
        "plan_bytes_per_token_without_sharing": plan.bytes_per_token_without_sharing,
        "dtype": plan.dtype,
        "per_layer_formula": plan.formula,
        "shared_layer_pairs": pairs,
        "layers_with_own_cache": len(plan.owning_layers),
        "layers": rows,
        "num_blocks": engine_kv.get("num_blocks"),
        "block_size": engine_kv.get("block_size"),
    }
    if plan.states or states:
        engine_state = int(engine_kv.get("state_bytes_per_sequence", 0))
        if engine_state != plan.state_bytes_per_sequence:
            problems.append(
                f"state bytes per sequence: engine {engine_state}, spec arithmetic "
                f"{plan.state_bytes_per_sequence}"
            )
        metrics |= {
            "state_bytes_per_sequence": engine_state,
            "plan_state_bytes_per_sequence": plan.state_bytes_per_sequence,
            "state_dtype": plan.state_dtype,
            "per_state_layer_formula": plan.state_formula,
            "state_layers": state_rows,
            "state_page_bytes": state_page,
            # Prefix caching of a hybrid model: vLLM's mamba cache mode.
            "enable_prefix_caching": engine_kv.get("enable_prefix_caching"),
            "mamba_cache_mode": engine_kv.get("mamba_cache_mode"),
            "mamba_block_size": engine_kv.get("mamba_block_size"),
        }
    summary = (
        f"engine: {engine_total:,} B/token KV cache ({plan.dtype}), "
        f"{engine_unshared:,} B/token without sharing"
    )
    if pairs:
        summary += (
            f"; sharing {', '.join(f'{a}->{b}' for a, b in pairs)} saves "
            f"{engine_unshared - engine_total:,} B/token ({saved:.1%})"
        )
    summary += (
        f". Spec arithmetic ({plan.formula} per layer with its own cache): "
        f"{plan.bytes_per_token:,} / {plan.bytes_per_token_without_sharing:,}."
    )
    if plan.states:
        summary += (
            f" Linear-attention state: engine {metrics['state_bytes_per_sequence']:,} "
            f"B per sequence over {len(plan.states)} layer(s); spec arithmetic "
            f"({plan.state_formula} per layer): "
            f"{plan.state_bytes_per_sequence:,}. " + _prefix_caching(engine_kv)
        )
    if problems:
        details = summary + "\nDisagreements:\n" + "\n".join(f"  {p}" for p in problems)
        return Check(name, "failed", metrics, details)
    return Check(name, "passed", metrics, summary + " They agree exactly.")
