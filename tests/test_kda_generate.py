"""The generated vLLM model for Kimi delta attention layers (model_specs/
kimi-k3-style.yaml): vLLM's own KDA layer beside MLA full attention (and beside gqa
attention), its loading of the checkpoint's KDA tensors, the specs it refuses,
and kimi-k3-style's tiny checkpoint on the CPU engine (KDA beside MLA, through
onboard's CPU shims for the KDA kernels and the MLA block size). The KDA model
beside gqa attention on the CPU engine is in test_kda_engine."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from onboard.arch import build_plan
from onboard.components.linear_attention import KDA_ROLES as KIMI_DELTA_ROLES
from onboard.generate import render_model
from onboard.spec import load_spec
from onboard.spec.layouts import LAYOUT_PRESETS, PARAM_ROLES
from onboard.spec.loader import SpecError, parse_spec_text
from onboard.targets.cpu_kernels import cpu_speculation_limit

ROOT = Path(__file__).resolve().parents[1]
SPEC_PATH = ROOT / "model_specs" / "kimi-k3-style.yaml"


@pytest.fixture(scope="module")
def spec():
    return load_spec(SPEC_PATH)


@pytest.fixture(scope="module")
def source(spec):
    return render_model(spec)


def _class(source: str, name: str) -> ast.ClassDef:
    tree = ast.parse(source)
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def test_kda_layers_are_vllms_kda_layer(spec, source):
    """The KDA mixer subclasses vLLM's KDA layer and adds only its checkpoint
    loading (no platform branch: vLLM's CPU build lacks the KDA kernels, which
    onboard.runtime.compat supplies to validation), sits at self_attn beside the
    MLA attention, and the hybrid cache is sized by vLLM's KDA calculators."""
    kda = _class(source, "KimiK3StyleDeltaAttention")
    assert [ast.unparse(b) for b in kda.bases] == ["KimiGatedDeltaNetAttention"]
    assert {f.name for f in kda.body if isinstance(f, ast.FunctionDef)} == {
        "__init__",
        "load_weights",
    }
    assert "super().__init__(config, vllm_config, prefix)" in source
    assert "current_platform" not in source and "SimpleNamespace" not in source
    assert "QwenGatedDeltaNetAttention" not in source
    assert "self.linear_attn" not in source
    for call in (
        "MambaStateDtypeCalculator.kda_state_dtype(",
        "MambaStateShapeCalculator.kda_state_shape(",
        "MambaStateCopyFuncCalculator.kda_state_copy_func()",
        "self.self_attn = KimiK3StyleDeltaAttention(",
        'linear_attention=config.layer_types[layer_idx] == "linear_attention"',
    ):
        assert call in source, call


def test_the_config_class_nests_kda_sizes_as_vllms_layer_reads_them(spec, tmp_path):
    """vLLM's KDA layer reads Kimi Linear's nested linear_attn_config: the config
    class generated for the new model type gives it from the flat keys
    config.json has (and config.json itself stays flat)."""
    import importlib.util

    from onboard.generate import generate_files

    files = generate_files(spec)
    path = tmp_path / "config.py"
    path.write_text(files["plugin/onboard_plugin_kimi_k3_style/config.py"])
    module_spec = importlib.util.spec_from_file_location("kda_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.KimiK3StyleConfig(linear_num_heads=2, linear_head_dim=64)
    assert config.linear_attn_config == {
        "num_heads": 2,
        "head_dim": 64,
        "short_conv_kernel_size": spec.linear_attention.conv_kernel_size,
    }
    assert "linear_attn_config" not in config.to_dict()
    for key in ("hidden_size", "hidden_act", "rms_norm_eps"):
        assert hasattr(config, key), key


def test_every_kda_tensor_has_a_home(spec, source):
    """Each KDA checkpoint tensor (its canonical name, as transformers' Kimi
    Linear saves it) is a shard of vLLM's merged projection or convolution in the
    generated load_weights, or a module / parameter vLLM's KDA layer has."""
    kda = _class(source, "KimiK3StyleDeltaAttention")
    load = next(f for f in kda.body if getattr(f, "name", "") == "load_weights")
    shards = {
        shard: (param, sid)
        for param, shard, sid in re.findall(
            r"\('(\w+)', '(\w+)', (\d)\)", ast.unparse(load)
        )
    }
    assert shards == {
        "q_proj": ("in_proj_qkvgfab", "0"),
        "k_proj": ("in_proj_qkvgfab", "1"),
        "v_proj": ("in_proj_qkvgfab", "2"),
        "b_proj": ("in_proj_qkvgfab", "3"),
        "f_a_proj": ("in_proj_qkvgfab", "4"),
        "q_conv1d": ("conv1d", "0"),
        "k_conv1d": ("conv1d", "1"),
        "v_conv1d": ("conv1d", "2"),
    }
    # vLLM's KimiGatedDeltaNetAttention's own modules and parameters.
    own = {"f_b_proj", "g_a_proj", "g_b_proj", "o_norm", "o_proj", "A_log", "dt_bias"}
    layout = LAYOUT_PRESETS["llama"]
    for role in KIMI_DELTA_ROLES:
        leaf = layout[role].removeprefix("model.layers.{layer}.self_attn")
        names = [leaf.lstrip(".")] if leaf else list(PARAM_ROLES.get(role, ()))
        if role == "kda_attn":
            names = ["A_log", "dt_bias"]
        for name in names:
            assert name in shards or name in own, (role, name)
    packed = re.search(r'"in_proj_qkvgfab": \[(.*?)\]', source)
    assert packed and packed.group(1).count('"') == 10


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("norm: {type: rmsnorm, eps: 1.0e-05}", "norm: {type: rmsnorm, eps: 1.0e-06}"),
         "output with eps 1e-05"),
        (("  conv_kernel_size: 4\n",
          "  conv_kernel_size: 4\n  state_dtype: bfloat16\n"),
         "recurrent state in float32"),
    ],
)  # fmt: skip
def test_refuses_what_vllms_kda_layer_computes_otherwise(change, message):
    # A spec rule (located at the field), not generate's refusal: whatever
    # `spec check` accepts, generate handles.
    text = SPEC_PATH.read_text().replace(*change)
    assert text != SPEC_PATH.read_text()
    with pytest.raises(SpecError, match=message):
        parse_spec_text(text)


def _beside_gqa(text: str) -> str:
    mla = text[text.index("  type: mla") : text.index("  layer_types:")]
    return text.replace(mla, "  type: gqa\n  num_heads: 32\n  num_kv_heads: 8\n")


def test_kda_beside_gqa_takes_its_projections_back(source):
    """Beside gqa attention the model's mapper stacks every q/k/v projection as
    qkv_proj (for the attention layers); the KDA layer takes its own back by the
    tensor's shard, which only that model prints."""
    gqa = render_model(parse_spec_text(_beside_gqa(SPEC_PATH.read_text())))
    assert '".q_proj": (".qkv_proj", "q"),' in gqa
    kda = ast.unparse(_class(gqa, "KimiK3StyleDeltaAttention"))
    assert "if module == 'qkv_proj':" in kda
    assert "module = f'{loaded_weight.shard_id}_proj'" in kda
    assert "qkv_proj" not in ast.unparse(_class(source, "KimiK3StyleDeltaAttention"))


def test_plan_state_is_the_kda_layers(spec):
    """The spec's arithmetic the kv-cache check compares with the engine's."""
    plan = build_plan(spec)
    shapes = plan.linear.state_shapes()
    assert shapes.conv == (3 * 32 * 128, 3)
    assert shapes.recurrent == (32, 128, 128)
    assert sum(plan.linear_layers) == 18


def test_serving_plan_counts_the_kda_states(spec):
    """onboard plan (and the new-model report's KV budget) sizes KDA states by
    the same arithmetic: 3 convolutions of 32 x 128 channels, 3 inputs each, in
    bf16, and a 128 x 128 float32 state per head."""
    from onboard.serving import make_deployment

    kv = make_deployment(spec, "b200").kv
    assert kv.state_formula == (
        "Kimi delta attention: conv (3 x 32 x 128) x 3 x 2 B + state 32 x 128 x "
        "128 x 4 B = 2,170,880 B per sequence"
    )
    assert len(kv.states) == 18


def test_speculation_limit_names_kda_only(spec):
    """Speculative decoding on the CPU engine is refused for KDA (beside MLA or
    gqa), where the CPU path keeps one state per sequence; Gated DeltaNet's CPU
    kernels verify drafts."""
    assert "Triton-only" in cpu_speculation_limit(spec)
    beside_gqa = parse_spec_text(_beside_gqa(SPEC_PATH.read_text()))
    assert cpu_speculation_limit(beside_gqa) == cpu_speculation_limit(spec)
    qwen3_next = load_spec(ROOT / "model_specs/qwen3-next-style.yaml")
    assert cpu_speculation_limit(qwen3_next) is None


def test_cpu_shims_for_kda_beside_mla(spec):
    """What vLLM's CPU build needs to run the model lives in
    onboard.runtime.compat, not in the plugin: the KDA kernels in torch, and the
    CPU MLA backend taking the hybrid cache's blocks only where MLA sits beside
    linear attention (vLLM aligns those blocks to 128)."""
    from onboard.generate.plugin import plugin_files
    from onboard.runtime.compat import shims_for

    assert {"kda_torch", "mla_blocks"} <= set(shims_for(spec))
    beside_gqa = parse_spec_text(_beside_gqa(SPEC_PATH.read_text()))
    assert "mla_blocks" not in shims_for(beside_gqa)
    assert "kda_torch" in shims_for(beside_gqa)
    glm5 = load_spec(ROOT / "model_specs/glm-5-style.yaml")
    assert not {"mla_blocks", "kda_torch"} & set(shims_for(glm5))
    init = next(
        v for k, v in plugin_files(spec, "").items() if k.endswith("/__init__.py")
    )
    assert "CPUMLABackend" not in init and "is_cpu" not in init


# ---- on the CPU engine ---------------------------------------------------------


@pytest.mark.engine
def test_kda_beside_mla_runs_on_the_cpu_engine(spec, tmp_path):
    """The tiny kimi-k3-style checkpoint (dense KDA, MoE KDA, MoE MLA layers)
    through the generated plugin on vLLM's CPU engine, in float32: accuracy
    against the float32 reference and the engine's cache accounting (MLA latent
    bytes per token, KDA state bytes per sequence) against the arithmetic; the
    MTP check is not-run with the reason (no KDA state per draft position on
    CPU), never failed."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.validate import validate

    ckpt = write_tiny_checkpoint(spec, tmp_path / "ckpt")
    result = validate(
        ckpt,
        ckpt / "spec.yaml",
        "cpu",
        tmp_path / "out",
        checks="accuracy,kv-cache,spec-decode:mtp",
    )
    accuracy, kv, mtp = result.checks
    assert accuracy.status == "passed", accuracy.details
    assert accuracy.metrics["engine_dtype"] == "float32"
    assert accuracy.metrics["greedy_failed_sequences"] == 0
    assert accuracy.metrics["prompt_logprob_max_abs_diff"] < 1e-3
    assert kv.status == "passed", kv.details
    # (512 + 64) float32 per MLA layer; per KDA layer three convolutions' last 3
    # inputs of 2 heads x 128 channels and 2 heads' 128 x 128 states, float32.
    assert kv.metrics["bytes_per_token"] == 576 * 4
    per_kda = 3 * 256 * 3 * 4 + 2 * 128 * 128 * 4
    assert kv.metrics["state_bytes_per_sequence"] == 2 * per_kda
    assert mtp.status == "not-run"
    assert mtp.details == f"not run on cpu: {cpu_speculation_limit(spec)}"
    assert result.passed
