"""The generated reference files, read as source: imports, dead code, stability.

Every generated file must import only torch, ``math`` and transformers' base
modules (configuration, pretrained model, generation mixin, cache utilities, model
outputs), never a transformers model module; this walks the AST of the files
generated for every bundled spec and for specs covering each feature.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from onboard.errors import InputError
from onboard.reference import render_reference
from onboard.spec import load_spec
from onboard.spec.loader import parse_spec_text
from onboard.spec.model import ModelSpec
from onboard.spec.module_tree import module_names

ROOT = Path(__file__).parents[1]
BUNDLED = sorted((ROOT / "model_specs").glob("*.yaml"))

ALLOWED_MODULES = {
    "huggingface_hub.dataclasses",
    "math",
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "typing",
    "transformers",
    "transformers.activations",
    "transformers.cache_utils",
    "transformers.configuration_utils",
    "transformers.generation",
    "transformers.generation.utils",
    "transformers.modeling_outputs",
    "transformers.modeling_utils",
}

BASE = """
vocab_size: 512
hidden_size: 64
num_hidden_layers: 4
max_position_embeddings: 256
"""

# Specs that together switch on every feature the generator knows.
VARIANTS = {
    "mla-no-q-lora": """
attention:
  type: mla
  num_heads: 4
  mla: {kv_lora_rank: 16, qk_nope_head_dim: 8, qk_rope_head_dim: 8, v_head_dim: 8}
rope: {theta: 10000.0, interleaved: true, scaling: {type: linear, factor: 2.0}}
mlp:
  intermediate_size: 96
  moe:
    num_experts: 8
    num_experts_per_tok: 2
    expert_intermediate_size: 32
    num_shared_experts: 2
    first_k_dense: 1
    router: {scoring: softmax, norm_topk_prob: false, num_groups: 4, topk_groups: 2}
checkpoint: {layout: deepseek}
""",
    "layernorm-partial-biases": """
norm: {type: layernorm, eps: 1.0e-05}
activation: gelu_pytorch_tanh
tie_word_embeddings: true
attention:
  num_heads: 4
  num_kv_heads: 1
  qkv_bias: true
  o_bias: true
  partial_rotary_factor: 0.5
  sliding_window: 8
  layer_types: [sliding_attention, full_attention, sliding_attention, full_attention]
rope: {theta: 10000.0, scaling: {type: llama3, factor: 8.0, low_freq_factor: 1.0,
       high_freq_factor: 4.0, original_max_position_embeddings: 64}}
mlp: {intermediate_size: 96}
""",
    "mixtral-layout-with-dense-layers": """
attention: {num_heads: 4, num_kv_heads: 2}
mlp:
  intermediate_size: 96
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 32
    layer_frequency: 2
    dense_layers: [3]
checkpoint: {layout: mixtral}
mtp: {num_heads: 1, mlp: dense}
""",
    "qwen-layout-gated-shared-expert": """
attention: {num_heads: 4, num_kv_heads: 2, qk_norm: true}
mlp:
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 32
    num_shared_experts: 1
    shared_expert_intermediate_size: 48
    shared_expert_gate: true
checkpoint:
  layout: qwen
  tensor_names: {router: "model.layers.{layer}.mlp.router"}
""",
    "granite-multipliers-fused-experts": """
embedding_multiplier: 12.0
residual_multiplier: 0.22
logits_scaling: 16.0
attention: {num_heads: 4, num_kv_heads: 2, softmax_scale: 0.0625}
mlp:
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 32
    num_shared_experts: 1
    shared_expert_intermediate_size: 48
checkpoint: {layout: granite, fused: [shared_gate_up_proj, experts]}
""",
    "fused-experts-with-dense-layers": """
attention: {num_heads: 4, num_kv_heads: 2}
mlp:
  intermediate_size: 96
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 32
    num_shared_experts: 1
    first_k_dense: 1
checkpoint: {fused: [experts]}
""",
    "sinks-stacked-experts": """
attention:
  num_heads: 4
  num_kv_heads: 2
  head_dim: 16
  sinks: true
  qkv_bias: true
  o_bias: true
  sliding_window: 8
  sliding_window_pattern: 2
rope:
  theta: 150000.0
  scaling: {type: yarn, factor: 32.0, original_max_position_embeddings: 64,
            beta_fast: 32.0, beta_slow: 1.0, truncate: false}
mlp:
  intermediate_size: 96
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 32
    first_k_dense: 1
    expert_bias: true
    swiglu_alpha: 1.702
    swiglu_limit: 7.0
    router: {scoring: softmax, norm_topk_prob: true, bias: true}
checkpoint: {layout: gpt_oss, fused: [experts], experts_format: gpt_oss}
""",
}


def variant(name: str) -> ModelSpec:
    model_type = name.replace("-", "_")
    arch = "".join(p.title() for p in name.split("-")) + "ForCausalLM"
    text = f"name: {name}\narchitecture: {arch}\nmodel_type: {model_type}\n"
    return parse_spec_text(text + BASE + VARIANTS[name], f"{name}.yaml")


SPECS = {p.stem: load_spec(p) for p in BUNDLED} | {n: variant(n) for n in VARIANTS}


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, str]]:
    """Onboard's own reference of each spec (standalone: qwen3-next-style's
    default reference is transformers' Qwen3-Next, tests/test_modular.py)."""
    return {
        name: render_reference(spec, standalone=True) for name, spec in SPECS.items()
    }


def imported_modules(source: str) -> list[tuple[str, int]]:
    """(module, relative level) of every import statement."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.module or "", node.level))
    return out


@pytest.mark.parametrize("name", sorted(SPECS))
def test_imports_only_torch_and_transformers_base_classes(rendered, name):
    spec = SPECS[name]
    files = rendered[name]
    config_module = f"configuration_{spec.module_name}"
    for filename, source in files.items():
        for module, level in imported_modules(source):
            if level:
                # The modeling file imports its configuration, nothing else local.
                assert (level, module, filename) == (
                    1,
                    config_module,
                    f"modeling_{spec.module_name}.py",
                )
                continue
            assert module in ALLOWED_MODULES, f"{filename} imports {module}"
            assert not module.startswith("transformers.models")
        # No dynamic way around the rule either.
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("__import__", "exec", "eval")
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert "transformers.models" not in node.value


def test_the_ast_check_catches_a_model_import():
    bad = "from transformers.models.llama.modeling_llama import LlamaMLP\n"
    assert [m for m, _ in imported_modules(bad)] == [
        "transformers.models.llama.modeling_llama"
    ]
    assert "transformers.models.llama.modeling_llama" not in ALLOWED_MODULES


def classes_and_functions(source: str) -> set[str]:
    return {
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef | ast.FunctionDef)
    }


def test_only_what_the_spec_uses_is_generated(rendered):
    def defs(name: str) -> set[str]:
        return classes_and_functions(
            rendered[name][f"modeling_{name.replace('-', '_')}.py"]
        )

    def text(name: str) -> str:
        return rendered[name][f"modeling_{name.replace('-', '_')}.py"]

    dense = defs("dense-gqa")
    assert {
        "Router",
        "MoE",
        "MTPLayer",
        "mtp_forward",
        "is_sliding_layer",
    } & dense == set()
    assert "e_score_correction_bias" not in text("dense-gqa")
    assert "kv_b_proj" not in text("dense-gqa")

    novel = defs("novel-launch")
    assert {"Router", "MoE", "MTPLayer", "mtp_forward", "kv_source_layer"} <= novel
    assert "is_sliding_layer" in novel and "kv_b_proj" not in text("novel-launch")

    deepseek = text("deepseek-v3-style")
    assert "kv_b_proj" in deepseek and "q_a_proj" in deepseek
    assert "window" not in deepseek and "kv_source" not in deepseek
    assert "is_sliding_layer" not in defs("deepseek-v3-style")

    assert "q_a_proj" not in text("mla-no-q-lora")
    assert "e_score_correction_bias" not in text("mla-no-q-lora")
    assert "grouped.max(dim=-1)" in text("mla-no-q-lora")
    assert "nn.LayerNorm" in text("layernorm-partial-biases")
    assert "x_pass" in text("layernorm-partial-biases")
    assert "_tied_weights_keys" in text("layernorm-partial-biases")
    assert "x_pass" not in text("novel-launch")
    assert "self.router = Router" in text("qwen-layout-gated-shared-expert")
    assert "self.shared_expert = " in text("qwen-layout-gated-shared-expert")
    mixtral = text("mixtral-layout-with-dense-layers")
    assert "class ExpertMLP" in mixtral and "self.w1 = " in mixtral
    assert "self.block_sparse_moe(h) if self.is_moe else self.mlp(h)" in mixtral


def test_generation_is_stable(rendered):
    for name, spec in SPECS.items():
        assert render_reference(spec, standalone=True) == rendered[name], name


def test_generated_files_are_ruff_clean(rendered, tmp_path):
    for files in rendered.values():
        for filename, source in files.items():
            (tmp_path / filename).write_text(source)
    for args in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--config",
             str(ROOT / "pyproject.toml"), str(tmp_path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr


def test_configuration_fields_are_the_config_json_keys(rendered):
    from onboard.spec.hf import hf_config_from_spec

    for name, spec in SPECS.items():
        source = rendered[name][f"configuration_{spec.module_name}.py"]
        (cls,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
        # Typed fields, as transformers' own configs declare them.
        fields = {
            n.target.id
            for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        assert not any(
            isinstance(n, ast.FunctionDef) and n.name == "__init__" for n in cls.body
        ), name
        written = set(hf_config_from_spec(spec)) - {
            "architectures",
            "model_type",
            "dtype",
            "transformers_version",
        }
        assert fields == written, name


def test_a_tensor_path_the_reference_cannot_build_is_refused_with_its_role():
    spec = variant("qwen-layout-gated-shared-expert")
    data = spec.model_dump()
    data["checkpoint"]["tensor_names"] = {
        "router": "model.layers.{layer}.mlp.deep.router.gate"
    }
    with pytest.raises(InputError, match=r"tensor_names\.router"):
        module_names(ModelSpec.model_validate(data))
    data["checkpoint"]["tensor_names"] = {"q_proj": "model.layers.{layer}.mlp.q_proj"}
    with pytest.raises(
        InputError, match=r"tensor_names\.q_proj: .*mlp\.q_proj.*k_proj"
    ):
        module_names(ModelSpec.model_validate(data))
