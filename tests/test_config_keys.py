"""Every key the generated config.json writes is read by the code it configures.

A key that changes the forward pass must be read from the config by the generated
vLLM model and by the generated Hugging Face reference (where there is one:
transformers' own class is the reference of a model type it knows, and reads its
own keys). Otherwise the config could say one thing and the code do another. The
rest are listed below as metadata, each with its reason. Reads are found on the
AST: ``config.<key>`` and ``getattr(config, "<key>", ...)``, and ``self.<key>``
inside the generated config class (its ``__post_init__`` derives fields).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from generate_variants import BUNDLED, any_spec

from onboard.generate import generate_files
from onboard.spec.hf import FAMILIES, IGNORED, find_base, hf_config_from_spec

# Keys that do not change what the generated code computes, and why.
METADATA: dict[str, str] = {
    **{key: "no effect on inference (spec.hf.IGNORED)" for key in IGNORED},
    "architectures": "selects the model class; vLLM and transformers read it",
    "model_type": "selects the config class; vLLM and transformers read it",
    "qk_head_dim": "derived (qk_nope_head_dim + qk_rope_head_dim); the parts are read",
    # Structural: which tensors exist. A config that disagrees fails at load with
    # missing or unexpected tensors, and spec inference reads the key back.
    "qk_norm": "structural: whether q_norm/k_norm tensors exist",
    "norm_placement": "structural: which norm tensors a layer has",
    # Fixed when the files are generated, read back by spec inference (Gemma's).
    "norm_unit_offset": "the norm class the files use (1 + weight or weight)",
    "scale_embedding": "whether the files scale the embeddings by sqrt(hidden)",
    "shared_expert_gate": "structural: whether the shared expert's gate tensor exists",
    "topk_method": "structural: noaux_tc means an e_score_correction_bias tensor",
    "mtp_mlp": "structural: which MLP tensors the MTP blocks have",
    "attn_output_gate": "structural: whether q_proj holds each head's output gate "
    "(twice the rows)",
    "linear_projections": "structural: which projection tensors a "
    "linear-attention layer has (grouped or split)",
    "linear_attention_type": "structural: which tensors a linear-attention layer "
    "has (Gated DeltaNet's or Kimi delta attention's); the files are generated for "
    "one",
    "mamba_ssm_dtype": "the serving engine's recurrent-state dtype (vLLM's "
    "mamba_ssm_cache_dtype, which the engine is launched with); no effect on the "
    "weights or the reference's float32 states",
    "tie_word_embeddings": "structural: whether lm_head.weight exists (transformers "
    "ties by it; the generated vLLM model ties exactly when the spec does)",
    "attention_sinks": "structural: whether the attention's sinks tensor exists",
    "moe_router_bias": "structural: whether the router's bias tensor exists",
    "moe_expert_bias": "structural: whether the experts' bias tensors exist",
}

# Keys one kind of file may leave unread, and why.
NOT_READ_BY = {
    # MLA's heads come from qk_nope/qk_rope/v head dims and the query heads;
    # transformers' DeepSeek classes declare these anyway.
    "mla": {
        "head_dim": "unused by MLA (transformers sets it to qk_rope_head_dim)",
        "num_key_value_heads": "unused by MLA (one latent serves all heads)",
    },
    "hf": {
        "max_position_embeddings": "sizes vLLM's rope cache; the reference "
        "computes the rope angles of each position it is given",
        # The reference reads the shared experts' total width.
        "n_shared_experts": "the reference reads shared_expert_intermediate_size, "
        "the shared experts' total width",
    },
    "vllm": {
        "partial_rotary_factor": "vLLM's get_rope reads it from rope_parameters, "
        "which holds it as well",
    },
    # Every layer MoE (and the MTP blocks too): the placement keys place nothing
    # else, and neither file builds a dense MLP; preflight compares them with the
    # spec's config.
    "all_moe": {
        "first_k_dense_replace": "every layer is MoE",
        "decoder_sparse_step": "every layer is MoE",
        "mlp_only_layers": "every layer is MoE",
        "intermediate_size": "no dense MLP in any block",
    },
    # Plain top-k over softmax scores: one group of all experts and a factor of
    # one are what it computes.
    "plain_topk": {
        "n_group": "ungrouped routing (one group)",
        "topk_group": "ungrouped routing (one group)",
        "routed_scaling_factor": "unscaled routing (1.0)",
    },
    # Every MLP is the experts' clamped SwiGLU (gpt-oss, whose transformers class
    # does not read hidden_act either).
    "clamped_swiglu_only": {
        "hidden_act": "no MLP applies it: the experts use the clamped SwiGLU",
    },
}


def _reads(source: str) -> set[str]:
    """Config attributes a generated file reads."""
    tree = ast.parse(source)
    reads: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
            (isinstance(node.value, ast.Name) and node.value.id == "config")
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "config")
        ):
            reads.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            reads.add(str(node.args[1].value))
        elif isinstance(node, ast.FunctionDef) and node.name == "__post_init__":
            reads |= _post_init_reads(node)
    return reads


def _post_init_reads(function: ast.FunctionDef) -> set[str]:
    """``self.<key>`` loads in a config class's ``__post_init__``, not counting
    ``self.<key> is None`` (filling in a default is not reading the key)."""
    defaults = {
        id(n.left)
        for n in ast.walk(function)
        if isinstance(n, ast.Compare)
        and isinstance(n.ops[0], ast.Is)
        and isinstance(n.comparators[0], ast.Constant)
        and n.comparators[0].value is None
    }
    return {
        n.attr
        for n in ast.walk(function)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        and isinstance(n.ctx, ast.Load)
        and id(n) not in defaults
    }


def _gdn_layer_reads() -> set[str]:
    """Config attributes vLLM's Gated DeltaNet layer reads itself (its source)."""
    import vllm.model_executor.layers.mamba.gdn.base as base
    import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as qwen

    return {key for m in (base, qwen) for key in _reads(Path(m.__file__).read_text())}


def _unread(name: str) -> dict[str, list[str]]:
    spec = any_spec(name)
    # A key set to null says nothing (transformers reads it as unset).
    config = hf_config_from_spec(spec)
    written = {key for key, value in config.items() if value is not None}
    written -= set(METADATA)
    # Written for vLLM's in-tree model only (DeepSeek-V3's scoring_func):
    # transformers' class has no such key and its code hard-codes the value, as
    # the generated model does.
    family = FAMILIES.get(spec.model_type)
    written -= set(family.vllm_keys if family else ())
    moe = spec.mlp.moe
    if moe is not None and moe.router.num_groups is None:
        # One group of all experts, for vLLM's in-tree DeepSeek MoE (which always
        # routes grouped); the generated model routes without groups.
        written -= {"n_group", "topk_group"}
    # The whole files: a modular spec's config.json holds its family's keys
    # beside the canonical ones the whole files read (onboard.spec.bases).
    files = generate_files(spec, standalone=True)
    vllm = {
        p: t for p, t in files.items() if p.startswith("plugin/") and p.endswith(".py")
    }
    hf = {p: t for p, t in files.items() if p.startswith("hf/") and p.endswith(".py")}
    if spec.attention.type == "mla":
        written -= set(NOT_READ_BY["mla"])
    if spec.mtp is None:  # a zero count: no MTP layers for either file to load
        written.discard("num_nextn_predict_layers")
    moe = spec.mlp.moe
    n = spec.num_hidden_layers
    if (
        moe is not None
        and all(spec.is_moe_layer(i) for i in range(n))
        and (spec.mtp is None or spec.mtp.mlp == "moe")
    ):
        written -= set(NOT_READ_BY["all_moe"])
    router = moe.router if moe is not None else None
    if router is not None and (router.scoring, router.num_groups) == ("softmax", None):
        if not router.bias_correction and router.routed_scaling_factor == 1.0:
            written -= set(NOT_READ_BY["plain_topk"])
    dense = any(not spec.is_moe_layer(i) for i in range(n))
    if moe is not None and moe.swiglu_limit is not None and not dense:
        written -= set(NOT_READ_BY["clamped_swiglu_only"])
    vllm_written = written - set(NOT_READ_BY["vllm"])
    vllm_reads = set().union(*map(_reads, vllm.values()))
    if spec.linear_attention is not None:
        # vLLM's own Gated DeltaNet layer reads its sizes from the config the
        # generated model hands it.
        vllm_reads |= _gdn_layer_reads()
    hf_reads = set().union(*map(_reads, hf.values()))
    match = find_base(spec)
    if match is not None:
        # ... and the family's own keys, as its published configs have them:
        # read where vLLM's or transformers' class of the family reads them.
        base = match.base
        family_reads = _source_reads(base.vllm_import)
        if base.mtp_module:
            family_reads |= _source_reads(
                f"vllm.model_executor.models.{base.mtp_module}"
            )
        t = base.model_type
        family_reads |= _source_reads(f"transformers.models.{t}.modeling_{t}")
        family_keys = set(hf_config_from_spec(match.as_base)) & family_reads
        vllm_written -= family_keys
        written -= family_keys
    unread = {"vllm": sorted(vllm_written - vllm_reads)}
    if hf:
        hf_written = written - set(NOT_READ_BY["hf"])
        unread["hf"] = sorted(hf_written - hf_reads)
    return unread


def _source_reads(module: str) -> set[str]:
    """Config attributes a module of vLLM or transformers reads (its source)."""
    return _reads(Path(importlib.import_module(module).__file__).read_text())


# The bundled specs, and Gemma's parts (its softmax scale and soft-caps are keys).
@pytest.mark.parametrize("name", [*BUNDLED, "var-sandwich"])
def test_every_written_key_is_read_or_metadata(name):
    unread = _unread(name)
    assert not any(unread.values()), (
        f"{name}: config.json keys the generated code does not read "
        f"(read them from the config, stop writing them, or list them in METADATA "
        f"with a reason): {unread}"
    )


def test_a_literal_in_place_of_a_read_is_caught():
    source = "class A:\n    def __init__(self, config):\n        self.bias = False\n"
    assert "qkv_bias" not in _reads(source)
    assert "qkv_bias" in _reads(source.replace("False", "config.qkv_bias"))
    assert "qkv_bias" in _reads(source.replace("False", 'getattr(config, "qkv_bias")'))
    default = (
        "def __post_init__(self):\n"
        "    if self.experts is None:\n"
        "        self.experts = []\n"
    )
    assert _reads(default) == set()
    assert _reads(default.replace("[]", "[0] * self.layers")) == {"layers"}
