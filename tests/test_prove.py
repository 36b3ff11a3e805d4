"""`spec from-hf` proves the spec it infers against transformers' own class.

Each verified family's config (small dims, the features its config class can
state) must prove: the reference generated for the inferred spec gives the logits
of transformers' model on a tiny random model of the family, its norms and biases
randomised. What a config does not say must fail the proof rather than be written
silently wrong: transformers' Llama ignores `rope_parameters.partial_rotary_factor`,
which the spec reads; tensor names that do not fit fail on the tensors.
"""

from __future__ import annotations

import pytest
import transformers
from test_spec_hf import FAMILIES, SMALL, run_cli, transformers_config

from onboard.errors import InputError
from onboard.reference.prove import RTOL, ProofFailed, prove_spec
from onboard.spec.hf import spec_from_hf_config


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


def test_an_unverified_family_is_accepted_by_its_proof_only(tmp_path):
    # Ministral is Llama's block under another model_type: proven, so accepted.
    config = transformers.MinistralConfig(**SMALL, head_dim=16).to_dict()
    with pytest.raises(InputError, match="has not verified"):
        spec_from_hf_config(config)  # the library refuses what it cannot prove
    spec = spec_from_hf_config(config, unverified=True)
    assert prove_spec(spec, config).max_rel_diff < RTOL
    # Gemma scales the embedding by sqrt(hidden_size) (and its norms by 1 + w),
    # which its config does not say.
    config = transformers.GemmaConfig(**SMALL).to_dict()
    spec = spec_from_hf_config(config, unverified=True)
    with pytest.raises(ProofFailed, match=r"the embedding \(before layer 0\)"):
        prove_spec(spec, config)

    transformers.MinistralConfig(**SMALL, head_dim=16).save_pretrained(
        tmp_path / "ministral"
    )
    out = tmp_path / "spec.yaml"
    r = run_cli("spec", "from-hf", tmp_path / "ministral", "-o", out)
    assert r.returncode == 0, r.stderr
    head = " ".join(out.read_text().split("spec_version")[0].split())
    assert "proven against transformers" in head
    assert "ministral is not among the verified families" in head
    r = run_cli("spec", "from-hf", tmp_path / "ministral", "-o", out, "--no-verify")
    assert r.returncode == 2 and "has not verified" in r.stderr
