"""Kimi delta attention (Kimi Linear's linear attention) as a token mixer.

The generated Hugging Face reference against transformers' Kimi Linear on the same
weights (float32): KDA layers beside MLA layers without rope, MoE with sigmoid
routing, bias correction and a shared expert, at Kimi's rms_norm_eps 1e-5 with
the MLA latent normalised at 1e-6 as transformers does (attention.mla.
latent_norm_eps); the reference's chunked form of the Kimi delta rule against its
recurrent form (the definition) and transformers' torch forms; its gated norm
against vLLM's own (native path); the plan's state shapes against vLLM's own
calculator; preflight, quantization, spec rules and the config round trip.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from onboard.arch import KimiDeltaAttention, build_plan
from onboard.arch.tensors import plan_tensors
from onboard.reference import generate_hf_reference, install_reference
from onboard.spec.hf import hf_config_from_spec, spec_from_hf_config
from onboard.spec.loader import parse_spec_text
from onboard.spec.model import ModelSpec
from onboard.spec.rules import check_rules

RTOL = 1e-4
VOCAB = 256

# A new model type with Kimi Linear's blocks, under the names transformers'
# KimiLinearForCausalLM saves (the MLP of every layer under block_sparse_moe).
KDA_SPEC = """
name: kda-ref
architecture: KdaRefForCausalLM
model_type: kda_ref
vocab_size: 256
hidden_size: 64
num_hidden_layers: 4
max_position_embeddings: 256
norm: {eps: 1.0e-5}
attention:
  type: mla
  num_heads: 4
  mla:
    q_lora_rank: null
    kv_lora_rank: 32
    qk_nope_head_dim: 32
    qk_rope_head_dim: 16
    v_head_dim: 32
    latent_norm_eps: 1.0e-6
  layer_types: [linear_attention, full_attention, linear_attention, full_attention]
rope: {nope_layers: [1, 3]}
linear_attention:
  type: kimi_delta
  num_key_heads: 2
  num_value_heads: 2
  key_head_dim: 32
  value_head_dim: 32
mlp:
  intermediate_size: 96
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 32
    num_shared_experts: 1
    first_k_dense: 1
    router:
      scoring: sigmoid
      norm_topk_prob: true
      bias_correction: true
      routed_scaling_factor: 2.446
checkpoint:
  layout: mixtral
  tensor_names:
    gate_proj: model.layers.{layer}.block_sparse_moe.gate_proj
    up_proj: model.layers.{layer}.block_sparse_moe.up_proj
    down_proj: model.layers.{layer}.block_sparse_moe.down_proj
    shared_gate_proj: model.layers.{layer}.block_sparse_moe.shared_experts.gate_proj
    shared_up_proj: model.layers.{layer}.block_sparse_moe.shared_experts.up_proj
    shared_down_proj: model.layers.{layer}.block_sparse_moe.shared_experts.down_proj
"""


pytestmark = pytest.mark.usefixtures("one_thread")


def kda_spec(text: str = KDA_SPEC) -> ModelSpec:
    return parse_spec_text(text)


def kimi_linear(seed: int = 0):
    """A small random transformers Kimi Linear (two KDA layers, two MLA layers,
    a dense first layer, then MoE with a shared expert), its norms, time-step
    biases and router bias randomised so that each one matters."""
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    torch.manual_seed(seed)
    config = KimiLinearConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        linear_head_dim=32,
        linear_num_heads=2,
        max_position_embeddings=256,
        # Kimi Linear's own; transformers normalises the MLA latent with eps 1e-6
        # whatever it says (the spec's attention.mla.latent_norm_eps).
        rms_norm_eps=1e-5,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        layer_types=[
            "linear_attention",
            "full_attention",
            "linear_attention",
            "full_attention",
        ],
    )
    model = KimiLinearForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(("norm.weight", "dt_bias", "e_score_correction_bias")):
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.5)
    return model


def load_reference(ckpt: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        ckpt, trust_remote_code=True, dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"], info["unexpected_keys"]
    return model.eval()


def as_kda_checkpoint(model, spec: ModelSpec, ckpt: Path) -> None:
    """``model``'s weights (saved in Kimi Linear's own names) under ``spec``'s
    config and reference."""
    model.save_pretrained(ckpt)
    (ckpt / "config.json").write_text(json.dumps(hf_config_from_spec(spec)))
    install_reference(spec, ckpt)


# ---- the reference against transformers ----------------------------------------------


def test_reference_matches_transformers_kimi_linear(tmp_path):
    """KDA layers (three convolutions, per-channel decay from the low-rank forget
    gate, delta rule, sigmoid-gated norm) and MLA layers without rope, on Kimi
    Linear's own weights: prompts of one chunk and of three (the chunked form),
    then cached greedy decoding (the recurrent form, the convolutions' cached
    inputs, the MLA latent cache)."""
    model = kimi_linear()
    spec = kda_spec()
    as_kda_checkpoint(model, spec, tmp_path)
    ref = load_reference(tmp_path)
    assert type(ref).__module__.endswith("modeling_kda_ref")
    for seq in (24, 150):
        ids = torch.randint(
            0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(1)
        )
        with torch.no_grad():
            want, got = model(ids).logits, ref(ids).logits
        rel = ((got - want).abs().max() / want.abs().max()).item()
        assert rel < RTOL, f"{seq} tokens: logits differ by {rel:.2e}"
    ids = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=12, do_sample=False)
        got = ref.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(want, got)


def test_a_dropped_decay_channel_split_shows(tmp_path):
    """The decay is per key channel: a checkpoint whose dt_bias is permuted within
    a head (a per-head decay would not notice) changes the logits."""
    model = kimi_linear(seed=4)
    spec = kda_spec()
    as_kda_checkpoint(model, spec, tmp_path)
    ref = load_reference(tmp_path)
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids).logits
        bias = ref.model.layers[0].self_attn.dt_bias
        bias.copy_(bias.view(2, 32).flip(-1).reshape(-1))
        got = ref(ids).logits
    assert ((got - want).abs().max() / want.abs().max()).item() > 1e-3


# ---- the reference's two forms of the Kimi delta rule --------------------------------


def _reference_module(tmp_path: Path):
    """The generated modeling module of the KDA spec, imported."""
    written = generate_hf_reference(kda_spec(), tmp_path)
    modeling = next(p for p in written if p.name.startswith("modeling_"))
    package = tmp_path.name
    sys.path.insert(0, str(tmp_path.parent))
    try:
        init = tmp_path / "__init__.py"
        init.write_text("")
        parent = importlib.util.spec_from_file_location(package, init)
        sys.modules[package] = importlib.util.module_from_spec(parent)
        spec = importlib.util.spec_from_file_location(
            f"{package}.{modeling.stem}", modeling
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(tmp_path.parent))


@pytest.mark.parametrize("seq", [1, 37, 64, 150])
def test_chunked_form_matches_the_recurrence(tmp_path, seq):
    """Within one chunk, at a chunk's edge and over three chunks, from a nonzero
    state, with a decay per key channel: the same outputs and final state as the
    token-by-token recurrence."""
    module = _reference_module(tmp_path / f"kref{seq}")
    gen = torch.Generator().manual_seed(seq)
    b, h, dk, dv = 2, 3, 16, 8
    q = torch.nn.functional.normalize(torch.randn(b, h, seq, dk, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(b, h, seq, dk, generator=gen), dim=-1)
    v = torch.randn(b, h, seq, dv, generator=gen)
    g = -torch.rand(b, h, seq, dk, generator=gen) * 2  # log decays in (-2, 0]
    beta = torch.rand(b, h, seq, generator=gen)
    state = torch.randn(b, h, dk, dv, generator=gen)
    want, want_state = module.recurrent_delta_rule(q, k, v, g, beta, state)
    got, got_state = module.chunked_delta_rule(q, k, v, g, beta, state)
    assert (got - want).abs().max().item() < 1e-4
    assert (got_state - want_state).abs().max().item() < 1e-4


def test_reference_rule_matches_transformers_torch_forms(tmp_path):
    """The reference's Kimi delta rule and transformers' own torch forms of it
    (chunked and recurrent, L2 norm and scale inside) agree on the same inputs."""
    from transformers.models.kimi_linear import modeling_kimi_linear as kimi

    module = _reference_module(tmp_path / "kref")
    gen = torch.Generator().manual_seed(11)
    b, s, h, d = 2, 70, 3, 16
    q, k, v = (torch.randn(b, s, h, d, generator=gen) for _ in range(3))
    g = -torch.rand(b, s, h, d, generator=gen) * 2
    beta = torch.rand(b, s, h, generator=gen)
    qn = module.l2_normalize(q) * d**-0.5
    kn = module.l2_normalize(k)
    heads_first = [x.transpose(1, 2) for x in (qn, kn, v, g, beta)]
    state = torch.zeros(b, h, d, d)
    got, got_state = module.recurrent_delta_rule(*heads_first, state)
    got = got.transpose(1, 2)
    for form in (kimi.chunk_kimi_delta_attention, kimi.recurrent_kimi_delta_attention):
        want, want_state = form(
            q,
            k,
            v,
            g=g,
            beta=beta,
            initial_state=None,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        assert (got - want).abs().max().item() < 1e-4, form.__name__
        assert (got_state - want_state).abs().max().item() < 1e-4, form.__name__


# ---- plan, tensors, rules, config --------------------------------------------------


def test_state_shapes_are_vllms():
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

    plan = build_plan(kda_spec())
    lin = plan.linear
    assert isinstance(lin, KimiDeltaAttention)
    for tp, spec_tokens in ((1, 0), (2, 3)):
        conv, recurrent = MambaStateShapeCalculator.kda_state_shape(
            tp,
            lin.num_heads,
            lin.head_dim,
            conv_kernel_size=lin.conv_kernel_size,
            num_spec=spec_tokens,
        )
        shapes = lin.state_shapes(tp, spec_tokens)
        assert sorted(shapes.conv) == sorted(conv)
        assert shapes.recurrent == tuple(recurrent)


def test_tensor_plan_has_kimi_lineare_shapes():
    """The tiny checkpoint's KDA tensors have the shapes Kimi Linear saves."""
    model = kimi_linear()
    tmp = {p.name: p.shape for p in plan_tensors(kda_spec())}
    import tempfile

    from safetensors import safe_open

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        with safe_open(f"{d}/model.safetensors", "pt") as f:
            saved = {k: tuple(f.get_tensor(k).shape) for k in f.keys()}  # noqa: SIM118
    assert tmp == saved


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("num_value_heads: 2", "num_value_heads: 4", "num_value_heads"),
        ("value_head_dim: 32", "value_head_dim: 64", "value_head_dim"),
        ("type: kimi_delta", "type: kimi_delta\n  projections: split", "projections"),
    ],
)
def test_rules(old, new, field):
    """Kimi delta attention's heads are key and value heads at once."""
    assert not check_rules(kda_spec())
    spec = ModelSpec.model_validate(yaml.safe_load(KDA_SPEC.replace(old, new)))
    assert any(path[-1] == field for path, _ in check_rules(spec))


def test_config_round_trip():
    spec = kda_spec()
    config = hf_config_from_spec(spec)
    assert config["linear_attention_type"] == "kimi_delta"
    assert config["linear_num_heads"] == 2 and config["linear_head_dim"] == 32
    back = spec_from_hf_config(config)
    assert back.linear_attention == spec.linear_attention
    assert back.attention.layer_types == spec.attention.layer_types


# ---- preflight and quantization --------------------------------------------------


def test_preflight_knows_kimi_linears_tensors(tmp_path):
    """A checkpoint transformers' Kimi Linear saved has every KDA tensor at the
    shape preflight expects (no shape or name error); A_log stored as the rates
    -exp(A_log) (every value negative) is the decay's conversion mistake."""
    from safetensors.torch import load_file, save_file

    from onboard.checkpoint.preflight import preflight

    spec = kda_spec()
    as_kda_checkpoint(kimi_linear(), spec, tmp_path)
    errors = [p for p in preflight(spec, tmp_path).problems if p.severity == "error"]
    assert not errors, errors
    kinds = {p.kind for p in preflight(spec, tmp_path).problems}
    assert "cpu-kda" in kinds
    shard = next(tmp_path.glob("*.safetensors"))
    tensors = load_file(shard)
    for name in [n for n in tensors if n.endswith(".A_log")]:
        tensors[name] = -tensors[name].exp()
    save_file(tensors, shard, metadata={"format": "pt"})
    problems = preflight(spec, tmp_path).problems
    assert any(p.kind == "linear-decay" and p.severity == "error" for p in problems)


def test_quantize_keeps_the_recurrence_in_16_bits(tmp_path):
    """NVFP4 quantizes the output projection of KDA layers; q/k/v (one merged
    Linear with beta and f_a in vLLM's KDA layer), the convolutions, A_log,
    dt_bias, the gated norm, the low-rank gates and beta stay 16-bit (and the
    kept Linears' modules go to the ignore list)."""
    from onboard.quantize.schemes import get_scheme
    from onboard.quantize.selection import make_selection

    spec = kda_spec()
    as_kda_checkpoint(kimi_linear(), spec, tmp_path)
    plan = make_selection(tmp_path, spec, get_scheme("nvfp4"))
    attn = "model.layers.0.self_attn"
    assert f"{attn}.o_proj.weight" in plan.quantized
    for name in ("q_proj", "k_proj", "v_proj", "q_conv1d", "k_conv1d", "v_conv1d",
                 "o_norm", "f_a_proj", "f_b_proj", "b_proj", "g_a_proj",
                 "g_b_proj"):  # fmt: skip
        assert f"{attn}.{name}.weight" in plan.kept
    assert {f"{attn}.A_log", f"{attn}.dt_bias"} <= set(plan.kept)
    assert {f"{attn}.{p}" for p in ("q_proj", "k_proj", "v_proj", "f_a_proj", "b_proj",
            "f_b_proj", "g_a_proj")} <= set(plan.ignore)  # fmt: skip


def test_gated_norm_is_vllms(tmp_path):
    """The reference's gated norm computes what vLLM's KDA layer's o_norm
    (FusedRMSNormGated, sigmoid gate) computes in its native torch path, at the
    eps vLLM builds it with (its default 1e-5, whatever rms_norm_eps says)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.third_party.flash_linear_attention.ops.kda import FusedRMSNormGated

    module = _reference_module(tmp_path / "kref")
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, 2, 32, generator=gen)
    gate = torch.randn(3, 7, 2, 32, generator=gen)
    weight = torch.randn(32, generator=gen)
    ours = module.GatedRMSNorm(32, 1e-5, torch.sigmoid)
    with set_current_vllm_config(VllmConfig()):  # a CustomOp reads it
        theirs = FusedRMSNormGated(32, activation="sigmoid")
    assert theirs.eps == 1e-5
    with torch.no_grad():
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
        want = theirs.forward_native(x, gate)
        got = ours(x, gate)
    assert (got - want).abs().max().item() < 1e-6
