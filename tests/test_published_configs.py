"""config.json files as the Hub publishes them (tests/fixtures/published_configs;
its README.md names each one's source): `spec from-hf` proves every one of a
family onboard proves, records a quantized upload's own quantization in the spec
(config.json's quantization_config, or ModelOpt's hf_quant_config.json beside
it), and names in the header each key it accepts as not changing the forward
pass. What stays refused is refused naming the key and why.

Each config is laid out as a download is (config.json, and hf_quant_config.json
where the upload has one) and run through what the CLI runs. The whole set is
`make test-all`'s (it takes minutes); `make test` runs a sample that covers each
kind of fix.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_spec_hf import run_cli

from onboard.errors import InputError
from onboard.quantize import _check_not_quantized
from onboard.reference.from_hf import infer_from_hf
from onboard.reference.prove import RTOL
from onboard.spec import load_spec

FIXTURES = Path(__file__).parent / "fixtures" / "published_configs"
NAMES = sorted(
    p.stem
    for p in FIXTURES.glob("*.json")
    if not p.name.endswith(".hf_quant_config.json")
)

# Published configs that stay refused, and what the refusal names.
REFUSED = {
    # the wrapper keeps its language model's lm_head under language_model (its
    # text_config alone proves: tests/test_llama4.py)
    "meta-llama__Llama-4-Scout-17B-16E-Instruct": "lm_head under the wrapper",
}
PROVEN = [n for n in NAMES if n not in REFUSED]

# (method, algorithm, file) each quantized upload's spec records.
QUANTIZED = {
    "deepseek-ai__DeepSeek-V3": ("fp8", "e4m3", "config.json"),
    "deepseek-ai__DeepSeek-V3.1": ("fp8", "e4m3", "config.json"),
    "deepseek-ai__DeepSeek-V3.2-Exp": ("fp8", "e4m3", "config.json"),
    "moonshotai__Kimi-K2-Instruct": ("fp8", "e4m3", "config.json"),
    "Qwen__Qwen3-30B-A3B-FP8": ("fp8", "e4m3", "config.json"),
    "MiniMaxAI__MiniMax-M2.5": ("fp8", "float8_e4m3fn", "config.json"),
    "openai__gpt-oss-20b": ("mxfp4", None, "config.json"),
    "RedHatAI__Meta-Llama-3.1-8B-Instruct-FP8-dynamic": (
        "compressed-tensors",
        "float-quantized",
        "config.json",
    ),
    "nvidia__Llama-3.1-70B-Instruct-FP8": ("modelopt", "FP8", "hf_quant_config.json"),
    "nvidia__DeepSeek-V3.1-NVFP4": ("modelopt", "NVFP4", "hf_quant_config.json"),
}

# Keys the header must name as accepted (they do not change the forward pass).
ACCEPTED = {
    "google__gemma-2-9b-it": ["cache_implementation", "sliding_window_size"],
    "google__gemma-3-1b-it": ["cache_implementation"],
    # the tokenizer's length, not the model's (only Kimi Linear's class maps it
    # to max_position_embeddings)
    "CohereLabs__c4ai-command-r-v01": ["model_max_length"],
    "unsloth__Llama-3.2-1B-Instruct": ["unsloth_fixed"],
    "openai__gpt-oss-20b": ["experts_per_token", "initial_context_length"],
    "Qwen__Qwen3.5-4B": [
        "text_config.mtp_num_hidden_layers",
        "text_config.mtp_use_dedicated_embeddings",
    ],
    "MiniMaxAI__MiniMax-M2.5": [
        "mtp_transformer_layers",
        "num_mtp_modules",
        "qk_norm_type",
        "rotary_dim",
        "use_mtp",
        "use_routing_bias",
    ],
}

# What else the header must say.
NOTES = {
    # remote code not beside the config, a class transformers ships named
    "moonshotai__Kimi-K2-Instruct": "its architectures names DeepseekV3ForCausalLM, "
    "transformers' class for 'deepseek_v3': read as 'deepseek_v3'",
    "mistralai__Mistral-Small-3.1-24B-Instruct-2503": "on text only: the wrapper's "
    "multi_modal_projector, vision_tower (vision)",
}

# `make test`'s sample: one config per kind of fix (quantization_config of each
# method, ModelOpt's file, accepted and duplicate keys, a letter pattern, remote
# code routed to a shipped class, a wrapper whose class takes any language model).
SAMPLE = {
    "RedHatAI__Meta-Llama-3.1-8B-Instruct-FP8-dynamic",
    "nvidia__Llama-3.1-70B-Instruct-FP8",
    "Qwen__Qwen3-30B-A3B-FP8",
    "openai__gpt-oss-20b",
    "google__gemma-2-9b-it",
    "LGAI-EXAONE__EXAONE-4.0-32B",
    "moonshotai__Kimi-K2-Instruct",
    "mistralai__Mistral-Small-3.1-24B-Instruct-2503",
    "MiniMaxAI__MiniMax-M2.5",
}


def downloaded(name: str, tmp_path: Path) -> Path:
    """The fixture ``name`` laid out as a Hub download: DIR/config.json (and
    DIR/hf_quant_config.json where the upload has one)."""
    directory = tmp_path / name
    directory.mkdir()
    shutil.copy(FIXTURES / f"{name}.json", directory / "config.json")
    quant = FIXTURES / f"{name}.hf_quant_config.json"
    if quant.exists():
        shutil.copy(quant, directory / "hf_quant_config.json")
    return directory / "config.json"


def from_hf(path: Path) -> tuple[str, object]:
    config = json.loads(path.read_text())
    return infer_from_hf(config, str(path))


def _header(header: str) -> str:
    return " ".join(line.removeprefix("# ") for line in header.splitlines())


def _marks(name: str):
    return () if name in SAMPLE else (pytest.mark.acceptance,)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in PROVEN])
def test_published_config_proves(name, tmp_path):
    header, spec = from_hf(downloaded(name, tmp_path))
    text = _header(header)
    assert "proven against transformers" in text, text
    rel = float(text.split("gives its logits within ")[1].split()[0])
    assert rel < RTOL
    quant = spec.checkpoint.source_quantization
    if name in QUANTIZED:
        assert quant is not None
        assert (quant.method, quant.algorithm, quant.file) == QUANTIZED[name]
        assert "The checkpoint is already quantized (" in text
        assert "checkpoint.source_quantization" in text
    else:
        assert quant is None
        assert "already quantized" not in text
    if name in NOTES:
        assert NOTES[name] in text, text
    for key in ACCEPTED.get(name, []):
        assert f"{key} (" in text.split("do not change the forward pass: ")[1], text


def test_the_set_covers_thirty_families():
    families = set()
    for name in PROVEN:
        config = json.loads((FIXTURES / f"{name}.json").read_text())
        families.add(config["model_type"])
    assert len(PROVEN) >= 30
    assert len(families) >= 30, sorted(families)
    readme = (FIXTURES / "README.md").read_text()
    for name in NAMES:
        assert f"`{name}`" in readme, f"README.md does not list {name}"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_stays_refused_names_why(name, tmp_path):
    with pytest.raises(InputError, match=REFUSED[name]):
        from_hf(downloaded(name, tmp_path))


def test_the_cli_writes_a_quantized_uploads_spec(tmp_path):
    # DeepSeek-V3.1 as NVIDIA publishes its NVFP4 weights: the quantization is in
    # hf_quant_config.json only.
    path = downloaded("nvidia__DeepSeek-V3.1-NVFP4", tmp_path)
    out = tmp_path / "spec.yaml"
    result = run_cli("spec", "from-hf", path.parent, "-o", out)
    assert result.returncode == 0, result.stderr
    spec = load_spec(out)
    assert spec.checkpoint.source_quantization.method == "modelopt"
    assert spec.checkpoint.source_quantization.algorithm == "NVFP4"
    assert "already quantized (modelopt NVFP4" in _header(out.read_text())
    assert run_cli("spec", "check", out).returncode == 0
    # quantize refuses the upload itself: it has no 16-bit weights to quantize.
    result = run_cli(
        "quantize", path.parent, "--scheme", "fp8-dynamic",
        "--spec", out, "--out", tmp_path / "q",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "hf_quant_config.json: the checkpoint is already quantized" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "q").exists()
    # A 16-bit checkpoint of the same architecture (new-model's tiny one) is
    # quantized, and the log says what the spec says of the published one.
    (tmp_path / "bf16").mkdir()
    notes = []
    _check_not_quantized(tmp_path / "bf16", spec, notes.append)
    assert "published checkpoint is already quantized (modelopt NVFP4)" in notes[0]


@pytest.mark.parametrize(
    ("key", "value", "names"),
    [
        (
            "experts_per_token",
            2,
            "experts_per_token=2 disagrees with num_experts_per_tok",
        ),
        (
            "initial_context_length",
            8192,
            "initial_context_length=8192 disagrees with "
            "rope_scaling.original_max_position_embeddings (4096)",
        ),
    ],
)
def test_a_duplicate_that_disagrees_is_refused_naming_both(key, value, names, tmp_path):
    path = downloaded("openai__gpt-oss-20b", tmp_path)
    config = json.loads(path.read_text())
    config[key] = value
    path.write_text(json.dumps(config))
    result = run_cli("spec", "from-hf", path, "-o", tmp_path / "spec.yaml")
    assert result.returncode == 2
    assert f"{path}: cannot map this config" in result.stderr
    assert names in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "spec.yaml").exists()


def test_a_letter_pattern_that_disagrees_with_layer_types_names_the_layer(tmp_path):
    path = downloaded("LGAI-EXAONE__EXAONE-4.0-32B", tmp_path)
    config = json.loads(path.read_text())
    config["sliding_window_pattern"] = "LLGG"
    path.write_text(json.dumps(config))
    with pytest.raises(InputError, match="layer 2 is sliding_attention in layer_types"):
        from_hf(path)


def test_an_hf_quant_config_that_is_not_modelopts_is_refused_located(tmp_path):
    path = downloaded("nvidia__Llama-3.1-70B-Instruct-FP8", tmp_path)
    (path.parent / "hf_quant_config.json").write_text('{"quantization": {}')
    with pytest.raises(InputError, match=r"hf_quant_config.json:1:\d+: invalid JSON"):
        from_hf(path)
    (path.parent / "hf_quant_config.json").write_text('{"quantization": {}}')
    with pytest.raises(InputError, match="quantization: expected an object with a "):
        from_hf(path)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("nvidia__Llama-3.1-70B-Instruct-FP8", "the checkpoint is already quantized "),
        ("openai__gpt-oss-20b", "quantization_config: the checkpoint is already "),
    ],
)
def test_validate_does_not_quantize_a_quantized_upload(name, says, tmp_path):
    from types import SimpleNamespace

    from onboard.validate import check_quant

    path = downloaded(name, tmp_path)
    check = check_quant.run(SimpleNamespace(model_dir=path.parent), "quant:fp8-dynamic")
    assert check.status == "not-run"
    assert says in check.details and "validate the 16-bit checkpoint" in check.details
