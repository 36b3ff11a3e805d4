"""Checkpoint preflight: headers and config.json against the spec, no weights read.

Real checkpoints throughout: tiny checkpoints written by onboard for the bundled
specs, checkpoints written by transformers' own save_pretrained, compressed-tensors
checkpoints written by `onboard quantize`, and header-only checkpoints at
DeepSeek-V3's full size (1.4 TB declared, sparse files on disk). Each broken copy
must be caught with the fix named, through the CLI too.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from safetensors import safe_open

from onboard.checkpoint.preflight import (
    DTYPE_BITS,
    HeaderError,
    PreflightReport,
    preflight,
    read_header,
)
from onboard.checkpoint.preflight_ct import CTGroup, QArgs, ct_tensors, qparam_shapes
from onboard.checkpoint.tiny import INDEX_FILE, plan_tensors, write_tiny_checkpoint
from onboard.errors import InputError
from onboard.spec import ModelSpec, load_spec
from onboard.spec.hf import hf_config_from_spec, spec_from_hf_config_file

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "model_specs"
BUNDLED = ["dense-gqa", "deepseek-v3-style", "novel-launch", "gpt-oss-style"]
DS = "deepseek-v3-style"

sys.path.insert(0, str(Path(__file__).parent))
from hf_tiny import FAMILIES, write_hf_checkpoint  # noqa: E402

# ---- helpers: real safetensors files, edited --------------------------------------

Tensors = dict[str, tuple[str, list[int], bytes]]


def load_raw(path: Path) -> Tensors:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {
        k: (
            v["dtype"],
            v["shape"],
            data[base + v["data_offsets"][0] : base + v["data_offsets"][1]],
        )
        for k, v in header.items()
    }


def save_raw(path: Path, tensors: Tensors) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset, blobs = 0, []
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        assert len(data) * 8 == math.prod(shape) * DTYPE_BITS[dtype], name
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))
    with safe_open(path, framework="numpy") as f:  # the real library accepts it
        assert set(f.keys()) == set(tensors)


def zeros(dtype: str, shape: list[int]) -> tuple[str, list[int], bytes]:
    return dtype, shape, bytes(math.prod(shape) * DTYPE_BITS[dtype] // 8)


def edit_shards(ckpt: Path, fn: Callable[[Tensors], Tensors]) -> None:
    """Apply ``fn`` to every shard and rewrite the index to match."""
    weight_map = {}
    for path in sorted(ckpt.glob("*.safetensors")):
        tensors = fn(load_raw(path))
        save_raw(path, tensors)
        weight_map.update(dict.fromkeys(tensors, path.name))
    index = json.loads((ckpt / INDEX_FILE).read_text())
    index["weight_map"] = dict(sorted(weight_map.items()))
    (ckpt / INDEX_FILE).write_text(json.dumps(index))


def edit_config(ckpt: Path, fn: Callable[[dict], None]) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    fn(config)
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))


def spec_of(ckpt: Path) -> ModelSpec:
    return load_spec(ckpt / "spec.yaml")


def one(report: PreflightReport, kind: str):
    found = report.by_kind(kind)
    assert len(found) == 1, (kind, report.lines())
    return found[0]


def errors_of(report: PreflightReport) -> set[str]:
    return {p.kind for p in report.errors}


# ---- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        n: write_tiny_checkpoint(load_spec(SPECS / f"{n}.yaml"), root / n)
        for n in BUNDLED
    }


@pytest.fixture
def broken(tiny, tmp_path) -> Callable[[str], Path]:
    """A fresh copy of a bundled tiny checkpoint, to break."""

    def copy(name: str = DS) -> Path:
        dst = tmp_path / f"{name}-broken"
        shutil.copytree(tiny[name], dst)
        return dst

    return copy


# ---- passing checkpoints ----------------------------------------------------------


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_tiny_checkpoints_pass(tiny, name: str) -> None:
    spec = spec_of(tiny[name])
    report = preflight(spec, tiny[name])
    assert report.ok and report.problems == [], report.lines()
    assert report.tensors == len(plan_tensors(spec)) and report.shards == 2
    assert report.check_seconds < 2.0, report.timings
    assert report.lines()[-1].endswith("matches the spec")


@pytest.fixture(scope="module")
def hf_written(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {f: write_hf_checkpoint(f, root / f) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_written_checkpoints_pass(hf_written, family: str) -> None:
    """save_pretrained's own files, with the spec `spec from-hf` infers."""
    ckpt = hf_written[family]
    report = preflight(spec_from_hf_config_file(ckpt), ckpt)
    assert report.ok, report.lines()
    if family == "deepseek_v3":
        # transformers has no MTP modules: save_pretrained drops the MTP layer the
        # config announces. The main model loads; MTP drafting could not.
        warning = one(report, "missing-mtp")
        assert warning.severity == "warning" and "set mtp: null" in warning.fix
        assert all(t.startswith("model.layers.3.") for t in warning.tensors)
        assert len(report.problems) == 1
    else:
        assert report.problems == [], report.lines()


def test_sinks_and_stacked_experts_shapes_name_their_spec_fields(
    hf_written, tmp_path
) -> None:
    """gpt-oss's attention sinks [heads] and stacked experts [experts, hidden,
    2 x width] / [experts, width, hidden] with their biases: a shape that differs
    names the spec field behind each dimension; a tensor the spec lacks names the
    field that adds it."""
    ckpt = tmp_path / "oss"
    shutil.copytree(hf_written["gpt_oss"], ckpt)
    spec = spec_from_hf_config_file(ckpt)

    shard = ckpt / "model.safetensors"  # save_pretrained's one shard
    tensors = load_raw(shard)
    name = "model.layers.0.self_attn.sinks"
    tensors[name] = zeros(tensors[name][0], [2])
    save_raw(shard, tensors)
    report = preflight(spec, ckpt)
    sinks = one(report, "shape")
    assert sinks.spec_fields == ("attention.num_heads",)
    assert "dim 0 is 2, but attention.num_heads = 4" in sinks.message

    data = spec.model_dump(mode="json")
    data["mlp"]["moe"]["expert_intermediate_size"] = 48
    data["attention"]["sinks"] = False
    report = preflight(ModelSpec.model_validate(data), hf_written["gpt_oss"])
    wrong = {
        p.where.split(" ")[0].rsplit(".", 1)[1]: p for p in report.by_kind("shape")
    }
    assert sorted(wrong) == ["down_proj", "gate_up_proj", "gate_up_proj_bias"]
    assert "2 × mlp.moe.expert_intermediate_size = 96" in wrong["gate_up_proj"].message
    assert wrong["down_proj"].spec_fields == ("mlp.moe.expert_intermediate_size",)
    unexpected = one(report, "unexpected-tensor")
    assert unexpected.fix == "set attention.sinks: true in the spec"


def test_transformers_deepseek_without_topk_method(hf_written, tmp_path) -> None:
    """docs/vllm-cpu-notes.md: transformers 5 writes no topk_method. The generated
    model serves the checkpoint as transformers does (a note says what vLLM's
    in-tree model needs); the in-tree model builds no e_score_correction_bias and
    fails to load with a KeyError."""
    ckpt = tmp_path / "ds"
    shutil.copytree(hf_written["deepseek_v3"], ckpt)
    edit_config(ckpt, lambda c: c.pop("topk_method"))
    spec = spec_from_hf_config_file(hf_written["deepseek_v3"])
    report = preflight(spec, ckpt)
    assert report.ok, report.lines()
    note = one(report, "config")
    assert note.severity == "note" and note.where == "topk_method"
    assert "in-tree" in note.message and '"topk_method": "noaux_tc"' in note.fix
    report = preflight(spec, ckpt, in_tree=True)
    problem = one(report, "config")
    assert problem.severity == "error"
    assert problem.where == "topk_method" and problem.config_keys == ("topk_method",)
    assert '"topk_method": "noaux_tc"' in problem.fix and "KeyError" in problem.message
    assert problem.spec_fields == ("mlp.moe.router.bias_correction",)


def _deepseek_as_transformers_writes_it(model_type: str, out: Path) -> Path:
    """A tiny DeepSeek checkpoint exactly as save_pretrained writes it (DeepSeek-V2:
    greedy routing, n_group and topk_group null; neither family writes
    scoring_func, V3 no topk_method), with the config class's defaults."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=2,
        first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=64,
        qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    return out


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3"])
def test_a_transformers_written_deepseek_checkpoint_passes(model_type, tmp_path):
    """The rule: a checkpoint exactly as transformers saves it passes preflight
    whenever transformers computes the spec's model from it. The keys only vLLM's
    in-tree model reads are notes for the generated model, errors for the in-tree
    one (which reads getattr(config, "n_group", 1) as None, routes by softmax
    without scoring_func, and builds no bias without topk_method)."""
    ckpt = _deepseek_as_transformers_writes_it(model_type, tmp_path / model_type)
    config = json.loads((ckpt / "config.json").read_text())
    unset = {"scoring_func"} | (
        {"n_group", "topk_group"} if model_type == "deepseek_v2" else {"topk_method"}
    )
    assert not {k for k in unset if config.get(k) is not None}
    spec = spec_from_hf_config_file(ckpt)
    report = preflight(spec, ckpt)
    assert report.ok, report.lines()
    notes = {p.where for p in report.by_kind("config")}
    assert notes == unset and all(
        p.severity == "note" for p in report.by_kind("config")
    )
    in_tree = preflight(spec, ckpt, in_tree=True)
    assert {p.where for p in in_tree.errors} == unset, in_tree.lines()


@pytest.mark.parametrize("absent", ["removed", "null"])
def test_an_absent_head_dim_means_the_width_over_the_heads(
    hf_written, tmp_path, absent
) -> None:
    """Qwen2 and Qwen-MoE config classes have no head_dim, Mixtral's writes null:
    transformers and vLLM then take hidden_size / num_attention_heads. (Qwen3's
    class has a default, 128, which an absent key means instead.)"""
    ckpt = tmp_path / "qwen3_moe"  # Qwen3MoeConfig declares no head_dim
    shutil.copytree(hf_written["qwen3_moe"], ckpt)
    spec = spec_from_hf_config_file(ckpt)
    assert spec.head_dim * spec.attention.num_heads == spec.hidden_size

    def drop(config: dict) -> None:
        if absent == "removed":
            config.pop("head_dim")
        else:
            config["head_dim"] = None

    edit_config(ckpt, drop)
    report = preflight(spec, ckpt)
    assert report.ok and report.problems == [], report.lines()
    # Where the width does not give the spec's head_dim, it is still required.
    wide = spec.model_copy(
        update={"attention": spec.attention.model_copy(update={"head_dim": 16})}
    )
    problem = one(preflight(wide, ckpt), "config")
    assert problem.where == "head_dim" and "the spec needs 16" in problem.message


def test_a_q_k_norm_of_the_other_scope_names_the_scope(tmp_path) -> None:
    """OLMoE's q/k norms span the whole projection: a spec that says per head is
    told to change qk_norm_scope, not its head sizes."""
    import transformers

    from onboard.reference.infer import infer_spec

    config = transformers.OlmoeConfig(
        vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=4,
        num_experts_per_tok=2, max_position_embeddings=256,
    )  # fmt: skip
    spec, _ = infer_spec(config.to_dict())
    assert spec.attention.qk_norm_scope == "projection"
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path / "olmoe")
    assert preflight(spec, tmp_path / "olmoe").problems == []
    per_head = spec.model_copy(
        update={
            "attention": spec.attention.model_copy(update={"qk_norm_scope": "head"})
        }
    )
    report = preflight(per_head, tmp_path / "olmoe")
    assert {p.where.split(" ")[0] for p in report.problems} == {
        f"model.layers.{{layer}}.self_attn.{n}_norm.weight" for n in "qk"
    }
    for problem in report.problems:
        assert problem.fix == "set attention.qk_norm_scope: projection in the spec"
        assert "over all heads of the projection" in problem.message


def test_max_window_layers_means_nothing_with_the_window_off(tmp_path) -> None:
    """A published Qwen2.5-7B config (dims shrunk): use_sliding_window false
    beside max_window_layers 28 of 28 layers; here 2 of 4, not the class default."""
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        use_sliding_window=False, sliding_window=4096, max_window_layers=2,
    )  # fmt: skip
    ckpt = tmp_path / "qwen2"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(ckpt)
    spec = spec_from_hf_config_file(ckpt)
    assert spec.attention.sliding_window is None
    report = preflight(spec, ckpt)
    assert report.ok and report.problems == [], report.lines()


def test_a_post_norm_checkpoint_is_not_renamed_into_a_pre_norm_spec(tmp_path) -> None:
    """OLMo-2's blocks normalise outputs: its post_feedforward_layernorm is not
    the pre-norm spec's input norm under another name (that rename would load the
    weights into the wrong place); the fix is the norm placement."""
    import transformers

    config = transformers.Olmo2Config(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    ckpt = tmp_path / "olmo2"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(ckpt)
    from onboard.reference.infer import infer_spec

    spec, _ = infer_spec(config.to_dict())
    assert spec.norm.placement == "post"
    assert preflight(spec, ckpt).problems == []
    pre = spec.model_copy(
        update={"norm": spec.norm.model_copy(update={"placement": "pre"})}
    )
    report = preflight(pre, ckpt)
    assert not report.by_kind("renamed-tensor"), report.lines()
    problem = one(report, "unexpected-tensor")
    assert "post_feedforward_layernorm" in problem.where
    assert problem.fix.endswith("set norm.placement: post in the spec")
    assert problem.spec_fields == ("norm.placement",)


def test_a_gemma2_checkpoint_passes_and_names_its_sandwich_norms(tmp_path) -> None:
    """Gemma-2's four norms per layer (sandwich) and its zero-centred norm weights
    pass preflight; against a post-norm spec its input norms are unexpected, and
    the fix is the placement that has them."""
    import transformers

    from onboard.spec.hf import spec_from_hf_config

    config = transformers.Gemma2Config(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, sliding_window=8,
    )  # fmt: skip
    ckpt = tmp_path / "gemma2"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(ckpt)
    spec = spec_from_hf_config(config.to_dict())
    assert spec.norm.placement == "sandwich"
    assert preflight(spec, ckpt).problems == []
    post = spec.model_copy(
        update={"norm": spec.norm.model_copy(update={"placement": "post"})}
    )
    report = preflight(post, ckpt)
    assert not report.by_kind("renamed-tensor"), report.lines()
    fixes = {p.fix for p in report.by_kind("unexpected-tensor")}
    assert any(f.endswith("set norm.placement: sandwich in the spec") for f in fixes)


def test_the_rope_of_a_layer_kind_the_model_lacks_is_not_compared(tmp_path) -> None:
    """Mellum / OLMo-3 configs key rope_parameters by layer type even when every
    layer attends fully: the sliding layers' entry is never read, and the spec
    (which has no rope.sliding then) writes it as the full layers'."""
    import transformers

    from onboard.reference.infer import infer_spec

    config = transformers.Olmo3Config(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        layer_types=["full_attention"] * 2, pad_token_id=0, eos_token_id=2,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "default", "rope_theta": 5e5},
        },
    )  # fmt: skip
    ckpt = tmp_path / "olmo3"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(ckpt)
    spec, _ = infer_spec(config.to_dict())
    assert spec.rope.sliding is None and spec.rope.theta == 5e5
    assert preflight(spec, ckpt).problems == []
    # The full layers' entry is compared.
    other = spec.model_copy(
        update={"rope": spec.rope.model_copy(update={"theta": 1e6})}
    )
    problem = one(preflight(other, ckpt), "config")
    assert problem.where == "rope_parameters.full_attention"


# ---- broken copies: each caught with its fix -----------------------------------------


def test_missing_router_bias(broken) -> None:
    ckpt = broken()
    edit_shards(
        ckpt,
        lambda t: {
            k: v for k, v in t.items() if not k.endswith("e_score_correction_bias")
        },
    )
    report = preflight(spec_of(ckpt), ckpt)
    problem = one(report, "missing-tensor")
    assert problem.where.startswith(
        "model.layers.{layer}.mlp.gate.e_score_correction_bias"
    )
    assert problem.tensors == (
        "model.layers.1.mlp.gate.e_score_correction_bias",
        "model.layers.2.mlp.gate.e_score_correction_bias",
    )
    assert "bias_correction: false" in problem.fix
    assert problem.spec_fields == ("mlp.moe.router.bias_correction",)
    assert errors_of(report) == {"missing-tensor"}


@pytest.mark.parametrize(
    ("variant_name", "module", "shape"),
    [
        ("var-bias-block", "model.layers.{layer}.block_sparse_moe", [8]),
        ("var-bias-2d", "model.layers.{layer}.mlp.moe_statics", [1, 8]),
    ],
)
def test_a_router_bias_at_its_own_module(variant_name, module, shape, tmp_path):
    """The tiny writer stores the bias where (and as) the spec says; a spec that
    puts it on the router gets the override, shape storage included, checked."""
    from generate_variants import variant

    ckpt = write_tiny_checkpoint(variant(variant_name), tmp_path / "ckpt")
    spec = spec_of(ckpt)
    layer = 1  # MoE in both variants
    name = f"{module.format(layer=layer)}.e_score_correction_bias"
    with safe_open(str(ckpt / _shard_of(ckpt, name)), "pt") as f:
        assert f.get_slice(name).get_shape() == shape
    assert preflight(spec, ckpt).ok
    data = spec.model_dump(mode="json")
    data["checkpoint"].update(tensor_names={}, router_bias_2d=False)
    problem = one(preflight(ModelSpec.model_validate(data), ckpt), "renamed-tensor")
    assert f"role 'router_bias' as '{module}'" in problem.message
    assert "checked: with the override" in problem.message
    assert f"router_bias: '{module}'" in problem.fix
    assert ("router_bias_2d: true" in problem.fix) == (len(shape) == 2)
    data = spec.model_dump(mode="json")
    data["checkpoint"]["router_bias_2d"] = len(shape) == 1
    problem = one(preflight(ModelSpec.model_validate(data), ckpt), "shape")
    assert problem.spec_fields == ("checkpoint.router_bias_2d",)
    assert problem.fix == (
        f"set checkpoint.router_bias_2d: {str(len(shape) == 2).lower()} in the spec"
    )


def _shard_of(ckpt: Path, name: str) -> str:
    return json.loads((ckpt / INDEX_FILE).read_text())["weight_map"][name]


def test_kv_sharing_layers_may_omit_their_own_kv(broken) -> None:
    """A KV-sharing layer reads an earlier layer's cache: its own K/V projections
    and k-norm are never run, so a checkpoint without them passes; a layer that
    computes K/V still needs them."""
    ckpt = broken("novel-launch")
    spec = spec_of(ckpt)
    sharing = "|".join(str(i) for i in sorted(spec.attention.kv_sharing))
    unused = re.compile(
        rf"model\.layers\.({sharing})\.self_attn\.(k_proj|v_proj|k_norm)\."
    )
    dropped: list[str] = []

    def drop_unused(tensors: Tensors) -> Tensors:
        dropped.extend(k for k in tensors if unused.match(k))
        return {k: v for k, v in tensors.items() if not unused.match(k)}

    edit_shards(ckpt, drop_unused)
    assert len(dropped) == 3 * len(spec.attention.kv_sharing)
    report = preflight(spec, ckpt)
    assert report.ok and report.problems == [], report.lines()

    target = spec.attention.kv_sharing[min(spec.attention.kv_sharing)]
    name = f"model.layers.{target}.self_attn.k_proj.weight"
    edit_shards(ckpt, lambda t: {k: v for k, v in t.items() if k != name})
    problem = one(preflight(spec, ckpt), "missing-tensor")
    assert problem.tensors == (name,)


def test_mla_latent_size(broken) -> None:
    """kv_a_proj_with_mqa rows != kv_lora_rank + qk_rope_head_dim."""
    ckpt = broken()

    def shrink_kv_a(t: Tensors) -> Tensors:
        return {
            k: zeros(v[0], [320, v[1][1]])
            if k.endswith("kv_a_proj_with_mqa.weight")
            else v
            for k, v in t.items()
        }

    edit_shards(ckpt, shrink_kv_a)
    report = preflight(spec_of(ckpt), ckpt)
    problem = one(report, "mla-latent")
    assert "320 rows" in problem.message and "512 + 64 = 576" in problem.message
    assert "kv_lora_rank" in problem.fix and len(problem.tensors) == 3
    assert set(problem.spec_fields) == {
        "attention.mla.kv_lora_rank",
        "attention.mla.qk_rope_head_dim",
    }
    # The spec targets cpu: the CPU MLA kernel's 576 constraint is named too.
    cpu = one(report, "cpu-mla")
    assert cpu.severity == "warning" and "576" in cpu.message
    assert errors_of(report) == {"mla-latent"}


def test_mla_smaller_latent_is_explained_field_by_field(broken) -> None:
    """A checkpoint made with kv_lora_rank 256: the fix names the value."""
    ckpt = broken()

    def rank_256(t: Tensors) -> Tensors:
        out = {}
        for k, (dtype, shape, data) in t.items():
            if k.endswith("kv_a_proj_with_mqa.weight"):
                shape = [256 + 64, shape[1]]
            elif k.endswith("kv_a_layernorm.weight"):
                shape = [256]
            elif k.endswith("kv_b_proj.weight"):
                shape = [shape[0], 256]
            out[k] = zeros(dtype, shape) if shape != t[k][1] else (dtype, shape, data)
        return out

    edit_shards(ckpt, rank_256)
    report = preflight(spec_of(ckpt), ckpt)
    latent = one(report, "mla-latent")
    assert "kv_lora_rank: 256 and qk_rope_head_dim: 64" in latent.fix
    shapes = report.by_kind("shape")
    assert {p.where.split(" ")[0].rsplit(".", 2)[-2] for p in shapes} == {
        "kv_a_layernorm",
        "kv_b_proj",
    }
    assert all("implies attention.mla.kv_lora_rank: 256" in p.message for p in shapes)


def test_renamed_router_gets_the_override_and_the_override_works(broken) -> None:
    ckpt = broken()
    edit_shards(
        ckpt,
        lambda t: {k.replace(".mlp.gate.", ".mlp.router."): v for k, v in t.items()},
    )
    spec = spec_of(ckpt)
    report = preflight(spec, ckpt)
    problem = one(report, "renamed-tensor")
    assert "checked" in problem.message
    override = "checkpoint: {tensor_names: {router: 'model.layers.{layer}.mlp.router'}}"
    assert problem.fix == f"add to the spec: {override}"
    assert errors_of(report) == {"renamed-tensor"}  # no separate missing/unexpected

    data = spec.model_dump(mode="json")
    data["checkpoint"]["tensor_names"] = {"router": "model.layers.{layer}.mlp.router"}
    fixed = preflight(ModelSpec.model_validate(data), ckpt)
    assert fixed.ok and fixed.problems == [], fixed.lines()


def test_renamed_in_one_layer_only_asks_for_a_rename(broken) -> None:
    ckpt = broken()
    edit_shards(
        ckpt,
        lambda t: {
            k.replace("layers.1.mlp.gate.", "layers.1.mlp.router."): v
            for k, v in t.items()
        },
    )
    problem = one(preflight(spec_of(ckpt), ckpt), "renamed-tensor")
    assert problem.fix.startswith("rename these tensors in the checkpoint")
    assert "layers 1" in problem.where


def test_wrong_layout_every_role_mapped(hf_written) -> None:
    """A Qwen3-MoE checkpoint read with the Mixtral layout: each expert role and the
    router are found under their real names (w1/w2/w3 told apart by the layout
    presets' spellings and by shape), and the suggested overrides fix it."""
    ckpt = hf_written["qwen3_moe"]
    spec = spec_from_hf_config_file(ckpt)
    data = spec.model_dump(mode="json")
    data["checkpoint"]["layout"] = "mixtral"
    report = preflight(ModelSpec.model_validate(data), ckpt)
    renamed = report.by_kind("renamed-tensor")
    overrides = {}
    for p in renamed:
        assert p.fix.startswith("add to the spec: checkpoint: {tensor_names: {")
        role, path = p.fix.split("{tensor_names: {")[1].rstrip("}").split(": ", 1)
        overrides[role] = path.strip("'")
    assert overrides == {
        "router": "model.layers.{layer}.mlp.gate",
        "expert_gate_proj": "model.layers.{layer}.mlp.experts.{expert}.gate_proj",
        "expert_up_proj": "model.layers.{layer}.mlp.experts.{expert}.up_proj",
        "expert_down_proj": "model.layers.{layer}.mlp.experts.{expert}.down_proj",
    }
    assert errors_of(report) == {"renamed-tensor"}
    assert "set checkpoint.layout" in one(report, "layout").fix
    data["checkpoint"]["tensor_names"] = overrides
    assert preflight(ModelSpec.model_validate(data), ckpt).ok


def test_config_without_topk_method_and_null_n_group(broken) -> None:
    # The spec routes in 4 groups: a null n_group breaks the generated model too;
    # a missing topk_method only vLLM's in-tree model (transformers' DeepSeek-V3
    # and the generated model always add the bias).
    ckpt = broken()
    edit_config(ckpt, lambda c: (c.pop("topk_method"), c.update(n_group=None)))
    report = preflight(spec_of(ckpt), ckpt)
    problems = {p.where: p for p in report.by_kind("config")}
    assert set(problems) == {"topk_method", "n_group"}
    assert [p.where for p in report.errors] == ["n_group"]
    assert "null breaks vLLM's grouped routing" in problems["n_group"].message
    assert '"n_group": 4' in problems["n_group"].fix
    assert problems["topk_method"].severity == "note"
    report = preflight(spec_of(ckpt), ckpt, in_tree=True)
    problems = {p.where: p for p in report.errors}
    assert set(problems) == {"topk_method", "n_group"}
    assert '"topk_method": "noaux_tc"' in problems["topk_method"].fix
    assert "e_score_correction_bias" in problems["topk_method"].message


def test_a_wrong_topk_method_is_still_an_error(broken) -> None:
    # A hand-written config that says something else than transformers computes.
    ckpt = broken()
    edit_config(ckpt, lambda c: c.update(topk_method="greedy"))
    problem = one(preflight(spec_of(ckpt), ckpt), "config")
    assert problem.severity == "error" and problem.where == "topk_method"
    assert '"topk_method": "noaux_tc"' in problem.fix


def test_config_field_differences_are_named(broken) -> None:
    ckpt = broken("novel-launch")
    edit_config(
        ckpt,
        lambda c: c.update(
            hidden_size=512, rms_norm_eps=1e-5, n_routed_experts=None, foo_bar=1
        ),
    )
    edit_config(ckpt, lambda c: c.update(num_experts=c.pop("n_routed_experts")))
    edit_config(ckpt, lambda c: c["rope_parameters"].update(rope_theta=1.0))
    report = preflight(spec_of(ckpt), ckpt)
    config = {p.where: p for p in report.by_kind("config")}
    assert set(config) == {
        "hidden_size",
        "rms_norm_eps",
        "n_routed_experts",
        "rope_parameters.rope_theta",
    }
    assert config["hidden_size"].spec_fields == ("hidden_size",)
    assert config["rms_norm_eps"].spec_fields == ("norm.eps",)
    assert "rope" in config["rope_parameters.rope_theta"].spec_fields
    assert one(report, "config-extra").where == "foo_bar"  # a note only


def test_truncated_shard_header(broken) -> None:
    ckpt = broken()
    shard = ckpt / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    report = preflight(spec_of(ckpt), ckpt)
    problem = one(report, "corrupt-shard")
    assert problem.where == shard.name and "truncated" in problem.message
    assert "re-download" in problem.fix
    # Its tensors are not listed again as missing one by one.
    assert errors_of(report) == {"corrupt-shard"}


def test_truncated_shard_data(broken) -> None:
    ckpt = broken()
    shard = ckpt / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    problem = one(preflight(spec_of(ckpt), ckpt), "corrupt-shard")
    assert "truncated: the header declares" in problem.message


def test_missing_shard(broken) -> None:
    ckpt = broken()
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    report = preflight(spec_of(ckpt), ckpt)
    problem = one(report, "missing-shard")
    assert "not on disk" in problem.message and "incomplete" in problem.fix
    assert errors_of(report) == {"missing-shard"}


def test_unindexed_shard_and_index_drift(broken) -> None:
    ckpt = broken()
    save_raw(ckpt / "model-extra.safetensors", {"x.weight": zeros("BF16", [2, 2])})
    index = json.loads((ckpt / INDEX_FILE).read_text())
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
    (ckpt / INDEX_FILE).write_text(json.dumps(index))
    report = preflight(spec_of(ckpt), ckpt)
    assert one(report, "unindexed-shard").severity == "warning"
    drift = one(report, "index")
    assert "wrong shard" in drift.message and drift.tensors == ("model.norm.weight",)
    assert report.ok  # vLLM reads every tensor of the listed shards


def test_unexpected_tensors_and_dtypes(broken) -> None:
    ckpt = broken("dense-gqa")

    def add(t: Tensors) -> Tensors:
        if "model.layers.0.input_layernorm.weight" not in t:
            return t
        dtype, shape, _ = t["model.layers.0.input_layernorm.weight"]
        return {
            **t,
            "model.layers.0.mlp.foo_proj.weight": zeros("BF16", [4, 4]),
            "model.layers.0.self_attn.rotary_emb.inv_freq": zeros("F32", [4]),
            "model.layers.0.input_layernorm.weight": zeros("F32", shape),
            "model.layers.0.mlp.down_proj.weight": zeros(
                "I8", t["model.layers.0.mlp.down_proj.weight"][1]
            ),
        }

    edit_shards(ckpt, add)
    report = preflight(spec_of(ckpt), ckpt)
    unexpected = {p.tensors[0]: p for p in report.by_kind("unexpected-tensor")}
    assert unexpected["model.layers.0.mlp.foo_proj.weight"].severity == "error"
    assert "tensor_names" in unexpected["model.layers.0.mlp.foo_proj.weight"].fix
    assert unexpected["model.layers.0.self_attn.rotary_emb.inv_freq"].severity == "note"
    dtypes = {p.severity: p for p in report.by_kind("dtype")}
    assert dtypes["warning"].tensors == ("model.layers.0.input_layernorm.weight",)
    assert "no quantization_config" in dtypes["error"].message


def test_full_spec_against_its_tiny_checkpoint(tiny) -> None:
    """The bundled (full-size) spec on the shrunk checkpoint: the layer count, the
    config fields and each dimension's spec field are named."""
    report = preflight(load_spec(SPECS / f"{DS}.yaml"), tiny[DS])
    layers = one(report, "layer-count")
    assert "3 layers" in layers.message and "61 + 1 MTP" in layers.message
    assert "num_hidden_layers in the spec to 2" in layers.fix
    norm = next(p for p in report.by_kind("shape") if p.where.startswith("model.norm"))
    assert "the checkpoint implies hidden_size: 256" in norm.message
    assert norm.spec_fields == ("hidden_size",)
    assert {"hidden_size", "vocab_size", "num_hidden_layers"} <= {
        p.where for p in report.by_kind("config")
    }
    # Missing layers 3..61 are one problem, not one per tensor pattern.
    assert not any("layers 3-" in p.where for p in report.by_kind("missing-tensor"))


def test_full_spec_on_a_tiny_checkpoint_points_at_its_own_spec(tiny, tmp_path):
    """Many size mismatches, and beside the checkpoint a spec.yaml with its sizes
    (as `onboard checkpoint tiny` and `new-model` write them): one line names it."""
    full = load_spec(SPECS / f"{DS}.yaml")
    own = tiny[DS] / "spec.yaml"
    (hint,) = preflight(full, tiny[DS]).by_kind("spec-hint")
    assert hint.severity == "note" and hint.where == str(own)
    assert f"onboard spec check {own} --checkpoint {tiny[DS]}" in hint.message
    assert len(hint.lines()) == 1
    assert preflight(spec_of(tiny[DS]), tiny[DS]).problems == []

    # new-model's layout: DIR/spec.yaml is the full spec, the checkpoint's own is
    # the one with its sizes.
    layout = tmp_path / "out"
    bf16 = layout / "checkpoints" / "bf16"
    shutil.copytree(tiny[DS], bf16)
    shutil.copy(SPECS / f"{DS}.yaml", layout / "spec.yaml")
    (hint,) = preflight(full, bf16).by_kind("spec-hint")
    assert hint.where == str(bf16 / "spec.yaml")
    # Without one of its own: DIR/spec.yaml when that has the sizes, else none.
    (bf16 / "spec.yaml").replace(layout / "spec.yaml")
    (hint,) = preflight(full, bf16).by_kind("spec-hint")
    assert hint.where == str(layout / "spec.yaml")
    (layout / "spec.yaml").unlink()
    assert preflight(full, bf16).by_kind("spec-hint") == []


def test_not_a_directory(tmp_path) -> None:
    with pytest.raises(InputError, match="not a checkpoint directory"):
        preflight(load_spec(SPECS / f"{DS}.yaml"), tmp_path / "nope")


def _st(header: dict, data: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + data


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x05", "no header length"),
        ((10**9).to_bytes(8, "little"), "over 100 MiB"),
        ((8).to_bytes(8, "little") + b"not json", "corrupt header"),
        (_st({"a": _entry("X9", [1], 0, 1)}, b"\0"), "unknown dtype"),
        (_st({"a": _entry("F32", [2], 0, 4)}, b"\0" * 4), "does not fit shape"),
        (_st({"a": _entry("U8", [1], 1, 2)}, b"\0" * 2), "starts at 1, not 0"),
        (_st({"a": _entry("U8", [4], 0, 4)}, b"\0" * 5), "trailing bytes"),
    ],
)
def test_read_header_refuses_damage(tmp_path, data: bytes, message: str) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    with pytest.raises(HeaderError, match=message):
        read_header(path)


# ---- the CLI ----------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / ".venv/bin/onboard"), *args], capture_output=True, text=True
    )


def test_cli_console_script(broken) -> None:
    """`onboard spec check SPEC --checkpoint DIR`: exit 2 with the fix, no traceback;
    exit 0 on a good checkpoint. The check itself takes milliseconds; the process
    spends its time importing transformers (hf_config_from_spec)."""
    ckpt = broken()
    edit_config(ckpt, lambda c: c.update(topk_method="greedy"))
    start = time.perf_counter()
    bad = _cli("spec", "check", str(ckpt / "spec.yaml"), "--checkpoint", str(ckpt))
    wall = time.perf_counter() - start
    assert bad.returncode == 2, bad.stderr
    assert "Traceback" not in bad.stderr + bad.stdout
    assert '"topk_method": "noaux_tc"' in bad.stdout
    assert "checkpoint does not match the spec" in bad.stderr
    summary = bad.stdout.strip().splitlines()[-1]
    seconds = float(re.search(r"read\) in ([\d.]+) s", summary).group(1))
    assert seconds < 2.0, summary
    print(f"CLI wall time {wall:.1f} s; check {seconds:.2f} s; {summary}")

    edit_config(ckpt, lambda c: c.update(topk_method="noaux_tc"))
    good = _cli("spec", "check", str(ckpt / "spec.yaml"), "--checkpoint", str(ckpt))
    assert good.returncode == 0 and "matches the spec" in good.stdout, good.stderr


BREAKS: dict[str, Callable[[Path], None]] = {
    "bias": lambda c: edit_shards(
        c,
        lambda t: {
            k: v for k, v in t.items() if not k.endswith("e_score_correction_bias")
        },
    ),
    "latent": lambda c: edit_shards(
        c,
        lambda t: {
            k: zeros(v[0], [320, v[1][1]])
            if k.endswith("kv_a_proj_with_mqa.weight")
            else v
            for k, v in t.items()
        },
    ),
    "rename": lambda c: edit_shards(
        c, lambda t: {k.replace(".mlp.gate.", ".mlp.router."): v for k, v in t.items()}
    ),
    "topk": lambda c: edit_config(c, lambda cfg: cfg.update(topk_method="greedy")),
    "header": lambda c: (c / "model-00001-of-00002.safetensors").write_bytes(
        b"\x00" * 9
    ),
    "shard": lambda c: (c / "model-00002-of-00002.safetensors").unlink(),
}
FIXES = {
    "bias": "bias_correction: false",
    "latent": "kv_lora_rank",
    "rename": "tensor_names: {router:",
    "topk": '"topk_method": "noaux_tc"',
    "header": "re-download the shard",
    "shard": "download or copy the missing shard",
}


@pytest.mark.parametrize("case", list(BREAKS))
def test_cli_main_on_each_break(broken, capsys, case: str) -> None:
    """The CLI entry point (in this process, imports warm): exit 2, the fix printed,
    no traceback, in well under two seconds."""
    from onboard.cli import main

    ckpt = broken()
    BREAKS[case](ckpt)
    argv = [
        "onboard",
        "spec",
        "check",
        str(ckpt / "spec.yaml"),
        "--checkpoint",
        str(ckpt),
    ]
    preflight(spec_of(ckpt), ckpt)  # warm the imports
    capsys.readouterr()
    start, old = time.perf_counter(), sys.argv
    sys.argv = argv
    try:
        with pytest.raises(SystemExit) as exit_info:
            main()
    finally:
        sys.argv = old
    elapsed = time.perf_counter() - start
    out = capsys.readouterr()
    assert exit_info.value.code == 2
    assert FIXES[case] in out.out, out.out
    assert "Traceback" not in out.out + out.err
    assert elapsed < 2.0, elapsed


# ---- quantized checkpoints (compressed-tensors) --------------------------------------

SCHEMES = ["fp8-dynamic", "fp8-block", "nvfp4a16", "mxfp4"]


@pytest.fixture(scope="module")
def quantized(tiny, tmp_path_factory) -> dict[str, Path]:
    from onboard.quantize import quantize_checkpoint

    root = tmp_path_factory.mktemp("quant")
    out = {s: quantize_checkpoint(tiny[DS], s, root / s, workers=1) for s in SCHEMES}
    # Calibrated NVFP4 (static activation global scales) on the dense model.
    out["nvfp4"] = quantize_checkpoint(
        tiny["dense-gqa"],
        "nvfp4",
        root / "nvfp4",
        workers=1,
        calibration_samples=2,
        calibration_seq_len=16,
    )
    return out


@pytest.mark.parametrize("scheme", [*SCHEMES, "nvfp4"])
def test_quantized_checkpoints_pass(quantized, scheme: str) -> None:
    ckpt = quantized[scheme]
    report = preflight(spec_of(ckpt), ckpt)
    assert report.quantization == "compressed-tensors"
    assert report.ok and report.problems == [], report.lines()
    names = set(json.loads((ckpt / INDEX_FILE).read_text())["weight_map"])
    suffixes = {n.rpartition(".")[2] for n in names}
    assert "weight_scale" in suffixes  # the scale tensors were checked, not skipped


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def test_quantized_expert_scales_dropped(quantized, tmp_path) -> None:
    ckpt = _copy(quantized["nvfp4a16"], tmp_path)
    edit_shards(
        ckpt,
        lambda t: {
            k: v
            for k, v in t.items()
            if not (
                k.startswith("model.layers.1.mlp.experts.")
                and k.endswith(".weight_scale")
            )
        },
    )
    report = preflight(spec_of(ckpt), ckpt)
    missing = report.by_kind("missing-tensor")
    assert len(missing) == 3 and all("re-quantize" in p.fix for p in missing)
    assert sum(len(p.tensors) for p in missing) == 3 * 8  # 8 experts x 3 projections
    assert errors_of(report) == {"missing-tensor"}


def test_quantized_ignore_list_disagrees(quantized, tmp_path) -> None:
    ckpt = _copy(quantized["nvfp4a16"], tmp_path)

    def ignore(q: dict) -> None:
        q["ignore"].remove("model.layers.1.mlp.gate")  # stored in 16 bits
        q["ignore"].append("model.layers.1.self_attn.o_proj")  # stored quantized
        q["ignore"].append("model.layers.0.self_attn.q_a_proj")  # half a fused pair

    edit_config(ckpt, lambda c: ignore(c["quantization_config"]))
    report = preflight(spec_of(ckpt), ckpt)
    mismatch = {p.where.split(" ")[0]: p for p in report.by_kind("quant-mismatch")}
    assert set(mismatch) == {
        "model.layers.{layer}.mlp.gate",
        "model.layers.{layer}.self_attn.o_proj",
        "model.layers.{layer}.self_attn.q_a_proj",
    }
    assert (
        "to quantization_config.ignore" in mismatch["model.layers.{layer}.mlp.gate"].fix
    )
    assert "remove it from quantization_config.ignore" in (
        mismatch["model.layers.{layer}.self_attn.o_proj"].fix
    )
    fused = one(report, "quant-fused")
    assert "kv_a_proj_with_mqa" in fused.message and "q_a_proj" in fused.message


def test_quantized_scheme_disagrees_with_scales(quantized, tmp_path) -> None:
    ckpt = _copy(quantized["fp8-block"], tmp_path)
    edit_config(
        ckpt,
        lambda c: c["quantization_config"]["config_groups"]["group_0"][
            "weights"
        ].update(block_structure=[64, 64]),
    )
    shapes = preflight(spec_of(ckpt), ckpt).by_kind("shape")
    assert shapes and all("block [64, 64]" in p.message for p in shapes)


def test_quantized_without_quantization_config(quantized, tmp_path) -> None:
    ckpt = _copy(quantized["fp8-block"], tmp_path)
    edit_config(ckpt, lambda c: c.pop("quantization_config"))
    report = preflight(spec_of(ckpt), ckpt)
    assert errors_of(report) == {"quant-config", "dtype"}
    assert "add the quantization_config" in one(report, "quant-config").fix


def test_other_quant_method_is_accepted_with_a_warning(quantized, tmp_path) -> None:
    """DeepSeek-V3's own FP8 release: quant_method fp8, weight_scale_inv."""
    ckpt = _copy(quantized["fp8-block"], tmp_path)
    edit_shards(
        ckpt,
        lambda t: {
            k.replace(".weight_scale", ".weight_scale_inv"): v for k, v in t.items()
        },
    )
    fp8 = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    edit_config(ckpt, lambda c: c.update(quantization_config=fp8))
    report = preflight(spec_of(ckpt), ckpt)
    assert report.ok, report.lines()
    assert [p.kind for p in report.problems] == ["quant-config"]
    assert "'fp8'" in report.problems[0].message


def test_unknown_compressed_tensors_format_warned_once(quantized, tmp_path) -> None:
    ckpt = _copy(quantized["fp8-block"], tmp_path)
    edit_config(
        ckpt,
        lambda c: c["quantization_config"]["config_groups"]["group_0"].update(
            format="marlin-24"
        ),
    )
    report = preflight(spec_of(ckpt), ckpt)
    assert report.ok and [p.kind for p in report.problems] == ["quant-config"]
    assert "'marlin-24' is not checked" in report.problems[0].message


@pytest.mark.parametrize(
    "preset",
    [
        "W8A16",
        "W4A16",
        "W4A16_ASYM",
        "W8A8",
        "INT8",
        "W4A8",
        "W4AFP8",
        "FP8",
        "FP8_DYNAMIC",
        "FP8_BLOCK",
        "NVFP4A16",
        "NVFP4",
        "MXFP4A16",
        "MXFP4",
        "MXFP8A16",
        "MXFP8",
    ],
)
def test_ct_mirror_matches_compressed_tensors(preset: str) -> None:
    """What the preflight expects for a quantized Linear equals what
    compressed-tensors itself writes: initialise and compress a real Linear."""
    import torch
    from compressed_tensors.compressors.base import compress_module
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.initialize import (
        initialize_module_for_quantization,
    )

    tags = {
        torch.float8_e4m3fn: "F8_E4M3",
        torch.uint8: "U8",
        torch.int32: "I32",
        torch.int8: "I8",
        torch.float32: "F32",
        torch.bfloat16: "BF16",
        torch.int64: "I64",
        torch.float16: "F16",
    }
    linear = torch.nn.Linear(256, 64, bias=False, dtype=torch.bfloat16)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    initialize_module_for_quantization(linear, scheme, force_zero_point=False)
    with torch.no_grad():
        for name, p in linear.named_parameters():
            if "scale" in name:
                p.fill_(1.0)
    compress_module(linear)
    written = {
        n: (tuple(t.shape), tags[t.dtype]) for n, t in linear.state_dict().items()
    }

    def args(a):
        return QArgs.parse(None if a is None else a.model_dump(mode="json"))

    group = CTGroup(
        "g",
        ("Linear",),
        scheme.format.value,
        args(scheme.weights),
        args(scheme.input_activations),
        args(scheme.output_activations),
    )
    expected = ct_tensors(group, 64, 256)
    assert expected is not None and set(expected) == set(written)
    for name, (shape, dtypes) in expected.items():
        assert shape is None or shape == written[name][0], name
        assert dtypes is None or written[name][1] in dtypes, name
    # qparam_shapes is initialize_qparams' shape rule, read back here directly.
    assert qparam_shapes(args(scheme.weights), "weight", (64, 256)).keys() <= set(
        written
    ) | {"weight_zero_point"}


# ---- a 1T-class checkpoint: headers only ---------------------------------------------


def write_sparse(path: Path, tensors: list[tuple[str, str, tuple[int, ...]]]) -> int:
    """A safetensors file whose header declares full-size tensors; the data is a
    hole (a sparse file: the declared bytes take no disk space)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in sorted(tensors):
        n = math.prod(shape) * DTYPE_BITS[dtype] // 8
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        f.truncate(8 + len(head) + offset)
    return offset


def write_header_only(spec: ModelSpec, out: Path, tensors=None) -> Path:
    """The spec's checkpoint at full size, one shard per layer, data as holes."""
    out.mkdir()
    shards: dict[str, list] = {}
    if tensors is None:
        for p in plan_tensors(spec):
            key = "global" if p.layer is None else f"layer{p.layer:03d}"
            shards.setdefault(key, []).append((p.name, "BF16", p.shape))
    else:
        shards = tensors
    weight_map, total = {}, 0
    for i, key in enumerate(sorted(shards), start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        total += write_sparse(out / file, shards[key])
        weight_map.update(dict.fromkeys((n for n, _, _ in shards[key]), file))
    (out / INDEX_FILE).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (out / "config.json").write_text(json.dumps(hf_config_from_spec(spec), indent=2))
    return out


def _rchar() -> int:
    """Bytes this process has read through read(2)-like calls (Linux)."""
    io = dict(
        line.split(": ") for line in Path("/proc/self/io").read_text().splitlines()
    )
    return int(io["rchar"])


@pytest.fixture(scope="module")
def full_size(tmp_path_factory) -> Path:
    spec = load_spec(SPECS / f"{DS}.yaml")
    return write_header_only(spec, tmp_path_factory.mktemp("full") / "bf16")


def _measure(spec: ModelSpec, ckpt: Path) -> tuple[PreflightReport, int]:
    hf_config_from_spec(spec)  # imports out of the measurement
    before = _rchar()
    report = preflight(spec, ckpt)
    return report, _rchar() - before


def test_full_size_deepseek_v3_reads_headers_only(full_size) -> None:
    spec = load_spec(SPECS / f"{DS}.yaml")
    with safe_open(full_size / "model-00010-of-00063.safetensors", "numpy") as f:
        assert f.get_slice(f.keys()[0]).get_shape()  # valid safetensors, real library
    report, read = _measure(spec, full_size)
    assert report.ok and report.problems == [], report.lines()
    assert report.tensors == len(plan_tensors(spec)) > 45_000
    assert report.data_bytes > 1.3e12  # 1.37 TB of bf16 weights declared
    on_disk = sum(p.stat().st_blocks * 512 for p in full_size.iterdir())
    assert on_disk < 50e6  # sparse: the data was never written, so never read
    metadata = sum((full_size / f).stat().st_size for f in (INDEX_FILE, "config.json"))
    assert read < report.header_bytes + metadata + 2**20, (read, report.header_bytes)
    assert report.check_seconds < 30, report.timings  # ~3 s on a loaded 2-core box
    print(f"1.37 TB checkpoint: {report.lines()[-1]}; bytes read {read}")


def test_full_size_broken_header_caught(full_size, tmp_path) -> None:
    spec = load_spec(SPECS / f"{DS}.yaml")
    ckpt = tmp_path / "ds"
    ckpt.mkdir()
    shard = ckpt / "model-00031-of-00063.safetensors"  # layer 29
    for src in full_size.iterdir():
        # Never copy these files: a copy would write their 1.4 TB of holes out.
        if src.name != shard.name:
            os.link(src, ckpt / src.name)
    shard = full_size / shard.name  # read the original, write a new file
    kept = [
        (n, d, tuple(s))
        for n, (d, s) in read_header(shard)[0].items()
        if not n.endswith("e_score_correction_bias")
    ]
    write_sparse(ckpt / shard.name, kept)
    report = preflight(spec, ckpt)
    problem = one(report, "missing-tensor")
    assert problem.tensors == ("model.layers.29.mlp.gate.e_score_correction_bias",)
    assert "bias_correction: false" in problem.fix


def test_full_size_nvfp4_headers(full_size, tmp_path) -> None:
    """NVFP4 at full size, laid out by onboard's quantizer planner (which reads the
    bf16 headers only): ~136k tensors, every weight_packed / weight_scale /
    weight_global_scale checked against compressed-tensors' rules."""
    from onboard.quantize.schemes import SCHEMES as QSCHEMES
    from onboard.quantize.schemes import quantization_config
    from onboard.quantize.selection import make_selection

    spec = load_spec(SPECS / f"{DS}.yaml")
    plan = make_selection(full_size, spec, QSCHEMES["nvfp4a16"])
    shards = {
        s.name: [(o.name, o.dtype, o.shape) for o in s.outputs] for s in plan.shards
    }
    ckpt = write_header_only(spec, tmp_path / "nvfp4", shards)
    edit_config(
        ckpt,
        lambda c: c.update(
            quantization_config=quantization_config(QSCHEMES["nvfp4a16"], plan.ignore)
        ),
    )
    report, read = _measure(spec, ckpt)
    assert report.ok and report.problems == [], report.lines()
    assert report.tensors > 130_000
    metadata = sum((ckpt / f).stat().st_size for f in (INDEX_FILE, "config.json"))
    assert read < report.header_bytes + metadata + 2**20
    assert report.check_seconds < 60, report.timings
    print(f"NVFP4 full size: {report.lines()[-1]}")


def test_proc_io_is_available() -> None:
    # The byte accounting above relies on it; fail loudly rather than skip.
    assert os.path.exists("/proc/self/io")


def test_mla_kv_sharing_layers_may_omit_their_latent_projection(tmp_path) -> None:
    """An MLA layer that reads an earlier layer's latent cache never runs its own
    kv_a_proj_with_mqa / kv_a_layernorm (its kv_b_proj it does): a checkpoint
    without them passes; the target still needs its own."""
    data = yaml.safe_load((SPECS / "deepseek-v3-style.yaml").read_text())
    data["attention"]["kv_sharing"] = {4: 3}
    # Generated without rope scaling and MTP heads (spec rules).
    data["rope"].pop("scaling")
    data.pop("mtp")
    data["speculators"] = []
    # transformers' deepseek_v3 class has no KV sharing: a model type of its own.
    data["model_type"] = "mla_share"
    data["architecture"] = "MlaShareForCausalLM"
    path = tmp_path / "mla-share.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    ckpt = write_tiny_checkpoint(load_spec(path), tmp_path / "ckpt")
    spec = spec_of(ckpt)
    assert spec.attention.kv_sharing  # read back from config.json
    (layer, target), *_ = spec.attention.kv_sharing.items()
    unused = re.compile(
        rf"model\.layers\.{layer}\.self_attn\.(kv_a_proj_with_mqa|kv_a_layernorm)\."
    )
    dropped: list[str] = []

    def drop_unused(tensors: Tensors) -> Tensors:
        dropped.extend(k for k in tensors if unused.match(k))
        return {k: v for k, v in tensors.items() if not unused.match(k)}

    edit_shards(ckpt, drop_unused)
    assert len(dropped) == 2
    report = preflight(spec, ckpt)
    assert report.ok and report.problems == [], report.lines()

    name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
    edit_shards(ckpt, lambda t: {k: v for k, v in t.items() if k != name})
    problem = one(preflight(spec, ckpt), "missing-tensor")
    assert problem.tensors == (name,)
