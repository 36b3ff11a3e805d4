"""Llama-4's language model (`llama4_text`) against transformers' own
Llama4ForCausalLM, on the same random weights. `make test` runs the proofs of
each part; the faults each proof catches (marked acceptance) run in `make
test-all`.

What is proven: the MoE block (MoE layers placed by moe_layers /
interleave_moe_layer_step beside dense layers of their own width,
intermediate_size_mlp; a router whose sigmoid of the top-1 logit scales the
expert's *input*; one shared expert; the experts stacked input dim first, as
transformers stores them), the complex-number (interleaved) rope with llama3
scaling; the NoPE layers' query temperature (attn_temperature_tuning,
floor_scale, attn_scale) and the weightless q/k norm of the rope layers
(use_qk_norm); the rope layers' chunked local attention (attention_chunk_size).
The multimodal wrapper (llama4) is refused, naming why.
"""

from __future__ import annotations

import pytest

from onboard.errors import InputError
from onboard.reference.prove import ProofFailed, family_model, prove_spec
from onboard.spec.hf import accepted_keys, hf_config_from_spec, spec_from_hf_config
from onboard.spec.model import ModelSpec
from onboard.spec.rules import check_rules

N_LAYERS = 4


def llama4_config(**over) -> dict:
    """A small Llama-4 text config: MoE on every second layer (dense between),
    every layer rotating and attending fully, no q/k norm."""
    from transformers import Llama4TextConfig

    kwargs = dict(
        vocab_size=1000, hidden_size=256, intermediate_size=128,
        intermediate_size_mlp=384, num_hidden_layers=N_LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
        no_rope_layers=[1] * N_LAYERS, layer_types=["full_attention"] * N_LAYERS,
        attn_temperature_tuning=False, use_qk_norm=False,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            # short, so the proof's positions meet the scaled frequencies
            "original_max_position_embeddings": 16,
        },
    )  # fmt: skip
    kwargs.update(over)
    config = Llama4TextConfig(**kwargs).to_dict()
    config["architectures"] = ["Llama4ForCausalLM"]
    config["for_llm_compressor"] = False  # as the published configs have it
    return config


def _edited(spec: ModelSpec, edit) -> ModelSpec:
    data = spec.model_dump(mode="json")
    edit(data)
    return ModelSpec.model_validate(data)


def test_llama4_text_moe_reads_and_proves():
    config = llama4_config()
    spec = spec_from_hf_config(config)
    moe = spec.mlp.moe
    assert spec.mlp.intermediate_size == 384  # the dense layers' own width
    assert moe.expert_intermediate_size == 128
    assert [spec.is_moe_layer(i) for i in range(N_LAYERS)] == [0, 1, 0, 1]
    assert moe.num_shared_experts == 1 and moe.shared_expert_intermediate_size is None
    assert moe.router.scoring == "sigmoid" and not moe.router.norm_topk_prob
    assert moe.router.weight_on_input
    assert spec.rope.interleaved and spec.rope.scaling.type == "llama3"
    assert spec.checkpoint.experts_format == "parameters_transposed"
    proof = prove_spec(spec, config)
    assert proof.num_layers == 2  # the shrunk model keeps a dense and an MoE layer
    # The spec writes back as the family's config and reads back as itself.
    written = hf_config_from_spec(spec)
    assert written["intermediate_size_mlp"] == 384
    assert written["intermediate_size"] == 128
    assert written["moe_layers"] == [1, 3]
    assert written["use_qk_norm"] is False
    assert spec_from_hf_config(written) == spec.model_copy(update={"name": spec.name})


def test_moe_layers_alone_place_the_moe_layers():
    # The class fills moe_layers from the step; a listed set wins over it.
    config = llama4_config(interleave_moe_layer_step=1, moe_layers=[0, 2, 3])
    spec = spec_from_hf_config(config)
    assert [spec.is_moe_layer(i) for i in range(N_LAYERS)] == [1, 0, 1, 1]
    config = llama4_config()
    config["moe_layers"] = [0, 1]  # layer 0 is dense by the step of 2
    with pytest.raises(InputError, match="moe_layers lists layer 0"):
        spec_from_hf_config(config)


@pytest.mark.acceptance
@pytest.mark.parametrize(
    ("fact", "fails"),
    [
        # The fault: the router's weight scales the expert's output instead of
        # its input (a SwiGLU expert is not linear in its input). Layer 1 is the
        # shrunk model's MoE layer.
        ("moe_router_weight_on_input", "first divergence: layer 1, after attention"),
        # NeoX halves instead of Llama-4's complex-number pairs.
        ("rope_interleave", "first divergence: layer 0, attention"),
    ],
)
def test_a_wrong_fact_of_llama4_fails_its_proof(monkeypatch, fact, fails):
    # Without the family's fact, the config (which has no key for it) reads as
    # the other value; the proof runs that model against transformers'.
    from onboard.spec import hf

    family = hf.FAMILIES["llama4_text"]
    facts = {k: v for k, v in family.facts.items() if k != fact}
    monkeypatch.setitem(
        hf.FAMILIES,
        "llama4_text",
        hf.Family(family.layout, facts, (), family.checkpoint),
    )
    config = llama4_config()
    spec = spec_from_hf_config(config)
    with pytest.raises(ProofFailed, match=fails):
        prove_spec(spec, config)


@pytest.mark.acceptance
@pytest.mark.parametrize(
    ("edit", "fails"),
    [
        # The router's weight on the output: llama4_text's class cannot say so.
        (
            lambda d: d["mlp"]["moe"]["router"].update(weight_on_input=False),
            "weight_on_input: the spec says False",
        ),
        # The stacks output dim first (Mistral-4's): the shapes differ.
        (
            lambda d: d["checkpoint"].update(experts_format="parameters"),
            "shapes differ",
        ),
    ],
)
def test_each_part_of_llama4_moe_is_needed_by_its_proof(edit, fails):
    config = llama4_config()
    spec = spec_from_hf_config(config)
    with family_model(spec, config) as family:
        with pytest.raises(InputError, match=fails):
            family.prove(_edited(spec, edit))


def test_for_llm_compressor_is_accepted_and_named():
    config = llama4_config()
    assert any(k.startswith("for_llm_compressor (") for k in accepted_keys(config))


def nope_config(**over) -> dict:
    """As :func:`llama4_config`, with Llama-4's attention: the last layer NoPE
    with its query temperature (a floor_scale the proof's 24 positions cross),
    the weightless q/k norm on the rope layers."""
    return llama4_config(
        no_rope_layers=[1, 1, 1, 0],
        attn_temperature_tuning=True,
        floor_scale=4,
        attn_scale=0.5,
        use_qk_norm=True,
        **over,
    )


def test_nope_temperature_and_the_qk_l2_norm_read_and_prove():
    config = nope_config()
    spec = spec_from_hf_config(config)
    att = spec.attention
    assert spec.rope.nope_layers == [3]
    assert (att.nope_temperature.floor_scale, att.nope_temperature.attn_scale) == (
        4,
        0.5,
    )
    assert att.qk_l2_norm and not att.qk_norm  # use_qk_norm is not Qwen's here
    proof = prove_spec(spec, config)
    assert proof.num_layers == 4
    written = hf_config_from_spec(spec)
    assert written["use_qk_norm"] is True and "qk_l2_norm" not in written
    assert written["attn_temperature_tuning"] is True
    assert written["no_rope_layers"] == [1, 1, 1, 0]
    assert spec_from_hf_config(written) == spec


@pytest.mark.acceptance
@pytest.mark.parametrize(
    ("edit", "fails"),
    [
        # No temperature: the NoPE layer's queries differ from position 3 on.
        (
            lambda d: d["attention"].update(nope_temperature=None),
            "first divergence: layer 3, attention",
        ),
        # No q/k norm on the rope layers.
        (
            lambda d: d["attention"].update(qk_l2_norm=False),
            "first divergence: layer 0, attention",
        ),
    ],
)
def test_each_part_of_llama4_attention_is_needed_by_its_proof(edit, fails):
    config = nope_config()
    spec = spec_from_hf_config(config)
    with family_model(spec, config) as family:
        with pytest.raises(ProofFailed, match=fails):
            family.prove(_edited(spec, edit))


@pytest.mark.acceptance
@pytest.mark.parametrize(
    ("fragment", "right", "wrong", "fails"),
    [
        # The temperature on the rope layers instead of the NoPE layers.
        (
            "components/temperature_tuning/hf_init.py.j2",
            "not rope and",
            "rope and",
            "first divergence: layer 0, attention",
        ),
        # Its steps one position early: floor(position / floor_scale).
        (
            "components/temperature_tuning/hf_after_rope.py.j2",
            "(positions + 1.0)",
            "positions",
            "first divergence: layer 3, attention",
        ),
        # The q/k norm on the NoPE layer too.
        (
            "components/qk_l2_norm/hf_init.py.j2",
            "{% if f.nope %}rope and {% endif %}",
            "",
            "first divergence: layer 3, attention",
        ),
    ],
)
def test_a_fault_in_the_generated_attention_fails_the_proof(
    monkeypatch, fragment, right, wrong, fails
):
    # The spec's values are read from the checkpoint's config (floor_scale,
    # no_rope_layers: preflight compares them with the spec); what the proof
    # checks is the code, here each fragment with one fault put in.
    _with_fault(monkeypatch, fragment, right, wrong)
    config = nope_config()
    with pytest.raises(ProofFailed, match=fails):
        prove_spec(spec_from_hf_config(config), config)


def _with_fault(monkeypatch, fragment: str, right: str, wrong: str) -> None:
    """Render ``fragment`` with ``right`` replaced by ``wrong`` (for the rest of
    the test)."""
    import jinja2

    from onboard import templating

    source = (templating.TEMPLATES / fragment).read_text()
    assert right in source
    env = templating.environment()
    faulty = jinja2.DictLoader({fragment: source.replace(right, wrong)})
    monkeypatch.setattr(env, "loader", jinja2.ChoiceLoader([faulty, env.loader]))
    # A cache of the test's own: the faulty fragment is not kept past it.
    monkeypatch.setattr(env, "cache", jinja2.utils.LRUCache(400))


def chunked_config(**over) -> dict:
    """As :func:`nope_config`, the rope layers attending in chunks of 8 (the
    proof's 24 tokens cross two chunk boundaries): Llama-4's text model whole."""
    return nope_config(layer_types=None, attention_chunk_size=8, **over)


def test_chunked_attention_reads_and_proves():
    config = chunked_config()
    assert config["layer_types"] == ["chunked_attention"] * 3 + ["full_attention"]
    spec = spec_from_hf_config(config)
    assert spec.attention.chunk_size == 8
    assert spec.layer_attention_types() == ["full_attention"] * N_LAYERS
    proof = prove_spec(spec, config)
    assert proof.num_layers == 4
    written = hf_config_from_spec(spec)
    assert written["layer_types"] == config["layer_types"]
    assert written["attention_chunk_size"] == 8
    assert spec_from_hf_config(written) == spec


@pytest.mark.acceptance
def test_without_its_chunks_the_proof_fails_at_the_first_layer():
    config = chunked_config()
    spec = spec_from_hf_config(config)
    with family_model(spec, config) as family:
        with pytest.raises(ProofFailed, match="first divergence: layer 0, attention"):
            family.prove(
                _edited(spec, lambda d: d["attention"].update(chunk_size=None))
            )


@pytest.mark.acceptance
@pytest.mark.parametrize(
    ("fragment", "right", "wrong", "fails"),
    [
        # The chunk boundary one token late.
        (
            "components/chunked_attention/hf_bias.py.j2",
            "q_pos // self.chunk != k_pos // self.chunk",
            "(q_pos - 1) // self.chunk != (k_pos - 1) // self.chunk",
            "first divergence: layer 0, attention",
        ),
        # The NoPE layer chunked, the rope layers not.
        (
            "components/chunked_attention/hf_init.py.j2",
            " if rope else None",
            " if not rope else None",
            "first divergence: layer 0, attention",
        ),
    ],
)
def test_a_fault_in_the_chunks_fails_the_proof(
    monkeypatch, fragment, right, wrong, fails
):
    _with_fault(monkeypatch, fragment, right, wrong)
    config = chunked_config()
    with pytest.raises(ProofFailed, match=fails):
        prove_spec(spec_from_hf_config(config), config)


def test_chunked_layers_other_than_the_rope_layers_are_refused():
    config = chunked_config()
    config["layer_types"] = ["chunked_attention"] * 2 + ["full_attention"] * 2
    with pytest.raises(InputError, match="are not the layers that rotate"):
        spec_from_hf_config(config)


def test_the_wrapper_is_refused_naming_its_lm_head():
    from transformers import AutoConfig

    config = AutoConfig.for_model("llama4").to_dict()
    with pytest.raises(InputError, match="lm_head under the wrapper"):
        spec_from_hf_config(config)


@pytest.mark.acceptance
def test_the_published_scout_language_model_proves():
    # Llama-4-Scout's text_config as published: every layer MoE, a NoPE layer
    # in four, chunks of 8192 (shrunk to 128, the proof runs 152 tokens) and the
    # temperature's floor_scale 8192 (shrunk to 4).
    import json
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "published_configs"
    published = json.loads(
        (fixture / "meta-llama__Llama-4-Scout-17B-16E-Instruct.json").read_text()
    )
    config = {**published["text_config"], "architectures": ["Llama4ForCausalLM"]}
    spec = spec_from_hf_config(config)
    assert spec.attention.chunk_size == 8192
    assert spec.rope.nope_layers == list(range(3, 48, 4))
    assert all(spec.is_moe_layer(i) for i in range(48))
    from onboard.reference.prove import proof_tokens

    assert proof_tokens(spec) == 128 + 24  # past the tiny model's first chunk
    prove_spec(spec, config)


def test_llama4_attention_rules():
    spec = spec_from_hf_config(nope_config())

    def edit(d):
        d["rope"]["nope_layers"] = []
        d["attention"]["qk_norm"] = True

    messages = " | ".join(m for _, m in check_rules(_edited(spec, edit)))
    assert "applies to the NoPE layers: set rope.nope_layers" in messages
    assert "not beside qk_norm" in messages


def test_weight_on_input_needs_top_1_without_renormalising():
    spec = spec_from_hf_config(llama4_config())

    def both(d):
        d["mlp"]["moe"].update(num_experts_per_tok=2)
        d["mlp"]["moe"]["router"].update(norm_topk_prob=True)

    problems = check_rules(_edited(spec, both))
    messages = " | ".join(message for _, message in problems)
    assert "only with top-1 routing" in messages
    assert "set norm_topk_prob: false" in messages


def test_the_generated_vllm_model_reads_like_vllm_s_llama4(tmp_path):
    import subprocess
    import sys

    from onboard.generate import generate_files
    from onboard.templating import RUFF_SETTINGS

    spec = spec_from_hf_config(chunked_config())
    files = generate_files(spec)
    rel = "plugin/onboard_plugin_llama4_text/llama4_text.py"
    source = files[rel]
    # vLLM's llama4.py names: Llama4MoE under feed_forward, its router, the
    # experts' input scaled by the top-1 weight, HF's stacks input dim first.
    for line in (
        "class Llama4MoE(nn.Module):",
        "self.feed_forward = Llama4MoE(",
        "apply_router_weight_on_input=True,",
        "is_fused_checkpoint_transposed=True,",
        "intermediate_size=config.intermediate_size_mlp,",
        "layer_idx in config.moe_layers",
        "is_neox_style=False,",
        # its NoPE layers' temperature and the rope layers' weightless q/k norm
        "= not use_rope and config.attn_temperature_tuning",
        "def _get_attn_scale(self, positions: torch.Tensor) -> torch.Tensor:",
        "if config.use_qk_norm and use_rope",
        "q = self.qk_norm(q.float()).reshape(-1, self.q_size).to(q.dtype)",
        "use_rope=config.no_rope_layers[layer_idx] == 1,",
        # the rope layers' chunked local attention, chosen as llama4.py does
        "chunked = use_rope and config.attention_chunk_size",
        "attn_cls = ChunkedLocalAttention if chunked else Attention",
        "self.attn = attn_cls(",
    ):
        assert line in source, line
    path = tmp_path / "llama4_text.py"
    path.write_text(source)
    config = [item for s in RUFF_SETTINGS for item in ("--config", s)]
    for args in (["format", "--check"], ["check"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--isolated", *config, str(path)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    # The reference scales the expert's input (the template's only branch).
    from onboard.reference import render_reference

    reference = render_reference(spec)
    modeling = next(t for p, t in reference.items() if "modeling" in p)
    assert "x[token] * weights[token, slot, None] @ experts.gate_up_proj[e]" in (
        modeling
    )


@pytest.mark.engine
@pytest.mark.acceptance
def test_the_generated_model_runs_on_the_cpu_engine_as_transformers(tmp_path):
    # Llama-4's text model whole, with chunks of 128 (the multiple of its KV
    # block vLLM's CPU attention takes): the generated plugin on the engine
    # (ChunkedLocalAttention on the rope layers) against Llama4ForCausalLM,
    # and the engine's per-layer cache kinds against the plan's.
    import json
    import subprocess

    from test_spec_hf import ONBOARD

    (tmp_path / "hf").mkdir()
    config = chunked_config()
    config["attention_chunk_size"] = 128
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    spec = tmp_path / "spec.yaml"

    def cli(*args, timeout=120):
        done = subprocess.run(
            [str(ONBOARD), *map(str, args)], capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        return done

    assert cli("spec", "from-hf", tmp_path / "hf", "-o", spec).returncode == 0
    ckpt = tmp_path / "ckpt"
    assert cli("checkpoint", "tiny", spec, "--out", ckpt).returncode == 0
    out = tmp_path / "val"
    done = cli(
        "validate", ckpt, "--spec", ckpt / "spec.yaml", "--target", "cpu",
        "--out", out, "--checks", "accuracy,kv-cache", timeout=1500,
    )  # fmt: skip
    result = json.loads((out / "validation.json").read_text())
    checks = {c["name"]: c for c in result["checks"]}
    assert result["vllm_model_class"].startswith("onboard_plugin_llama4_text.")
    assert checks["accuracy"]["status"] == "passed", checks["accuracy"]["details"]
    assert checks["kv-cache"]["status"] == "passed", checks["kv-cache"]["details"]
    assert done.returncode == 0, done.stderr


def test_a_chunk_the_cpu_engine_cannot_run_is_named_by_spec_check():
    from onboard.targets.check import target_findings

    spec = spec_from_hf_config(chunked_config())  # chunks of 8
    findings = [f for f in target_findings(spec) if f.path[-1] == "chunk_size"]
    assert len(findings) == 1
    assert "is not divisible by block_size 128" in findings[0].message
    config = chunked_config()
    config["attention_chunk_size"] = 256
    spec = spec_from_hf_config(config)
    assert not [f for f in target_findings(spec) if f.path[-1] == "chunk_size"]


def test_validate_reports_a_chunk_the_cpu_engine_cannot_run_as_not_run(tmp_path):
    # Chunks of 8 stop vLLM's CPU engine at its start: every check is not-run
    # with vLLM's reason (a limit of the CPU build, not a fault of the model),
    # and no engine is started.
    from onboard.checkpoint import write_tiny_checkpoint
    from onboard.validate.harness import validate

    ckpt = write_tiny_checkpoint(spec_from_hf_config(chunked_config()), tmp_path / "c")
    result = validate(
        ckpt, ckpt / "spec.yaml", "cpu", tmp_path / "val", checks="accuracy,kv-cache"
    )
    assert [c.name for c in result.checks] == ["accuracy", "kv-cache"]
    for check in result.checks:
        assert check.status == "not-run"
        assert "'attn_chunk_size 8 is not divisible by block_size 128'" in check.details
    assert (tmp_path / "val" / "validation.json").is_file()
