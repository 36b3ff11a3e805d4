"""Sparse MLA (attention.indexer: DeepSeek-V3.2, GLM-5) beyond the reference's
parity tests in tests/test_reference.py: the rules, the config mapping's
refusals, the tiny checkpoint against transformers' own class, preflight's
shapes, quantization keeping the indexer in 16 bits, and the vLLM generator's
refusal.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_spec_hf import run_cli, transformers_config

from onboard.errors import InputError
from onboard.spec.hf import spec_from_hf_config
from onboard.spec.loader import dump_spec
from onboard.spec.model import ModelSpec
from onboard.spec.rules import check_rules


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def dsa_spec(model_type: str = "deepseek_v32") -> ModelSpec:
    return spec_from_hf_config(transformers_config(model_type).to_dict())


def _edited(spec: ModelSpec, **attention) -> ModelSpec:
    data = spec.model_dump(mode="json")
    for path, value in attention.items():
        node = data["attention"]
        *parents, leaf = path.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    return ModelSpec.model_validate(data)


def test_families_read_their_indexer():
    v32, glm = dsa_spec("deepseek_v32"), dsa_spec("glm_moe_dsa")
    for spec in (v32, glm):
        idx = spec.attention.indexer
        assert (idx.num_heads, idx.head_dim, idx.topk) == (4, 96, 8)
        assert spec.rope.interleaved and spec.attention.mla.latent_norm_eps == 1e-6
    assert not v32.attention.indexer.rope_interleave
    assert glm.attention.indexer.rope_interleave


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (dict(mla__q_lora_rank=None), "needs attention.mla.q_lora_rank"),
        (dict(indexer__head_dim=32), "at least attention.mla.qk_rope_head_dim"),
        (dict(indexer__shared_layers=[0]), "layer 0: a shared layer reuses"),
        (dict(indexer__shared_layers=[4]), "layer 4: a shared layer reuses"),
        (dict(kv_sharing={"2": 1}), "beside cross-layer KV sharing"),
    ],
)
def test_rules(edit, message):
    problems = check_rules(_edited(dsa_spec(), **edit))
    assert any(message in str(p) for p in problems), problems


def test_an_indexer_needs_mla():
    data = dsa_spec().model_dump(mode="json")
    gqa = transformers_config("llama").to_dict()
    data["attention"] = {
        "num_heads": gqa["num_attention_heads"],
        "num_kv_heads": gqa["num_key_value_heads"],
        "indexer": data["attention"]["indexer"],
    }
    problems = check_rules(ModelSpec.model_validate(data))
    assert any("it needs attention.type mla" in str(p) for p in problems), problems


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # A shared layer reuses an earlier layer's top-k: layer 0 has none.
        (
            dict(indexer_types=["shared", "full", "full", "shared"]),
            "indexer_types=.*must list full or shared for each of the 4 layers, "
            "the first full",
        ),
        (
            dict(indexer_types=["full", "shared"]),
            "indexer_types=.*must list full or shared for each of the 4 layers",
        ),
        (
            dict(layer_types=["indexed_attention", "full_attention"] * 2),
            "layer_types: indexed_attention layers are expressible only as every",
        ),
    ],
)
def test_what_the_spec_cannot_say_is_refused(change, message):
    config = {**transformers_config("glm_moe_dsa").to_dict(), **change}
    with pytest.raises(InputError, match=message):
        spec_from_hf_config(config)


def test_index_fields_without_a_top_k_are_refused():
    config = transformers_config("deepseek_v3").to_dict() | {"index_n_heads": 4}
    with pytest.raises(InputError, match="index_n_heads: set but index_topk is not"):
        spec_from_hf_config(config)


def test_tiny_checkpoint_loads_in_transformers_and_matches_the_reference(tmp_path):
    """onboard's tiny checkpoint of the family has exactly the tensors
    transformers' DeepseekV32ForCausalLM has, and the reference gives its
    logits on it."""
    from transformers import AutoModelForCausalLM

    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.reference import install_reference

    spec = dsa_spec()
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0, dtype="float32")
    theirs, info = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, output_loading_info=True
    )
    assert type(theirs).__name__ == "DeepseekV32ForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    install_reference(spec, ckpt)
    ours = AutoModelForCausalLM.from_pretrained(
        ckpt, trust_remote_code=True, dtype=torch.float32
    )
    assert type(ours).__module__.startswith("transformers_modules.")
    ids = torch.randint(0, spec.vocab_size, (2, 20), generator=torch.Generator())
    with torch.no_grad():
        want, got = theirs.eval()(ids).logits, ours.eval()(ids).logits
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-4


def _saved(tmp_path, model_type: str = "deepseek_v32"):
    """transformers' own tiny model of the family, saved in bfloat16."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = transformers_config(model_type)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    return spec_from_hf_config(json.loads((tmp_path / "config.json").read_text()))


def test_preflight_knows_the_indexer_tensors(tmp_path):
    """A checkpoint transformers saved has every indexer tensor at the shape
    preflight expects; weights_proj in float32 beside bfloat16 weights is by
    design (transformers keeps it so), another tensor in float32 is not; a
    transposed wq_b is named."""
    from safetensors.torch import load_file, save_file

    from onboard.checkpoint.preflight import preflight

    spec = _saved(tmp_path)
    errors = [p for p in preflight(spec, tmp_path).problems if p.severity == "error"]
    assert not errors, errors
    shard = next(tmp_path.glob("*.safetensors"))
    tensors = load_file(shard)
    layer = "model.layers.0.self_attn.indexer"
    tensors[f"{layer}.weights_proj.weight"] = tensors[
        f"{layer}.weights_proj.weight"
    ].float()
    tensors[f"{layer}.wk.weight"] = tensors[f"{layer}.wk.weight"].float()
    tensors[f"{layer}.wq_b.weight"] = tensors[f"{layer}.wq_b.weight"].T.contiguous()
    save_file(tensors, shard, metadata={"format": "pt"})
    problems = preflight(spec, tmp_path).problems
    mixed = [str(p) for p in problems if p.kind == "dtype"]
    assert any("wk" in p for p in mixed) and not any("weights_proj" in p for p in mixed)
    errors = [str(p) for p in problems if p.severity == "error"]
    assert any("wq_b" in p for p in errors), errors


def test_quantize_keeps_the_indexer_in_16_bits(tmp_path):
    """NVFP4 quantizes MLA's projections; the indexer's wq_b, wk, weights_proj
    and k_norm stay 16-bit, its Linear layers on the ignore list."""
    from onboard.quantize.plan import make_plan
    from onboard.quantize.schemes import get_scheme

    spec = _saved(tmp_path)
    plan = make_plan(tmp_path, spec, get_scheme("nvfp4"))
    attn = "model.layers.0.self_attn"
    assert f"{attn}.q_b_proj.weight" in plan.quantized
    for name in ("wq_b", "wk", "weights_proj", "k_norm"):
        assert f"{attn}.indexer.{name}.weight" in plan.kept
    for name in ("wq_b", "wk", "weights_proj"):
        assert f"{attn}.indexer.{name}" in plan.ignore


def test_the_vllm_model_is_refused_with_the_reason(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(dump_spec(dsa_spec()))
    result = run_cli("generate", path, "-o", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert "attention.indexer: the vLLM model is not generated for sparse MLA" in (
        result.stderr + result.stdout
    )


def test_kv_plan_counts_the_index_keys():
    """vLLM's indexer cache holds each token's index key in FP8 with a float32
    scale per 128 dims beside MLA's latent: DeepSeek-V3.2's 128-dim key adds
    132 bytes to the 576 latent entries."""
    from onboard.plan.kv import kv_report

    config = transformers_config("deepseek_v32", index_head_dim=128).to_dict()
    report = kv_report(spec_from_hf_config(config), dtype="bfloat16")
    assert {layer.bytes_per_token for layer in report.layers} == {576 * 2 + 132}


def test_glm_shared_indexer_layers_are_read_and_proven():
    """GLM's indexer_types: a shared layer has no indexer tensors and reuses the
    nearest earlier full layer's top-k. The spec reads and writes them back, the
    shrunk spec keeps both kinds of layer, and the proof passes."""
    from onboard.reference.prove import RTOL, prove_spec
    from onboard.spec.hf import hf_config_from_spec
    from onboard.spec.shrink import shrink_spec

    kinds = ["full", "shared", "full", "shared"]
    config = transformers_config("glm_moe_dsa", indexer_types=kinds).to_dict()
    spec = spec_from_hf_config(config)
    assert spec.attention.indexer.shared_layers == [1, 3]
    assert hf_config_from_spec(spec)["indexer_types"] == kinds
    assert shrink_spec(spec).attention.indexer.shared_layers
    assert prove_spec(spec, config).max_rel_diff < RTOL
