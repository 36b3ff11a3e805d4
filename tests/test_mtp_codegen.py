"""The generated MTP draft module and its registration on vLLM 0.32.

Without an engine: the file's shape, the facts about vLLM the generator relies on
(checked against the installed vLLM, so a vLLM upgrade that changes them fails
here), and the plugin's registration (idempotent, picklable, chaining). On the
CPU engine (``engine``): speculative decoding with the generated draft gives the
tokens of plain decoding, the engine instantiates the generated classes, and
which head runs at each draft step is measured.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import installed_plugin_env
from generate_variants import ALL, any_spec, bundled

from onboard.generate import generate_files, model_class_path
from onboard.pipeline.generate import generate_all
from onboard.runtime.compare import GreedyOutput, compare_greedy
from onboard.spec.mtp import (
    GENERIC_MTP_MODEL_TYPE,
    TUPLE_ARCHITECTURES,
    VLLM_MTP_ARCHITECTURES,
    heads_run_by_vllm,
    in_tree_change,
    mtp_class_path,
    mtp_draft,
    speculative_config,
)
from onboard.spec.naming import OVERRIDE_ENV

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
MTP_SPECS = [name for name in ALL if any_spec(name).mtp is not None]


def mtp_file(name: str) -> str:
    """The generated MTP draft (standalone: qwen3-next-style's default draft is
    vLLM's Qwen3NextMTP, subclassed, tests/test_modular.py)."""
    spec = any_spec(name)
    package = f"plugin/onboard_plugin_{spec.module_name}"
    files = generate_files(spec, standalone=True)
    return files[f"{package}/{spec.module_name}_mtp.py"]


# ---- the generated file ---------------------------------------------------------


def model_file(name: str) -> str:
    """The generated model file the standalone MTP draft imports from."""
    spec = any_spec(name)
    package = f"plugin/onboard_plugin_{spec.module_name}"
    return generate_files(spec, standalone=True)[f"{package}/{spec.module_name}.py"]


def mtp_block_call(source: str) -> ast.Call:
    """The ``self.mtp_block = <call>`` of the MTP file."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == (
            "self.mtp_block"
        ):
            assert isinstance(node.value, ast.Call)
            return node.value
    raise AssertionError("no self.mtp_block")


@pytest.mark.parametrize("name", MTP_SPECS)
def test_mtp_file_shape(name):
    """DeepSeek-MTP shape: norms, eh_proj, block, shared head, compute_logits and
    load_weights; only the MTP classes, the block being the model file's decoder
    layer (imported, not repeated) with the spec's mtp.mlp; no per-layer plan."""
    spec = any_spec(name)
    source = mtp_file(name)
    tree = ast.parse(source)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    draft = mtp_draft(spec, standalone=True)
    top = classes[draft.class_name]
    methods = {n.name for n in top.body if isinstance(n, ast.FunctionDef)}
    assert {"forward", "compute_logits", "load_weights", "embed_input_ids"} <= methods
    prefix = draft.class_name.removesuffix("MTP")
    assert set(classes) == {
        f"{prefix}SharedHead",
        f"{prefix}MultiTokenPredictorLayer",
        f"{prefix}MultiTokenPredictor",
        draft.class_name,
    }
    layer_src = ast.get_source_segment(
        source, classes[f"{prefix}MultiTokenPredictorLayer"]
    )
    for attr in ("self.enorm", "self.hnorm", "self.eh_proj", "self.shared_head"):
        assert attr in layer_src
    assert f"from .{spec.module_name} import {prefix}DecoderLayer\n" in source
    call = mtp_block_call(source)
    assert ast.unparse(call.func) == f"{prefix}DecoderLayer"
    # The sparse-MLA top-k buffer is passed through by name, not a literal.
    passed = {
        k.arg: ast.unparse(k.value)
        for k in call.keywords
        if k.arg == "topk_indices_buffer"
    }
    assert passed in ({}, {"topk_indices_buffer": "topk_indices_buffer"})
    assert bool(passed) == (spec.attention.indexer is not None)
    keywords = {
        k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg not in passed
    }
    model_classes = {
        n.name for n in ast.parse(model_file(name)).body if isinstance(n, ast.ClassDef)
    }
    if "moe" in keywords:  # the model file has both MLP kinds
        assert keywords == {"moe": spec.mtp.mlp == "moe"}
    else:  # ... or only the MTP's
        assert not keywords
        assert (f"{prefix}MoE" in model_classes) == (spec.mtp.mlp == "moe")
    # MTP layers index past num_hidden_layers: nothing may look them up in a
    # per-layer list of the config, nor build a sliding window or a KV-sharing
    # target for them (the decoder layer's defaults: full attention, own cache).
    for word in ("layer_types", "kv_sharing", "sliding", "extract_layer_index"):
        assert word not in source, word


# All-MoE layers with a dense MTP head: the model file carries the dense MLP for
# the MTP blocks only, and its layers pass moe=True.
_ALL_MOE_DENSE_MTP = """
name: all-moe-dense-mtp
architecture: AllMoeDenseMtpForCausalLM
model_type: all_moe_dense_mtp
vocab_size: 1024
hidden_size: 256
num_hidden_layers: 2
max_position_embeddings: 4096
attention: {num_heads: 4, num_kv_heads: 2}
mlp:
  intermediate_size: 512
  moe: {num_experts: 8, num_experts_per_tok: 2, expert_intermediate_size: 64}
mtp: {num_heads: 1, mlp: dense}
checkpoint: {layout: deepseek}
"""


def test_dense_mtp_block_of_an_all_moe_model():
    from onboard.spec import parse_spec_text

    spec = parse_spec_text(_ALL_MOE_DENSE_MTP, file="<all-moe-dense-mtp>")
    files = generate_files(spec)  # rendered, ruff-formatted and lint-checked
    package = "plugin/onboard_plugin_all_moe_dense_mtp"
    model = files[f"{package}/all_moe_dense_mtp.py"]
    mtp = files[f"{package}/all_moe_dense_mtp_mtp.py"]
    assert "class AllMoeDenseMtpMLP(nn.Module):" in model
    assert "moe=True," in model  # every model layer is MoE
    call = mtp_block_call(mtp)
    assert [(k.arg, ast.literal_eval(k.value)) for k in call.keywords] == [
        ("moe", False)
    ]
    # The MTP file maps the dense block's gate/up pair; the model file maps none
    # (no model layer is dense).
    assert '".mlp.gate_proj": (".mlp.gate_up_proj", 0)' in mtp
    assert ".mlp.gate_up_proj" not in model.split("class AllMoeDenseMtpForCausalLM")[1]


@pytest.mark.parametrize("name", MTP_SPECS)
def test_mtp_return_convention_follows_vllm_proposer(name):
    """vLLM unpacks (logits hidden, next-step hidden) only for some architecture
    names; the generated forward returns what vLLM expects for its name."""
    spec = any_spec(name)
    draft = mtp_draft(spec, standalone=True)
    source = mtp_file(name)
    returns_tuple = "return hidden_states, self.shared_head(hidden_states)" in source
    assert returns_tuple == draft.returns_tuple
    assert returns_tuple == (spec.model_type == "deepseek_v3")


def test_dense_gqa_has_no_mtp_file():
    files = generate_files(bundled("dense-gqa"))
    assert not [p for p in files if p.endswith("_mtp.py")]
    assert "MTP" not in files["plugin/onboard_plugin_dense_gqa/__init__.py"]


# ---- facts about the installed vLLM ------------------------------------------------


def _hf_config(model_type: str, architecture: str, heads: int):
    from transformers import PreTrainedConfig

    config = PreTrainedConfig(
        architectures=[architecture], num_nextn_predict_layers=heads
    )
    config.model_type = model_type
    return config


def test_vllm_maps_the_known_model_types_as_the_generator_assumes():
    from vllm.config.speculative import MTPModelTypes, SpeculativeConfig

    for model_type, architecture in VLLM_MTP_ARCHITECTURES.items():
        config = SpeculativeConfig.hf_config_override(
            _hf_config(model_type, "XForCausalLM", 1)
        )
        assert config.architectures == [architecture]
        assert config.model_type in MTPModelTypes.__args__
    # A new model type is left alone: vLLM would then refuse method "mtp".
    config = SpeculativeConfig.hf_config_override(
        _hf_config("novel_launch", "NovelLaunchForCausalLM", 2)
    )
    assert config.model_type == "novel_launch"
    assert "novel_launch" not in MTPModelTypes.__args__
    assert GENERIC_MTP_MODEL_TYPE in MTPModelTypes.__args__


def test_vllm_unpacks_exactly_the_tuple_architectures():
    from types import SimpleNamespace

    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    def unpacks(architecture: str) -> bool:
        proposer = SimpleNamespace(
            method="mtp",
            draft_model_config=SimpleNamespace(
                hf_config=SimpleNamespace(architectures=[architecture])
            ),
        )
        return SpecDecodeBaseProposer.model_returns_tuple(proposer)

    for architecture in TUPLE_ARCHITECTURES:
        assert unpacks(architecture)
    assert not unpacks(mtp_draft(bundled("novel-launch")).architecture)
    assert unpacks(mtp_draft(bundled("deepseek-v3-style")).architecture)


def test_vllm_proposer_passes_no_draft_step_to_the_mtp_model():
    """The source of the head finding: the V1 proposer (the CPU engine's) never
    passes spec_step_idx, so the draft's default (head 0) runs at every step."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    for method in ("propose", "_sample_draft_tokens", "_greedy_sample"):
        source = inspect.getsource(getattr(SpecDecodeBaseProposer, method))
        assert "spec_step_idx" not in source, method
    assert heads_run_by_vllm(bundled("novel-launch"), 3) == [0, 0, 0]
    with pytest.raises(ValueError):
        heads_run_by_vllm(bundled("dense-gqa"), 1)


def test_speculative_config_and_in_tree_change():
    novel = bundled("novel-launch")
    assert speculative_config(novel) == {"method": "mtp", "num_speculative_tokens": 2}
    assert speculative_config(novel, 1)["num_speculative_tokens"] == 1
    lines = "\n".join(in_tree_change(novel))
    assert '"novel_launch_mtp" to MTPModelTypes' in lines
    assert "hf_config_override" in lines
    assert '"NovelLaunchMTPModel"' in lines
    assert in_tree_change(bundled("deepseek-v3-style")) == []


# ---- registration ------------------------------------------------------------------

_REGISTER_SCRIPT = """
import json, pickle, sys
sys.path.insert(0, sys.argv[1])
import importlib
plugin = importlib.import_module(sys.argv[2])
from vllm import ModelRegistry
from vllm.config.speculative import SpeculativeConfig
from transformers import AutoConfig
original = SpeculativeConfig.hf_config_override
plugin.register()
first = SpeculativeConfig.hf_config_override
plugin.register()
plugin.register()
override = SpeculativeConfig.hf_config_override
chain = 0
link = override
while link is not None:
    chain += 1
    link = getattr(link, "__wrapped__", None)
entry = ModelRegistry.models[plugin.MTP_ARCHITECTURE]
# The draft module imports its blocks from the model module (relative import).
draft_module = importlib.import_module(entry.module_name)
out = {
    "draft_class": getattr(draft_module, entry.class_name).__name__,
    "patched": override is not original,
    "stable": override is first,
    "chain": chain,
    "registered": [entry.module_name, entry.class_name],
    "pickles": pickle.loads(pickle.dumps(override)) is override,
}
if getattr(plugin, "MODEL_TYPE", None):
    config = AutoConfig.for_model(plugin.MODEL_TYPE, num_nextn_predict_layers=2,
                                  architectures=[plugin.ARCHITECTURE])
    config = override(config)
    out["draft"] = [config.model_type, config.n_predict, config.architectures]
from transformers import PreTrainedConfig
ds = PreTrainedConfig(architectures=["DeepseekV3ForCausalLM"],
                      num_nextn_predict_layers=1)
ds.model_type = "deepseek_v3"
out["deepseek"] = override(ds).architectures
print(json.dumps(out))
"""


def _register(spec, plugin_dir: Path, override: bool) -> tuple[dict, str]:
    env = {**os.environ}
    env.pop(OVERRIDE_ENV, None)
    if override:
        env[OVERRIDE_ENV] = "all"
    package = f"onboard_plugin_{spec.module_name}"
    run = subprocess.run(
        [PY, "-c", _REGISTER_SCRIPT, str(plugin_dir), package],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stdout + run.stderr


@pytest.mark.parametrize("name", ["novel-launch", "deepseek-v3-style"])
def test_registration_is_idempotent_and_selects_the_generated_class(name, tmp_path):
    spec = bundled(name)
    generate_all(spec, tmp_path)
    out, _ = _register(spec, tmp_path / "plugin", override=True)
    module, cls = mtp_class_path(spec).split(":")
    assert out["registered"] == [module, cls]
    assert out["draft_class"] == cls
    # vLLM's own mapping of other model types survives the wrapper.
    assert out["deepseek"] == ["DeepSeekMTPModel"]
    if mtp_draft(spec).override:
        assert out["patched"] and out["stable"] and out["chain"] == 2
        assert out["pickles"]  # the draft ModelConfig travels to engine processes
        assert out["draft"] == ["mtp", 2, ["NovelLaunchMTPModel"]]
    else:
        assert not out["patched"]


def test_an_in_tree_architecture_is_replaced_only_when_asked(tmp_path):
    """deepseek-v3-style's architectures are vLLM's own (DeepseekV3ForCausalLM,
    DeepSeekMTPModel): installed, its plugin leaves them to vLLM and says so in
    vLLM's log; with ONBOARD_OVERRIDE_ARCHITECTURES it serves them, and says
    that too."""
    spec = bundled("deepseek-v3-style")
    generate_all(spec, tmp_path)
    kept, log = _register(spec, tmp_path / "plugin", override=False)
    assert kept["registered"][0] == "vllm.model_executor.models.deepseek_mtp"
    assert f"vLLM already serves {spec.architecture}; this plugin leaves it" in log
    assert f"set {OVERRIDE_ENV}={spec.architecture} to serve" in log
    taken, log = _register(spec, tmp_path / "plugin", override=True)
    module = f"onboard_plugin_{spec.module_name}.{spec.module_name}_mtp"
    assert taken["registered"][0] == module
    assert f"serving {spec.architecture} with onboard_plugin_" in log


# ---- on the CPU engine ---------------------------------------------------------------


def install_plugin(plugin_dir: Path, site: Path) -> None:
    src = site.parent / f"{site.name}-src"
    shutil.copytree(plugin_dir, src)
    pip = subprocess.run(
        [PY, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "--target", str(site), str(src)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr


def run_mtp_engine(name: str, tmp: Path, k: int) -> dict:
    from onboard.checkpoint.tiny import write_tiny_checkpoint

    spec = bundled(name)
    ckpt = write_tiny_checkpoint(spec, tmp / "ckpt", seed=0, dtype="float32")
    generate_all(spec, tmp / "gen")
    install_plugin(tmp / "gen" / "plugin", tmp / "site")
    env = installed_plugin_env(tmp / "site", spec, tmp)
    out = tmp / "report.json"
    run = subprocess.run(
        [PY, str(ROOT / "tests" / "mtp_engine.py"), str(ckpt), str(out), "--k",
         str(k), "--prompts", "4", "--max-tokens", "16"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-6000:]
    report = json.loads(out.read_text())
    report["spec"] = spec
    return report


def _greedy(run: dict, i: int) -> GreedyOutput:
    return GreedyOutput(
        run["tokens"][i],
        [{int(t): lp for t, lp in step.items()} for step in run["top"][i]],
    )


def check_lossless_and_classes(report: dict) -> None:
    spec = report["spec"]
    plain, mtp = report["plain"], report["mtp"]
    target = model_class_path(spec).replace(":", ".")
    assert plain["classes"] == {"target": target, "draft": None}
    assert mtp["classes"] == {
        "target": target,
        "draft": mtp_class_path(spec).replace(":", "."),
    }
    for i in range(len(report["prompts"])):
        result = compare_greedy(_greedy(mtp, i), _greedy(plain, i))
        assert result.accepted, (i, result.reason)


@pytest.fixture(scope="module")
def novel_launch_mtp(tmp_path_factory) -> dict:
    return run_mtp_engine("novel-launch", tmp_path_factory.mktemp("novel_mtp"), k=2)


@pytest.mark.engine
def test_novel_launch_mtp_draft_is_lossless(novel_launch_mtp):
    """New model type: the plugin alone makes method "mtp" select the generated
    draft, and speculative decoding gives plain decoding's tokens."""
    check_lossless_and_classes(novel_launch_mtp)


@pytest.mark.engine
def test_vllm_runs_the_first_head_at_every_draft_step(novel_launch_mtp):
    """Two heads, k=2: every draft-model call runs head 0 (layer
    num_hidden_layers) and compute_logits is never given another step."""
    report = novel_launch_mtp
    calls = report["mtp"]["calls"]
    first = int(min(report["mtp"]["heads"], key=int))
    assert len(report["mtp"]["heads"]) == 2
    assert calls["heads"], "the draft never ran"
    assert set(calls["heads"]) == {first + h for h in heads_run_by_vllm(
        report["spec"], report["k"])}  # fmt: skip
    assert set(calls["logits_steps"]) == {0}


@pytest.mark.engine
@pytest.mark.acceptance
def test_deepseek_v3_mtp_draft_replaces_vllms_and_is_lossless(tmp_path):
    """A model type vLLM maps itself (deepseek_v3 -> DeepSeekMTPModel): the
    generated class is instantiated instead of vLLM's DeepSeekMTP."""
    check_lossless_and_classes(run_mtp_engine("deepseek-v3-style", tmp_path, k=1))
