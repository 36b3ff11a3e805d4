"""The generated vLLM model for Kimi delta attention layers (model_specs/
kimi-k3-style.yaml): vLLM's own KDA layer beside MLA full attention (and beside gqa
attention), its loading of the checkpoint's KDA tensors, its plain-torch CPU path,
the specs it refuses, and validation on the cpu target (KDA beside MLA cannot run
there: an engine error is not-run, with vLLM's own error recorded). The KDA model
beside gqa attention on the CPU engine is in test_kda_engine."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from onboard.arch import build_plan
from onboard.generate import render_model
from onboard.spec import load_spec
from onboard.spec.layouts import KIMI_DELTA_ROLES, LAYOUT_PRESETS, PARAM_ROLES
from onboard.spec.loader import parse_spec_text
from onboard.targets.cpu_kernels import cpu_engine_limit
from onboard.templating import GenerationError
from onboard.validate import harness
from onboard.validate.results import Check

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
    """The KDA mixer subclasses vLLM's KDA layer (no Gated DeltaNet layer; its
    own mixer code is the CPU path only, the other platforms run vLLM's
    _forward), sits at self_attn beside the MLA attention, and the hybrid cache is
    sized by vLLM's KDA calculators."""
    kda = _class(source, "KimiK3StyleDeltaAttention")
    assert [ast.unparse(b) for b in kda.bases] == ["KimiGatedDeltaNetAttention"]
    assert {f.name for f in kda.body if isinstance(f, ast.FunctionDef)} == {
        "__init__",
        "load_weights",
        "_forward",
        "_forward_cpu",
    }
    assert (
        "        if not current_platform.is_cpu():\n"
        "            super()._forward(mixed_qkv, g1, g2, beta, core_attn_out)\n"
        "            return\n"
    ) in source
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
    # vLLM's layer reads Kimi Linear's nested config, fed from the flat keys.
    for key, attr in (
        ("num_heads", "linear_num_heads"),
        ("head_dim", "linear_head_dim"),
        ("short_conv_kernel_size", "linear_conv_kernel_dim"),
    ):
        assert f'"{key}": config.{attr},' in source


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
    text = SPEC_PATH.read_text().replace(*change)
    assert text != SPEC_PATH.read_text()
    with pytest.raises(GenerationError, match=message):
        render_model(parse_spec_text(text))


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
    from onboard.plan import make_plan

    kv = make_plan(spec, "b200").kv
    assert kv.state_formula == (
        "Kimi delta attention: conv (3 x 32 x 128) x 3 x 2 B + state 32 x 128 x "
        "128 x 4 B = 2,170,880 B per sequence"
    )
    assert len(kv.states) == 18


def test_cpu_engine_limit_names_kda_beside_mla_only(spec):
    assert "CPU MLA backend takes 16-token blocks only" in cpu_engine_limit(spec)
    beside_gqa = parse_spec_text(_beside_gqa(SPEC_PATH.read_text()))
    assert cpu_engine_limit(beside_gqa) is None
    assert (
        cpu_engine_limit(load_spec(ROOT / "model_specs/qwen3-next-style.yaml")) is None
    )


def _ctx(spec, tmp_path):
    return harness.RunContext(
        spec=spec,
        model_dir=tmp_path,
        out_dir=tmp_path,
        work_dir=tmp_path,
        plugin=None,
        hf_dir=None,
        prompts=[],
        prompt_note="",
    )


def test_engine_errors_of_a_kda_model_are_not_run(spec, tmp_path, monkeypatch):
    """On cpu an engine error of a KDA model is not-run with vLLM's own error;
    a check that failed on its own terms (no engine error) stays failed, and a
    model without the limit keeps its engine errors as failures."""
    outcomes = {
        "died": RuntimeError("engine worker died"),
        "refused": Check("refused", "failed", {"engine_error": "ValueError: no"}),
        "wrong": Check("wrong", "failed", {"max_logprob_diff": 3.0}, "differs"),
    }

    def runner(ctx, name):
        outcome = outcomes[name]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(harness, "_runner", lambda name: runner)
    ctx = _ctx(spec, tmp_path)
    died = harness._run_check(ctx, "died")
    assert died.status == "not-run"
    assert "CPU MLA" in died.details and "engine worker died" in died.details
    refused = harness._run_check(ctx, "refused")
    assert refused.status == "not-run"
    assert refused.metrics["engine_error"] == "ValueError: no"
    assert harness._run_check(ctx, "wrong").status == "failed"

    ctx.engine_failure = {"error": "RuntimeError: Unsupported block size"}
    load = harness._load_failure_check(ctx, "accuracy")
    assert load.status == "not-run"
    assert "Unsupported block size" in load.details

    other = _ctx(load_spec(ROOT / "model_specs/qwen3-next-style.yaml"), tmp_path)
    assert harness._run_check(other, "died").status == "failed"
    assert harness._run_check(other, "refused").status == "failed"


# ---- on the CPU engine (acceptance tier) -------------------------------------------


@pytest.mark.engine
@pytest.mark.acceptance
def test_cpu_engine_checks_are_not_run_with_vllms_error(spec, tmp_path):
    """The tiny kimi-k3-style checkpoint through the generated plugin on vLLM's
    CPU engine: accuracy and kv-cache are not-run (never failed) with the limit
    and the error vLLM itself gave."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.validate import validate

    ckpt = write_tiny_checkpoint(spec, tmp_path / "ckpt")
    result = validate(
        ckpt,
        ckpt / "spec.yaml",
        "cpu",
        tmp_path / "out",
        checks="accuracy,kv-cache",
    )
    assert [c.status for c in result.checks] == ["not-run", "not-run"]
    accuracy = result.check("accuracy")
    assert accuracy.metrics["cpu_limit"] == cpu_engine_limit(spec)
    assert accuracy.metrics["engine_error"]
    assert "vLLM's own error: " in accuracy.details
    assert not result.passed
