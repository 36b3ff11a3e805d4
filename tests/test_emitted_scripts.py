"""Every script and command line onboard writes survives hostile paths.

The scripts are generated into directories whose names hold a space, `$(...)`,
backticks and both kinds of quote, and then RUN with stub executables first on
PATH, named like the real tools (vllm, curl, speculators, python3, pip), which
record the argv they receive. Nothing the path holds may execute (no PWNED file
appears), and each tool receives each path as one exact argument.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from validate_fixtures import LLAMA_SPEC, write_spec

ONBOARD = str(Path(sys.executable).with_name("onboard"))
HOSTILE = "a b $(touch PWNED1) `touch PWNED2` 'q' \"dq\" ;touch PWNED3"
BUNDLED = Path(__file__).resolve().parents[1] / "model_specs"

# A stub records its name and argv (NUL-separated, one file per call). With
# STUB_SERVER=1, `vllm serve` then stays up like a server until it is killed, and
# `curl` answers a /health check once that server's call is recorded (so that no
# call is lost to the script's kill).
STUB = r"""#!/usr/bin/env bash
f="$STUB_LOG/call.$(date +%s%N).$$"  # in the order of the calls
printf '%s\0' "$(basename "$0")" "$@" >"$f"
[[ "${STUB_SERVER:-}" == 1 ]] || exit 0
case "$(basename "$0") $1 $*" in
    "vllm serve"*) touch "$STUB_LOG/serving"; exec sleep 60 ;;
    curl*/health*)
        for _ in $(seq 100); do
            rm "$STUB_LOG/serving" 2>/dev/null && break
            sleep 0.1
        done ;;
esac
exit 0
"""
TOOLS = ("vllm", "curl", "speculators", "python3", "pip", "nvidia-smi")


@pytest.fixture
def stubs(tmp_path) -> dict[str, str]:
    """An environment whose PATH starts with the stubs; STUB_LOG collects calls."""
    bin_dir, log = tmp_path / "stub-bin", tmp_path / "stub-log"
    bin_dir.mkdir()
    log.mkdir()
    for tool in TOOLS:
        path = bin_dir / tool
        path.write_text(STUB)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "BASE_URL")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", STUB_LOG=str(log))
    return env


def calls(env: dict[str, str]) -> list[list[str]]:
    out = []
    recorded = Path(env["STUB_LOG"]).glob("call.*")
    for f in sorted(recorded, key=lambda f: int(f.name.split(".")[1])):
        out.append(f.read_bytes().decode().split("\0")[:-1])
    return out


def find(recorded: list[list[str]], *prefix: str) -> list[list[str]]:
    return [c for c in recorded if c[: len(prefix)] == list(prefix)]


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def run_script(script: Path, env: dict[str, str], cwd: Path, *args: str):
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    cwd.mkdir(exist_ok=True)
    proc = subprocess.run(
        ["bash", str(script), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def no_injection(root: Path) -> None:
    assert not [p for p in root.rglob("PWNED*")]


def test_speculators_recipe_with_hostile_paths(tmp_path, stubs):
    out = tmp_path / HOSTILE / "speculators"
    proc = subprocess.run(
        [
            ONBOARD,
            "speculators",
            str(BUNDLED / "deepseek-v3-style.yaml"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    verifier = str(tmp_path / HOSTILE / "verifier")
    work = str(tmp_path / HOSTILE / "work")
    env = dict(stubs, VERIFIER=verifier, WORK=work, STUB_SERVER="1")
    run_script(out / "eagle3" / "recipe.sh", env, tmp_path / "cwd")
    no_injection(tmp_path)

    recorded = calls(env)
    (serve,) = find(recorded, "vllm", "serve")
    assert serve[2] == verifier
    assert json.loads(value(serve, "--speculative-config"))["method"] == (
        "extract_hidden_states"
    )
    (prepare,) = find(recorded, "speculators", "prepare-data")
    assert value(prepare, "--model") == verifier
    assert value(prepare, "--output") == f"{work}/data"
    (train,) = find(recorded, "speculators", "train")
    # The head is saved where the speculative config tells vLLM to look.
    config = json.loads((out / "speculative-config.eagle3.json").read_text())
    assert value(train, "--save-path") == config["model"] == str(out / "eagle3")
    layers = train[train.index("--target-layer-ids") + 1 : train.index("--num-layers")]
    assert layers == ["2", "30", "58"]


def test_emitted_gpu_run_with_hostile_paths(tmp_path, stubs):
    from onboard.validate.emit import emit

    spec_path = write_spec(
        tmp_path / "spec.yaml",
        LLAMA_SPEC + "speculators:\n  - {method: ngram, num_speculative_tokens: 3}\n",
    )
    model = str(tmp_path / HOSTILE / "model")
    out = tmp_path / HOSTILE / "emitted"
    manifest = emit(model, spec_path, "b200", out)
    env = dict(stubs, STUB_SERVER="1")
    run_script(out / "run.sh", env, tmp_path / "cwd")  # every phase, install too
    no_injection(tmp_path)

    recorded = calls(env)
    serves = find(recorded, "vllm", "serve")
    assert [s[2] for s in serves] == [model, model]  # baseline, spec-ngram
    ngram = json.loads(value(serves[1], "--speculative-config"))
    assert ngram == manifest["variants"]["spec-ngram"]
    benches = find(recorded, "vllm", "bench", "serve")
    assert benches and {value(b, "--model") for b in benches} == {model}
    assert {value(b, "--result-dir") for b in benches} == {
        str(out / "results" / "bench" / "baseline"),
        str(out / "results" / "bench" / "spec-ngram"),
    }
    python = find(recorded, "python3")
    scripts = {c[1] for c in python if c[1].endswith(".py")}
    assert scripts == {
        str(out / name)
        for name in ("onboard_probe.py", "accuracy_client.py", "reference_logprobs.py")
    }
    (accuracy,) = [c for c in python if c[1].endswith("accuracy_client.py")]
    assert value(accuracy, "--manifest") == str(out / "manifest.json")
    (lm_eval,) = find(recorded, "python3", "-m", "lm_eval")
    assert value(lm_eval, "--model_args").startswith(f"model={model},")
    assert value(lm_eval, "--output_path") == str(out / "results" / "lm_eval")
    assert ["python3", "-m", "pip", "install", str(out / "plugin")] in recorded


def test_plan_command_with_a_hostile_model(tmp_path, stubs):
    from onboard.serving import make_deployment
    from onboard.serving.serve import shell
    from onboard.spec import load_spec

    model = str(tmp_path / HOSTILE / "model")
    plan = make_deployment(
        load_spec(BUNDLED / "dense-gqa.yaml"), "b200", "bf16", model=model
    )
    snippet = shell({"VLLM_X": HOSTILE, **plan.env}, plan.argv)
    proc = subprocess.run(
        ["bash", "-c", snippet + '\nprintf %s "$VLLM_X" >"$STUB_LOG/env"'],
        env=stubs,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    no_injection(tmp_path)
    assert calls(stubs) == [plan.argv]
    assert (Path(stubs["STUB_LOG"]) / "env").read_text() == HOSTILE


def test_model_card_command_with_a_hostile_draft(tmp_path, stubs):
    from onboard.publish.card import CardInputs, Speculator, serve_command

    draft = str(tmp_path / HOSTILE / "draft")
    inputs = CardInputs(
        checkpoint=None,
        spec=None,
        verdict=None,
        repo_id="org/model",
        revision="dev",
        speculators=[Speculator("eagle3", {"method": "eagle3", "model": draft}, "x")],
    )
    command, _ = serve_command(inputs)
    proc = subprocess.run(
        ["bash", "-c", command],
        env=stubs,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    no_injection(tmp_path)
    ((*head, flag, config),) = calls(stubs)
    assert head == ["vllm", "serve", "org/model", "--revision", "dev"]
    assert flag == "--speculative-config" and json.loads(config)["model"] == draft
