"""The CLI's answers to careless input: an --out that is a file or lies under one,
`spec from-hf` asked to overwrite its own config.json, a missing validate
argument, a misspelt check, and usage lines; each a located message and exit 2,
never a traceback. Through the installed `onboard` program, as users run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

ONBOARD = str(Path(sys.executable).with_name("onboard"))
SPECS = Path(__file__).resolve().parents[1] / "model_specs"
DENSE = SPECS / "dense-gqa.yaml"


def onboard(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [ONBOARD, *map(str, args)], capture_output=True, text=True, cwd=cwd
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def refused(result: subprocess.CompletedProcess, *phrases: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr


@pytest.fixture
def config_dir(tmp_path) -> Path:
    """A directory holding the config.json of the bundled dense spec."""
    from onboard.spec import load_spec
    from onboard.spec.hf import hf_config_from_spec

    directory = tmp_path / "hf"
    directory.mkdir()
    config = hf_config_from_spec(load_spec(DENSE))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


# ---- --out that cannot be a directory -------------------------------------------


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "file.txt"
    path.write_text("keep me")
    return path


def test_generate_out_is_a_file(a_file):
    refused(onboard("generate", DENSE, "--out", a_file), "is a file, not a directory")
    refused(
        onboard("generate", DENSE, "--out", a_file / "sub"),
        f"{a_file / 'sub'}: cannot be created: {a_file} is a file",
    )
    assert a_file.read_text() == "keep me"


def test_quantize_out_is_a_file(a_file, tmp_path):
    ckpt = tmp_path / "ckpt"  # never read: --out is refused first
    ckpt.mkdir()
    r = onboard("quantize", ckpt, "--scheme", "fp8-dynamic", "--out", a_file)
    refused(r, "is a file, not a directory")
    assert "not empty" not in r.stderr
    r = onboard("quantize", ckpt, "--scheme", "fp8-dynamic", "--out", a_file / "q")
    refused(r, f"{a_file} is a file")
    assert a_file.read_text() == "keep me"


def test_spec_from_hf_output_under_a_file_or_a_directory(a_file, config_dir):
    refused(
        onboard("spec", "from-hf", config_dir, "-o", a_file / "spec.yaml"),
        f"{a_file} is a file",
    )
    refused(
        onboard("spec", "from-hf", config_dir, "-o", config_dir),
        "is a directory, not a file",
    )
    assert a_file.read_text() == "keep me"
    assert sorted(p.name for p in config_dir.iterdir()) == ["config.json"]


# ---- spec from-hf and its own input -----------------------------------------------


def test_spec_from_hf_refuses_to_overwrite_its_input(config_dir, tmp_path):
    config = config_dir / "config.json"
    before = config.read_bytes()
    (tmp_path / "link").symlink_to(config_dir)
    os.link(config, tmp_path / "hardlink.json")
    for source, output in [
        (config_dir, config),
        (config, config),
        (config_dir, "./hf/config.json"),  # relative to the working directory
        (config_dir, "hf/../hf/config.json"),
        (tmp_path / "link", config),  # the input through a symlink
        (config_dir, tmp_path / "link" / "config.json"),
        (config_dir, tmp_path / "hardlink.json"),  # the same file, another name
    ]:
        r = onboard("spec", "from-hf", source, "-o", output, cwd=tmp_path)
        refused(r, "is the input", "would destroy the config")
        assert config.read_bytes() == before
    ok = onboard("spec", "from-hf", config_dir, "-o", config_dir / "spec.yaml")
    assert ok.returncode == 0, ok.stderr
    assert config.read_bytes() == before


# ---- validate -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,missing",
    [
        (["--spec", DENSE, "--out", "o"], "missing MODEL_DIR"),
        (["ckpt", "--out", "o"], "missing --spec"),
        (["ckpt", "--spec", DENSE], "missing --out"),
        (["ckpt"], "missing --spec, --out"),
    ],
)
def test_validate_names_what_is_missing(args, missing, tmp_path):
    refused(onboard("validate", *args, cwd=tmp_path), f"validate: {missing} (")


def test_misspelt_check_gets_a_suggestion(tmp_path):
    r = onboard(
        "validate", tmp_path, "--spec", DENSE, "--out", tmp_path / "o", "--checks",
        "acuracy,kv-cache",
    )  # fmt: skip
    refused(r, "unknown check 'acuracy'; did you mean 'accuracy'?")
    r = onboard("new-model", DENSE, "--out", tmp_path / "n", "--checks", "kvcache")
    refused(r, "did you mean 'kv-cache'?")
    assert not (tmp_path / "o").exists() and not (tmp_path / "n").exists()


# ---- usage lines -------------------------------------------------------------------


def _commands(group, path=()):
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


def test_usage_lines_name_arguments_in_capitals():
    from onboard.cli import app

    runner = CliRunner()
    names = list(_commands(typer.main.get_command(app)))
    assert ("spec", "check") in names and ("speculators", "tune") in names
    for name in names:
        result = runner.invoke(app, [*name, "--help"], terminal_width=200)
        assert result.exit_code == 0, (name, result.output)
        usage = next(line for line in result.output.splitlines() if "Usage:" in line)
        assert "{" not in usage and not any(c.islower() for c in usage.split()[-1])
        if name in (("generate",), ("spec", "check"), ("checkpoint", "tiny")):
            assert usage.split()[-1] == "SPEC", usage


# ---- the spec fuzz's findings, through the CLI ------------------------------------

LOCATED_LINE = r"^(error|warning): [^\n]+?:\d+:\d+: \S+: .+$"


def _spec(tmp_path: Path, name: str, edit) -> Path:
    import yaml

    data = yaml.safe_load((SPECS / f"{name}.yaml").read_text())
    data["model_type"] = "onb_" + data["model_type"]
    data["architecture"] = "Onb" + data["architecture"]
    edit(data)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _glm_shared(data):
    data.pop("mtp")
    data["speculators"] = []
    data["mlp"]["moe"].update(first_k_dense=0, layer_frequency=3)
    data["attention"]["indexer"]["shared_layers"] = [3]


def test_check_locates_a_short_layer_types_beside_linear_attention(tmp_path):
    def edit(data):
        data["attention"]["layer_types"] = ["full_attention", "full_attention"]
        data["checkpoint"]["tensor_names"] = {"o_proj": "model.layers.{layer}.a.o"}

    r = onboard("spec", "check", _spec(tmp_path, "qwen3-next-style", edit))
    refused(r, "attention.layer_types: has 2 entries")


def test_generate_and_tiny_take_a_shared_indexer_layer_off_layer_0(tmp_path):
    # AssertionError: shrunk spec breaks the spec rules ... shared_layers
    spec = _spec(tmp_path, "glm-5-style", _glm_shared)
    r = onboard("generate", spec, "--out", tmp_path / "gen")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "gen" / "hf").is_dir()
    r = onboard("checkpoint", "tiny", spec, "--out", tmp_path / "tiny")
    assert r.returncode == 0, r.stderr


def test_check_refuses_an_index_head_dim_off_the_fp8_groups_beside_a_gpu(tmp_path):
    import re

    def edit(data):
        data["attention"]["indexer"]["head_dim"] = 96

    r = onboard("spec", "check", _spec(tmp_path, "glm-5-style", edit))
    refused(r, "attention.indexer.head_dim: head_dim 96 is not a multiple of 128")
    assert all(re.match(LOCATED_LINE, line) for line in r.stderr.splitlines())


def test_check_warns_where_no_reference_will_be_generated(tmp_path):
    def edit(data):
        data["checkpoint"]["tensor_names"] = {"q_proj": "model.layers.{layer}.a.q"}

    r = onboard("spec", "check", _spec(tmp_path, "dense-gqa", edit))
    assert r.returncode == 0, r.stderr
    assert "checkpoint.tensor_names.q_proj: no Hugging Face reference" in r.stderr


def test_check_warns_of_gdn_dims_the_cpu_kernels_refuse(tmp_path):
    def edit(data):
        data["linear_attention"].update(key_head_dim=96, value_head_dim=96)

    r = onboard("spec", "check", _spec(tmp_path, "qwen3-next-style", edit))
    assert r.returncode == 0, r.stderr
    assert "linear_attention.key_head_dim: the cpu engine's Gated DeltaNet" in r.stderr
