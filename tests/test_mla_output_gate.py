"""MLA's output gate (onboard/components/mla_output_gate.py): the spec field and
its rules, config.json both ways, the checkpoint tensor, both generated models,
parity of the reference with transformers' HY-V4 attention (per element, and per
head as HY-V4's gate with each head's row repeated), and the generated vLLM model
on the CPU engine against the reference (a negated gate fails it)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import generated_engine_run, judge_engine_outputs
from test_generate_ast import check_file, model_file_problems

from onboard.arch import build_plan
from onboard.arch.tensors import plan_tensors
from onboard.components.mla_output_gate import MLAOutputGate
from onboard.generate import generate_files
from onboard.reference import install_reference
from onboard.spec.hf import hf_config_from_spec, spec_from_hf_config
from onboard.spec.layouts import LINEAR_ROLES
from onboard.spec.loader import SpecError, load_spec, parse_spec_text
from onboard.spec.module_tree import used_roles

pytestmark = pytest.mark.usefixtures("one_thread")

# The CPU MLA kernel takes a latent of 576 only (kv_lora_rank 512 + rope 64).
GATED = """
name: tiny-gated-mla
architecture: TinyGatedMlaForCausalLM
model_type: tiny_gated_mla
vocab_size: 512
hidden_size: 256
num_hidden_layers: 3
max_position_embeddings: 512
norm: {type: rmsnorm, eps: 1.0e-06}
attention:
  type: mla
  num_heads: 4
  mla:
    q_lora_rank: 64
    kv_lora_rank: 512
    qk_nope_head_dim: 32
    qk_rope_head_dim: 64
    v_head_dim: 32
    output_gate: PER
rope: {theta: 10000.0}
mlp:
  intermediate_size: 512
"""


def gated(per: str = "element", extra: str = ""):
    return parse_spec_text(GATED.replace("PER", per) + extra)


@pytest.mark.parametrize("per", ["element", "head"])
def test_the_gate_is_in_the_plan_the_config_and_the_checkpoint(per):
    spec = gated(per)
    plan = build_plan(spec)
    gate = plan.layers[0].mixer.part(MLAOutputGate)
    assert gate == MLAOutputGate(per, 4, 32)
    # config.json states it, and reads back to the same spec.
    config = hf_config_from_spec(spec)
    assert config["mla_output_gate"] == per
    assert spec_from_hf_config(config) == spec
    # One gate_proj per layer, [heads x (v_head_dim or 1), hidden], quantizable.
    rows = 4 * (32 if per == "element" else 1)
    tensors = {t.name: t.shape for t in plan_tensors(spec)}
    for layer in range(3):
        name = f"model.layers.{layer}.self_attn.gate_proj.weight"
        assert tensors[name] == (rows, 256)
    assert "mla_gate_proj" in used_roles(spec) and "mla_gate_proj" in LINEAR_ROLES
    ungated = parse_spec_text(GATED.replace("    output_gate: PER\n", ""))
    assert build_plan(ungated).layers[0].mixer.parts == ()
    assert "mla_output_gate" not in hf_config_from_spec(ungated)


@pytest.mark.parametrize(
    ("extra", "what"),
    [
        ("  kv_sharing: {2: 0}\n", "attention.kv_sharing"),
        ("  indexer: {num_heads: 2, head_dim: 64, topk: 8}\n", "attention.indexer"),
    ],
)
def test_what_the_gate_is_not_beside_yet(extra, what):
    text = GATED.replace("PER", "element").replace("rope:", extra + "rope:")
    with pytest.raises(SpecError) as error:
        parse_spec_text(text)
    assert f"attention.mla.output_gate: not expressible beside {what} yet" in str(
        error.value
    )


def test_a_gate_kind_that_does_not_exist_is_located():
    with pytest.raises(SpecError) as error:
        parse_spec_text(GATED.replace("PER", "channel"))
    assert "attention.mla.output_gate" in str(error.value)


@pytest.mark.parametrize("per", ["element", "head"])
def test_both_generated_models_print_the_gate(per):
    """The vLLM model is MLA's direct form (vLLM's MLAAttention, then the gate,
    then o_proj), lint-clean, importing and branching as a PR file may; the
    reference gates the attention output in the same place. Both read the
    gate's kind from the config."""
    spec = gated(per)
    files = generate_files(spec)
    model = files["plugin/onboard_plugin_tiny_gated_mla/tiny_gated_mla.py"]
    hf = files["hf/modeling_tiny_gated_mla.py"]
    assert "MultiHeadLatentAttentionWrapper" not in model
    assert "self.mla_attn = MLAAttention(" in model
    for text in (model, hf):
        assert 'config.mla_output_gate == "element"' in text
        assert "torch.sigmoid(gate)" in text
    gate = model.index("torch.sigmoid(gate)")
    assert model.index("self.mla_attn(") < gate < model.index("self.o_proj(attn")
    assert hf.index("attend(q, k, v") < hf.index("torch.sigmoid(gate)")
    plugin = {p: t for p, t in files.items() if p.startswith("plugin/")}
    problems = [
        problem
        for path, text in plugin.items()
        if path.endswith(".py")
        for problem in check_file(path, text, spec.module_name)
    ]
    problems += model_file_problems("tiny_gated_mla.py", model)
    assert not problems, problems


def test_preflight_checks_the_gate_tensors(tmp_path):
    """A tiny checkpoint of the spec passes preflight; one whose gate is missing
    in a layer, or has per-head rows where the spec says per element, does not."""
    from safetensors.torch import load_file, save_file

    from onboard.checkpoint.preflight import preflight
    from onboard.checkpoint.tiny import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(gated("element"), tmp_path / "ckpt", seed=0)
    spec = load_spec(ckpt / "spec.yaml")  # the tiny checkpoint's own (2 layers)
    assert preflight(spec, ckpt).ok
    gate = "model.layers.{}.self_attn.gate_proj.weight"
    for shard in ckpt.glob("*.safetensors"):
        tensors = load_file(shard)
        tensors.pop(gate.format(0), None)
        if gate.format(1) in tensors:
            tensors[gate.format(1)] = tensors[gate.format(1)][:4].contiguous()
        save_file(tensors, shard, metadata={"format": "pt"})
    report = preflight(spec, ckpt)
    found = {(p.kind, p.message) for p in report.problems}
    assert any("missing" in kind for kind, _ in found), found
    assert any("shape [4, 256], expected [128, 256]" in m for _, m in found), found


# ---- parity with transformers' HY-V4 attention ---------------------------------

HY = dict(
    hidden_size=64,
    num_attention_heads=4,
    q_lora_rank=32,
    kv_lora_rank=48,
    qk_nope_head_dim=16,
    qk_rope_head_dim=16,
    v_head_dim=16,
)
HY_SPEC = f"""
name: hy-gate
architecture: HyGateForCausalLM
model_type: hy_gate
vocab_size: 64
hidden_size: {HY["hidden_size"]}
num_hidden_layers: 1
max_position_embeddings: 256
norm: {{type: rmsnorm, eps: 1.0e-06}}
attention:
  type: mla
  num_heads: {HY["num_attention_heads"]}
  mla:
    q_lora_rank: {HY["q_lora_rank"]}
    kv_lora_rank: {HY["kv_lora_rank"]}
    qk_nope_head_dim: {HY["qk_nope_head_dim"]}
    qk_rope_head_dim: {HY["qk_rope_head_dim"]}
    v_head_dim: {HY["v_head_dim"]}
    output_gate: PER
rope: {{theta: 10000.0}}
mlp: {{intermediate_size: 96}}
"""


def _hy_v4_attention(seq: int):
    """transformers' HY-V4 attention (MLA with an element-wise output gate, a
    learned sink and the DSA indexer): sinks at -1e4 take no share of any
    softmax, and an index top-k past the context picks every key, so what is
    left is gated MLA."""
    from transformers.models.hy_v4.modeling_hy_v4 import (
        HYV4Attention,
        HYV4Config,
        HYV4RotaryEmbedding,
    )

    config = HYV4Config(
        **HY,
        vocab_size=64,
        num_hidden_layers=1,
        rms_norm_eps=1e-6,
        index_topk=4 * seq,
        index_head_dim=32,
        index_n_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attention = HYV4Attention(config, layer_idx=0).float().eval()
    with torch.no_grad():
        for name, param in attention.named_parameters():
            if "layernorm" in name:
                param.copy_(1 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(0.2 * torch.randn_like(param))
        attention.sinks.fill_(-1e4)
    return attention, HYV4RotaryEmbedding(config)


def _reference_attention(tmp_path, per: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = parse_spec_text(HY_SPEC.replace("PER", per))
    ckpt = tmp_path / per
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(hf_config_from_spec(spec)))
    install_reference(spec, ckpt)
    config = AutoConfig.from_pretrained(ckpt, trust_remote_code=True)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    return model.float().eval()


def _run_reference(model, x):
    """The reference model's first attention layer on ``x`` (its own rope and
    mask, as its forward gives them): the layer's output."""
    captured = {}
    layer = model.model.layers[0]

    def feed(module, args, kwargs):
        # Replace the attention's input by x; keep everything else it gets.
        return (x, *args[1:]), kwargs

    def keep(module, args, kwargs, output):
        captured["out"] = output

    hooks = [
        layer.self_attn.register_forward_pre_hook(feed, with_kwargs=True),
        layer.self_attn.register_forward_hook(keep, with_kwargs=True),
    ]
    try:
        with torch.no_grad():
            model(torch.zeros(x.shape[:2], dtype=torch.long))
    finally:
        for hook in hooks:
            hook.remove()
    return captured["out"]


@pytest.mark.parametrize("per", ["element", "head"])
def test_the_reference_gate_is_hy_v4s(tmp_path, per):
    """The generated reference's gated MLA layer gives transformers'
    HYV4Attention's output on the same weights (float32); per head, HY-V4's
    element gate with each head's gate row repeated v_head_dim times is the
    same function. Without the gate the outputs differ."""
    seq = 12
    hy, rope = _hy_v4_attention(seq)
    ref = _reference_attention(tmp_path, per)
    attn = ref.model.layers[0].self_attn
    weights = {
        name: param
        for name, param in hy.named_parameters()
        if not name.startswith("indexer.") and name != "sinks"
    }
    if per == "head":
        head_rows = torch.randn(HY["num_attention_heads"], HY["hidden_size"]) * 0.2
        with torch.no_grad():
            hy.gate_proj.weight.copy_(
                head_rows.repeat_interleave(HY["v_head_dim"], dim=0)
            )
        weights["gate_proj.weight"] = head_rows
    own = dict(attn.named_parameters())
    assert set(own) == set(weights), (sorted(own), sorted(weights))
    with torch.no_grad():
        for name, param in own.items():
            param.copy_(weights[name])

    x = torch.randn(
        2, seq, HY["hidden_size"], generator=torch.Generator().manual_seed(1)
    )
    positions = torch.arange(seq)[None].expand(2, -1)
    causal = (
        torch.full((seq, seq), float("-inf")).triu(1)[None, None].expand(2, 1, -1, -1)
    )
    with torch.no_grad():
        want, _, _ = hy(x, rope(x, positions), causal, position_ids=positions)
    got = _run_reference(ref, x)
    assert (got - want).abs().max() < 1e-5 * want.abs().max()

    # The gate matters: without it the outputs are far apart. (A zero gate
    # weight makes every gate sigmoid(0) = 1/2: twice that output is ungated.)
    with torch.no_grad():
        hy.gate_proj.weight.zero_()
        half, _, _ = hy(x, rope(x, positions), causal, position_ids=positions)
    assert (2 * half - want).abs().max() > 1e-2 * want.abs().max()


# ---- the generated vLLM model on the CPU engine --------------------------------


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("gate-engine")
    return generated_engine_run(gated("element"), work, every=2)


@pytest.mark.engine
def test_the_gated_model_on_the_engine_matches_the_reference(engine_run):
    """The generated model (MLA's direct form with the gate, vLLM's CPU MLA
    backend) on the CPU engine against the float32 reference by the accuracy
    check's rule; the same engine outputs against the reference of the
    checkpoint with every gate_proj negated (sigmoid(-g) = 1 - sigmoid(g)) fail
    it."""
    from onboard.runtime.compare import PROMPT_LOGPROB_ATOL
    from onboard.runtime.reference import load_reference

    spec, ckpt, work, prompts, info, outputs = engine_run
    assert info["model_class"] == (
        "onboard_plugin_tiny_gated_mla.tiny_gated_mla.TinyGatedMlaForCausalLM"
    )
    ref = load_reference(ckpt, spec, work / "gen" / "hf", work / "ref")

    def verdict():
        return judge_engine_outputs(outputs, ref.model, prompts)

    good = verdict()
    assert good.passed, good.details
    assert good.metrics["prompt_logprob_max_abs_diff"] < 1e-3
    gates = [p for n, p in ref.model.named_parameters() if "self_attn.gate_proj" in n]
    assert len(gates) == spec.num_hidden_layers
    with torch.no_grad():
        for gate in gates:
            gate.neg_()
    negated = verdict()
    print(f"gated MLA on the engine: {good.details}; gate negated: {negated.details}")
    assert not negated.passed
    assert negated.metrics["prompt_logprob_max_abs_diff"] > 10 * PROMPT_LOGPROB_ATOL
