"""Phi-3's LongRoPE (`rope.scaling.type: longrope`), proven against transformers.

transformers' Phi3ForCausalLM is the independent reference: a tiny random Phi-3
with one short and one long factor per rotary pair is saved by transformers
itself, the spec is read from its config.json, and the reference onboard
generates loads the same weights and must give its logits (float32, within
1e-4 of the largest) on a sequence within original_max_position_embeddings
(the short factors) and on one past it (the long factors: transformers picks
them per forward pass by its largest position + 1, and so does the reference).

The comparison can fail: the same reference with the short and long factors
swapped in its config.json, or with the attention factor dropped, differs from
transformers by far more than the tolerance (asserted below), and so does
transformers' own output on the first tokens of a short and of a long sequence
(the long factors are really taken).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_reference import RTOL, VOCAB, load_reference
from test_spec_hf import run_cli

from onboard.errors import InputError
from onboard.generate import render_model
from onboard.reference import install_reference
from onboard.reference.infer import infer_spec
from onboard.spec.hf import hf_config_from_spec, spec_from_hf_config
from onboard.spec.loader import parse_spec_text

pytestmark = pytest.mark.usefixtures("one_thread")

ORIGINAL = 16  # original_max_position_embeddings of the tiny models
SHORT, LONG = 12, 40  # sequence lengths: within it, and past it


def _factors(n: int, seed: int, low: float, high: float) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    return [
        round(float(x), 4) for x in torch.empty(n).uniform_(low, high, generator=gen)
    ]


def phi3(partial: float = 1.0, attention_factor: float | None = 1.3):
    """A tiny random Phi-3 with LongRoPE (head_dim 16; rotary_dim 16 * partial)."""
    from transformers import Phi3Config, Phi3ForCausalLM

    pairs = int(16 * partial) // 2
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": _factors(pairs, 1, 1.0, 2.0),
        "long_factor": _factors(pairs, 2, 2.0, 8.0),
        "original_max_position_embeddings": ORIGINAL,
        "partial_rotary_factor": partial,
    }
    if attention_factor is not None:
        rope["attention_factor"] = attention_factor
    config = Phi3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        max_position_embeddings=64,
        original_max_position_embeddings=ORIGINAL,
        rope_parameters=rope,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return Phi3ForCausalLM(config).eval()


def _ids(seq: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(1))


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def _saved(tmp_path: Path, model) -> tuple[Path, object]:
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    # What `spec from-hf` runs: read, and proven on transformers' tiny model (24
    # tokens: past the original context, so the long factors).
    spec, _ = infer_spec(json.loads((ckpt / "config.json").read_text()))
    install_reference(spec, ckpt)
    return ckpt, spec


def _with_rope(ckpt: Path, change) -> torch.nn.Module:
    """The reference loaded again with its config's rope_parameters changed."""
    path = ckpt / "config.json"
    config = json.loads(path.read_text())
    change(config["rope_parameters"])
    path.write_text(json.dumps(config))
    return load_reference(ckpt)


@pytest.mark.parametrize("partial", [1.0, 0.75])
def test_reference_matches_phi3_short_and_long(tmp_path, partial):
    model = phi3(partial)
    ckpt, spec = _saved(tmp_path, model)
    scaling = spec.rope.scaling
    assert scaling.type == "longrope" and scaling.attention_factor == 1.3
    assert scaling.original_max_position_embeddings == ORIGINAL
    assert len(scaling.short_factor) == int(16 * partial) // 2
    ref = load_reference(ckpt)
    assert type(ref).__module__.startswith("transformers_modules.")
    want, got = {}, {}
    with torch.no_grad():
        for seq in (SHORT, LONG):
            want[seq], got[seq] = model(_ids(seq)).logits, ref(_ids(seq)).logits
            assert _rel(got[seq], want[seq]) < RTOL, seq
    # The long sequence really took the long factors: its first tokens differ
    # from the same tokens alone (within the original context).
    assert _rel(want[LONG][:, :SHORT], want[SHORT]) > 100 * RTOL

    # Swapped factors: both paths fail.
    def swap(rope):
        rope["short_factor"], rope["long_factor"] = (
            rope["long_factor"],
            rope["short_factor"],
        )

    swapped = _with_rope(ckpt, swap)
    with torch.no_grad():
        for seq in (SHORT, LONG):
            assert _rel(swapped(_ids(seq)).logits, want[seq]) > 100 * RTOL, seq


def test_attention_factor_matters_and_its_default_follows_the_context(tmp_path):
    ckpt, _ = _saved(tmp_path, phi3())
    want = phi3()(_ids(SHORT)).logits.detach()
    # Ignored: the default from max_position_embeddings / original (64 / 16),
    # sqrt(1 + ln 4 / ln 16) = 1.22, instead of the stated 1.3.
    default = math.sqrt(1 + math.log(64 / ORIGINAL) / math.log(ORIGINAL))
    dropped = _with_rope(ckpt, lambda rope: rope.update(attention_factor=default))
    with torch.no_grad():
        # (random tiny weights attend almost evenly: measured 2.1e-3, 20x RTOL)
        assert _rel(dropped(_ids(SHORT)).logits, want) > 10 * RTOL
    # A model without one: the default, equal to transformers'.
    default = phi3(attention_factor=None)
    ckpt, spec = _saved(tmp_path / "default", default)
    assert spec.rope.scaling.attention_factor is None
    ref = load_reference(ckpt)
    with torch.no_grad():
        for seq in (SHORT, LONG):
            assert _rel(ref(_ids(seq)).logits, default(_ids(seq)).logits) < RTOL


def test_legacy_su_reads_as_longrope_and_round_trips():
    config = phi3().config.to_dict()
    rope = dict(config.pop("rope_parameters"))
    rope.pop("rope_type")
    config["rope_scaling"] = {**rope, "type": "su"}
    spec = spec_from_hf_config(config)
    assert spec.rope.scaling.type == "longrope"
    written = hf_config_from_spec(spec)["rope_parameters"]
    assert written["rope_type"] == "longrope"
    assert written["original_max_position_embeddings"] == ORIGINAL
    assert spec_from_hf_config(hf_config_from_spec(spec)).rope == spec.rope
    # A model type transformers does not know: onboard's own reading of "su".
    config.update(model_type="acme_lm", architectures=["AcmeLmForCausalLM"])
    assert spec_from_hf_config(config).rope == spec.rope


def test_generated_vllm_model_passes_the_attention_factor():
    """vLLM's LongRoPE derives its factor on cos and sin from
    max_position_embeddings unless short_mscale / long_mscale say otherwise."""
    text = render_model(spec_from_hf_config(phi3().config.to_dict()))
    assert 'mscale = rope_parameters["attention_factor"]' in text
    assert '"short_mscale": mscale' in text and '"long_mscale": mscale' in text
    config = phi3(attention_factor=None).config.to_dict()
    text = render_model(spec_from_hf_config(config))
    assert "mscale" not in text
    assert "rope_parameters=config.rope_parameters," in text


SPEC = """\
spec_version: 1
name: tiny-longrope
architecture: TinyLongropeForCausalLM
model_type: tiny_longrope
vocab_size: 256
hidden_size: 64
num_hidden_layers: 2
max_position_embeddings: 64
tie_word_embeddings: false
attention: {{num_heads: 4, num_kv_heads: 2, head_dim: 16{attention}}}
mlp: {{intermediate_size: 96}}
rope:
  theta: 10000.0{interleaved}
  scaling:
    type: {kind}
    original_max_position_embeddings: {original}
    short_factor: {short}
    long_factor: [2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5]{extra}
"""
GOOD = dict(
    attention="",
    interleaved="",
    kind="longrope",
    original=16,
    short="[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]",
    extra="\n    attention_factor: 1.2",
)


def test_a_longrope_spec_round_trips_through_its_config():
    spec = parse_spec_text(SPEC.format(**GOOD), "s.yaml")
    config = hf_config_from_spec(spec)
    assert config["rope_parameters"]["attention_factor"] == 1.2
    assert spec_from_hf_config(config) == spec


@pytest.mark.parametrize(
    ("change", "located", "said"),
    [
        (
            dict(short="[1.0, 1.1, 1.2]"),
            "rope.scaling.short_factor",
            "3 factors; longrope needs one per rotary pair: rotary_dim / 2 = 8",
        ),
        (
            dict(attention=", partial_rotary_factor: 0.5"),
            "rope.scaling.long_factor",
            "8 factors; longrope needs one per rotary pair: rotary_dim / 2 = 4",
        ),
        (
            dict(short="[1.0, 1.1, 1.2, -1.3, 1.4, 1.5, 1.6, 1.7]"),
            "rope.scaling.short_factor[3]",
            "greater than 0 (got -1.3)",
        ),
        (
            dict(original=128),
            "rope.scaling.original_max_position_embeddings",
            "exceeds",
        ),
        (
            dict(interleaved="\n  interleaved: true"),
            "rope.interleaved",
            "longrope rotates the two halves",
        ),
        (
            dict(extra="\n    factor: 4.0\n    attention_factor: -1"),
            "rope.scaling.attention_factor",
            "greater than 0 (got -1)",
        ),
        (
            dict(kind="yarn", extra="\n    factor: 4.0"),
            "rope.scaling.short_factor",
            "short_factor applies to longrope scaling only",
        ),
    ],
)
def test_bad_longrope_specs_are_located_and_exit_2(tmp_path, change, located, said):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(**{**GOOD, **change}))
    result = run_cli("spec", "check", path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if located in line]
    assert lines and said in " ".join(lines), result.stderr


def test_longrope_needs_its_factors_and_original_context():
    text = SPEC.format(**GOOD).replace("    original_max_position_embeddings: 16\n", "")
    with pytest.raises(InputError) as info:
        parse_spec_text(text, "s.yaml")
    assert "longrope rope scaling needs original_max_position_embeddings" in str(
        info.value
    )
    config = phi3().config.to_dict()
    del config["rope_parameters"]["long_factor"]
    with pytest.raises(InputError) as info:
        spec_from_hf_config(config, source="cfg.json")
    assert "long_factor" in str(info.value)


# ---- the generated vLLM model on the CPU engine --------------------------------

# vLLM's CPU attention takes head_dim 32, not 16: 16 rotary pairs.
ENGINE_SPEC = (
    SPEC.format(
        **{
            **GOOD,
            "original": 64,
            "short": str([round(1 + i / 16, 4) for i in range(16)]),
        }
    )
    .replace("head_dim: 16", "head_dim: 32")
    .replace("\nmax_position_embeddings: 64", "\nmax_position_embeddings: 256")
    .replace(
        "long_factor: [2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5]",
        f"long_factor: {[2.0 + i / 2 for i in range(16)]}",
    )
)


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    from conftest import generated_engine_run

    from onboard.validate.harness import longrope_context

    spec = parse_spec_text(ENGINE_SPEC, "tiny-longrope.yaml")
    work = tmp_path_factory.mktemp("longrope-engine")
    # As validation runs it: within original_max_position_embeddings, where
    # vLLM (by max_model_len) and the reference (by each pass's length) both
    # take the short factors.
    context = longrope_context(spec)
    assert context == 64
    return generated_engine_run(spec, work, every=2, max_model_len=context)


@pytest.mark.engine
def test_the_longrope_model_on_the_engine_matches_the_reference(engine_run):
    """The generated model (vLLM's Phi3LongRoPEScaledRotaryEmbedding, the stated
    attention factor passed as short_mscale / long_mscale) on the CPU engine
    against the float32 reference by the accuracy check's rule (measured: 6 of 6
    identical, prompt logprobs within 4.4e-05 nats); the same engine outputs
    against the reference with the short and long factors swapped fail it (3.2
    nats), and differ from it with vLLM's default attention factor in place of
    the stated one by more than ten times the bound."""
    from conftest import judge_engine_outputs

    from onboard.runtime.compare import PROMPT_LOGPROB_ATOL
    from onboard.runtime.reference import load_reference

    spec, ckpt, work, prompts, info, outputs = engine_run
    assert info["model_class"].endswith(".TinyLongropeForCausalLM")
    assert max(len(p) for p in prompts) + 16 <= 64

    def verdict(name: str):
        ref = load_reference(ckpt, spec, work / "gen" / "hf", work / name)
        return judge_engine_outputs(outputs, ref.model, prompts)

    good = verdict("ref")
    assert good.passed, good.details
    config = json.loads((ckpt / "config.json").read_text())
    # vLLM's own factor on cos and sin, sqrt(1 + ln 4 / ln 64) = 1.155 from
    # max_position_embeddings / original, instead of the stated 1.2: the engine
    # took the stated one (short_mscale / long_mscale).
    rope = config["rope_parameters"]
    rope["attention_factor"] = math.sqrt(1 + math.log(256 / 64) / math.log(64))
    (ckpt / "config.json").write_text(json.dumps(config))
    unscaled = verdict("ref-vllm-default")
    assert unscaled.metrics["prompt_logprob_max_abs_diff"] > 10 * PROMPT_LOGPROB_ATOL
    rope["attention_factor"] = 1.2
    rope = config["rope_parameters"]
    rope["short_factor"], rope["long_factor"] = (
        rope["long_factor"],
        rope["short_factor"],
    )
    (ckpt / "config.json").write_text(json.dumps(config))
    swapped = verdict("ref-swapped")
    print(
        f"longrope on the engine: {good.details}; vLLM's default attention "
        f"factor: {unscaled.details}; swapped: {swapped.details}"
    )
    assert not swapped.passed
    assert swapped.metrics["prompt_logprob_max_abs_diff"] > 10 * PROMPT_LOGPROB_ATOL
