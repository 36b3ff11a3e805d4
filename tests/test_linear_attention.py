"""Linear-attention token mixers (Gated DeltaNet, the Qwen3-Next form).

Three kinds of parity: the generated Hugging Face reference against transformers'
Qwen3-Next on the same weights (float32); the reference's chunked form of the
gated delta rule against its recurrent form (the definition); and the generated
vLLM model on the CPU engine against the reference (one engine start, with the
kv-cache check's state accounting read from the same run; an engine start of its
own, so the engine tests are in the acceptance tier). Besides: the plan's
state shapes are vLLM's own, tiny checkpoints keep a layer of each kind, and
preflight catches the decay's two known conversion mistakes.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import generated_engine_run, judge_engine_outputs
from safetensors.torch import load_file, save_file

from onboard.arch import build_plan
from onboard.checkpoint.preflight import preflight
from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.reference import generate_hf_reference, install_reference
from onboard.serving.kv import kv_report
from onboard.spec.hf import hf_config_from_spec, spec_from_hf_config
from onboard.spec.loader import load_spec, parse_spec_text
from onboard.spec.model import ModelSpec
from onboard.spec.rules import check_rules
from onboard.spec.shrink import shrink_spec

ROOT = Path(__file__).parents[1]
RTOL = 1e-4
VOCAB = 256

# A hybrid model of a new model type with Qwen3-Next's blocks and tensor names
# (norms scale by weight here; Qwen3-Next's own scale by 1 + weight).
HYBRID = """
name: hybrid-ref
architecture: HybridRefForCausalLM
model_type: hybrid_ref
vocab_size: 256
hidden_size: 64
num_hidden_layers: 4
max_position_embeddings: 256
norm: {eps: 1.0e-6}
attention:
  num_heads: 4
  num_kv_heads: 2
  head_dim: 32
  qk_norm: true
  output_gate: true
  partial_rotary_factor: 0.25
  layer_types: [linear_attention, linear_attention, linear_attention, full_attention]
linear_attention:
  num_key_heads: 2
  num_value_heads: 4
  key_head_dim: 64
  value_head_dim: 64
  projections: PROJECTIONS
mlp:
  intermediate_size: 96
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 32
    num_shared_experts: 1
    shared_expert_intermediate_size: 48
    shared_expert_gate: true
checkpoint: {layout: qwen}
"""


pytestmark = pytest.mark.usefixtures("one_thread")


def hybrid(projections: str = "grouped") -> ModelSpec:
    return parse_spec_text(HYBRID.replace("PROJECTIONS", projections))


def qwen3_next(seed: int = 0):
    """A small random transformers Qwen3-Next (three GDN layers, one gated
    attention layer, MoE with a gated shared expert), its norms and time-step
    biases randomised so that each one matters."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_hidden_layers=4,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        max_position_embeddings=256,
    )
    model = Qwen3NextForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(("norm.weight", "dt_bias")):
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


def as_hybrid_checkpoint(model, spec: ModelSpec, ckpt: Path) -> None:
    """``model``'s weights under ``spec``'s config and reference; Qwen3-Next's
    (1 + weight) norms become plain weights (its gated norm is one already)."""
    model.save_pretrained(ckpt)
    (ckpt / "config.json").write_text(json.dumps(hf_config_from_spec(spec)))
    for shard in ckpt.glob("*.safetensors"):
        tensors = load_file(shard)
        for name in tensors:
            if name.endswith("norm.weight") and ".linear_attn." not in name:
                tensors[name] = tensors[name] + 1
        save_file(tensors, shard, metadata={"format": "pt"})
    # Onboard's own reference: the spec is Qwen3-Next across the norms' bridge,
    # whose modular reference would be transformers' class itself.
    install_reference(spec, ckpt, standalone=True)


# ---- the reference against transformers ----------------------------------------------


def test_reference_matches_transformers_qwen3_next(tmp_path):
    """Gated DeltaNet layers (grouped projections, convolution, decay, delta rule,
    gated norm) and gated attention, on Qwen3-Next's own weights: prompts of one
    chunk and of three (the chunked form), then cached greedy decoding (the
    recurrent form, the convolution's cached inputs)."""
    model = qwen3_next()
    spec = hybrid()
    as_hybrid_checkpoint(model, spec, tmp_path)
    ref = load_reference(tmp_path)
    assert type(ref).__module__.endswith("modeling_hybrid_ref")
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


def test_reference_split_projections_match_grouped_ones(tmp_path):
    """Qwen3.5 stores the projections split (in_proj_qkv, in_proj_z, in_proj_b,
    in_proj_a); the same weights regrouped give the same logits."""
    model = qwen3_next(seed=3)
    grouped, split = tmp_path / "grouped", tmp_path / "split"
    as_hybrid_checkpoint(model, hybrid(), grouped)
    spec = hybrid("split")
    as_hybrid_checkpoint(model, spec, split)
    for shard in split.glob("*.safetensors"):
        tensors = load_file(shard)
        for name in [n for n in tensors if ".in_proj_" in n]:
            tensors.update(_split_projection(name, tensors.pop(name), k=2, v=4))
        save_file(tensors, shard, metadata={"format": "pt"})
    ids = torch.randint(0, VOCAB, (2, 70), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = load_reference(grouped)(ids).logits
        got = load_reference(split)(ids).logits
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-6


def _split_projection(name: str, w: torch.Tensor, k: int, v: int) -> dict:
    """Qwen3-Next's grouped rows (per key head: q, k, v, z; b, a) as Qwen3.5's."""
    module = name.rsplit(".", 2)[0]
    per = v // k
    if name.endswith("in_proj_qkvz.weight"):
        dk = dv = 64
        g = w.view(k, 2 * dk + 2 * per * dv, -1)
        q, kk, vv, z = g.split([dk, dk, per * dv, per * dv], dim=1)
        flat = [t.reshape(-1, w.shape[1]) for t in (q, kk, vv, z)]
        return {
            f"{module}.in_proj_qkv.weight": torch.cat(flat[:3]),
            f"{module}.in_proj_z.weight": flat[3],
        }
    g = w.view(k, 2 * per, -1)
    b, a = g.split([per, per], dim=1)
    return {
        f"{module}.in_proj_b.weight": b.reshape(-1, w.shape[1]),
        f"{module}.in_proj_a.weight": a.reshape(-1, w.shape[1]),
    }


# ---- the reference's two forms of the gated delta rule -------------------------------


def _reference_module(tmp_path: Path):
    """The generated modeling module of the hybrid spec, imported."""
    written = generate_hf_reference(hybrid(), tmp_path, standalone=True)
    modeling = next(p for p in written if p.name.startswith("modeling_"))
    package = tmp_path.name
    sys.path.insert(0, str(tmp_path.parent))
    try:
        spec = importlib.util.spec_from_file_location(
            f"{package}.{modeling.stem}",
            modeling,
            submodule_search_locations=None,
        )
        init = tmp_path / "__init__.py"
        init.write_text("")
        parent = importlib.util.spec_from_file_location(package, init)
        sys.modules[package] = importlib.util.module_from_spec(parent)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(tmp_path.parent))


@pytest.mark.parametrize("seq", [1, 37, 64, 150])
def test_chunked_form_matches_the_recurrence(tmp_path, seq):
    """Within one chunk, at a chunk's edge and over three chunks, from a nonzero
    state: the same outputs and final state as the token-by-token recurrence."""
    module = _reference_module(tmp_path / f"ref{seq}")
    gen = torch.Generator().manual_seed(seq)
    b, h, dk, dv = 2, 3, 16, 8
    q = torch.nn.functional.normalize(torch.randn(b, h, seq, dk, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(b, h, seq, dk, generator=gen), dim=-1)
    v = torch.randn(b, h, seq, dv, generator=gen)
    # log decays in (-2, 0], one per head (broadcast over the key channels)
    g = -torch.rand(b, h, seq, 1, generator=gen) * 2
    beta = torch.rand(b, h, seq, generator=gen)
    state = torch.randn(b, h, dk, dv, generator=gen)
    want, want_state = module.recurrent_delta_rule(q, k, v, g, beta, state)
    got, got_state = module.chunked_delta_rule(q, k, v, g, beta, state)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    assert torch.allclose(got_state, want_state, atol=1e-5, rtol=1e-4)
    # A wrong decay shows: the chunked form is not trivially equal to anything.
    _, other = module.chunked_delta_rule(q, k, v, g * 2, beta, state)
    assert not torch.allclose(other, want_state, atol=1e-3)


# ---- spec, plan, config --------------------------------------------------------------


def test_state_shapes_are_vllms():
    """The plan's per-sequence state is what vLLM's calculator allocates, with
    and without speculative tokens and tensor parallelism."""
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

    spec = load_spec(ROOT / "model_specs/qwen3-next-style.yaml")
    lin = build_plan(spec).linear
    assert lin is not None
    for tp, spec_tokens in ((1, 0), (2, 0), (4, 3)):
        conv, recurrent = MambaStateShapeCalculator.gated_delta_net_state_shape(
            tp, 16, 32, 128, 128, 4, spec_tokens
        )
        shapes = lin.state_shapes(tp, spec_tokens)
        assert sorted(conv) == sorted(shapes.conv)
        assert tuple(recurrent) == shapes.recurrent
    kv = kv_report(spec, "bfloat16")
    # 36 GDN layers: conv 8192 x 3 x 2 B + state 32 x 128 x 128 x 4 B each.
    assert len(kv.states) == 36 and len(kv.layers) == 12
    assert kv.state_bytes_per_sequence == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)
    assert kv.bytes_per_request(1000) == 1000 * kv.bytes_per_token + (
        kv.state_bytes_per_sequence
    )


def test_config_round_trip_and_rules():
    for projections in ("grouped", "split"):
        spec = hybrid(projections)
        back = spec_from_hf_config(hf_config_from_spec(spec), name=spec.name)
        assert back.linear_attention == spec.linear_attention
        assert back.attention.layer_types == spec.attention.layer_types
        assert back.attention.output_gate
    bad = HYBRID.replace("PROJECTIONS", "grouped").replace(
        "num_value_heads: 4", "num_value_heads: 3"
    )
    assert ("linear_attention", "num_value_heads") in _rules(bad)
    gelu = HYBRID.replace("PROJECTIONS", "grouped") + "activation: gelu\n"
    assert ("activation",) in _rules(gelu)
    orphan = HYBRID.replace("PROJECTIONS", "grouped").replace(
        "linear_attention, linear_attention, linear_attention, full_attention",
        "full_attention, full_attention, full_attention, full_attention",
    )
    assert ("linear_attention",) in _rules(orphan)
    scaled = HYBRID.replace("PROJECTIONS", "grouped") + "residual_multiplier: 0.5\n"
    assert ("residual_multiplier",) in _rules(scaled)


def test_from_hf_reads_qwen3_next_norms_as_unit_offset():
    """Qwen3-Next's config reads as this spec with norms that scale by 1 + weight
    (`norm.unit_offset`); its linear-attention layers' gated norm stays plain
    (tests/test_prove.py proves the family against transformers)."""
    config = qwen3_next().config.to_dict()
    spec = spec_from_hf_config(config)
    assert spec.norm.unit_offset
    assert spec.linear_attention.projections == "grouped"


def _rules(text: str) -> dict:
    return dict(check_rules(ModelSpec.model_validate(yaml.safe_load(text))))


def test_tiny_checkpoint_keeps_each_layer_kind():
    """The bundled Qwen3-Next-style spec shrinks to a GDN layer and a gated
    attention layer; the kernel-bound dims stay, the heads shrink."""
    spec = load_spec(ROOT / "model_specs/qwen3-next-style.yaml")
    tiny = shrink_spec(spec)
    assert tiny.attention.layer_types == ["linear_attention", "full_attention"]
    lin = tiny.linear_attention
    assert (lin.key_head_dim, lin.value_head_dim, lin.conv_kernel_size) == (128, 128, 4)
    assert (lin.num_key_heads, lin.num_value_heads) == (2, 4)


# ---- preflight: the decay's conversion mistakes -------------------------------------


@pytest.fixture(scope="module")
def tiny_hybrid(tmp_path_factory) -> tuple[ModelSpec, Path]:
    ckpt = tmp_path_factory.mktemp("hybrid") / "ckpt"
    write_tiny_checkpoint(hybrid(), ckpt, seed=0)
    return load_spec(ckpt / "spec.yaml"), ckpt


def _edited(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(dst / shard)
        edit(tensors)
        save_file(tensors, dst / shard, metadata={"format": "pt"})
        index["weight_map"] = {
            **{
                n: f
                for n, f in index["weight_map"].items()
                if n in tensors or f != shard
            },
            **dict.fromkeys(tensors, shard),
        }
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def _kinds(report) -> dict[str, str]:
    return {p.where: p.message for p in report.problems if p.kind == "linear-decay"}


def test_preflight_passes_the_tiny_checkpoint(tiny_hybrid):
    spec, ckpt = tiny_hybrid
    report = preflight(spec, ckpt)
    assert report.ok, report.lines()


def test_preflight_catches_rates_stored_as_log_rates(tiny_hybrid, tmp_path):
    """A = -exp(A_log) under A_log's name (the A_log -> A conversion wrong)."""
    spec, ckpt = tiny_hybrid

    def to_rates(tensors):
        for name in [n for n in tensors if n.endswith(".A_log")]:
            tensors[name] = -tensors[name].float().exp()

    report = preflight(spec, _edited(ckpt, tmp_path / "rates", to_rates))
    found = _kinds(report)
    assert not report.ok
    assert any("every A_log value is negative" in m for m in found.values()), found


def test_preflight_catches_a_tensor_of_rates(tiny_hybrid, tmp_path):
    spec, ckpt = tiny_hybrid

    def renamed(tensors):
        for name in [n for n in tensors if n.endswith(".A_log")]:
            tensors[name.removesuffix("_log")] = -tensors.pop(name).float().exp()

    report = preflight(spec, _edited(ckpt, tmp_path / "named", renamed))
    found = _kinds(report)
    assert any("A_log -> A conversion is missing" in m for m in found.values()), found
    # The missing A_log and the unexpected A are one problem, not three.
    assert not [p for p in report.problems if p.kind in ("missing", "unexpected")]


def test_preflight_catches_a_doubled_time_step_bias(tiny_hybrid, tmp_path):
    """dt_bias folded into the projection that gives a, and kept as well."""
    spec, ckpt = tiny_hybrid

    def doubled(tensors):
        for name in [n for n in tensors if n.endswith(".in_proj_ba.weight")]:
            bias = torch.zeros(tensors[name].shape[0], dtype=tensors[name].dtype)
            tensors[name.replace(".weight", ".bias")] = bias

    report = preflight(spec, _edited(ckpt, tmp_path / "doubled", doubled))
    found = _kinds(report)
    assert any("add the time-step bias twice" in m for m in found.values()), found


def test_preflight_names_the_output_gate(tiny_hybrid, tmp_path):
    spec, ckpt = tiny_hybrid

    def halved(tensors):
        for name in [n for n in tensors if n.endswith("self_attn.q_proj.weight")]:
            tensors[name] = tensors[name][: tensors[name].shape[0] // 2].clone()

    report = preflight(spec, _edited(ckpt, tmp_path / "gate", halved))
    assert any("attention.output_gate" in p.fix for p in report.problems), (
        report.lines()
    )


def test_tiny_init_makes_the_decay_matter(tiny_hybrid):
    """The tiny checkpoint's log decay rates lie in log([1, 16])."""
    _, ckpt = tiny_hybrid
    values = [
        t.float().numpy()
        for shard in ckpt.glob("*.safetensors")
        for n, t in load_file(shard).items()
        if n.endswith(".A_log")
    ]
    assert values
    flat = np.concatenate(values)
    assert flat.min() >= 0 and flat.max() <= np.log(16) + 1e-2


# ---- the generated vLLM model on the CPU engine (one engine start) -------------------
# The engine-vs-reference parity and the state accounting share one engine start
# and run in `make test`; prefix caching (two more starts) is in `make test-all`.


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    """The tiny hybrid checkpoint through the generated plugin on vLLM's CPU
    engine (float32, float32 states): greedy outputs and prompt logprobs of the
    validation prompts, and the engine's cache report."""
    # Standalone: onboard's generated Gated DeltaNet model (the spec is Qwen3-Next
    # across the norms' bridge, whose modular file runs vLLM's own class).
    return generated_engine_run(
        hybrid(), tmp_path_factory.mktemp("engine"), standalone=True
    )


@pytest.mark.engine
def test_engine_matches_the_reference_and_a_flipped_decay_does_not(
    engine_run, tmp_path
):
    """The generated model (vLLM's Gated DeltaNet layer, gated attention) on the
    CPU engine (float32 through the gdn_float32 shim) against the float32
    reference, by the accuracy check's rule; the same engine outputs against the
    reference of the checkpoint with every A_log sign-flipped fail it."""
    from onboard.runtime.compare import PROMPT_LOGPROB_ATOL
    from onboard.runtime.reference import load_reference

    spec, ckpt, work, prompts, info, outputs = engine_run
    assert info["model_class"].startswith("onboard_plugin_hybrid_ref.")

    def verdict(checkpoint: Path, label: str):
        shutil.rmtree(work / "ref", ignore_errors=True)
        ref = load_reference(checkpoint, spec, work / "gen" / "hf", work / "ref")
        return judge_engine_outputs(outputs, ref.model, prompts)

    good = verdict(ckpt, "good")
    assert good.passed, good.details
    assert good.metrics["greedy_identical_sequences"] == len(prompts)

    def flip(tensors):
        for name in [n for n in tensors if n.endswith(".A_log")]:
            tensors[name] = -tensors[name]

    flipped = verdict(_edited(ckpt, tmp_path / "flipped", flip), "flipped")
    assert not flipped.passed
    assert flipped.metrics["prompt_logprob_max_abs_diff"] > 10 * PROMPT_LOGPROB_ATOL


@pytest.mark.engine
def test_engine_state_accounting_equals_the_spec(engine_run):
    """vLLM's own cache report: each linear-attention layer's state (shapes,
    bytes per sequence) and the attention layer's KV bytes per token equal the
    plan's arithmetic at the engine's dtypes."""
    from onboard.validate.check_kv_cache import compare

    spec, *_, info, _ = engine_run
    plan = kv_report(spec, "float32", model_dtype="float32", state_dtype="float32")
    check = compare(info["kv_cache"], plan)
    assert check.status == "passed", check.details
    assert check.metrics["state_bytes_per_sequence"] == plan.state_bytes_per_sequence
    assert check.metrics["state_bytes_per_sequence"] > 0
    # The hybrid block the plan predicts (the cpu target's 128-token kernel
    # block, raised until a page holds a state), the padded state page, and the
    # blocks of the engine's 1 GiB (VLLM_CPU_KVCACHE_SPACE=1).
    block = plan.hybrid_block_size(128)
    assert info["kv_cache"]["block_size"] == block
    assert check.metrics["state_page_bytes"] == plan.state_page_bytes(block)
    assert info["kv_cache"]["num_blocks"] == 2**30 // plan.bytes_per_block(block)


@pytest.mark.engine
@pytest.mark.acceptance
def test_prefix_caching_reuses_states_and_changes_nothing(tmp_path):
    """vLLM 0.32 caches a hybrid model's prefixes in `align` mode: a prompt of
    more than two hybrid blocks, repeated, hits its cached blocks, and every
    greedy output equals the engine's without prefix caching and the
    reference's (two engine starts)."""
    from onboard.generate import generate_files, write_trees
    from onboard.runtime.engine import (
        Engine,
        EngineOptions,
        engine_state_options,
        read_plugin,
    )
    from onboard.runtime.reference import load_reference, run_reference

    spec_text = HYBRID.replace("PROJECTIONS", "grouped").replace(
        "max_position_embeddings: 256", "max_position_embeddings: 2048"
    )
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(parse_spec_text(spec_text), ckpt, seed=0)
    spec = load_spec(ckpt / "spec.yaml")
    write_trees(generate_files(spec, standalone=True), tmp_path / "gen")
    rng = np.random.default_rng(0)
    base = rng.integers(3, 500, 900).tolist()
    prompts = [base, base, base + rng.integers(3, 500, 20).tolist()]
    ref = load_reference(ckpt, spec, tmp_path / "gen" / "hf", tmp_path / "ref")
    want = [run_reference(ref.model, p, 8)[1].token_ids for p in prompts]
    got = {}
    for cached in (False, True):
        options = EngineOptions(
            model_dir=ckpt,
            plugin=read_plugin(tmp_path / "gen" / "plugin"),
            max_model_len=1024,
            extra={"enable_prefix_caching": cached},
            **engine_state_options(spec),
        )
        engine = Engine(options, tmp_path / f"e{cached}", tmp_path / f"e{cached}.log")
        engine.start()
        try:
            info = engine.wait_ready()
            # One at a time: each later request finds the earlier ones' blocks.
            got[cached] = [
                engine.generate([p], temperature=0.0, max_tokens=8, ignore_eos=True)[
                    "outputs"
                ][0]["token_ids"]
                for p in prompts
            ]
            hits = engine.metrics().get("vllm:prefix_cache_hits", 0)
        finally:
            engine.close()
        mode = info["kv_cache"]["mamba_cache_mode"]
        assert mode == ("align" if cached else "none")
        block = info["kv_cache"]["block_size"]
        # Measured: 768 tokens, two 384-token blocks, over the two repeats.
        assert (hits >= 2 * block) if cached else hits == 0
    assert got[True] == got[False] == want
