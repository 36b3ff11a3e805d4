"""`onboard validate` end to end: the CLI, the generated plugin, the real vLLM engine.

Checkpoints are written by transformers' own classes (random weights, float32, a
scaled output head). Each model is validated once per session (one engine each) and
the tests read its validation.json; start and total times are printed (-s) and kept
in the accuracy check's ``timings``.

The first tests need no engine: plugin discovery through the synthesized
``.dist-info``, bad input (exit 2) and a GPU target (checks not run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from validate_fixtures import (
    DEEPSEEK_V3_SPEC,
    LLAMA_SPEC,
    WRONG_LAYOUT_SPEC,
    rename_tensors,
    write_deepseek_v3,
    write_llama,
    write_spec,
)

from onboard.runtime.compare import PROMPT_LOGPROB_ATOL
from onboard.runtime.engine import Engine, EngineOptions, plugin_site, read_plugin
from onboard.runtime.engine_worker import root_cause

ONBOARD = str(Path(sys.executable).with_name("onboard"))
ENGINE_RUN_TIMEOUT = 1800


@dataclass
class Run:
    returncode: int
    output: str
    seconds: float
    result: dict | None
    out_dir: Path

    def check(self, name: str) -> dict:
        return next(c for c in self.result["checks"] if c["name"] == name)


def _validate(model_dir: Path, spec: Path, out_dir: Path, *extra: str) -> Run:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            ONBOARD,
            "validate",
            str(model_dir),
            "--spec",
            str(spec),
            "--out",
            str(out_dir),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=ENGINE_RUN_TIMEOUT,
    )
    seconds = time.perf_counter() - t0
    path = out_dir / "validation.json"
    result = json.loads(path.read_text()) if path.exists() else None
    run = Run(proc.returncode, proc.stdout + proc.stderr, seconds, result, out_dir)
    if result is not None:
        timings = run.check("accuracy")["metrics"].get("timings", {})
        print(f"\n{model_dir.name}: validate {seconds:.1f} s (CLI), timings {timings}")
    return run


@pytest.fixture(scope="session")
def llama_ckpt(tmp_path_factory) -> Path:
    return write_llama(tmp_path_factory.mktemp("llama") / "ckpt")


# -- no engine ------------------------------------------------------------------


def test_plugin_is_found_by_importlib_metadata_with_nothing_installed(tmp_path):
    from onboard.pipeline.generate import generate_all
    from onboard.spec import parse_spec_text

    generate_all(parse_spec_text(LLAMA_SPEC), tmp_path / "gen")
    plugin = read_plugin(tmp_path / "gen" / "plugin")
    assert plugin.package == "onboard_plugin_tiny_llama"
    assert plugin.target == "onboard_plugin_tiny_llama:register"
    site = plugin_site(plugin, tmp_path / "site")
    # A fresh interpreter, as vLLM's processes are: the entry point is visible and
    # loads the generated register() from the plugin directory.
    code = (
        "from importlib.metadata import entry_points\n"
        "eps = entry_points(group='vllm.general_plugins')\n"
        "ep = [e for e in eps if e.name == 'onboard_plugin_tiny_llama'][0]\n"
        "fn = ep.load(); print(ep.value, fn.__module__, fn.__code__.co_filename)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin.root), str(site)]))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "onboard_plugin_tiny_llama:register onboard_plugin_tiny_llama" in out.stdout
    assert str(tmp_path / "gen" / "plugin") in out.stdout


def test_engine_environment_isolates_the_plugin(tmp_path, llama_ckpt):
    from onboard.pipeline.generate import generate_all
    from onboard.spec import parse_spec_text

    generate_all(parse_spec_text(LLAMA_SPEC), tmp_path / "gen")
    plugin = read_plugin(tmp_path / "gen" / "plugin")
    env = Engine(
        EngineOptions(llama_ckpt, plugin), tmp_path / "w", tmp_path / "log"
    ).environment()
    assert env["VLLM_PLUGINS"] == "onboard_plugin_tiny_llama"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(plugin.root)
    in_tree = Engine(
        EngineOptions(llama_ckpt, None), tmp_path / "w", tmp_path / "log"
    ).environment()
    assert in_tree["VLLM_PLUGINS"] == ""  # no plugin at all: vLLM's own classes


def test_bad_input_exits_2_with_a_message(tmp_path, llama_ckpt):
    spec = write_spec(tmp_path / "spec.yaml", LLAMA_SPEC)
    cases = [
        ([str(tmp_path / "missing"), "--spec", str(spec)], "no such directory"),
        ([str(llama_ckpt), "--spec", str(tmp_path / "nope.yaml")], "nope.yaml"),
        ([str(llama_ckpt), "--spec", str(spec), "--checks", "acc"], "unknown check"),
        ([str(llama_ckpt), "--spec", str(spec), "--target", "tpu"], "unknown target"),
    ]
    other = write_spec(
        tmp_path / "other.yaml",
        LLAMA_SPEC.replace("hidden_size: 128", "hidden_size: 256"),
    )
    cases.append(
        (
            [str(llama_ckpt), "--spec", str(other)],
            "hidden_size is 128 but the spec says 256",
        )
    )
    for args, message in cases:
        proc = subprocess.run(
            [ONBOARD, "validate", *args, "--out", str(tmp_path / "out")],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_gpu_target_writes_not_run_checks(tmp_path, llama_ckpt):
    spec = write_spec(tmp_path / "spec.yaml", LLAMA_SPEC)
    run = _validate(
        llama_ckpt,
        spec,
        tmp_path / "out",
        "--target",
        "b200",
        "--checks",
        "accuracy,spec-decode:ngram",
    )
    assert run.returncode == 1  # nothing was proven on b200
    assert run.result["passed"] is False and run.result["target"] == "b200"
    assert [c["status"] for c in run.result["checks"]] == ["not-run", "not-run"]
    assert all("b200" in c["details"] for c in run.result["checks"])
    assert (tmp_path / "out" / "report.html").exists()


# Lines from real vLLM 0.32 logs: a harmless warning with a traceback (chat-template
# warm-up without a tokenizer), then a worker that failed to load weights.
_REAL_LOG = """\
(MainProcess pid=9584) WARNING 11-30 06:18:32 [base.py:380] Traceback (most recent call last):
(MainProcess pid=9584) WARNING 11-30 06:18:32 [base.py:380] ValueError: Tokenizer not available when `skip_tokenizer_init=True`
(Worker pid=22549) ERROR 11-30 07:29:23 [multiproc_executor.py:953] WorkerProc failed to start.
(Worker pid=22549) ERROR 11-30 07:29:23 [multiproc_executor.py:953] Traceback (most recent call last):
(Worker pid=22549) ERROR 11-30 07:29:23 [multiproc_executor.py:953]   File "/x/vllm/model_executor/models/utils.py", line 340, in load_weights
(Worker pid=22549) ERROR 11-30 07:29:23 [multiproc_executor.py:953]     raise ValueError(msg)
(Worker pid=22549) ERROR 11-30 07:29:23 [multiproc_executor.py:953] ValueError: There is no module or parameter named 'model.layers.0.attention' in LlamaForCausalLM.
(EngineCore pid=22438) ERROR 11-30 07:29:26 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=22438) ERROR 11-30 07:29:26 [core.py:1510] Exception: WorkerProc initialization failed due to an exception in a background process.
"""  # noqa: E501


def test_root_cause_is_the_first_error_traceback_of_the_engine_log():
    cause, traceback = root_cause(_REAL_LOG)
    assert cause == (
        "ValueError: There is no module or parameter named "
        "'model.layers.0.attention' in LlamaForCausalLM."
    )
    assert traceback.startswith("Traceback") and "load_weights" in traceback
    assert root_cause("INFO nothing failed\n") == (None, "")


# vLLM 0.32 on a CPU without AMX, loading an fp8-block checkpoint (the reasons of
# a kernel refusal come on lines of their own).
_KERNEL_LOG = """\
(Worker pid=1980) ERROR 12-01 22:48:52 [multiproc_executor.py:953] Traceback (most recent call last):
(Worker pid=1980) ERROR 12-01 22:48:52 [multiproc_executor.py:953]     raise ValueError(
(Worker pid=1980) ERROR 12-01 22:48:52 [multiproc_executor.py:953] ValueError: Failed to find a kernel that can implement the ScaledMM linear layer. Reasons:\x20
(Worker pid=1980) ERROR 12-01 22:48:52 [multiproc_executor.py:953] CPUFp8W8A8BlockScaledMMKernel requires AMX tile support (Sapphire Rapids or newer)..
(Worker pid=1980) ERROR 12-01 22:48:52 [multiproc_executor.py:953] CPUFp8BlockScaledMMKernel requires AMX tile support (Sapphire Rapids or newer)..
(EngineCore pid=1966) ERROR 12-01 22:48:55 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=1966) ERROR 12-01 22:48:55 [core.py:1510] Exception: WorkerProc initialization failed due to an exception in a background process.
"""  # noqa: E501


def test_root_cause_keeps_the_lines_of_a_multi_line_message():
    cause, traceback = root_cause(_KERNEL_LOG)
    assert cause == (
        "ValueError: Failed to find a kernel that can implement the ScaledMM linear "
        "layer. Reasons: CPUFp8W8A8BlockScaledMMKernel requires AMX tile support "
        "(Sapphire Rapids or newer).. CPUFp8BlockScaledMMKernel requires AMX tile "
        "support (Sapphire Rapids or newer).."
    )
    assert "WorkerProc initialization failed" not in traceback


# -- real engine ------------------------------------------------------------------


@pytest.fixture(scope="session")
def llama_run(tmp_path_factory, llama_ckpt) -> Run:
    root = tmp_path_factory.mktemp("llama-run")
    spec = write_spec(root / "spec.yaml", LLAMA_SPEC)
    # No --generated: validate generates the plugin itself, nothing is installed.
    return _validate(llama_ckpt, spec, root / "out")


@pytest.fixture(scope="session")
def deepseek_run(tmp_path_factory) -> Run:
    root = tmp_path_factory.mktemp("deepseek")
    ckpt = write_deepseek_v3(root / "ckpt")
    spec = write_spec(root / "spec.yaml", DEEPSEEK_V3_SPEC)
    gen = subprocess.run(
        [ONBOARD, "generate", str(spec), "--out", str(root / "gen")],
        capture_output=True,
        text=True,
    )
    assert gen.returncode == 0, gen.stderr
    return _validate(ckpt, spec, root / "out", "--generated", str(root / "gen"))


def _assert_passed_with_generated_class(run: Run, package: str) -> None:
    assert run.result is not None, run.output
    accuracy = run.check("accuracy")
    assert run.returncode == 0, accuracy["details"] + run.output[-3000:]
    assert run.result["passed"] is True
    assert accuracy["status"] == "passed" and accuracy["passed"] is True
    # What the engine instantiated, read back from it: the generated class.
    assert run.result["vllm_model_class"].startswith(package + ".")
    m = accuracy["metrics"]
    assert m["generated_class_instantiated"] is True
    assert m["num_prompts"] >= 8 and m["max_new_tokens"] == 32
    assert m["greedy_compared_tokens"] == m["num_prompts"] * 32
    assert m["greedy_failed_sequences"] == 0
    assert 0.0 <= m["prompt_logprob_max_abs_diff"] <= PROMPT_LOGPROB_ATOL
    # Decisive logits: the pass is not one on flat logits.
    assert m["top1_top2_margin_median"] > 0.1
    assert run.result["reference"].startswith("transformers ")
    html = (run.out_dir / "report.html").read_text()
    assert run.result["vllm_model_class"] in html and "passed" in html


@pytest.mark.engine
def test_llama_passes_through_the_generated_plugin(llama_run):
    _assert_passed_with_generated_class(llama_run, "onboard_plugin_tiny_llama")
    m = llama_run.check("accuracy")["metrics"]
    assert m["prompts"].endswith("checkpoint tokenizer")
    assert set(m["timings"]) >= {"engine_start_s", "reference_s", "validate_total_s"}
    # The engine's own KV-cache accounting: 2 layers x (K, V) x 2 KV heads x 32 dims
    # x 4 bytes (float32), no sharing.
    info = json.loads((llama_run.out_dir / "logs" / "engine.json").read_text())
    assert info["model_class"] == llama_run.result["vllm_model_class"]
    kv = info["kv_cache"]
    assert kv["bytes_per_token"] == kv["bytes_per_token_without_sharing"] == 1024
    assert len(kv["layers"]) == 2 and kv["shared_layers"] == {}
    assert kv["num_blocks"] > 0


@pytest.mark.engine
@pytest.mark.acceptance
def test_the_same_harness_runs_vllms_in_tree_class(tmp_path_factory, llama_ckpt):
    """The baseline mode: vLLM's own Llama, with the plugin kept out."""
    root = tmp_path_factory.mktemp("in-tree")
    spec = write_spec(root / "spec.yaml", LLAMA_SPEC)
    run = _validate(llama_ckpt, spec, root / "out", "--reference-vllm-in-tree")
    assert run.returncode == 0, run.output[-3000:]
    assert run.result["vllm_model_class"] == (
        "vllm.model_executor.models.llama.LlamaForCausalLM"
    )
    m = run.check("accuracy")["metrics"]
    assert m["generated_class_instantiated"] is False
    assert m["model_code"] == "vLLM's in-tree model classes"
    assert m["prompt_logprob_max_abs_diff"] <= PROMPT_LOGPROB_ATOL


@pytest.mark.engine
def test_deepseek_v3_passes_through_the_generated_plugin(deepseek_run):
    _assert_passed_with_generated_class(deepseek_run, "onboard_plugin_tiny_deepseek_v3")
    # MLA caches one latent per token and layer: (512 + 64) x 4 bytes x 2 layers.
    info = json.loads((deepseek_run.out_dir / "logs" / "engine.json").read_text())
    assert info["kv_cache"]["bytes_per_token"] == 2 * 576 * 4


def test_wrong_tensor_layout_fails_before_the_engine_naming_tensors(
    tmp_path_factory, llama_ckpt
):
    """The spec says q/k/v/o live under `attn`; the checkpoint has `self_attn`:
    the preflight refuses it (exit 2) naming the checkpoint's unmatched tensors and
    the names the model expects, before any engine starts."""
    root = tmp_path_factory.mktemp("wrong-layout")
    spec = write_spec(root / "spec.yaml", WRONG_LAYOUT_SPEC)
    run = _validate(llama_ckpt, spec, root / "out")
    assert run.returncode == 2, run.output[-3000:]
    assert "Traceback" not in run.output
    assert "preflight, no engine started" in run.output
    assert "self_attn.q_proj" in run.output  # in the checkpoint, not expected
    assert ".attn." in run.output  # expected by the spec, not in the checkpoint
    assert "starting the vLLM engine" not in run.output


@pytest.mark.engine
@pytest.mark.acceptance
def test_renamed_checkpoint_tensors_fail_naming_tensors_and_parameters(
    tmp_path_factory, llama_ckpt
):
    """Right spec, but the checkpoint calls the attention block `attention`; with
    the preflight off, the engine's own load fails and the worker names the
    unmatched checkpoint tensors and the model parameters left unloaded."""
    root = tmp_path_factory.mktemp("renamed")
    ckpt = rename_tensors(llama_ckpt, root / "ckpt", ".self_attn.", ".attention.")
    spec = write_spec(root / "spec.yaml", LLAMA_SPEC)
    run = _validate(ckpt, spec, root / "out", "--no-preflight")
    _assert_names_listed(run, "attention")


def _assert_names_listed(run: Run, block: str) -> None:
    assert run.result is not None, run.output
    assert run.returncode == 1, run.output[-3000:]
    assert "Traceback" not in run.output
    accuracy = run.check("accuracy")
    assert accuracy["status"] == "failed" and run.result["passed"] is False
    m, details = accuracy["metrics"], accuracy["details"]
    # The root cause from the engine's processes, not the front end's generic error.
    assert m["engine_error"] and "Engine core initialization failed" not in details
    expected = {
        f"model.layers.{layer}.{block}.{proj}.weight"
        for layer in range(2)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    assert set(m["unmatched_checkpoint_tensors"]) == expected
    for name in expected:
        assert name in details
    unloaded = m["unloaded_model_parameters"]
    assert {f"model.layers.{i}.self_attn.qkv_proj.weight" for i in range(2)} <= set(
        unloaded
    )
    assert {f"model.layers.{i}.self_attn.o_proj.weight" for i in range(2)} <= set(
        unloaded
    )
    assert "model parameters got no checkpoint tensor" in details
    assert "checkpoint tensors match no model parameter" in details
    # Nothing else is blamed: the MLP, norms and embeddings matched.
    assert len(unloaded) == 4
