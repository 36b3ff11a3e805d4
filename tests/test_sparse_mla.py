"""Sparse MLA (attention.indexer: DeepSeek-V3.2, GLM-5) beyond the reference's
parity tests in tests/test_reference.py: the rules, the config mapping's
refusals, the tiny checkpoint against transformers' own class, preflight's
shapes, quantization keeping the indexer in 16 bits, the generated vLLM model
and its indexer module against the reference's beyond the top-k.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_spec_hf import transformers_config

from onboard.errors import InputError
from onboard.spec.hf import spec_from_hf_config
from onboard.spec.model import ModelSpec
from onboard.spec.rules import check_rules

pytestmark = pytest.mark.usefixtures("one_thread")


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
        (
            dict(kv_sharing={"2": 1}, indexer__shared_layers=[3]),
            "shared indexer layers beside cross-layer KV sharing",
        ),
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
    from onboard.quantize.schemes import get_scheme
    from onboard.quantize.selection import make_selection

    spec = _saved(tmp_path)
    plan = make_selection(tmp_path, spec, get_scheme("nvfp4"))
    attn = "model.layers.0.self_attn"
    assert f"{attn}.q_b_proj.weight" in plan.quantized
    for name in ("wq_b", "wk", "weights_proj", "k_norm"):
        assert f"{attn}.indexer.{name}.weight" in plan.kept
    for name in ("wq_b", "wk", "weights_proj"):
        assert f"{attn}.indexer.{name}" in plan.ignore


def test_the_vllm_model_selects_vllms_sparse_mla(tmp_path):
    """The generated model builds vLLM's sparse MLA where the config has an
    index top-k (its indexer op, FP8 index-key cache, top-k buffer) and dense MLA
    without one; wk and weights_proj load into one GEMM; a GLM shared layer skips
    the top-k."""
    from onboard.generate import generate_files

    source = generate_files(dsa_spec())[
        "plugin/onboard_plugin_deepseek_v32/deepseek_v32.py"
    ]
    for needle in (
        "class DeepseekV32Indexer(nn.Module):",
        "SparseAttnIndexer(",
        "DeepseekV32IndexerCache(",
        "self.is_sparse = bool(config.index_topk)",
        "is_sparse=self.is_sparse,",
        "topk_indices_buffer=topk_indices_buffer,",
        '".indexer.wk.": (".indexer.wk_weights_proj.", 0),',
        '".indexer.weights_proj.": (".indexer.wk_weights_proj.", 1),',
        "is_neox_style=True,",  # DeepSeek-V3.2's index rope: NeoX halves
    ):
        assert needle in source, needle
    assert "skip_topk" not in source
    kinds = ["full", "shared", "full", "shared"]
    glm = spec_from_hf_config(
        transformers_config("glm_moe_dsa", indexer_types=kinds).to_dict()
    )
    source = next(
        text
        for name, text in generate_files(glm).items()
        if name.endswith("/glm_moe_dsa.py")
    )
    assert "skip_topk=skip_topk," in source
    assert 'index_types[layer_idx] == "shared"' in source
    # GLM's latent norms keep their 1e-6 beside rms_norm_eps 1e-5 (its config has
    # no key for it).
    assert glm.norm.eps == 1e-5 and "        eps = 1e-06\n" in source


@pytest.fixture(scope="module")
def indexer_sides(tmp_path_factory):
    """Per family: the spec, the generated reference on its tiny checkpoint, and
    the generated vLLM model file, imported."""
    from transformers import AutoModelForCausalLM

    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.generate import generate_files
    from onboard.reference import install_reference
    from onboard.validate.check_indexer import import_generated

    built = {}

    def build(name: str):
        if name in built:
            return built[name]
        kinds = ["full", "shared", "full", "shared"] if name == "glm_shared" else None
        model_type = "deepseek_v32" if name == "deepseek_v32" else "glm_moe_dsa"
        extra = {"indexer_types": kinds} if kinds else {}
        spec = spec_from_hf_config(transformers_config(model_type, **extra).to_dict())
        root = tmp_path_factory.mktemp(name)
        ckpt = root / "ckpt"
        write_tiny_checkpoint(spec, ckpt, seed=0, dtype="float32")
        install_reference(spec, ckpt)
        ref = AutoModelForCausalLM.from_pretrained(
            ckpt, trust_remote_code=True, dtype=torch.float32
        ).eval()
        for path, text in generate_files(spec).items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        package = next((root / "plugin").glob("onboard_plugin_*"))
        built[name] = (spec, ref, import_generated(package, spec))
        return built[name]

    return build


@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa", "glm_shared"])
def test_generated_indexer_matches_the_reference_beyond_top_k(indexer_sides, family):
    """The generated vLLM indexer module, loaded through the model's own weight
    mapping, on three times the top-k tokens: the reference's index scores, the
    same top-k set for every query, the same sparse attention over it; the sparse
    choice matters there (dense attention differs)."""
    from onboard.validate.check_indexer import RTOL, indexer_parity

    spec, ref, module = indexer_sides(family)
    result = indexer_parity(spec, ref, module)
    assert result["passed"], result["details"]
    assert result["context_tokens"] > result["index_topk"]
    assert result["score_max_rel_diff"] < RTOL
    assert result["topk_set_mismatches"] == 0 and result["queries_compared"] > 0
    assert result["sparse_vs_dense_rel_diff"] > 1e-2


@pytest.mark.parametrize(
    "tensor", ["wk.weight", "weights_proj.weight", "wq_b.weight", "k_norm.bias"]
)
def test_a_corrupted_indexer_tensor_fails_the_check(indexer_sides, tensor):
    """Noise on one of the generated side's indexer tensors moves the index scores
    past the tolerance and changes the top-k sets."""
    from onboard.validate.check_indexer import RTOL, indexer_parity

    spec, ref, module = indexer_sides("deepseek_v32")
    where = "model.layers.0.self_attn.indexer"
    own = ref.model.layers[0].self_attn.indexer.state_dict()
    tensors = {f"{where}.{k}": v.clone() for k, v in own.items()}
    weight = tensors[f"{where}.{tensor}"]
    noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(1))
    tensors[f"{where}.{tensor}"] = weight + noise * weight.std() * 0.5
    result = indexer_parity(spec, ref, module, tensors=tensors)
    assert not result["passed"], result["details"]
    assert result["score_max_rel_diff"] > 10 * RTOL


def test_cpu_validation_runs_dense_equivalent_within_the_top_k():
    """The CPU engine runs the model without its index_topk (dense MLA) on
    prompts cut so that prompt plus generated tokens stay within the top-k."""
    from onboard.validate.harness import dense_equivalent

    prompts = [list(range(30)), [1, 2, 3]]
    cut, new, note, extra, path = dense_equivalent(
        {"index_topk": 8}, prompts, 32, "tokenizer"
    )
    assert new == 4 and [len(p) for p in cut] == [4, 3]
    assert all(len(p) + new <= 8 for p in cut)
    assert extra == {"hf_overrides": {"index_topk": 0}}
    assert path == {"path": "dense-equivalent", "context_bound": 8}
    assert "dense-equivalent" in note


def test_kv_plan_counts_the_index_keys():
    """vLLM's indexer cache holds each token's index key in FP8 with a float32
    scale per 128 dims beside MLA's latent: DeepSeek-V3.2's 128-dim key adds
    132 bytes to the 576 latent entries."""
    from onboard.serving.kv import kv_report

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


def test_gpu_run_exercises_the_sparse_path(tmp_path):
    """The emitted b200 run of the bundled sparse-MLA spec asks for prompts past
    its top-k, and the thresholds make ingest fail a run whose prompts never
    left it."""
    from pathlib import Path

    from onboard.runtime.prompts import PROMPTS
    from onboard.validate.emit import emit, sparse_prompts

    spec_path = Path(__file__).parents[1] / "model_specs" / "glm-5-style.yaml"
    manifest = emit("glm-5-style/GLM-5-Style", spec_path, "b200", tmp_path / "run")
    thresholds = json.loads((tmp_path / "run" / "thresholds.json").read_text())
    assert thresholds["accuracy"]["index_topk"] == 2048
    assert thresholds["accuracy"]["min_prompt_tokens"] == 2049
    assert manifest["max_prompt_tokens"] > 2049
    long = manifest["prompts"][: len(manifest["prompts"]) - len(PROMPTS)]
    # About 8 characters per wanted token: far more tokens than the top-k.
    assert len(long) == 4 and all(len(text) >= 8 * 2049 for text in long)
    assert sparse_prompts(PROMPTS, 10)[4:] == list(PROMPTS)


def test_ingest_fails_a_gpu_run_that_stayed_within_the_top_k(tmp_path):
    from onboard.validate.ingest import _accuracy

    # Engine and reference agree exactly on a 3-token prompt.
    prompt = {
        "prompt_token_ids": [1, 2, 3],
        "prompt_logprobs": [None, {"2": -1.0}, {"3": -1.0}],
        "token_ids": [4],
        "top_logprobs": [{"4": -0.5}],
    }
    reference = {
        "prompt_token_ids": [1, 2, 3],
        "prompt_rows": [None, {"tokens": {"2": -1.0}}, {"tokens": {"3": -1.0}}],
        "token_ids": [4],
        "top_logprobs": [{"4": -0.5}],
    }
    (tmp_path / "vllm_accuracy.json").write_text(json.dumps({"prompts": [prompt]}))
    (tmp_path / "reference_accuracy.json").write_text(
        json.dumps({"prompts": [reference]})
    )
    from onboard.validate.emit import ACCURACY_THRESHOLDS

    limits = {**ACCURACY_THRESHOLDS, "index_topk": 8, "min_prompt_tokens": 9}
    check, _ = _accuracy(tmp_path, {"accuracy": limits})
    assert check.status == "failed" and check.metrics["longest_prompt_tokens"] == 3
    assert "the sparse attention path was not exercised" in check.details
    limits = {**limits, "index_topk": 2, "min_prompt_tokens": 3}
    check, _ = _accuracy(tmp_path, {"accuracy": limits})
    assert check.status == "passed", check.details


def test_kv_sharing_layers_keep_an_indexer_of_their_own(tmp_path):
    """Mistral-Large-4-style: a layer reading another layer's latent still picks
    its own top-k. The reference decoding token by token (a sharing layer's
    cache entry holds its index keys alone) gives the logits of one whole
    forward on a context past the top-k, where the choice matters; the plan
    counts the sharing layers' index keys, and the vLLM model builds their
    indexers."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.generate import generate_files
    from onboard.reference import install_reference
    from onboard.serving.kv import kv_report
    from onboard.spec import load_spec

    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root / "model_specs/mistral-large-4-style.yaml")
    report = kv_report(spec, dtype="bfloat16")
    shared = [x for x in report.layers if x.shares is not None]
    assert len(shared) == 16 and {x.kind for x in shared} == {"indexer"}
    assert report.bytes_per_token == 48 * (576 * 2 + 132) + 16 * 132

    ckpt = write_tiny_checkpoint(spec, tmp_path / "ckpt", dtype="float32")
    tiny = load_spec(ckpt / "spec.yaml")
    assert tiny.attention.kv_sharing and tiny.attention.indexer is not None
    install_reference(tiny, ckpt)
    model = AutoModelForCausalLM.from_pretrained(
        ckpt, trust_remote_code=True, dtype=torch.float32
    ).eval()
    topk = model.config.index_topk
    ids = torch.randint(
        0, tiny.vocab_size, (1, 2 * topk + 8), generator=torch.Generator()
    )
    with torch.no_grad():
        whole = model(ids).logits[0]
        out = model(ids[:, :topk], use_cache=True)
        steps = [out.logits[0, -1]]
        cache = out.past_key_values
        for t in range(topk, ids.shape[1] - 1):
            out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[0, -1])
        indexers = [m for m in model.modules() if type(m).__name__ == "Indexer"]
        assert len(indexers) == tiny.num_hidden_layers  # sharing layers' too
        for indexer in indexers:
            indexer.topk = ids.shape[1]  # every token: dense MLA
        dense = model(ids).logits[0]
    scale = whole.abs().max()
    stepped = torch.stack(steps)
    assert ((stepped - whole[topk - 1 : -1]).abs().max() / scale).item() < 1e-4
    assert ((dense - whole)[2 * topk :].abs().max() / scale).item() > 1e-2

    source = next(
        text
        for name, text in generate_files(spec).items()
        if name.endswith("/mistral_large_4_style.py") and "plugin/" in name
    )
    sharing = source[source.index("kv_sharing_target_layer_name=kv_sharing") :]
    for needle in ("use_sparse=self.is_sparse,", "indexer=self.indexer,"):
        assert needle in sharing, needle
    assert "self.indexer(hidden_states, q_c, positions" in source
