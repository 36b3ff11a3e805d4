"""`onboard publish` against a local server speaking the Hub's HTTP API
(tests/hub_server.py): the real Hub is not reachable from these machines.

Covers the acceptance criteria: the published repository is byte-identical to the
checkpoint and its card parses with the expected metadata; a failure in the
middle of an upload is finished by a second run without a second commit or pull
request; the token appears in no output, log or exception.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hub_server import HubServer
from huggingface_hub import HfApi, ModelCard, hf_hub_download
from publish_helpers import FIXTURES, TOKEN, build_dense_fp8

from onboard.errors import InputError
from onboard.publish import PublishFailed, publish
from onboard.publish.hub import transfer_protocol

REPO = "onboard-test/tiny-dense-fp8"


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    """The FP8 checkpoint of the bundled dense-gqa spec (which asks for
    fp8-dynamic), at ``layout / "checkpoints" / "fp8-dynamic"``."""
    return build_dense_fp8(tmp_path_factory.mktemp("publish")).parents[1]


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # Multipart uploads for objects over 1 MiB: the shards take the path large
    # launch checkpoints take on the Hub.
    with HubServer(TOKEN, part_size=1 << 20, page_size=4) as server:
        yield server


def _fp8(layout: Path) -> dict:
    """Arguments publishing the FP8 checkpoint, forced: its real validation on
    CPU failed (the accuracy check's 16-bit tolerance; see
    tests/fixtures/publish/README.md), which the card then says."""
    return {
        "checkpoint_dir": layout / "checkpoints" / "fp8-dynamic",
        "validation": layout / "validation-fp8" / "validation.json",
        "force": True,
        "base_model": "onboard-test/tiny-dense",
    }


def _publish(hub: HubServer, args: dict, **kwargs):
    return publish(
        args["checkpoint_dir"],
        kwargs.pop("repo_id", REPO),
        endpoint=hub.url,
        validation=args.get("validation"),
        force=args.get("force", False),
        base_model=args.get("base_model"),
        backoff=0.01,
        **kwargs,
    )


def _assert_identical(hub: HubServer, ref: str, checkpoint: Path, card, cache: Path):
    """Every local file, and nothing else but .gitattributes, is on the server at
    ``ref`` byte for byte; a shard downloaded through huggingface_hub too."""
    repo = REPO
    remote = hub.files(repo, ref)
    local = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    local["README.md"] = card.encode()
    assert set(remote) == set(local) | {".gitattributes"}
    for name, data in local.items():
        assert remote[name] == data, name
    # And through the client's own download path, for the weights.
    shard = "model-00001-of-00002.safetensors"
    path = hf_hub_download(repo, shard, revision=ref, endpoint=hub.url, cache_dir=cache)
    assert Path(path).read_bytes() == local[shard]


def test_fp8_checkpoint_published_byte_identical_with_a_parsable_card(
    layout, hub, tmp_path
):
    args = _fp8(layout)
    report = _publish(hub, args)
    out = report.outcome
    assert out is not None and out.pr_num == 1 and out.ref == "refs/pr/1"
    assert out.verified == len(report.upload.files) == 10
    assert out.pr_url == f"{hub.url}/{REPO}/discussions/1"
    _assert_identical(
        hub, "refs/pr/1", args["checkpoint_dir"], report.upload.card, tmp_path
    )
    # A pull request, as launch repos are prepared before release: main is
    # untouched until someone merges it.
    assert set(hub.files(REPO, "main")) == {".gitattributes"}
    [pr] = hub.pull_requests(REPO)
    assert pr.status == "open" and report.upload.marker in pr.title
    # Large files went through LFS (multipart), small ones inline.
    assert hub.requests("PUT", r"/lfs-upload/.*/\d+$")

    # The card as huggingface_hub parses it, downloaded from the repository.
    card_path = hf_hub_download(
        REPO, "README.md", revision="refs/pr/1", endpoint=hub.url, cache_dir=tmp_path
    )
    card = ModelCard.load(card_path)
    data = card.data.to_dict()
    assert data["base_model"] == "onboard-test/tiny-dense"
    assert data["base_model_relation"] == "quantized"
    assert data["library_name"] == "vllm"
    assert data["license"] == "llama3.1"
    assert data["pipeline_tag"] == "text-generation"
    assert set(data["tags"]) == {
        "vllm",
        "onboard",
        "compressed-tensors",
        "fp8",
        "speculators",
    }
    assert "published with `--force`" in card.text
    assert (
        f"vllm serve {REPO} --speculative-config "
        """'{"method": "ngram", "num_speculative_tokens": 3}'"""
    ) in card.text
    # The real (failed) validation numbers, and the hardware they come from.
    assert "| prompt logprob max abs diff (nats) | 1.944 |" in card.text
    assert "on **CPU (vLLM CPU build)**" in card.text


def test_rerun_changes_nothing(layout, hub):
    args = _fp8(layout)
    first = _publish(hub, args).outcome
    commits = hub.commit_count(REPO)
    puts = len(hub.requests("PUT"))
    second = _publish(hub, args).outcome
    assert second.reused and second.pr_num == first.pr_num
    assert hub.commit_count(REPO) == commits
    assert len(hub.pull_requests(REPO)) == 1
    assert len(hub.requests("PUT")) == puts  # nothing sent again
    assert not hub.requests("POST", "/commit/")[1:]


def test_transient_failures_are_retried_within_one_run(layout, hub, tmp_path):
    args = _fp8(layout)
    # A 500 after part of the first part of a shard arrived, a connection dropped
    # in the middle of another part, a 503 on the commit, a dropped listing.
    put_500 = hub.inject("PUT", r"/lfs-upload/.*/1$", status=500, read_bytes=300_000)
    put_drop = hub.inject("PUT", r"/lfs-upload/.*/2$", "drop", read_bytes=200_000)
    commit_503 = hub.inject("POST", r"/commit/main$", status=503)
    tree_drop = hub.inject("GET", r"/tree/", "drop")
    report = _publish(hub, args)
    assert [f.fired for f in (put_500, put_drop, commit_503, tree_drop)] == [1] * 4
    assert report.outcome.verified == 10
    assert hub.commit_count(REPO) == 2  # the initial commit and ours
    assert len(hub.pull_requests(REPO)) == 1
    _assert_identical(
        hub, "refs/pr/1", args["checkpoint_dir"], report.upload.card, tmp_path
    )


def test_failure_mid_upload_then_second_run_completes(layout, hub, tmp_path):
    args = _fp8(layout)
    record = json.loads((args["checkpoint_dir"] / "onboard-quantize.json").read_text())
    oid1, oid2 = (
        record["shards"][f"model-0000{i}-of-00002.safetensors"]["sha256"]
        for i in (1, 2)
    )
    # Every upload of the second part of shard 2 fails with a 503, 100 kB into
    # the part, until the storage "recovers": huggingface_hub's own retries give
    # up, then ours (none in this run).
    fault = hub.inject(
        "PUT",
        rf"/lfs-upload/.*/{oid2}/2$",
        status=503,
        read_bytes=100_000,
        headers={"Retry-After": "0"},
        times=-1,
    )
    with pytest.raises(PublishFailed) as info:
        _publish(hub, args, retries=0)
    assert "did not complete" in str(info.value)
    assert "run the same command again" in str(info.value)
    assert fault.fired >= 2
    assert hub.commit_count(REPO) == 1 and not hub.pull_requests(REPO)
    first_run_puts = hub.requests("PUT", oid1)
    assert first_run_puts  # shard 1 made it in the first run
    assert oid1 in hub.repos[REPO].lfs and oid2 not in hub.repos[REPO].lfs

    hub.clear_faults()
    report = _publish(hub, args)
    assert report.outcome.pr_num == 1 and not report.outcome.reused
    assert hub.commit_count(REPO) == 2 and len(hub.pull_requests(REPO)) == 1
    # LFS is content-addressed: shard 1 was not sent again.
    assert hub.requests("PUT", oid1) == first_run_puts
    _assert_identical(
        hub, "refs/pr/1", args["checkpoint_dir"], report.upload.card, tmp_path
    )


@pytest.mark.parametrize("retries", [0, 2])
def test_lost_commit_answer_does_not_duplicate(layout, hub, retries):
    """The commit takes effect but its answer never arrives. The same run (with
    retries) or the next run (without) finds the pull request by its marker."""
    args = _fp8(layout)
    hub.inject("POST", r"/commit/main$", "drop_after")
    if retries == 0:
        with pytest.raises(PublishFailed):
            _publish(hub, args, retries=0)
        assert len(hub.pull_requests(REPO)) == 1  # it did happen
    report = _publish(hub, args, retries=retries)
    assert report.outcome.reused and report.outcome.pr_num == 1
    assert report.outcome.verified == 10
    assert hub.commit_count(REPO) == 2
    assert len(hub.pull_requests(REPO)) == 1
    # One commit request in all: the one whose answer was lost.
    assert [r[2] for r in hub.requests("POST", "/commit/")] == ["applied 200, dropped"]


def test_direct_commit_to_a_new_branch_and_rerun(layout, hub, tmp_path):
    args = _fp8(layout)
    report = _publish(hub, args, pull_request=False, revision="fp8")
    assert report.outcome.pr_num is None and report.outcome.ref == "fp8"
    assert f"vllm serve {REPO} --revision fp8" in report.upload.card
    _assert_identical(hub, "fp8", args["checkpoint_dir"], report.upload.card, tmp_path)
    commits = hub.commit_count(REPO)
    again = _publish(hub, args, pull_request=False, revision="fp8")
    # huggingface_hub finds every file unchanged and makes no empty commit.
    assert hub.commit_count(REPO) == commits
    assert again.outcome.commit == report.outcome.commit


def test_private_request_refuses_an_existing_public_repo(layout, hub):
    hub.create_repo(REPO, private=False)
    with pytest.raises(InputError, match="exists and is public"):
        _publish(hub, _fp8(layout), private=True)
    assert hub.commit_count(REPO) == 1  # nothing uploaded
    report = _publish(
        hub, _fp8(layout), repo_id="onboard-test/private-one", private=True
    )
    assert hub.repos["onboard-test/private-one"].private
    assert report.outcome.verified == 10


def test_remote_mismatch_is_a_failure(layout, hub):
    args = _fp8(layout)
    _publish(hub, args)
    # Someone pushes a different config.json to the pull request.
    api = HfApi(endpoint=hub.url, token=TOKEN)
    with transfer_protocol(hub.url):
        api.upload_file(
            path_or_fileobj=b"{}",
            path_in_repo="config.json",
            repo_id=REPO,
            revision="refs/pr/1",
        )
    with pytest.raises(PublishFailed) as info:
        _publish(hub, args)
    assert "does not match the local files" in str(info.value)
    assert "config.json: git blob" in str(info.value)


# -- the token -------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    out = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def test_token_never_leaks_even_when_the_server_echoes_it(layout, hub, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    # A misbehaving server puts the token in its error message and header.
    echo = {
        "status": 500,
        "body": f"bad request from {TOKEN}",
        "headers": {"X-Error-Message": f"token {TOKEN} rejected", "Retry-After": "0"},
    }
    hub.inject("POST", r"/preupload/", times=-1, **echo)
    logs: list[str] = []
    with pytest.raises(PublishFailed) as info:
        _publish(hub, _fp8(layout), retries=1, log=logs.append)
    texts = [str(e) for e in _chain(info.value)] + [repr(info.value)]
    out, err = capsys.readouterr()
    everything = "\n".join([*texts, *logs, caplog.text, out, err])
    assert "***" in "\n".join(texts + logs)  # the echoed message, redacted
    assert TOKEN not in everything
    # No raw exception hangs off ours (its text is not redacted).
    assert info.value.__cause__ is None and info.value.__context__ is None

    # Without redaction the token would be there: huggingface_hub copies the
    # server's message into its exceptions.
    from huggingface_hub.errors import HfHubHTTPError

    hub.inject("GET", r"/refs$", **echo)
    with pytest.raises(HfHubHTTPError) as raw:
        HfApi(endpoint=hub.url, token=TOKEN).list_repo_refs(REPO)
    assert TOKEN in str(raw.value)


def test_refused_token_is_bad_input_and_not_shown(layout, hub, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "hf_wrong" + TOKEN[8:]
    monkeypatch.setenv("HF_TOKEN", wrong)
    with pytest.raises(InputError) as info:
        _publish(hub, _fp8(layout))
    text = "\n".join(str(e) for e in _chain(info.value))
    assert "refused the request (401)" in text
    assert wrong not in text + caplog.text


def test_no_token_is_bad_input(layout, hub, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(InputError, match="no Hugging Face token"):
        _publish(hub, _fp8(layout))
    assert hub.log == []


def test_fixture_results_are_the_recorded_ones():
    # Guard: the failed FP8 result the tests force through is the recorded run.
    data = json.loads(
        (FIXTURES / "deepseek-v3-style-fp8-dynamic.validation.json").read_text()
    )
    assert data["passed"] is False
    assert "Unsupported FP8 MoE backend" in data["checks"][0]["details"]
    dense = json.loads((FIXTURES / "dense-gqa-fp8-dynamic.validation.json").read_text())
    assert dense["passed"] is False
