"""Credentials never printed by `onboard publish`: a password in the --endpoint URL
is redacted in every line it prints (dry run, progress, outcome, errors), and a
--revision that is a token is refused before anything is printed or sent. The
installed console script against the local Hub server (tests/hub_server.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_server import HubServer
from publish_helpers import TOKEN, build_dense_fp8

from onboard.publish.hub import Redactor, redact_urls

CLI = Path(sys.executable).parent / "onboard"
REPO = "onboard-test/redact-fp8"
SECRET = "s3cretPassw0rd"


@pytest.fixture(scope="module")
def fp8(tmp_path_factory) -> Path:
    return build_dense_fp8(tmp_path_factory.mktemp("publish"))


@pytest.fixture
def hub():
    with HubServer(TOKEN, part_size=1 << 20) as server:
        yield server


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    out.update(
        HF_TOKEN=TOKEN,
        HF_HOME=str(tmp_path / "hf-home"),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    return out


def _run(fp8: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    args = [
        str(CLI),
        "publish",
        str(fp8),
        "--repo",
        REPO,
        "--validation",
        str(fp8.parents[1] / "validation-fp8" / "validation.json"),
        "--force",
        *extra,
    ]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert TOKEN not in result.stdout + result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


def _with_password(hub: HubServer) -> str:
    scheme, rest = hub.url.split("://", 1)
    return f"{scheme}://user:{SECRET}@{rest}"


def test_dry_run_redacts_the_endpoint_password(fp8, hub, env):
    result = _run(fp8, env, "--endpoint", _with_password(hub), "--dry-run")
    assert result.returncode == 0, result.stderr
    host = hub.url.split("://", 1)[1]
    assert f"at http://***@{host} " in result.stdout
    assert "dry run: nothing was uploaded" in result.stdout
    assert hub.log == []


def test_upload_redacts_the_endpoint_password(fp8, hub, env):
    """The credentials in the URL reach the HTTP client (which sends them as basic
    auth in place of the token, so this Hub refuses the request): the error the
    user sees names the endpoint with its password hidden."""
    result = _run(fp8, env, "--endpoint", _with_password(hub))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "the Hub refused the request (401)" in result.stderr
    assert "http://***@127.0.0.1:" in result.stderr
    assert REPO not in hub.repos  # refused at the first request: nothing made


def test_bad_endpoint_is_refused_redacted(fp8, hub, env):
    result = _run(fp8, env, "--endpoint", f"ftp://user:{SECRET}@host")
    assert result.returncode == 2
    assert "--endpoint: expected an http(s) URL, got 'ftp://***@host'" in result.stderr


@pytest.mark.parametrize("dry_run", [True, False])
def test_token_as_revision_is_refused_before_anything(fp8, hub, env, dry_run):
    extra = ["--endpoint", hub.url, "--revision", TOKEN]
    result = _run(fp8, env, *extra, *(["--dry-run"] if dry_run else []))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "--revision: this looks like a Hugging Face token" in result.stderr
    assert hub.log == []
    assert not Path(env["HF_HOME"]).exists()


def test_branch_names_that_are_not_tokens_pass(fp8, hub, env):
    # hf_ with a short suffix is a branch name like any other.
    result = _run(fp8, env, "--endpoint", hub.url, "--revision", "hf_fix", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "--revision hf_fix" in result.stdout  # the card's serve command


@pytest.mark.parametrize(
    "text,shown",
    [
        ("http://user:pw@host:8080/x", "http://***@host:8080/x"),
        (
            "https://tok@hf.co/a and HTTP://a:b@c",
            "https://***@hf.co/a and HTTP://***@c",
        ),
        ("http://u:p@ss@host/x", "http://***@host/x"),  # an unencoded @ in it
        ("http://host/a@b?c=d@e", "http://host/a@b?c=d@e"),  # no userinfo
        ("user@example.org", "user@example.org"),
    ],
)
def test_redact_urls(text, shown):
    assert redact_urls(text) == shown
    assert Redactor("tok")(text + " tok") == shown + " ***"
