"""`onboard speculators`: vLLM speculative configs, speculators-format heads,
recipes and refusals, checked against the pinned vLLM's and speculators' own
config classes (no engine starts here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.errors import InputError
from onboard.spec import load_spec
from onboard.spec.hf import hf_config_from_spec
from onboard.spec.model import SPEC_METHODS
from onboard.speculators import write_speculators
from onboard.speculators.heads import (
    EAGLE_METHODS,
    aux_layer_ids,
    head_config,
    load_head_config,
    speculators_type,
)
from onboard.speculators.methods import vllm_method, vllm_methods

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "model_specs"


def _spec_with(base: str, speculators: list[dict], tmp: Path, **changes) -> Path:
    data = yaml.safe_load((SPECS / f"{base}.yaml").read_text())
    data["speculators"] = speculators
    data.update(changes)
    path = tmp / f"{base}-custom.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from onboard.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def vllm_config():
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    def build(target_dir: Path, speculative: dict):
        target = ModelConfig(
            model=str(target_dir),
            dtype="float32",
            skip_tokenizer_init=True,
            max_model_len=256,
        )
        return SpeculativeConfig(
            **speculative,
            target_model_config=target,
            target_parallel_config=ParallelConfig(),
        )

    return build


def _target_dir(spec, tmp: Path) -> Path:
    """A directory with the full-size model's config.json (no weights: vLLM's
    configs read only the config)."""
    path = tmp / f"target-{spec.name}"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config_from_spec(spec)))
    return path


def test_spec_methods_are_vllm_methods():
    # The spec can only name methods the pinned vLLM accepts (p_eagle and dflash2
    # by the vLLM method their heads run under).
    known = vllm_methods()
    served = {vllm_method(m) for m in SPEC_METHODS}
    assert known is not None and served <= known, served - known
    assert "p_eagle" not in known and "dflash2" not in known  # hence the mapping


def test_aux_layer_ids():
    assert aux_layer_ids(61) == [2, 30, 58]  # vLLM's default (2, n//2, n-3)
    assert aux_layer_ids(32) == [2, 16, 29]
    assert aux_layer_ids(2) == [1, 2]  # tiny: never the embeddings (id 0)
    assert aux_layer_ids(4) == [1, 2, 4]
    for n in range(1, 80):
        ids = aux_layer_ids(n)
        assert ids == sorted(set(ids)) and 1 <= ids[0] and ids[-1] <= n


@pytest.mark.parametrize("spec_name", ["deepseek-v3-style", "dense-gqa"])
def test_bundled_specs_configs_accepted_by_vllm(spec_name, tmp_path, vllm_config):
    spec = load_spec(SPECS / f"{spec_name}.yaml")
    written = write_speculators(spec, tmp_path / "out")
    assert all(p.exists() for p in written)
    target = _target_dir(spec, tmp_path)
    for entry in spec.speculators:
        path = tmp_path / "out" / f"speculative-config.{entry.method}.json"
        cfg = vllm_config(target, json.loads(path.read_text()))
        assert cfg.method == vllm_method(entry.method)
        assert cfg.num_speculative_tokens == entry.num_speculative_tokens
        if entry.method in EAGLE_METHODS:
            # vLLM read our speculators-format head: its own EAGLE-3 Llama head,
            # fed by the layers we chose.
            assert cfg.draft_model_config.architectures == [
                "Eagle3LlamaForCausalLM"
                if entry.method == "eagle3"
                else "PeagleLlamaForCausalLM"  # vLLM's registry: its EAGLE-3 class
            ]
            assert cfg.parallel_drafting == (entry.method == "p_eagle")
            hf = cfg.draft_model_config.hf_config
            assert hf.eagle_aux_hidden_state_layer_ids == aux_layer_ids(
                spec.num_hidden_layers
            )
            assert hf.hidden_size == spec.hidden_size
            assert hf.draft_vocab_size == min(32000, spec.vocab_size)
        if entry.method == "mtp":
            assert cfg.draft_model_config.architectures == ["DeepSeekMTPModel"]
    summary = json.loads((tmp_path / "out" / "speculators.json").read_text())
    assert set(summary["methods"]) == {e.method for e in spec.speculators}


def test_every_method_accepted_by_vllm(tmp_path, vllm_config):
    """ngram, mtp, eagle3, p_eagle, dflash, dflash2, dspark and suffix (whose only
    missing piece here is the arctic-inference package) on the tiny
    DeepSeek-V3-style checkpoint; draft_model on the tiny dense one (a
    DeepSeek-V3 draft is refused, below)."""
    entries = [
        {"method": "ngram", "num_speculative_tokens": 3},
        {"method": "mtp", "num_speculative_tokens": 1},
        {"method": "eagle3", "num_speculative_tokens": 3},
        {"method": "p_eagle", "num_speculative_tokens": 3},
        {"method": "dflash", "num_speculative_tokens": 4},
        {"method": "dflash2", "num_speculative_tokens": 4},
        {"method": "dspark", "num_speculative_tokens": 4},
        {"method": "suffix", "num_speculative_tokens": 8},
    ]
    spec = load_spec(SPECS / "deepseek-v3-style.yaml")
    target = write_tiny_checkpoint(spec, tmp_path / "target", seed=0)
    dense = load_spec(SPECS / "dense-gqa.yaml")
    dense_target = write_tiny_checkpoint(dense, tmp_path / "dense", seed=0)
    draft = write_tiny_checkpoint(dense, tmp_path / "draft", seed=1)
    cases = [
        (target, entries),
        (
            dense_target,
            [
                {
                    "method": "draft_model",
                    "num_speculative_tokens": 2,
                    "model": str(draft),
                }
            ],
        ),
    ]
    seen = set()
    for target_dir, listed in cases:
        tiny = load_spec(target_dir / "spec.yaml")
        tiny = load_spec(_spec_with_data(tiny, listed, tmp_path))
        out = tmp_path / f"out-{tiny.name}"
        write_speculators(tiny, out)
        for entry in tiny.speculators:
            path = out / f"speculative-config.{entry.method}.json"
            speculative = json.loads(path.read_text())
            if entry.method == "suffix":
                with pytest.raises(ImportError, match="Arctic Inference"):
                    vllm_config(target_dir, speculative)
                seen.add("suffix")
                continue
            cfg = vllm_config(target_dir, speculative)
            assert cfg.method == vllm_method(entry.method)
            seen.add(entry.method)
            hf = cfg.draft_model_config and cfg.draft_model_config.hf_config
            # Adaptive verification where vLLM implements it for the method.
            adaptive = entry.method in ("dspark", "dflash2")
            assert cfg.enable_adaptive_verification == adaptive, entry.method
            if entry.method in ("p_eagle", "dflash", "dflash2", "dspark"):
                assert cfg.parallel_drafting
                assert hf.eagle_aux_hidden_state_layer_ids == aux_layer_ids(
                    tiny.num_hidden_layers
                )
            if entry.method == "p_eagle":
                # The mask slots' token, as the V1 proposer reads it.
                assert hf.pard_token == tiny.vocab_size - 1
            if entry.method == "dflash2":
                assert cfg.draft_model_config.architectures == ["DFlash2DraftModel"]
    assert seen == set(SPEC_METHODS)


def _spec_with_data(spec, speculators: list[dict], tmp: Path) -> Path:
    data = spec.model_dump(mode="json", exclude_none=True)
    data["speculators"] = speculators
    path = tmp / f"{spec.name}-listed.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_refuses_deepseek_checkpoint_as_draft_model(tmp_path):
    # vLLM 0.32 rewrites every draft config with its MTP override: a DeepSeek-V3
    # checkpoint given as draft_model silently becomes an MTP draft.
    spec = load_spec(SPECS / "deepseek-v3-style.yaml")
    draft = write_tiny_checkpoint(spec, tmp_path / "draft", seed=1)
    tiny = load_spec(draft / "spec.yaml")
    listed = [{"method": "draft_model", "model": str(draft)}]
    with pytest.raises(InputError, match="DeepSeekMTPModel"):
        write_speculators(load_spec(_spec_with_data(tiny, listed, tmp_path)), tmp_path)


@pytest.mark.parametrize("method", ["eagle3", "p_eagle", "dflash", "dflash2", "dspark"])
def test_head_config_round_trips_through_speculators(method, tmp_path):
    from speculators import SpeculatorModelConfig

    spec = load_spec(SPECS / "dense-gqa.yaml")
    data = head_config(spec, method, 3)
    (tmp_path / "config.json").write_text(json.dumps(data))
    loaded = SpeculatorModelConfig.from_pretrained(str(tmp_path))
    assert type(loaded) is type(load_head_config(data))
    assert loaded.speculators_model_type == speculators_type(method)
    assert loaded.speculators_config.verifier.name_or_path == spec.base_checkpoint
    assert loaded.speculators_config.verifier.architectures == [spec.architecture]
    assert loaded.speculators_config.proposal_methods[0].speculative_tokens == 3
    layer = loaded.transformer_layer_config
    assert layer.hidden_size == spec.hidden_size == loaded.target_hidden_size
    assert layer.num_attention_heads == spec.attention.num_heads
    assert layer.num_key_value_heads == spec.num_kv_heads
    assert layer.vocab_size == spec.vocab_size
    assert loaded.draft_vocab_size == 32000
    ids = (
        loaded.eagle_aux_hidden_state_layer_ids
        if method in EAGLE_METHODS
        else loaded.aux_hidden_state_layer_ids
    )
    assert ids == [2, 16, 29]


def test_recipe_sizes_follow_the_spec(tmp_path):
    spec = load_spec(SPECS / "deepseek-v3-style.yaml")
    write_speculators(spec, tmp_path)
    recipe = (tmp_path / "eagle3" / "recipe.sh").read_text()
    assert "--target-layer-ids 2 30 58" in recipe
    assert '"eagle_aux_hidden_state_layer_ids": [2, 30, 58, 61]' in recipe
    assert "--draft-vocab-size 32000" in recipe
    assert "--ttt-steps 3" in recipe
    assert "57344 bytes per token" in recipe  # 4 layers x 7168 x 2 bytes
    assert "speculators generate-offline-data" in recipe
    assert "--on-missing generate" in recipe  # the online variant
    check = subprocess.run(["bash", "-n", str(tmp_path / "eagle3" / "recipe.sh")])
    assert check.returncode == 0


# ---- refusals, through the command line (exit 2, with the reason) -------------


def test_cli_writes_configs(tmp_path):
    proc = _run_cli(
        "speculators", str(SPECS / "dense-gqa.yaml"), "--out", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "speculative-config.ngram.json").is_file()
    assert (tmp_path / "eagle3" / "config.json").is_file()


def test_refuses_unknown_method(tmp_path):
    spec = _spec_with("dense-gqa", [{"method": "medusa3"}], tmp_path)
    proc = _run_cli("speculators", str(spec), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "speculators[0].method" in proc.stderr and "medusa3" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_refuses_mtp_without_heads(tmp_path):
    spec = _spec_with("dense-gqa", [{"method": "mtp"}], tmp_path)
    proc = _run_cli("speculators", str(spec), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "speculators[0].method" in proc.stderr
    assert "mtp needs MTP heads" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_refuses_draft_with_other_hidden_size(tmp_path):
    other = load_spec(SPECS / "dense-gqa.yaml").model_copy(update={"hidden_size": 2048})
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps(head_config(other, "eagle3", 3)))
    spec = _spec_with("dense-gqa", [{"method": "eagle3", "model": str(head)}], tmp_path)
    proc = _run_cli("speculators", str(spec), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "hidden states of size 2048" in proc.stderr
    assert "hidden_size is 4096" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_refuses_draft_model_with_other_vocabulary(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    config = hf_config_from_spec(load_spec(SPECS / "dense-gqa.yaml"))
    (draft / "config.json").write_text(json.dumps({**config, "vocab_size": 32000}))
    spec = _spec_with(
        "dense-gqa", [{"method": "draft_model", "model": str(draft)}], tmp_path
    )
    with pytest.raises(InputError, match="vocab_size is 32000"):
        write_speculators(load_spec(spec), tmp_path / "out")
    missing = _spec_with("dense-gqa", [{"method": "draft_model"}], tmp_path)
    with pytest.raises(InputError, match="draft_model needs `model:`"):
        write_speculators(load_spec(missing), tmp_path / "out")


def test_trained_head_format_loads_in_speculators(tmp_path):
    """The head the tiny trainer saves is what speculators' own Eagle3DraftModel
    loads: every tensor name and shape, nothing left over but the verifier's
    frozen training-only copies."""
    import torch
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel

    from onboard.speculators.eagle3 import make_head_class, save_head

    model_dir = write_tiny_checkpoint(
        load_spec(SPECS / "dense-gqa.yaml"), tmp_path / "tiny", seed=0
    )
    tiny = load_spec(model_dir / "spec.yaml")
    config = head_config(
        tiny, "eagle3", 3, verifier=str(model_dir), draft_vocab=tiny.vocab_size
    )
    shape = (tiny.vocab_size, tiny.hidden_size)
    head = make_head_class()(
        config["transformer_layer_config"],
        len(aux_layer_ids(tiny.num_hidden_layers)),
        torch.randn(shape),
        torch.randn(shape),
    )
    save_head(head, config, tmp_path / "head")
    loaded = Eagle3DraftModel.from_pretrained(str(tmp_path / "head"))
    state = loaded.state_dict()
    saved = load_file(str(tmp_path / "head" / "model.safetensors"))
    for name, tensor in saved.items():
        assert name in state, name
        assert torch.equal(state[name], tensor), name
    assert {n for n in state if n not in saved} == {
        "verifier_lm_head.weight",
        "verifier_norm.weight",
    }


def test_refuses_a_head_listed_under_another_method(tmp_path):
    # A DFlash2 head listed as dflash would draft as plain DFlash on vLLM's V1
    # runner (which refuses it); an EAGLE-3 head listed as p_eagle has no
    # mask_hidden for vLLM's parallel drafting. Both name the method to use.
    spec = load_spec(SPECS / "dense-gqa.yaml")
    for kind, listed, hint in (
        ("dflash2", "dflash", "is a 'dflash2' head, not 'dflash' (list it as "
         "method dflash2)"),
        ("p_eagle", "eagle3", "is a 'peagle' head, not 'eagle3' (list it as "
         "method p_eagle)"),
        ("eagle3", "p_eagle", "is a 'eagle3' head, not 'peagle'"),
    ):  # fmt: skip
        head = tmp_path / kind
        head.mkdir(exist_ok=True)
        (head / "config.json").write_text(json.dumps(head_config(spec, kind, 3)))
        path = _spec_with(
            "dense-gqa", [{"method": listed, "model": str(head)}], tmp_path
        )
        with pytest.raises(InputError, match=re.escape(hint)):
            write_speculators(load_spec(path), tmp_path / "out")
