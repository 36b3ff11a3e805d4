"""`spec from-hf` proves the spec it infers against transformers' own class.

Each verified family's config (small dims, the features its config class can
state) must prove: the reference generated for the inferred spec gives the logits
of transformers' model on a tiny random model of the family, its norms and biases
randomised. What a config does not say must fail the proof rather than be written
silently wrong: transformers' Llama ignores `rope_parameters.partial_rotary_factor`,
which the spec reads; tensor names that do not fit fail on the tensors.
"""

from __future__ import annotations

import json
import re

import pytest
import transformers
from test_spec_hf import FAMILIES, MOE, SMALL, run_cli, transformers_config

from onboard.errors import InputError
from onboard.reference.prove import RTOL, ProofFailed, prove_spec
from onboard.spec import hf, load_spec
from onboard.spec.hf import spec_from_hf_config
from onboard.spec.model import ModelSpec


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_verified_family_proves(family):
    config = transformers_config(family).to_dict()
    spec = spec_from_hf_config(config)
    proof = prove_spec(spec, config)
    assert proof.max_rel_diff < RTOL
    assert proof.model_class == spec.architecture
    assert proof.num_layers >= 1
    assert proof.transformers_version == transformers.__version__
    assert ("MTP" in proof.header()) == (spec.mtp is not None)


def _edited(spec: ModelSpec, path: str, value) -> ModelSpec:
    data = spec.model_dump(mode="json")
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[leaf] = value
    return ModelSpec.model_validate(data)


@pytest.mark.parametrize(
    ("path", "value", "fails"),
    [
        # yarn's correction range rounded to whole dims: other rope frequencies
        ("rope.scaling.truncate", None, "first divergence: layer 0, attention "),
        # the family's facts: its config cannot say otherwise
        ("attention.sinks", False, "attention.sinks: the spec says False"),
        ("mlp.moe.router.bias", False, "router.bias: the spec says False"),
        ("mlp.moe.router.norm_topk_prob", False, "norm_topk_prob: the spec says"),
        # the experts per expert, not stacked
        ("checkpoint.layout", "llama", "does not name: .*mlp.router.weight"),
    ],
)
def test_each_part_of_gpt_oss_is_needed_by_its_proof(path, value, fails):
    from onboard.reference.prove import family_model

    config = transformers_config("gpt_oss").to_dict()
    spec = spec_from_hf_config(config)
    with family_model(spec, config) as family:
        with pytest.raises(InputError, match=fails):
            family.prove(_edited(spec, path, value))


def test_gpt_oss_parts_are_found_by_the_proof_without_its_facts(monkeypatch):
    # Read as a family nothing is known of, its sinks, router and expert biases,
    # layout and routing are found by the tensors and the proof.
    from onboard.reference.infer import infer_spec
    from onboard.spec import hf

    monkeypatch.delitem(hf.FAMILIES, "gpt_oss")
    config = transformers_config("gpt_oss").to_dict()
    spec, proof = infer_spec(config)
    assert proof.max_rel_diff < RTOL
    moe = spec.mlp.moe
    assert spec.attention.sinks and moe.router.bias and moe.expert_bias
    assert moe.router.scoring == "softmax" and moe.router.norm_topk_prob
    assert spec.checkpoint.layout == "gpt_oss"
    assert spec.checkpoint.experts_format == "gpt_oss"
    found = proof.found
    assert found["attention_sinks"] is True and found["moe_router_bias"] is True
    assert found["checkpoint.layout"] == "gpt_oss"


def test_a_key_the_family_ignores_fails_the_proof():
    # transformers' Llama applies rope to the whole head whatever the config says.
    config = transformers.LlamaConfig(
        **SMALL,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    ).to_dict()
    spec = spec_from_hf_config(config)
    assert spec.attention.partial_rotary_factor == 0.5  # what the config says
    with pytest.raises(ProofFailed, match="first divergence: layer 0, attention "):
        prove_spec(spec, config)


def test_tensor_names_that_do_not_fit_fail_on_the_tensors():
    config = transformers_config("qwen3").to_dict()
    spec = spec_from_hf_config(config)
    renamed = spec.model_copy(
        update={
            "checkpoint": spec.checkpoint.model_copy(
                update={"tensor_names": {"q_norm": "model.layers.{layer}.self_attn.qn"}}
            )
        }
    )
    with pytest.raises(ProofFailed) as failed:
        prove_spec(renamed, config)
    message = str(failed.value)
    assert "does not fit the family's tensors" in message
    assert "self_attn.q_norm.weight" in message  # transformers has, the spec lacks
    assert "self_attn.qn.weight" in message  # the spec names, transformers lacks


def test_cli_writes_what_was_proven_or_nothing(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    transformers_config("qwen3_moe").save_pretrained(good)
    transformers.LlamaConfig(
        **SMALL,
        rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5},
    ).save_pretrained(bad)

    out = tmp_path / "good.yaml"
    r = run_cli("spec", "from-hf", good, "-o", out)
    assert r.returncode == 0, r.stderr
    head = out.read_text().split("spec_version")[0]
    assert head.startswith("# Inferred by `onboard spec from-hf`; proven against")
    assert f"transformers {transformers.__version__}" in head
    assert "Qwen3MoeForCausalLM" in head
    assert run_cli("spec", "check", out).returncode == 0

    out = tmp_path / "bad.yaml"
    r = run_cli("spec", "from-hf", bad, "-o", out)
    assert r.returncode == 2
    assert "first divergence: layer 0, attention (or the norm before it)" in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()
    r = run_cli("spec", "from-hf", bad, "-o", out, "--no-verify")
    assert r.returncode == 0, r.stderr
    assert out.read_text().startswith(
        "# Inferred by `onboard spec from-hf`; not proven (--no-verify).\n"
    )


def test_remote_code_is_refused_unless_unproven_is_asked_for(tmp_path):
    # A Kimi-K2-style config: a model type transformers lacks, whose auto_map
    # code interleaves rope without a key saying so. Read as a new model type it
    # would rotate the halves: the proof cannot run, so from-hf refuses.
    import json

    config = transformers_config("deepseek_v3").to_dict()
    config.update(
        model_type="kimi_k2",
        architectures=["KimiK2ForCausalLM"],
        auto_map={"AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    )
    config.pop("rope_interleave", None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "kimi.yaml"
    r = run_cli("spec", "from-hf", path, "-o", out)
    assert r.returncode == 2 and not out.exists()
    assert "'kimi_k2' is remote code (auto_map:" in r.stderr
    assert "rope interleaving" in r.stderr and "Traceback" not in r.stderr
    assert "modeling_deepseek.py (auto_map.AutoModelForCausalLM) is not in" in r.stderr
    assert "auto_map.AutoConfig is not set" in r.stderr
    r = run_cli("spec", "from-hf", path, "-o", out, "--no-verify")
    assert r.returncode == 0, r.stderr
    assert "not proven (--no-verify)" in out.read_text()

    # As Kimi-K2 publishes it, its architectures names DeepSeek-V3's class, which
    # transformers ships (and interleaves rope by default): read as that family
    # and proven against it, and the header says so.
    config["architectures"] = ["DeepseekV3ForCausalLM"]
    path.write_text(json.dumps(config))
    out.unlink()
    r = run_cli("spec", "from-hf", path, "-o", out)
    assert r.returncode == 0, r.stderr
    header = " ".join(out.read_text().replace("# ", "").split())
    assert "read as 'deepseek_v3'" in header
    spec = load_spec(out)
    assert (spec.name, spec.model_type) == ("kimi-k2", "deepseek_v3")
    assert spec.rope.interleaved


REMOTE_CONFIG = """
from transformers.models.helium.configuration_helium import HeliumConfig


class HelConfig(HeliumConfig):
    model_type = "hel_remote"
"""
REMOTE_MODELING = """
from transformers.models.helium.modeling_helium import HeliumForCausalLM

from .configuration_hel import HelConfig


class HelForCausalLM(HeliumForCausalLM):
    config_class = HelConfig
"""


def test_remote_code_beside_the_config_is_proven_against(tmp_path):
    # A model type transformers lacks, with its code in the checkpoint directory
    # (auto_map). The code interleaves rope (it is Helium's), which its config
    # does not say: read alone the spec would rotate halves; proven against the
    # code, the spec interleaves.
    import json

    from onboard.spec import load_spec

    config = transformers.HeliumConfig(**SMALL, head_dim=16).to_dict()
    config.update(
        model_type="hel_remote",
        architectures=["HelForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_hel.HelConfig",
            "AutoModelForCausalLM": "modeling_hel.HelForCausalLM",
        },
    )
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(config))
    (ckpt / "configuration_hel.py").write_text(REMOTE_CONFIG)
    (ckpt / "modeling_hel.py").write_text(REMOTE_MODELING)
    out = tmp_path / "spec.yaml"

    r = run_cli("spec", "from-hf", ckpt, "-o", out)  # runs no code unasked
    assert r.returncode == 2 and not out.exists()
    assert f"Its code is in {ckpt}: pass --trust-remote-code" in r.stderr

    r = run_cli("spec", "from-hf", ckpt, "-o", out, "--trust-remote-code")
    assert r.returncode == 0, r.stderr
    head = " ".join(
        line.removeprefix("# ")
        for line in out.read_text().split("spec_version")[0].splitlines()
    )
    assert f"HelForCausalLM, the family's own code in {ckpt} (auto_map)" in head
    assert "rope_interleave true" in head
    assert load_spec(out).rope.interleaved is True

    out.unlink()
    r = run_cli("spec", "from-hf", ckpt, "-o", out, "--no-verify")
    assert r.returncode == 0, r.stderr
    assert load_spec(out).rope.interleaved is False  # what the config alone says


def test_a_family_without_known_facts_is_accepted_by_its_proof_only(
    tmp_path, monkeypatch
):
    # Ministral is Llama's block under another model_type: proven, so accepted.
    # No list of families decides: the reading is a hypothesis, the proof decides.
    config = transformers.MinistralConfig(**SMALL, head_dim=16).to_dict()
    spec = spec_from_hf_config(config)
    assert prove_spec(spec, config).max_rel_diff < RTOL
    # Gemma scales the embedding by sqrt(hidden_size) (and its norms by 1 + w),
    # which its config does not say: without the family's facts, the proof fails.
    monkeypatch.delitem(hf.FAMILIES, "gemma")
    config = transformers.GemmaConfig(**SMALL).to_dict()
    spec = spec_from_hf_config(config)
    assert not spec.scale_embedding
    with pytest.raises(ProofFailed, match=r"the embedding \(before layer 0\)"):
        prove_spec(spec, config)

    transformers.MinistralConfig(**SMALL, head_dim=16).save_pretrained(
        tmp_path / "ministral"
    )
    out = tmp_path / "spec.yaml"
    r = run_cli("spec", "from-hf", tmp_path / "ministral", "-o", out)
    assert r.returncode == 0, r.stderr
    comment = out.read_text().split("spec_version")[0].splitlines()
    head = " ".join(line.removeprefix("# ") for line in comment)
    assert "proven against transformers" in head
    assert "MinistralForCausalLM" in head
    # --no-verify reads any family and says that nothing was proven.
    out.unlink()
    r = run_cli("spec", "from-hf", tmp_path / "ministral", "-o", out, "--no-verify")
    assert r.returncode == 0, r.stderr
    assert out.read_text().startswith(
        "# Inferred by `onboard spec from-hf`; not proven (--no-verify).\n"
    )


# -- what the config does not state, found by the proof ------------------------------


def test_an_unverified_family_has_its_fixed_routing_found_by_the_proof(tmp_path):
    # GLM-4-MoE routes by sigmoid with a bias correction, and its config has no
    # key for either: the tensors show the bias, only the proof shows sigmoid.
    from onboard.pipeline.generate import generate_all
    from onboard.reference.infer import infer_spec
    from onboard.spec.hf import hf_config_from_spec, open_concepts

    config = transformers.Glm4MoeConfig(
        **SMALL, n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1,
        num_nextn_predict_layers=0, **MOE,
    ).to_dict()  # fmt: skip
    assert {"scoring_func", "topk_method"} <= set(open_concepts("glm4_moe"))
    with pytest.raises(ProofFailed, match="does not fit the family's tensors"):
        prove_spec(spec_from_hf_config(config), config)
    spec, proof = infer_spec(config)
    router = spec.mlp.moe.router
    assert (router.scoring, router.bias_correction) == ("sigmoid", True)
    assert proof.found["scoring_func"] == "sigmoid"
    assert proof.found["topk_method"] == "noaux_tc"
    assert "as the proof found it: " in proof.header()
    # The spec keeps what was found: its config.json reads back to the same spec.
    assert hf_config_from_spec(spec)["model_type"] == "glm4_moe"
    generate_all(spec, tmp_path / "gen")
    assert (tmp_path / "gen" / "plugin").is_dir()


def test_a_hard_coded_rope_layout_is_found_by_the_proof():
    # Helium interleaves its rotary pairs; its config does not say so.
    from onboard.reference.infer import infer_spec

    config = transformers.HeliumConfig(**SMALL, head_dim=16).to_dict()
    assert spec_from_hf_config(config).rope.interleaved is False
    spec, proof = infer_spec(config)
    assert spec.rope.interleaved is True
    assert proof.found["rope_interleave"] is True
    assert proof.max_rel_diff < RTOL


@pytest.mark.parametrize(
    ("model_type", "placement"), [("olmo2", "post"), ("olmoe", "pre")]
)
def test_a_qk_norm_over_the_whole_projection_is_found_and_proven(model_type, placement):
    # OLMo-2 and OLMoE normalise q and k over the whole projection (one weight per
    # channel of all heads), which no config key says: the norms' shapes show it.
    # OLMo-2's post_feedforward_layernorm is a post-norm block's, not a renamed
    # input norm (the names of another role's preset are never renamed).
    from onboard.reference.infer import infer_spec

    extra = dict(num_experts=4, num_experts_per_tok=2) if model_type == "olmoe" else {}
    config = transformers.AutoConfig.for_model(
        model_type, **SMALL, head_dim=16, **extra
    ).to_dict()
    spec, proof = infer_spec(config)
    att = spec.attention
    assert (att.qk_norm, att.qk_norm_scope) == (True, "projection")
    assert spec.norm.placement == placement
    assert spec.checkpoint.tensor_names == {}
    assert proof.max_rel_diff < RTOL
    # Per head, the same norms misfit on their shapes and the proof is not run.
    data = spec.model_dump(mode="json")
    data["attention"]["qk_norm_scope"] = "head"
    with pytest.raises(ProofFailed, match="shapes differ: .*k_norm.weight is \\[32\\]"):
        prove_spec(ModelSpec.model_validate(data), config)


def test_a_verified_family_is_not_searched():
    from onboard.reference.infer import infer_spec
    from onboard.spec.hf import open_concepts

    assert open_concepts("qwen3") == []
    spec, proof = infer_spec(transformers_config("qwen3").to_dict())
    assert spec.attention.qk_norm and proof.found == {}


def test_tensor_names_no_layout_has_are_found_then_proven():
    # HunYuan stores its per-head q/k norms as query_layernorm / key_layernorm
    # (found by their shapes) and applies them after rope (found by the proof:
    # before rope, the logits differ).
    from onboard.reference.infer import infer_spec, renamed
    from onboard.reference.prove import family_model

    config = transformers.HunYuanDenseV1Config(**SMALL, head_dim=16).to_dict()
    spec = spec_from_hf_config(config, facts={"qk_norm": True})
    with family_model(spec, config) as family:
        assert family.misfit(spec)
        found = renamed(spec, family)
        assert found.checkpoint.tensor_names == {
            "q_norm": "model.layers.{layer}.self_attn.query_layernorm",
            "k_norm": "model.layers.{layer}.self_attn.key_layernorm",
        }
        assert family.misfit(found) == []
        with pytest.raises(ProofFailed, match="first divergence: layer 0, attention"):
            family.prove(found)
    spec, proof = infer_spec(config)
    assert spec.attention.qk_norm_after_rope is True
    assert proof.found["qk_norm_after_rope"] is True
    assert proof.max_rel_diff < RTOL


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        # SmolLM3: every second layer here (no_rope_layer_interval) has no rope.
        ("smollm3", dict(no_rope_layer_interval=2, pad_token_id=0)),
        # EXAONE-4: once a window is set, its full-attention layers have no rope.
        ("exaone4", dict(sliding_window=8, sliding_window_pattern=2)),
    ],
)
def test_layers_without_rope_are_read_and_proven(model_type, extra):
    from onboard.reference.infer import infer_spec

    config = transformers.AutoConfig.for_model(
        model_type, **SMALL, head_dim=16, **extra
    ).to_dict()
    spec, proof = infer_spec(config)
    assert spec.rope.nope_layers == [1, 3]
    assert proof.max_rel_diff < RTOL
    if model_type == "exaone4":
        # Its config cannot say "rope everywhere" once a window is set.
        data = spec.model_dump(mode="json")
        data["rope"]["nope_layers"] = []
        with pytest.raises(InputError, match="rope.nope_layers: the spec says"):
            prove_spec(ModelSpec.model_validate(data), config)
    else:
        bad = dict(config, no_rope_layers=[1, 0, 2, 0])
        with pytest.raises(InputError, match="no_rope_layers=.*1 \\(rope\\) or 0"):
            spec_from_hf_config(bad)


def test_per_layer_mlp_kinds_place_the_moe_layers():
    # GLM-4-MoE-Lite says which layers are MoE only by mlp_layer_types.
    from onboard.reference.infer import infer_spec

    config = transformers.AutoConfig.for_model(
        "glm4_moe_lite",
        **SMALL | dict(num_key_value_heads=4),
        **MOE,
        n_routed_experts=8,
        kv_lora_rank=32,
        q_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        mlp_layer_types=["dense", "sparse", "dense", "sparse"],
    ).to_dict()
    spec, proof = infer_spec(config)
    assert [spec.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert proof.max_rel_diff < RTOL
    bad = dict(config, mlp_layer_types=["dense", "sparse", "sparse"])
    with pytest.raises(InputError, match="mlp_layer_types=.*dense or sparse for each"):
        spec_from_hf_config(bad)


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("seed_oss", dict(attention_bias=True, attention_out_bias=False)),
        ("ernie4_5", dict(use_bias=False)),
    ],
)
def test_families_whose_keys_are_mapped_prove(model_type, extra):
    # Seed-OSS: q/k/v biases without an o_proj bias (attention_out_bias);
    # ERNIE-4.5: interleaved rope, which its config does not state.
    from onboard.reference.infer import infer_spec

    config = transformers.AutoConfig.for_model(
        model_type, **SMALL, head_dim=16, **extra
    ).to_dict()
    spec, proof = infer_spec(config)
    assert proof.max_rel_diff < RTOL
    if model_type == "seed_oss":
        assert (spec.attention.qkv_bias, spec.attention.o_bias) == (True, False)
    else:
        assert spec.rope.interleaved is True


# -- Granite: four multipliers, experts stored fused -----------------------------------


@pytest.mark.parametrize(
    ("concept", "where"),
    [
        ("embedding_multiplier", "the embedding (before layer 0)"),
        ("attention_multiplier", "layer 0, attention (or the norm before it)"),
        ("residual_multiplier", "layer 0, after attention"),
        ("logits_scaling", "the final norm or the output head"),
    ],
)
def test_each_granite_multiplier_is_read_and_proven(monkeypatch, concept, where):
    # The reference reads each multiplier from the config; one left unread (as
    # if the template dropped it) must fail the proof where it acts.
    from dataclasses import replace

    from onboard.components.embeddings import COMPONENT as EMBEDDINGS
    from onboard.components.logits import COMPONENT as LOGITS
    from onboard.components.residual_stream import COMPONENT as RESIDUAL_STREAM
    from onboard.components.softmax_scale import COMPONENT as SOFTMAX_SCALE

    config = transformers_config("granite").to_dict()
    spec = spec_from_hf_config(config)
    assert prove_spec(spec, config).max_rel_diff < RTOL
    # Each factor's key is its component's (the residual multiplier's, the
    # residual stream's code reads).
    owner = {
        "attention_multiplier": (SOFTMAX_SCALE, "multiplier"),
        "embedding_multiplier": (EMBEDDINGS, "multiplier"),
        "logits_scaling": (LOGITS, "divisor"),
    }
    if concept in owner:
        component, key = owner[concept]
        keys = component.code_context
        monkeypatch.setattr(
            component,
            "code_context",
            lambda node, config_keys: replace(keys(node, config_keys), **{key: None}),
        )
    else:
        monkeypatch.setattr(
            RESIDUAL_STREAM, "multiplier_key", lambda stream, config_keys: None
        )
    with pytest.raises(ProofFailed, match=re.escape(f"first divergence: {where}")):
        prove_spec(spec, config)


@pytest.mark.parametrize("model_type", ["granitemoe", "granitemoeshared"])
def test_fused_experts_are_the_family_s_tensors(model_type):
    # Granite-MoE saves each layer's experts stacked (input_linear [E, 2I, H],
    # output_linear [E, H, I]); one tensor per expert does not fit them.
    config = transformers_config(model_type).to_dict()
    spec = spec_from_hf_config(config)
    assert "experts" in spec.checkpoint.fused
    assert prove_spec(spec, config).max_rel_diff < RTOL
    data = spec.model_dump(mode="json")
    data["checkpoint"]["fused"].remove("experts")
    with pytest.raises(ProofFailed) as failed:
        prove_spec(ModelSpec.model_validate(data), config)
    message = str(failed.value)
    assert "block_sparse_moe.input_linear.weight" in message  # not named
    assert "block_sparse_moe.experts.0.gate_proj.weight" in message  # not saved


# -- fused checkpoint tensors, parallel blocks, scaled logits ------------------------


def test_fused_projections_are_found_and_proven(tmp_path):
    # Phi-3 stores q/k/v and gate/up each as one tensor; its config says nothing
    # of it (the tensors do). Its top-level original_max_position_embeddings only
    # matters to a longrope scaling (tests/test_longrope.py). Partial rotary and
    # a sliding window come from its config.
    from onboard.reference.infer import infer_spec
    from onboard.spec.hf import hf_config_from_spec, hf_fields

    config = transformers.Phi3Config(
        **SMALL,
        pad_token_id=0,
        eos_token_id=2,
        sliding_window=8,
        original_max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5},
    ).to_dict()
    spec, proof = infer_spec(config)
    assert spec.checkpoint.fused == ["qkv_proj", "gate_up_proj"]
    assert proof.found["checkpoint.fused"] == ["qkv_proj", "gate_up_proj"]
    assert spec.attention.partial_rotary_factor == 0.5
    assert spec.attention.sliding_window == 8
    assert proof.max_rel_diff < RTOL
    # Its config.json (written for the generated files) reads back to it.
    back = spec_from_hf_config(hf_config_from_spec(spec))
    assert hf_fields(back) == hf_fields(spec)
    # The same spec with the projections apart misfits on the tensors.
    apart = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(
        update={"fused": []})})  # fmt: skip
    with pytest.raises(ProofFailed, match=r"self_attn\.qkv_proj\.weight"):
        prove_spec(apart, config)
    longrope = dict(
        config,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0] * 4,
            "long_factor": [2.0] * 4,
            "partial_rotary_factor": 0.5,
            "original_max_position_embeddings": 128,
        },
    )
    # With longrope, the top-level copy is its original context (Phi3Config's copy
    # wins over the rope parameters'), and the factors are the spec's.
    scaling = spec_from_hf_config(longrope).rope.scaling
    assert scaling.type == "longrope"
    assert scaling.original_max_position_embeddings == 128
    assert scaling.short_factor == [1.0] * 4 and scaling.long_factor == [2.0] * 4


@pytest.mark.parametrize("model_type", ["cohere", "cohere2"])
def test_parallel_blocks_with_scaled_logits_are_found_and_proven(model_type):
    # Cohere: one weight-only LayerNorm per layer that attention and the MLP both
    # read (the tensors show it), interleaved rope (the proof shows it), logits
    # multiplied by logit_scale, tied embeddings. Cohere-2 slides on three layers
    # of four and its full-attention layers use no rope (the proof shows it).
    from onboard.reference.infer import infer_spec
    from onboard.spec.hf import hf_config_from_spec

    extra = dict(sliding_window=8) if model_type == "cohere2" else {}
    config = transformers.AutoConfig.for_model(
        model_type, **SMALL, logit_scale=0.25, **extra
    ).to_dict()
    spec, proof = infer_spec(config)
    assert (spec.norm.type, spec.norm.placement, spec.norm.bias) == (
        "layernorm",
        "parallel",
        False,
    )
    assert spec.rope.interleaved and spec.tie_word_embeddings
    assert spec.logit_scale == 0.25
    assert proof.found["norm_placement"] == "parallel"
    assert proof.max_rel_diff < RTOL
    if model_type == "cohere2":
        assert spec.attention.sliding_window == 8
        assert spec.rope.nope_layers == [3]
        assert proof.found["nope_when_sliding"] is True
    # The generated files read the scale from the config written for the spec.
    assert hf_config_from_spec(spec)["logit_scale"] == 0.25
    # A pre-norm block names a norm the family lacks; rope on the halves differs
    # in the first layer's attention.
    data = spec.model_dump(mode="json")
    data["norm"]["placement"] = "pre"
    with pytest.raises(ProofFailed, match="post_attention_layernorm"):
        prove_spec(ModelSpec.model_validate(data), config)
    data = spec.model_dump(mode="json")
    data["rope"]["interleaved"] = False
    with pytest.raises(ProofFailed, match="layer 0, attention"):
        prove_spec(ModelSpec.model_validate(data), config)


def test_q_k_norms_with_a_weight_per_head_are_found_and_proven():
    # Command R+'s q/k norms (use_qk_norm) are LayerNorms over each head with a
    # weight row per head ([heads, head_dim], randomised by the proof), found by
    # their shapes; a shared per-head weight misfits on them.
    from onboard.reference.infer import infer_spec

    config = transformers.CohereConfig(**SMALL, use_qk_norm=True).to_dict()
    spec, proof = infer_spec(config)
    assert (spec.attention.qk_norm, spec.attention.qk_norm_scope) == (
        True,
        "head_weights",
    )
    assert proof.max_rel_diff < RTOL
    data = spec.model_dump(mode="json")
    data["attention"]["qk_norm_scope"] = "head"
    with pytest.raises(ProofFailed, match=r"q_norm.weight is \[4, 16\]"):
        prove_spec(ModelSpec.model_validate(data), config)


def test_interleaved_partial_rope_and_a_fused_mlp_are_found_and_proven():
    # GLM: gate/up in one tensor, rope on half of each head with interleaved
    # pairs, and biases on q/k/v but not on o_proj though its attention_bias
    # says true.
    from onboard.reference.infer import infer_spec

    config = transformers.GlmConfig(**SMALL, head_dim=16, pad_token_id=0).to_dict()
    spec, proof = infer_spec(config)
    att = spec.attention
    assert spec.checkpoint.fused == ["gate_up_proj"]
    assert att.partial_rotary_factor == 0.5 and spec.rope.interleaved
    assert (att.qkv_bias, att.o_bias) == (True, False)
    assert proof.max_rel_diff < RTOL
    data = spec.model_dump(mode="json")
    data["rope"]["interleaved"] = False  # the halves of the rotary dims instead
    with pytest.raises(ProofFailed, match="layer 0, attention"):
        prove_spec(ModelSpec.model_validate(data), config)


@pytest.mark.parametrize(
    ("model_type", "extra", "module", "routing"),
    [
        # Sigmoid with a bias on the MoE block; its full-attention layer (3, the
        # fourth of the sliding pattern) has no rope, which no key says.
        (
            "exaone_moe",
            dict(num_experts=8, num_shared_experts=1, head_dim=16, **MOE),
            "model.layers.{layer}.mlp",
            ("sigmoid", False),
        ),
        # Sigmoid with a bias on the block, no expert groups, Mixtral names.
        (
            "minimax_m2",
            dict(num_local_experts=8, head_dim=16, num_experts_per_tok=2),
            "model.layers.{layer}.block_sparse_moe",
            ("sigmoid", False),
        ),
        # Softmax whose top-k is chosen on score + bias, the bias stored as
        # [1, num_experts] on a module of its own; its router starts at zero
        # (the proof draws it, or softmax and sigmoid would weigh alike).
        (
            "ernie4_5_moe",
            dict(moe_num_experts=8, moe_k=2, moe_intermediate_size=32, head_dim=16),
            "model.layers.{layer}.mlp.moe_statics",
            ("softmax", True),
        ),
    ],
)
def test_a_router_bias_at_its_own_module_is_found_and_proven(
    model_type, extra, module, routing
):
    from onboard.reference.infer import infer_spec
    from onboard.spec.hf import hf_config_from_spec

    config = transformers.AutoConfig.for_model(model_type, **SMALL, **extra).to_dict()
    spec, proof = infer_spec(config)
    router = spec.mlp.moe.router
    assert router.bias_correction and router.norm_topk_prob
    assert router.scoring == routing[0]
    assert spec.checkpoint.tensor_names["router_bias"] == module
    assert spec.checkpoint.router_bias_2d is routing[1]
    assert proof.found["checkpoint.tensor_names.router_bias"] == module
    assert proof.max_rel_diff < RTOL
    if model_type == "exaone_moe":
        assert spec.rope.nope_layers == [3]
        assert proof.found["nope_when_sliding"] is True
    # What was found survives the spec's own config.json.
    assert hf_config_from_spec(spec)["model_type"] == model_type
    # Without the override the bias is a tensor the spec does not name.
    data = spec.model_dump(mode="json")
    data["checkpoint"].update(tensor_names={}, router_bias_2d=False)
    with pytest.raises(ProofFailed, match="e_score_correction_bias"):
        prove_spec(ModelSpec.model_validate(data), config)


# -- Gemma's parts -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("drop", "where"),
    [
        # The soft-caps are small in test_spec_hf's Gemma-2 config, so on the tiny
        # model they change the logits.
        ({"attention": {"logit_softcap": None}}, "layer 0, attention"),
        ({"final_logit_softcap": None}, "the final norm or the output head"),
        ({"attention": {"query_pre_attn_scalar": None}}, "layer 0, attention"),
    ],
)
def test_each_gemma2_attention_part_is_proven(drop, where):
    config = transformers_config("gemma2").to_dict()
    spec = spec_from_hf_config(config)
    assert prove_spec(spec, config).max_rel_diff < RTOL
    data = spec.model_dump(mode="json")
    for key, value in drop.items():
        if isinstance(value, dict):
            data[key].update(value)
        else:
            data[key] = value
    with pytest.raises(ProofFailed, match=f"first divergence: {where}"):
        prove_spec(ModelSpec.model_validate(data), config)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (("scale_embedding",), False),
        (("norm", "unit_offset"), False),
        (("norm", "placement"), "pre"),
    ],
)
def test_a_gemma_fact_cannot_be_dropped(field, value):
    # What Gemma-2's code hard-codes is no key of its config: a spec without it
    # cannot be written as a gemma2 config.json (the proof never runs).
    config = transformers_config("gemma2").to_dict()
    data = spec_from_hf_config(config).model_dump(mode="json")
    *parents, leaf = field
    target = data
    for key in parents:
        target = target[key]
    target[leaf] = value
    with pytest.raises(InputError, match=f"{'.'.join(field)}: the spec says"):
        prove_spec(ModelSpec.model_validate(data), config)


def test_glm4_sandwich_norms_are_proven_by_role():
    # GLM-4's post_attention_layernorm is its MLP's input norm (Gemma-2's is
    # attention's output norm): the two swapped name every tensor, and the proof
    # fails on the forward pass.
    config = transformers_config("glm4").to_dict()
    spec = spec_from_hf_config(config)
    assert prove_spec(spec, config).max_rel_diff < RTOL
    data = spec.model_dump(mode="json")
    names = data["checkpoint"]["tensor_names"]
    names["attention_output_norm"], names["mlp_input_norm"] = (
        names["mlp_input_norm"],
        names["attention_output_norm"],
    )
    with pytest.raises(ProofFailed, match="first divergence: layer 0"):
        prove_spec(ModelSpec.model_validate(data), config)


def test_gemma3_reads_a_rope_per_layer_kind():
    # Hub-style Gemma-3 keys: the legacy rope_theta / rope_local_base_freq /
    # rope_scaling and a sliding_window_pattern, which its class turns into
    # rope_parameters and layer_types.
    config = transformers.Gemma3TextConfig(
        **SMALL,
        head_dim=16,
        sliding_window=8,
        sliding_window_pattern=2,
        rope_theta=1e6,
        rope_local_base_freq=1e4,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
    ).to_dict()
    spec = spec_from_hf_config(config)
    assert spec.layer_attention_types() == ["sliding_attention", "full_attention"] * 2
    assert (spec.rope.theta, spec.rope.scaling.type) == (1e6, "linear")
    assert spec.rope.sliding.theta == 1e4 and spec.rope.sliding.scaling is None
    assert prove_spec(spec, config).max_rel_diff < RTOL
    # Gemma-3's attention never reads attn_logit_softcapping: a config setting it
    # is refused rather than read one way by the spec, another by the model.
    with pytest.raises(InputError, match="attention.logit_softcap: the config says"):
        spec_from_hf_config({**config, "attn_logit_softcapping": 50.0})
    # A family whose class has one rope for every layer takes no per-kind rope.
    qwen3 = {
        **transformers_config("qwen3").to_dict(),
        "rope_parameters": config["rope_parameters"],
    }
    with pytest.raises(InputError, match="rope_parameters: per layer type, but"):
        spec_from_hf_config(qwen3)


def test_olmo3_sliding_layers_with_their_own_rope_prove():
    # OLMo-3: OLMo-2's block (found by the proof) with sliding layers and a rope
    # per layer kind, which its config keys by layer type.
    from onboard.reference.infer import infer_spec

    config = transformers.Olmo3Config(
        **SMALL,
        head_dim=16,
        sliding_window=8,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "default", "rope_theta": 5e5},
        },
    ).to_dict()
    spec, proof = infer_spec(config)
    assert (
        spec.norm.placement == "post" and spec.attention.qk_norm_scope == "projection"
    )
    assert spec.rope.theta == 5e5 and spec.rope.sliding.theta == 1e4
    assert "sliding_attention" in spec.layer_attention_types()
    assert proof.max_rel_diff < RTOL


@pytest.mark.parametrize(
    ("model_type", "field", "value"),
    [
        # Qwen3-Next's and Qwen3.5's decoder-layer, q/k and final norms scale by
        # 1 + weight (their gated DeltaNet norm by its weight: the proof passes
        # only with both right).
        ("qwen3_next", ("norm", "unit_offset"), False),
        ("qwen3_5_text", ("norm", "unit_offset"), False),
        # Qwen3.5 stores the projections Qwen3-Next groups per key head apart.
        ("qwen3_5_text", ("linear_attention", "projections"), "grouped"),
        ("qwen3_next", ("linear_attention", "projections"), "split"),
    ],
)
def test_a_qwen_hybrid_fact_cannot_be_dropped(model_type, field, value):
    config = transformers_config(model_type).to_dict()
    data = spec_from_hf_config(config).model_dump(mode="json")
    *parents, leaf = field
    target = data
    for key in parents:
        target = target[key]
    target[leaf] = value
    with pytest.raises(InputError, match=f"{'.'.join(field)}: the spec says"):
        prove_spec(ModelSpec.model_validate(data), config)


def test_qwen3_5_text_mrope_is_the_plain_rope_on_text():
    # Published Qwen3.5 configs split the rope's frequencies between time, height
    # and width positions; a language model's three positions are the same, so
    # the plain rope is proven. Another family's rope does not take the keys.
    mrope = {
        "rope_type": "default",
        "rope_theta": 1e6,
        "partial_rotary_factor": 0.25,  # the class's own (set beside these too)
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    }
    config = transformers_config("qwen3_5_text", rope_parameters=mrope).to_dict()
    spec = spec_from_hf_config(config)
    assert spec.rope.theta == 1e6 and spec.rope.scaling is None
    assert spec.attention.partial_rotary_factor == 0.25
    assert prove_spec(spec, config).max_rel_diff < RTOL
    other = transformers_config("qwen3_next", rope_parameters=mrope).to_dict()
    with pytest.raises(InputError, match="mrope_section: not expressible"):
        spec_from_hf_config(other)


def _wrapper_config(model_type: str, text_type: str) -> dict:
    from transformers import AutoConfig

    text = transformers_config(text_type).to_dict()
    return AutoConfig.for_model(model_type, text_config=text).to_dict()


@pytest.mark.parametrize(
    ("model_type", "text_type"),
    [("qwen3_5", "qwen3_5_text"), ("qwen3_5_moe", "qwen3_5_moe_text")],
)
def test_a_multimodal_wrapper_is_proven_on_its_language_model(model_type, text_type):
    # Qwen3.5 as published: the language model's config is text_config, its
    # tensors model.language_model.*, the vision tower's model.visual.*. The
    # spec is the language model alone, proven against the wrapper's own class
    # on text input (the reference loads the wrapper's tensors renamed).
    from onboard.generate import render_model
    from onboard.spec.hf import hf_config_from_spec

    config = _wrapper_config(model_type, text_type)
    spec = spec_from_hf_config(config)
    text_spec = spec_from_hf_config(transformers_config(text_type).to_dict())
    assert spec.model_type == model_type
    assert spec.architecture.endswith("ForConditionalGeneration")
    assert spec.checkpoint.language_model_prefix == "model.language_model"
    assert spec.checkpoint.skipped_prefixes == ["model.visual"]
    same = {"attention", "linear_attention", "mlp", "norm", "rope", "hidden_size"}
    assert spec.model_dump(include=same) == text_spec.model_dump(include=same)
    proof = prove_spec(spec, config)
    assert proof.model_class == spec.architecture
    assert proof.max_rel_diff < RTOL
    assert "wrapper's model.visual (vision) is not part" in proof.header()
    written = hf_config_from_spec(spec)
    assert written["model_type"] == model_type
    assert written["text_config"]["model_type"] == text_type
    assert spec_from_hf_config(written) == spec.model_copy(
        update={"name": model_type.replace("_", "-")}
    )
    # The vLLM model reads text_config and loads the wrapper's checkpoint.
    source = render_model(spec)
    assert "model_config.hf_config\n" not in source
    assert "model_config.hf_text_config" in source
    assert '"model.language_model.": "model."' in source
    assert '"model.visual.": None' in source
    assert "qwen3_5 import" not in source  # never vLLM's multimodal class


def test_a_wrapper_s_language_model_at_another_prefix_fails_on_the_tensors():
    config = _wrapper_config("qwen3_5", "qwen3_5_text")
    data = spec_from_hf_config(config).model_dump(mode="json")
    data["checkpoint"]["language_model_prefix"] = "model.text_model"
    with pytest.raises(ProofFailed, match="does not fit the family's tensors"):
        prove_spec(ModelSpec.model_validate(data), config)
    data = spec_from_hf_config(config).model_dump(mode="json")
    data["checkpoint"]["skipped_prefixes"] = []
    with pytest.raises(ProofFailed, match="outside its language model are model"):
        prove_spec(ModelSpec.model_validate(data), config)


def test_a_wrapper_around_an_unproven_language_model_is_refused():
    from transformers import AutoConfig

    # Llama-4's wraps a proven family, in a checkpoint form not expressible.
    config = AutoConfig.for_model("llama4").to_dict()
    with pytest.raises(InputError, match="lm_head under the wrapper"):
        spec_from_hf_config(config)
    config = _wrapper_config("qwen3_5", "qwen3_5_text")
    config["text_config"]["model_type"] = "qwen3_5_moe_text"
    with pytest.raises(InputError, match="nests a 'qwen3_5_text' language model"):
        spec_from_hf_config(config)


def _mistral4_config() -> dict:
    from transformers import AutoConfig

    small = dict(
        vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=512, q_lora_rank=64,
        qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32,
        moe_intermediate_size=64, intermediate_size=128, n_routed_experts=8,
        num_experts_per_tok=2, max_position_embeddings=256,
    )  # fmt: skip
    config = AutoConfig.for_model("mistral4", **small).to_dict()
    # A short original context: the proof's positions pass it several times, so
    # the query scaling grows within the sequence.
    config["rope_parameters"].update(original_max_position_embeddings=4, factor=2.0)
    return config


def test_mistral4_is_proven():
    # Mistral-4: DeepSeek-V3's MLA and MoE. Its partial_rotary_factor is the
    # rope's share of the whole q/k head (nope + rope) and reads as the spec's
    # qk_rope_head_dim; its queries grow with the position (llama_4_scaling);
    # its experts are two parameters of one module, output dim first.
    config = _mistral4_config()
    assert config["rope_parameters"]["partial_rotary_factor"] == 64 / 96
    assert config["rope_parameters"]["llama_4_scaling_beta"] == 0.1
    spec = spec_from_hf_config(config)
    assert spec.attention.mla.qk_rope_head_dim == 64
    assert spec.attention.partial_rotary_factor == 1.0
    scaling = spec.attention.llama_4_scaling
    assert (scaling.beta, scaling.original_max_position_embeddings) == (0.1, 4)
    assert spec.checkpoint.experts_format == "parameters"
    prove_spec(spec, config)
    config["rope_parameters"]["partial_rotary_factor"] = 0.5
    with pytest.raises(InputError, match="rotates 48 dims of each MLA head's 96"):
        spec_from_hf_config(config)


def test_mistral4_without_its_query_scaling_fails_the_proof():
    config = _mistral4_config()
    data = spec_from_hf_config(config).model_dump(mode="json")
    data["attention"]["llama_4_scaling"] = None
    with pytest.raises(ProofFailed, match="first divergence: layer 0, attention"):
        prove_spec(ModelSpec.model_validate(data), config)


def test_mistral4_with_its_experts_stored_otherwise_fails_the_proof():
    config = _mistral4_config()
    data = spec_from_hf_config(config).model_dump(mode="json")
    data["checkpoint"].update(experts_format="linear", tensor_names={})
    with pytest.raises(ProofFailed, match=r"mlp\.experts\.gate_up_proj"):
        prove_spec(ModelSpec.model_validate(data), config)


def test_a_mistral4_checkpoint_transformers_wrote_passes_preflight(tmp_path):
    # save_pretrained keeps the experts as the module holds them (no conversion
    # mapping un-fuses them): the tensors the spec names, at the spec's shapes.
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from onboard.checkpoint.preflight import preflight

    config = _mistral4_config()
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(
        CONFIG_MAPPING["mistral4"].from_dict(config)
    )
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        shape = f.get_slice("model.layers.0.mlp.experts.gate_up_proj").get_shape()
    assert shape == [8, 2 * 64, 128]  # [experts, gate rows then up rows, hidden]
    spec = spec_from_hf_config(json.loads((tmp_path / "config.json").read_text()))
    report = preflight(spec, tmp_path)
    assert not [p for p in report.problems if p.severity == "error"], report.problems
    data = spec.model_dump(mode="json")
    data["checkpoint"].update(experts_format="linear", tensor_names={})
    report = preflight(ModelSpec.model_validate(data), tmp_path)
    assert any("mlp.experts" in p.where for p in report.problems)


def test_mistral4_query_scaling_needs_its_original_context():
    config = _mistral4_config()
    config["rope_parameters"].update(rope_type="default", type="default")
    for key in ("factor", "original_max_position_embeddings", "beta_fast",
                "beta_slow", "mscale", "mscale_all_dim"):  # fmt: skip
        config["rope_parameters"].pop(key)
    with pytest.raises(InputError, match="llama_4_scaling_beta=0.1: needs"):
        spec_from_hf_config(config)
    config["rope_parameters"]["original_max_position_embeddings"] = 8
    spec = spec_from_hf_config(config)
    assert spec.rope.scaling is None
    assert spec.attention.llama_4_scaling.original_max_position_embeddings == 8


def test_a_wrapper_checkpoint_transformers_wrote_passes_preflight(tmp_path):
    # The checkpoint as published (vision tower and all) matches the spec read
    # from its config: its tensors as the generated model loads them.
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from onboard.checkpoint.preflight import preflight
    from onboard.reference.prove import shrink_vision

    config = AutoConfig.for_model(
        "qwen3_5", text_config=transformers_config("qwen3_5_text").to_dict()
    )
    shrink_vision(config)
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(config).save_pretrained(tmp_path)
    spec = spec_from_hf_config(json.loads((tmp_path / "config.json").read_text()))
    report = preflight(spec, tmp_path)
    assert not [p for p in report.problems if p.severity == "error"], report.problems
    data = spec.model_dump(mode="json")
    data["checkpoint"]["skipped_prefixes"] = []
    report = preflight(ModelSpec.model_validate(data), tmp_path)
    assert any("model.visual" in p.where for p in report.problems)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"skipped_prefixes": ["model.visual"]}, "needs checkpoint.language_model"),
        ({"language_model_prefix": "model"}, "not `model` or `lm_head`"),
        (
            {
                "language_model_prefix": "model.language_model",
                "skipped_prefixes": ["model.language_model.layers"],
            },
            "is inside the language model",
        ),
    ],
)
def test_wrapper_prefix_rules(change, message):
    from onboard.spec.rules import check_rules

    config = transformers_config("qwen3_5_text").to_dict()
    data = spec_from_hf_config(config).model_dump(mode="json")
    data["checkpoint"].update(change)
    problems = check_rules(ModelSpec.model_validate(data))
    assert any(message in m for _, m in problems), problems


def test_a_published_qwen3_5_config_is_read_without_its_mtp_head():
    # Published Qwen3.5 configs state full_attention_interval beside layer_types
    # (a copy: the class reads layer_types) and Qwen's MTP head, which the main
    # model does not use: the spec has no MTP heads, and the header names it.
    config = _wrapper_config("qwen3_5", "qwen3_5_text")
    text = config["text_config"]
    text.update(full_attention_interval=4, mtp_num_hidden_layers=1)
    spec = spec_from_hf_config(config)
    assert spec.checkpoint.language_model_prefix
    assert spec.mtp is None
    assert "text_config.mtp_num_hidden_layers (Qwen's MTP head" in " ".join(
        hf.accepted_keys(config)
    )
    text["full_attention_interval"] = 3
    with pytest.raises(InputError, match="full_attention_interval=3 disagrees"):
        spec_from_hf_config(config)
