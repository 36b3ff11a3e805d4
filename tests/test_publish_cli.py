"""`onboard publish` as users run it: the installed console script, against the
local Hub server (tests/hub_server.py), killed in the middle of an upload and
run again; dry runs; exit codes; the token from the login cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_server import HubServer
from publish_helpers import TOKEN, build_dense_fp8

CLI = Path(sys.executable).parent / "onboard"
REPO = "onboard-test/cli-fp8"


@pytest.fixture(scope="module")
def fp8(tmp_path_factory) -> Path:
    return build_dense_fp8(tmp_path_factory.mktemp("publish"))


@pytest.fixture
def hub():
    with HubServer(TOKEN, part_size=1 << 20) as server:
        yield server


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """The CLI's environment: the token in HF_TOKEN, a private HF_HOME."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    out.update(
        HF_TOKEN=TOKEN,
        HF_HOME=str(tmp_path / "hf-home"),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    return out


def _args(fp8: Path, hub: HubServer, *extra: str) -> list[str]:
    return [
        str(CLI),
        "publish",
        str(fp8),
        "--repo",
        REPO,
        "--endpoint",
        hub.url,
        "--validation",
        str(fp8.parents[1] / "validation-fp8" / "validation.json"),
        "--force",
        *extra,
    ]


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert TOKEN not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


def test_dry_run_prints_files_sizes_and_card_and_touches_nothing(fp8, hub, env):
    del env["HF_TOKEN"]  # a dry run needs no token
    result = _run(_args(fp8, hub, "--dry-run"), env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    shard = fp8 / "model-00001-of-00002.safetensors"
    assert f"model-00001-of-00002.safetensors  {shard.stat().st_size:>14,d} B" in out
    assert "files (10," in out and "README.md" in out
    assert "--- README.md (model card) ---" in out
    assert "base_model_relation" not in out  # tiny: no base model to relate to
    assert "library_name: vllm" in out
    assert "--force: publishing anyway; the card says so" in out
    assert "dry run: nothing was uploaded" in out
    assert hub.log == []  # not a single request
    assert not (Path(env["HF_HOME"])).exists()


def test_refusals_exit_2_with_the_reason(fp8, hub, env, tmp_path):
    args = _args(fp8, hub)
    args.remove("--force")
    result = _run(args, env)
    assert result.returncode == 2
    assert "validation did not pass (failed checks: accuracy)" in result.stderr
    assert "--force publishes it anyway" in result.stderr

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in fp8.iterdir():
        if f.name != "model-00002-of-00002.safetensors":
            (broken / f.name).write_bytes(f.read_bytes())
    result = _run(_args(broken, hub), env)
    assert result.returncode == 2
    assert "not a complete checkpoint" in result.stderr
    assert "model-00002-of-00002.safetensors: listed in" in result.stderr
    assert hub.log == []


def test_a_card_gets_no_licence_the_inputs_do_not_state(fp8, hub, env):
    """A spec without `license:` (as `spec from-hf` writes one: config.json
    states none) is refused until --license names the weights' licence."""
    del env["HF_TOKEN"]
    # (beside it: the validation.json _args names is found from there)
    unstated = shutil.copytree(fp8, fp8.parent / "unstated-licence")
    spec = unstated / "spec.yaml"
    text = spec.read_text()
    assert "\nlicense: " in text
    spec.write_text(
        "".join(
            line for line in text.splitlines(True) if not line.startswith("license: ")
        )
    )
    result = _run(_args(unstated, hub, "--dry-run"), env)
    assert result.returncode == 2
    assert "no licence for the model card: its spec.yaml states none" in result.stderr
    assert "--license" in result.stderr
    result = _run(_args(unstated, hub, "--dry-run", "--license", "llama3.1"), env)
    assert result.returncode == 0, result.stderr
    assert "license: llama3.1" in result.stdout
    assert hub.log == []


def test_killed_mid_upload_then_rerun_finishes(fp8, hub, env):
    record = json.loads((fp8 / "onboard-quantize.json").read_text())["shards"]
    oid1 = record["model-00001-of-00002.safetensors"]["sha256"]
    oid2 = record["model-00002-of-00002.safetensors"]["sha256"]
    # The first part of shard 2 hangs on the server; shard 1 gets through.
    stall = hub.inject("PUT", rf"/lfs-upload/.*/{oid2}/1$", "stall")
    proc = subprocess.Popen(
        _args(fp8, hub), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert stall.stalled.wait(timeout=240), "the upload never reached shard 2"
        deadline = time.monotonic() + 120
        while oid1 not in hub.repos[REPO].lfs:
            assert time.monotonic() < deadline, "shard 1 never finished"
            time.sleep(0.1)
    finally:
        proc.kill()  # the interruption: Ctrl-C, a lost machine, ...
        out, err = proc.communicate(timeout=60)
    assert TOKEN.encode() not in out + err
    stall.release.set()
    hub.clear_faults()
    assert hub.commit_count(REPO) == 1 and not hub.pull_requests(REPO)
    shard1_puts = hub.requests("PUT", oid1)

    result = _run(_args(fp8, hub), env)
    assert result.returncode == 0, result.stderr
    assert f"published: {hub.url}/{REPO}/discussions/1" in result.stdout
    assert "verified 10 files against local checksums at refs/pr/1" in result.stdout
    assert hub.commit_count(REPO) == 2 and len(hub.pull_requests(REPO)) == 1
    assert hub.requests("PUT", oid1) == shard1_puts  # not sent again
    remote = hub.files(REPO, "refs/pr/1")
    for f in fp8.iterdir():
        assert remote[f.name] == f.read_bytes(), f.name

    # A third run: everything is there; it says so and changes nothing.
    again = _run(_args(fp8, hub), env)
    assert again.returncode == 0, again.stderr
    assert "published (found from an earlier run)" in again.stdout
    assert hub.commit_count(REPO) == 2 and len(hub.pull_requests(REPO)) == 1


def test_token_from_the_login_cache(fp8, hub, env):
    del env["HF_TOKEN"]
    home = Path(env["HF_HOME"])
    home.mkdir(parents=True)
    (home / "token").write_text(TOKEN)  # where `hf auth login` keeps it
    result = _run(_args(fp8, hub), env)
    assert result.returncode == 0, result.stderr
    assert len(hub.pull_requests(REPO)) == 1


def test_missing_or_refused_token_exits_2(fp8, hub, env):
    no_token = dict(env)
    del no_token["HF_TOKEN"]
    result = _run(_args(fp8, hub), no_token)
    assert result.returncode == 2
    assert "no Hugging Face token" in result.stderr
    assert hub.log == []

    wrong = dict(env, HF_TOKEN="hf_" + "x" * 34)
    result = subprocess.run(
        _args(fp8, hub), env=wrong, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2
    assert "refused the request (401)" in result.stderr
    assert wrong["HF_TOKEN"] not in result.stdout + result.stderr


def test_server_rejecting_the_commit_exits_1(fp8, hub, env):
    hub.inject("POST", r"/commit/", status=422, body="LFS object missing")
    result = _run(_args(fp8, hub), env)
    assert result.returncode == 1
    assert "failed: the upload failed" in result.stderr
    assert "LFS object missing" in result.stderr
