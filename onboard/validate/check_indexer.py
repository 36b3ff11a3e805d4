"""The ``indexer`` check: sparse MLA's lightning indexer of the generated vLLM model
against the reference's, tensor by tensor, on a context longer than the top-k.

vLLM's CPU platform runs no sparse attention, so the engine checks run the model
densely on contexts within the top-k (``path: dense-equivalent``). This check covers
what they cannot: it takes one layer's indexer out of the generated model file,
loads the checkpoint's tensors into it through the file's own weight mapping (wk
and weights_proj stacked into one GEMM), and compares, on a context of three times
the top-k, (1) every query's index scores, (2) the top-k set each query keeps and
(3) the reference's sparse attention over the generated indexer's sets against
over its own. What runs is the generated ``project`` (projections, LayerNorm, index
rope, head weights) and the scoring vLLM's indexer op computes, in float32; the
op's FP8 rounding and its kernels run on GPU targets only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from onboard.spec.model import ModelSpec, class_prefix
from onboard.spec.module_tree import module_names
from onboard.validate.results import Check
from onboard.validate.serve import free_port

# float32 on both sides: the scores and the attention outputs agree to rounding.
RTOL = 1e-4
# Queries compared: the last ones of the context, each with more visible keys than
# the top-k keeps.
CONTEXT_FACTOR = 3
MAX_TOPK = 256  # a larger top-k makes the [query, key] score matrices too large


def run(ctx, name: str) -> Check:
    spec: ModelSpec = ctx.spec
    if spec.attention.indexer is None:
        return Check.not_run(name, "the spec has no attention.indexer")
    if ctx.plugin is None:
        return Check.not_run(name, "no generated plugin (vLLM's in-tree classes ran)")
    reference = generated_reference(ctx.model_dir, spec, ctx.hf_dir, ctx.work_dir)
    module = import_generated(ctx.plugin.root / ctx.plugin.package, spec)
    result = indexer_parity(spec, reference, module)
    status = "passed" if result["passed"] else "failed"
    return Check(name, status, result, result.pop("details"))


def generated_reference(
    model_dir: Path, spec: ModelSpec, hf_dir: Path | None, work_dir: Path
) -> Any:
    """The generated Hugging Face reference on the checkpoint, in float32 (also
    where transformers has the family: the check reads the reference's indexer
    module and its score method)."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from onboard.reference.overlay import overlay_with_remote_code

    config = json.loads((Path(model_dir) / "config.json").read_text())
    source = overlay_with_remote_code(
        Path(model_dir), spec, hf_dir, config, Path(work_dir) / "indexer-check"
    )
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=torch.float32, trust_remote_code=True
    )
    return model.eval()


def import_generated(package_dir: Path, spec: ModelSpec) -> ModuleType:
    """The generated vLLM model file, imported on its own (it has no relative
    imports; the MTP file has)."""
    path = Path(package_dir) / f"{spec.module_name}.py"
    name = f"_onboard_indexer_check_{spec.module_name}"
    loader = importlib.util.spec_from_file_location(name, path)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    sys.modules[name] = module
    loader.loader.exec_module(module)
    return module


@contextlib.contextmanager
def vllm_layers(max_model_len: int) -> Iterator[None]:
    """What vLLM's layers read while they are built outside an engine: a current
    config and a one-process model-parallel group."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    config = VllmConfig()
    object.__setattr__(
        config,
        "model_config",
        SimpleNamespace(max_model_len=max_model_len, is_moe=False),
    )
    config.attention_config.sparse_mla_prefill_workspace_factor = 1
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    with set_current_vllm_config(config):
        fresh = not ps.model_parallel_is_initialized()
        if fresh:
            ps.init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
                backend="gloo",
            )
            ps.initialize_model_parallel(1, 1)
        try:
            yield
        finally:
            torch.set_default_dtype(dtype)
            if fresh:
                ps.destroy_model_parallel()
                ps.destroy_distributed_environment()


def generated_indexer(
    module: ModuleType,
    spec: ModelSpec,
    config: Any,
    tensors: dict[str, Any],
    layer: int,
):
    """The generated model's indexer of ``layer`` and its index rope, built in
    float32 and loaded with ``tensors`` (checkpoint names, e.g.
    ``model.layers.0.self_attn.indexer.wk.weight``) through the model class's own
    weight mapper."""
    from vllm.config import CacheConfig
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    prefix = class_prefix(spec.architecture)
    indexer_cls = getattr(module, f"{prefix}Indexer")
    mapper = getattr(module, spec.architecture).hf_to_vllm_mapper
    where = f"model.layers.{layer}.self_attn.indexer"
    indexer = indexer_cls(config, None, CacheConfig(), None, prefix=where)
    params = dict(indexer.named_parameters())
    loaded = set()
    for ckpt_name, tensor in tensors.items():
        mapped = mapper._map_name_with_shard(ckpt_name)
        assert mapped is not None, ckpt_name
        vllm_name, shard = mapped
        param = params[vllm_name.removeprefix(where + ".")]
        loader = getattr(param, "weight_loader", default_weight_loader)
        if shard is None:
            loader(param, tensor)
        else:
            loader(param, tensor, shard)
        loaded.add(vllm_name)
    missing = {f"{where}.{n}" for n in params} - loaded
    assert not missing, f"no checkpoint tensor for {sorted(missing)}"
    for sub in indexer.modules():
        method = getattr(sub, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(sub)
    idx = spec.attention.indexer
    assert idx is not None and spec.attention.mla is not None
    rope = dict(config.rope_parameters)
    if spec.rope.scaling and spec.rope.scaling.type == "yarn":
        rope["rope_type"] = "deepseek_yarn"
    rotary = get_rope(
        spec.attention.mla.qk_rope_head_dim,
        max_position=config.max_position_embeddings,
        rope_parameters=rope,
        is_neox_style=not idx.rope_interleave,
    )
    return indexer, rotary


def indexer_parity(
    spec: ModelSpec,
    reference: Any,
    module: ModuleType,
    *,
    layer: int | None = None,
    tensors: dict[str, Any] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Compare ``layer``'s indexer (the first layer with one of its own) of the
    generated module against the reference model's, on random hidden states of
    CONTEXT_FACTOR x top-k tokens. ``tensors`` (checkpoint names) replace the
    reference's own indexer weights on the generated side (a test corrupts one to
    see the check fail)."""
    import torch

    idx = spec.attention.indexer
    assert idx is not None
    if layer is None:
        layer = next(
            i for i in range(spec.num_hidden_layers) if i not in idx.shared_layers
        )
    config = reference.config
    topk = int(config.index_topk)
    if topk > MAX_TOPK:
        raise ValueError(
            f"index_topk {topk} > {MAX_TOPK}: the check runs on tiny checkpoints"
        )
    names = module_names(spec)
    base = getattr(reference, names["base"])
    attn = getattr(getattr(base, names["layers"])[layer], names["attn"])
    ref_indexer = getattr(attn, names["indexer"])

    def state() -> tuple:
        """What the layers pass along: a model with KV sharing the latents its
        layers computed, one with shared indexer layers the picked top-k."""
        latents = ({},) if spec.attention.kv_sharing else ()
        return latents + (([],) if idx.shared_layers else ())

    ref_module = sys.modules[type(attn).__module__]
    where = f"model.layers.{layer}.self_attn.indexer"
    if tensors is None:
        tensors = {f"{where}.{k}": v for k, v in ref_indexer.state_dict().items()}
    seq = CONTEXT_FACTOR * topk
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, seq, config.hidden_size, generator=gen)
    positions = torch.arange(seq)
    with torch.no_grad(), vllm_layers(max(seq, 64)):
        indexer, rotary = generated_indexer(module, spec, config, tensors, layer)
        # The indexer's query input: MLA's normalised query latent.
        q_latent = getattr(attn, names["q_a_norm"])(getattr(attn, names["q_a_proj"])(x))
        q, k, w = indexer.project(x[0], q_latent[0], positions, rotary.forward_native)
    with torch.no_grad():
        # What vLLM's indexer op scores: sum over heads of weight x relu(q.k).
        ours = (torch.einsum("shd,td->sht", q, k).relu() * w[:, :, None]).sum(1)
        cos, sin = ref_module.rope_cos_sin(config, positions[None])
        keys = ref_indexer.keys(x, cos, sin)
        bias = ref_module.attention_bias(seq, seq, seq, None, x.dtype, x.device)
        theirs = ref_indexer(x, q_latent, keys, cos, sin, bias)[0]
        visible = torch.ones(seq, seq, dtype=torch.bool).tril()
        ours = ours.masked_fill(~visible, float("-inf"))
        scale = theirs[visible].abs().max().item()
        score_diff = (ours - theirs)[visible].abs().max().item() / scale
        # Queries that see more keys than the top-k keeps: their sets differ.
        rows = range(topk, seq)
        our_top = ours.topk(topk, dim=-1).indices
        their_top = theirs.topk(topk, dim=-1).indices
        set_mismatch = sum(
            set(our_top[r].tolist()) != set(their_top[r].tolist()) for r in rows
        )
        # The reference's sparse attention over our sets and over its own.
        want = attn(x, cos, sin, seq, None, None, *state())
        ref_indexer.select = lambda _scores: our_top[None]
        try:
            got = attn(x, cos, sin, seq, None, None, *state())
        finally:
            del ref_indexer.select
        attn_diff = ((got - want).abs().max() / want.abs().max()).item()
        # How much the choice matters here: the dense attention over every token.
        ref_indexer.topk = seq
        try:
            dense = attn(x, cos, sin, seq, None, None, *state())
        finally:
            ref_indexer.topk = topk
        sparse_vs_dense = ((dense - want).abs().max() / want.abs().max()).item()
    passed = score_diff < RTOL and set_mismatch == 0 and attn_diff < RTOL
    details = (
        f"layer {layer}'s indexer on {seq} tokens (index_topk {topk}), float32: "
        f"index scores max rel diff {score_diff:.2e}; top-k sets differ on "
        f"{set_mismatch} of {len(rows)} queries that see more than {topk} keys; "
        f"sparse attention over the generated sets vs the reference's: max rel "
        f"diff {attn_diff:.2e} (dense attention differs by {sparse_vs_dense:.2e}). "
        f"Tolerance {RTOL:.0e}, no set may differ."
    )
    return {
        "passed": passed,
        "path": "tensor (generated indexer module, float32, no engine)",
        "layer": layer,
        "context_tokens": seq,
        "index_topk": topk,
        "score_max_rel_diff": score_diff,
        "topk_set_mismatches": set_mismatch,
        "queries_compared": len(rows),
        "attention_max_rel_diff": attn_diff,
        "sparse_vs_dense_rel_diff": sparse_vs_dense,
        "details": details,
    }
