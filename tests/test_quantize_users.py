"""onboard quantize on checkpoints as users have them: written by transformers'
``save_pretrained``, with no spec.yaml.

Without a spec, quantize reads the layout from the checkpoint's tensor names and
config.json (onboard/quantize/layout.py) instead of inferring a spec through
transformers. These tests hold that path to the spec-inferred one: the same selection
for every family `onboard spec from-hf` maps, byte-identical outputs on every
shape a user's checkpoint takes (``dtype`` or ``torch_dtype``, one file without an
index, tied embeddings, unequal shards), and no transformers import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from onboard.errors import InputError
from onboard.quantize import inferred_spec, quantize_checkpoint
from onboard.quantize.schemes import SCHEMES
from onboard.quantize.selection import STACKED_EXPERTS_KEPT, make_selection
from onboard.validate.check_quant import GUARDED

# Weight-only and dynamic schemes: calibrated nvfp4 runs the reference model.
UNCALIBRATED = [name for name, s in SCHEMES.items() if not s.calibrated]
# The schemes whose input groups fit these tiny families' 64-wide layers (INT4's
# groups of 128 do not: refused, tests/test_quantize.py); the plan is the same
# for every scheme that fits.
FITTING = [s for s in SCHEMES.values() if s.input_multiple <= 64]


def _configs() -> dict:
    import transformers as tf

    common = dict(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
    )
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    mla = dict(
        num_key_value_heads=4,  # MLA: as many KV heads as query heads
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_shared_experts=1,
    )
    return {
        "llama": tf.LlamaConfig(**common),
        "mistral": tf.MistralConfig(**common),
        "qwen2": tf.Qwen2Config(**common),
        "qwen3": tf.Qwen3Config(**common, head_dim=16),
        "qwen2_moe": tf.Qwen2MoeConfig(
            **common, **moe, shared_expert_intermediate_size=64
        ),
        "qwen3_moe": tf.Qwen3MoeConfig(**common, **moe, head_dim=16),
        "mixtral": tf.MixtralConfig(
            **common, num_local_experts=4, num_experts_per_tok=2
        ),
        "deepseek_v2": tf.DeepseekV2Config(**{**common, **mla}),
        "deepseek_v3": tf.DeepseekV3Config(
            **{**common, **mla}, n_group=2, topk_group=1
        ),
        "granite": tf.GraniteConfig(**common),
        # Each layer's experts stacked in two 3-D tensors (checkpoint.fused).
        "granitemoe": tf.GraniteMoeConfig(
            **common, num_local_experts=4, num_experts_per_tok=2
        ),
        "granitemoeshared": tf.GraniteMoeSharedConfig(
            **common,
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=64,
        ),
    }


# What transformers 5 leaves out of these configs and a user's file says (its
# model hard-codes them): spec inference needs them, the layout path does not.
EXTRA_KEYS = {
    "deepseek_v2": {"topk_method": "greedy", "scoring_func": "softmax"},
    "deepseek_v3": {"topk_method": "noaux_tc", "scoring_func": "sigmoid"},
}


def save_family(family: str, out: Path, **save) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_configs()[family], dtype=torch.bfloat16)
    model.save_pretrained(out, **save)
    if family in EXTRA_KEYS:
        path = out / "config.json"
        config = json.loads(path.read_text())
        path.write_text(json.dumps({**config, **EXTRA_KEYS[family]}, indent=2))
    return out


def decisions(selection) -> dict:
    return {
        "quantized": sorted(selection.quantized),
        "kept": selection.kept,
        "ignore": selection.ignore,
        "fused": sorted(sorted(names) for names in selection.fused.values()),
        "outputs": {s.name: s.outputs for s in selection.shards},
    }


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {f: save_family(f, root / f) for f in _configs()}


@pytest.mark.parametrize("family", list(_configs()))
def test_layout_from_names_plans_what_the_inferred_spec_plans(family_dirs, family):
    model_dir = family_dirs[family]
    spec = inferred_spec(model_dir)
    for scheme in FITTING:
        from_names = make_selection(model_dir, None, scheme)
        from_spec = make_selection(model_dir, spec, scheme)
        assert decisions(from_names) == decisions(from_spec), (family, scheme.name)
        assert from_names.quantized, family


@pytest.mark.parametrize(
    "variant", ["torch_dtype", "single-file", "tied", "unequal-shards"]
)
def test_every_checkpoint_shape_quantizes_as_with_the_inferred_spec(tmp_path, variant):
    family = "qwen2_moe"  # shared expert: the qwen layout, not the first preset
    src = tmp_path / "src"
    if variant == "tied":
        config = _configs()[family]
        config.tie_word_embeddings = True
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(
            src
        )
    elif variant == "single-file":
        save_family(family, src)
    else:
        save_family(family, src, max_shard_size="20KB")
    if variant == "torch_dtype":
        path = src / "config.json"
        config = json.loads(path.read_text())
        config["torch_dtype"] = config.pop("dtype")
        path.write_text(json.dumps(config, indent=2))
    if variant == "unequal-shards":
        # Merge all but the last shard into the first: one large, a few small.
        _merge_shards(src)
    shards = sorted(src.glob("*.safetensors"))
    if variant == "single-file":
        assert [p.name for p in shards] == ["model.safetensors"]
        assert not (src / "model.safetensors.index.json").exists()
    if variant == "tied":
        assert "lm_head.weight" not in _tensor_names(src)
    if variant == "unequal-shards":
        sizes = sorted(p.stat().st_size for p in shards)
        assert len(sizes) >= 3 and sizes[-1] > 5 * sizes[0]

    spec = inferred_spec(src)
    for scheme in ("fp8-dynamic", "nvfp4a16", "mxfp4"):
        light = quantize_checkpoint(src, scheme, tmp_path / f"light-{scheme}")
        full = quantize_checkpoint(src, scheme, tmp_path / f"spec-{scheme}", spec=spec)
        assert files(light) == files(full), (variant, scheme)
    if variant == "tied":
        ignore = json.loads((light / "config.json").read_text())["quantization_config"][
            "ignore"
        ]
        assert "lm_head" in ignore


def _tensor_names(d: Path) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for shard in d.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as f:
            names.update(f.keys())
    return names


def _merge_shards(src: Path) -> None:
    from safetensors.torch import load_file, save_file

    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    keep_apart = shards[-3:]
    merged: dict = {}
    for name in shards[:-3]:
        merged.update(load_file(src / name))
        (src / name).unlink()
    first = shards[0]
    save_file(merged, src / first, metadata={"format": "pt"})
    for tensor in merged:
        index["weight_map"][tensor] = first
    assert first not in keep_apart
    index_path.write_text(json.dumps(index, indent=2))


def test_quantize_without_a_spec_never_imports_transformers(family_dirs, tmp_path):
    """The spec-free path reads config.json directly: transformers' import (seconds)
    is not on it. Run in a fresh interpreter, as the CLI runs."""
    script = (
        "import sys\n"
        "from onboard.quantize import quantize_checkpoint\n"
        "quantize_checkpoint(sys.argv[1], 'nvfp4a16', sys.argv[2])\n"
        "real = [n for n, m in sys.modules.items() if getattr(m, '__file__', 0)\n"
        "        and n.split('.')[0] == 'transformers']\n"
        "print(len(real), 'transformers modules imported')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script, family_dirs["qwen3_moe"], tmp_path / "q"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0 transformers modules imported", r.stdout
    assert json.loads((tmp_path / "q" / "config.json").read_text())[
        "quantization_config"
    ]["config_groups"]


def test_a_config_without_layer_count_is_refused(family_dirs, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for p in family_dirs["llama"].iterdir():
        (src / p.name).write_bytes(p.read_bytes())
    config = json.loads((src / "config.json").read_text())
    del config["num_hidden_layers"]
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="num_hidden_layers"):
        quantize_checkpoint(src, "fp8-dynamic", tmp_path / "out")
    assert not list(tmp_path.glob(".out*")) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", ["granitemoe", "granitemoeshared"])
def test_stacked_experts_stay_16_bit_and_are_ignored_per_expert(family_dirs, family):
    # A 3-D tensor of every expert of a layer is no Linear module: it is copied
    # unchanged, and vLLM's fused MoE layer (which asks for its experts by name,
    # as <block>.experts.<e>.gate_proj ...) finds each in `ignore`, so it builds
    # the layer unquantized. The router stays 16-bit; the shared expert, a
    # fused but ordinary Linear, is quantized.
    model_dir = family_dirs[family]
    selection = make_selection(model_dir, None, SCHEMES["fp8-dynamic"])
    assert selection.layout.layout == "granite"
    block = "model.layers.1.block_sparse_moe"
    for name in ("input_linear.weight", "output_linear.weight"):
        assert selection.kept[f"{block}.{name}"] == STACKED_EXPERTS_KEPT
    # The quant check requires them unchanged (tests/test_quant_check.py style).
    assert GUARDED["stacked experts"] == (STACKED_EXPERTS_KEPT,)
    projections = ("gate_proj", "up_proj", "down_proj")
    experts = {f"{block}.experts.{e}.{p}" for e in range(4) for p in projections}
    assert experts <= set(selection.ignore)
    assert f"{block}.router.layer" in selection.ignore
    assert f"{block}.router.layer.weight" in selection.kept
    shared = "model.layers.1.shared_mlp.input_linear.weight"
    assert (shared in selection.quantized) == (family == "granitemoeshared")


# The router's bias kept on a module of its own (transformers' save_pretrained
# writes these names): (config, the bias's module, the facts from-hf finds).
BIAS_FAMILIES = {
    "exaone_moe": (
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
        "model.layers.{layer}.mlp",
        {"qk_norm": True, "topk_method": "noaux_tc", "scoring_func": "sigmoid"},
    ),
    "minimax_m2": (
        dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16),
        "model.layers.{layer}.block_sparse_moe",
        {
            "qk_norm": True,
            "qk_norm_scope": "projection",
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "norm_topk_prob": True,
        },
    ),
    "ernie4_5_moe": (
        dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32),
        "model.layers.{layer}.mlp.moe_statics",
        {"topk_method": "noaux_tc", "rope_interleave": True, "norm_topk_prob": True},
    ),
}


@pytest.mark.parametrize("family", list(BIAS_FAMILIES))
def test_a_router_bias_at_its_own_module_stays_16_bit(family, tmp_path):
    """With the layout read from names (no spec) or from the spec's router_bias
    role, the bias is kept byte for byte, never quantized nor ignored as a
    Linear module."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from onboard.spec.hf import spec_from_hf_config
    from onboard.spec.model import ModelSpec

    extra, module, facts = BIAS_FAMILIES[family]
    common = _configs()["llama"].to_dict()
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    config = AutoConfig.for_model(
        family, **{k: common[k] for k in keep}, intermediate_size=128,
        num_key_value_heads=2, max_position_embeddings=256, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():  # away from its initial zeros, so a change would show
        for name, tensor in model.state_dict().items():
            if name.endswith("e_score_correction_bias"):
                tensor.normal_(0.0, 0.05)
    model.save_pretrained(tmp_path / family)
    biases = sorted(n for n in _tensor_names(tmp_path / family) if "e_score" in n)
    layers = {n.split(".")[2] for n in biases}
    assert biases == sorted(
        f"{module.format(layer=i)}.e_score_correction_bias" for i in layers
    )
    data = spec_from_hf_config(config.to_dict(), facts=facts).model_dump(mode="json")
    data["checkpoint"]["tensor_names"] = {"router_bias": module}
    data["checkpoint"]["router_bias_2d"] = family == "ernie4_5_moe"
    if family == "minimax_m2":
        data["checkpoint"]["layout"] = "mixtral"
    spec = ModelSpec.model_validate(data)
    for scheme in FITTING:
        for used in (None, spec):
            selection = make_selection(tmp_path / family, used, scheme)
            assert not set(biases) & set(selection.quantized), (family, scheme.name)
            why = "no role of the spec's layout" if used is None else "role router_bias"
            assert {selection.kept[b] for b in biases} == {why}
            assert not {b.rpartition(".")[0] for b in biases} & set(selection.ignore)
    out = quantize_checkpoint(tmp_path / family, "fp8-dynamic", tmp_path / "q")
    from safetensors.torch import load_file

    def tensors(d: Path) -> dict[str, torch.Tensor]:
        return {k: v for p in d.glob("*.safetensors") for k, v in load_file(p).items()}

    before, after = tensors(tmp_path / family), tensors(out)
    for bias in biases:
        assert after[bias].dtype == before[bias].dtype  # ERNIE's is float32
        assert torch.equal(after[bias], before[bias]) and before[bias].any()
    assert before[biases[0]].shape == ((1, 4) if family == "ernie4_5_moe" else (4,))
