"""GPU targets: `onboard validate --emit` writes the run, `--ingest` judges what it
brought back.

The round trip runs the emitted run.sh's own phases (accuracy requests, lm-eval,
`vllm bench serve --save-result`, /metrics, the Hugging Face reference) against a
real CPU `vllm serve` of a tiny Llama with the generated plugin, then ingests
those files: no hand-written results. lm-eval runs a bundled GSM8K-format task
(tests/fixtures/lm_eval_task) so nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from validate_fixtures import LLAMA_SPEC, write_llama, write_spec

ONBOARD = str(Path(sys.executable).with_name("onboard"))
TASK_DIR = Path(__file__).parent / "fixtures" / "lm_eval_task"
SPEC_TEXT = LLAMA_SPEC + (
    "speculators:\n"
    "  - {method: ngram, num_speculative_tokens: 3}\n"
    "  - {method: eagle3}\n"
)


def _onboard(*args: str) -> subprocess.CompletedProcess:
    """The CLI's main() in this process (each `onboard` process spends seconds on
    imports here), with its exit code, stdout and stderr."""
    from onboard import cli

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["onboard", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _manifest_env(path: Path, name: str) -> str:
    """A variable of manifest.env as bash sees it (arrays joined by spaces)."""
    out = subprocess.run(
        ["bash", "-c", f'source "$1"; echo "${{{name}[*]}}"', "_", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


# -- emit, no engine ----------------------------------------------------------------


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory) -> Path:
    return write_spec(tmp_path_factory.mktemp("spec") / "spec.yaml", SPEC_TEXT)


@pytest.mark.parametrize("target", ["b200", "mi355x"])
def test_emit_writes_a_self_contained_run(tmp_path, spec_path, target):
    out = tmp_path / "run"
    # MODEL is a Hub id: nothing local is needed to emit.
    proc = _onboard(
        "validate",
        "my-org/tiny-llama",
        "--spec",
        str(spec_path),
        "--target",
        target,
        "--emit",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in out.iterdir()}
    assert {
        "run.sh",
        "manifest.env",
        "manifest.json",
        "thresholds.json",
        "accuracy_client.py",
        "reference_logprobs.py",
        "onboard_probe.py",
        "plugin",
        "spec.yaml",
        "results",
    } <= names
    assert (out / "plugin" / "pyproject.toml").is_file()
    syntax = subprocess.run(["bash", "-n", str(out / "run.sh")], capture_output=True)
    assert syntax.returncode == 0, syntax.stderr
    for script in ("accuracy_client.py", "reference_logprobs.py", "onboard_probe.py"):
        compile((out / script).read_text(), script, "exec")

    run = (out / "run.sh").read_text()
    assert "vllm bench serve" in run and "--save-result" in run
    assert '"$URL/metrics"' in run and "-m lm_eval" in run
    # The served class is asked of the workers (model-class phase).
    assert "--worker-extension-cls onboard_probe.ModelClassProbe" in run
    assert "VLLM_SERVER_DEV_MODE=1" in run and "phase_model_class" in run
    env = out / "manifest.env"
    assert _manifest_env(env, "MODEL") == "my-org/tiny-llama"
    assert _manifest_env(env, "VARIANTS") == "baseline spec-ngram"
    assert '"method":"ngram"' in _manifest_env(env, "SPEC_CONFIG_spec_ngram")
    flags = _manifest_env(env, "SERVE_FLAGS")
    assert "--tensor-parallel-size 1" in flags
    assert "--gpu-memory-utilization 0.92" in flags
    install = _manifest_env(env, "INSTALL_CMD")
    if target == "mi355x":
        assert _manifest_env(env, "TARGET_ENV") == "VLLM_ROCM_USE_AITER=1"
        assert "rocm" in install
    else:
        assert _manifest_env(env, "TARGET_ENV") == ""
        assert install == "pip install vllm==0.32.0"
    assert _manifest_env(env, "PLUGIN_ENTRY_POINT") == "onboard_plugin_tiny_llama"

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == target and manifest["model"] == "my-org/tiny-llama"
    assert len(manifest["prompts"]) == 12 and manifest["top_k"] == 5
    # eagle3 without a trained head has no variant, and says why.
    assert set(manifest["variants"]) == {"baseline", "spec-ngram"}
    assert any("eagle3" in n for n in manifest["notes"])
    thresholds = json.loads((out / "thresholds.json").read_text())
    assert thresholds["accuracy"]["prompt_logprob_max_abs_diff"] == 0.5
    assert thresholds["spec_decode"] == {"ngram": {"min_mean_acceptance_length": 1.0}}
    assert thresholds["lm_eval"]["min"] is None


def test_emit_refuses_a_directory_with_results(tmp_path, spec_path):
    out = tmp_path / "run"
    args = ["validate", "m/x", "--spec", str(spec_path), "--target", "b200"]
    assert _onboard(*args, "--emit", str(out)).returncode == 0
    (out / "results" / "vllm_accuracy.json").write_text("{}")
    proc = _onboard(*args, "--emit", str(out))
    assert proc.returncode == 2 and "already holds results" in proc.stderr


def test_bad_input_exits_2(tmp_path, spec_path):
    emitted = tmp_path / "run"
    assert (
        _onboard(
            "validate", "m/x", "--spec", str(spec_path), "--target", "b200",
            "--emit", str(emitted),
        ).returncode
        == 0
    )  # fmt: skip
    out = str(tmp_path / "out")
    cases = [
        (["--target", "b200", "--ingest", str(tmp_path / "nope")], "no such directory"),
        (["--target", "b200", "--ingest", str(tmp_path)], "manifest.json: missing"),
        (["--target", "mi355x", "--ingest", str(emitted)], "but --target is"),
        (["--target", "z9", "--ingest", str(emitted)], "unknown target"),
        (["--target", "b200", "--ingest", str(emitted)], "no results"),
    ]
    for args, message in cases:
        proc = _onboard("validate", *args, "--out", out)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    (emitted / "results" / "bench").mkdir()
    (emitted / "results" / "vllm_accuracy.json").write_text("{not json")
    (emitted / "results" / "reference_accuracy.json").write_text("{}")
    proc = _onboard(
        "validate", "--target", "b200", "--ingest", str(emitted), "--out", out
    )
    assert proc.returncode == 2 and "invalid JSON" in proc.stderr, proc.stderr
    # The real executable maps the same error to exit 2.
    proc = subprocess.run(
        [
            ONBOARD, "validate", "m/x", "--spec", str(spec_path), "--target", "z9",
            "--emit", str(tmp_path / "e2"),
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and "unknown target" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- the round trip on a real CPU server ------------------------------------------


@dataclass
class RoundTrip:
    emitted: Path
    out: Path
    log: str
    speculative: bool

    def ingest(self) -> tuple[subprocess.CompletedProcess, dict]:
        proc = _onboard(
            "validate", "--target", "b200", "--ingest", str(self.emitted),
            "--out", str(self.out),
        )  # fmt: skip
        path = self.out / "b200" / "validation.json"
        return proc, json.loads(path.read_text()) if path.exists() else {}


def _round_trip(root: Path, speculative: bool) -> RoundTrip:
    from onboard.pipeline.generate import generate_all
    from onboard.runtime.engine import EngineOptions, read_plugin
    from onboard.spec import load_spec
    from onboard.validate.emit import emit
    from onboard.validate.serve import Server

    ckpt = write_llama(root / "ckpt")
    spec_path = write_spec(root / "spec.yaml", SPEC_TEXT)
    spec = load_spec(spec_path)
    generate_all(spec, root / "gen")
    plugin = read_plugin(root / "gen" / "plugin")
    emitted = root / "emitted"
    # Emitted for b200 with the local checkpoint as MODEL; run here against CPU
    # servers of the same checkpoint (BASE_URL: the script starts none itself).
    manifest = emit(str(ckpt), spec_path, "b200", emitted, generated=root / "gen")
    variants = {"baseline": None}
    if speculative:
        variants["spec-ngram"] = manifest["variants"]["spec-ngram"]
    logs = []
    for variant, config in variants.items():
        extra = {"speculative_config": config} if config else {}
        # Served as run.sh serves: with the model-class probe and dev mode.
        probe = manifest["model_class_probe"]
        extra["worker_extension_cls"] = probe["worker_extension_cls"]
        options = EngineOptions(
            ckpt, plugin, max_model_len=512, extra=extra, env=probe["env"]
        )
        server = Server(
            options,
            root / f"work-{variant}",
            root / f"{variant}.log",
            pythonpath=(emitted,),
        )
        phases = [f"model-class:{variant}", f"bench:{variant}", f"scrape:{variant}"]
        if variant == "baseline":
            phases = ["env", "accuracy", "lm-eval", *phases]
        with server.start():
            server.wait_ready()
            env = {
                **server.environment(),
                "BASE_URL": server.base_url,
                "SKIP_INSTALL": "1",
                "PYTHON": sys.executable,
                "CONCURRENCY": "1 2",
                "BENCH_INPUT_LEN": "32",
                "BENCH_OUTPUT_LEN": "32",
                "BENCH_PROMPTS_PER_SLOT": "2",
                "BENCH_MIN_PROMPTS": "4",
                "LM_EVAL_TASKS": "gsm8k_onboard_tiny",
                "LM_EVAL_INCLUDE": str(TASK_DIR),
                "LM_EVAL_NUM_FEWSHOT": "1",
                "HF_DATASETS_OFFLINE": "1",
                "HF_HUB_OFFLINE": "1",
            }
            # lm-eval reads the task's data files relative to the working directory.
            proc = subprocess.run(
                ["bash", str(emitted / "run.sh"), *phases],
                env=env,
                cwd=TASK_DIR,
                capture_output=True,
                text=True,
                timeout=900,
            )
            logs.append(proc.stdout + proc.stderr)
            assert proc.returncode == 0, logs[-1][-6000:]
        shutil.copy(
            root / f"{variant}.log", emitted / "results" / f"server-{variant}.log"
        )
    # The reference after the servers stopped, as run.sh orders it; float32 as the
    # CPU server ran (the b200 default is bf16).
    env = dict(os.environ, REF_DTYPE="float32", REF_DEVICE="cpu", PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(emitted / "run.sh"), "reference"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs.append(proc.stdout + proc.stderr)
    assert proc.returncode == 0, logs[-1][-6000:]
    return RoundTrip(emitted, root / "out", "\n".join(logs), speculative)


@pytest.fixture(scope="session")
def round_trip(tmp_path_factory) -> RoundTrip:
    return _round_trip(tmp_path_factory.mktemp("round-trip"), speculative=False)


def _set_threshold(emitted: Path, section: str, key: str, value) -> None:
    path = emitted / "thresholds.json"
    data = json.loads(path.read_text())
    data[section][key] = value
    path.write_text(json.dumps(data, indent=2))


def _check(result: dict, name: str) -> dict:
    return next(c for c in result["checks"] if c["name"] == name)


def _assert_real_results(trip: RoundTrip, result: dict) -> None:
    results = trip.emitted / "results"
    # vLLM's own files: `vllm bench serve --save-result` JSON, lm-eval's results.
    bench = json.loads((results / "bench" / "baseline" / "bench-c2.json").read_text())
    assert bench["backend"] == "vllm" and bench["max_concurrency"] == 2
    assert list((results / "lm_eval").glob("**/results_*.json"))
    assert result["target"] == "b200"
    accuracy = _check(result, "accuracy")
    assert accuracy["status"] == "passed", accuracy["details"]
    m = accuracy["metrics"]
    assert m["num_prompts"] == 12 and m["greedy_compared_tokens"] == 12 * 32
    # float32 on both sides: the same bound as the cpu target's validate.
    assert m["prompt_logprob_max_abs_diff"] < 1e-2
    assert m["prompt_positions"] > 100
    # The class the server's worker built, asked over vLLM's /collective_rpc.
    assert result["vllm_model_class"].startswith("onboard_plugin_tiny_llama.")
    assert result["vllm_model_class"].endswith(".LlamaForCausalLM")
    assert m["generated_class_instantiated"] is True
    probe = json.loads((results / "model-class-baseline.json").read_text())
    assert probe["workers"] == [result["vllm_model_class"]]
    speed = _check(result, "speed")
    assert speed["status"] == "passed", speed["details"]
    assert [s["concurrency"] for s in speed["metrics"]["sweep"]] == [1, 2]
    assert speed["metrics"]["output_tokens_per_s"] > 0
    assert speed["metrics"]["ttft_ms"] > 0 and speed["metrics"]["tpot_ms"] > 0
    # The engine's own timings per level, from the /metrics run.sh saved around it.
    for level in speed["metrics"]["sweep"]:
        assert level["engine_tpot_ms"] > 0 and level["engine_ttft_ms"] > 0, level
    gsm = _check(result, "lm-eval:gsm8k_onboard_tiny")
    assert gsm["metrics"]["num_samples"] == 4
    assert 0.0 <= gsm["metrics"]["score"] <= 1.0


@pytest.mark.engine
def test_round_trip_ingests_real_cpu_results(round_trip):
    trip = round_trip
    # No GSM8K minimum in the emitted thresholds: scored, not judged.
    proc, result = trip.ingest()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_real_results(trip, result)
    assert _check(result, "lm-eval:gsm8k_onboard_tiny")["status"] == "not-run"
    # This run served no speculative variant: its check says so, never passes.
    sd = _check(result, "spec-decode:ngram")
    assert sd["status"] == "not-run" and "metrics-spec-ngram.prom" in sd["details"]
    assert result["passed"] is True
    assert (trip.out / "b200" / "report.html").is_file()
    assert (trip.out / "b200" / "results" / "vllm_accuracy.json").is_file()

    # A server that built vLLM's own class instead: accuracy fails, as on cpu.
    probe_path = trip.emitted / "results" / "model-class-baseline.json"
    probe = probe_path.read_text()
    in_tree = "vllm.model_executor.models.llama.LlamaForCausalLM"
    probe_path.write_text(probe.replace(result["vllm_model_class"], in_tree))
    proc, wrong = trip.ingest()
    assert proc.returncode == 1 and wrong["vllm_model_class"] == in_tree
    accuracy = _check(wrong, "accuracy")
    assert (
        accuracy["status"] == "failed"
        and "did not take effect" in (accuracy["details"])
    )
    probe_path.write_text(probe)

    # Thresholds the same numbers miss: the checks fail, exit 1.
    score = _check(result, "lm-eval:gsm8k_onboard_tiny")["metrics"]["score"]
    tokens_per_s = _check(result, "speed")["metrics"]["output_tokens_per_s"]
    _set_threshold(trip.emitted, "lm_eval", "min", score + 0.01)
    _set_threshold(trip.emitted, "speed", "min_output_tokens_per_s", tokens_per_s * 2)
    _set_threshold(trip.emitted, "accuracy", "prompt_logprob_max_abs_diff", 1e-9)
    proc, result = trip.ingest()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _check(result, "lm-eval:gsm8k_onboard_tiny")["status"] == "failed"
    assert "misses min_output_tokens_per_s" in _check(result, "speed")["details"]
    assert _check(result, "accuracy")["status"] == "failed"
    assert result["passed"] is False
    # And a minimum it meets: judged and passed.
    _set_threshold(trip.emitted, "lm_eval", "min", score)
    _set_threshold(trip.emitted, "speed", "min_output_tokens_per_s", None)
    _set_threshold(trip.emitted, "accuracy", "prompt_logprob_max_abs_diff", 0.5)
    proc, result = trip.ingest()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _check(result, "lm-eval:gsm8k_onboard_tiny")["status"] == "passed"


@pytest.mark.engine
@pytest.mark.acceptance
def test_round_trip_with_speculative_decoding(tmp_path_factory):
    trip = _round_trip(tmp_path_factory.mktemp("round-trip-sd"), speculative=True)
    proc, result = trip.ingest()
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    _assert_real_results(trip, result)
    sd = _check(result, "spec-decode:ngram")
    m = sd["metrics"]
    print(f"\nspec-decode:ngram ingested: {sd['details']}")
    assert m["num_drafts"] > 0 and len(m["acceptance_rate_per_position"]) == 3
    assert m["mean_acceptance_length"] >= 1.0 and m["speedup"] > 0
    assert sd["status"] == "passed", sd["details"]
    _set_threshold(
        trip.emitted, "spec_decode", "ngram", {"min_mean_acceptance_length": 4.5}
    )
    proc, result = trip.ingest()
    assert proc.returncode == 1
    assert _check(result, "spec-decode:ngram")["status"] == "failed"
