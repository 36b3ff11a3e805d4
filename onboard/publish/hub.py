"""Upload to the Hub with huggingface_hub: create the repository if missing, send
every file as one commit (a pull request by default), verify the remote files
against the local checksums.

Reruns are safe. Large files go through LFS, which is content-addressed: objects a
previous run uploaded are not sent again. The commit carries a marker (a hash of
the files and the target) in its title; before committing, an open or merged pull
request with that marker means an earlier run already got that far, and it is
reused instead of opening a second one. Without a pull request, huggingface_hub
itself skips files the branch already has, so an applied commit is not repeated.
Each step is retried with exponential backoff on transient errors (HTTP 408, 429,
5xx, dropped connections, timeouts); the commit step is retried only through the
marker check, so a commit whose answer was lost is found rather than repeated.

The token comes from huggingface_hub's own places (``HF_TOKEN``, the login cache)
and is never printed: every message and log record leaving this module has it
replaced by ``***``, including messages the server wrote.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from onboard.errors import CheckFailed, InputError
from onboard.publish.checkpoint import LocalFile

T = TypeVar("T")

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
HUB_HOSTS = ("https://huggingface.co", "https://hf.co")
# Files the Hub adds to every new repository; not the checkpoint's, not verified.
HUB_FILES = frozenset({".gitattributes"})


class PublishFailed(CheckFailed):
    """The upload or its verification did not succeed (exit code 1)."""


@dataclass
class Target:
    repo_id: str
    endpoint: str
    private: bool = False
    revision: str = "main"
    pull_request: bool = True


@dataclass
class Outcome:
    repo_url: str
    ref: str  # where the files were verified: refs/pr/N or the branch
    commit: str | None = None
    pr_num: int | None = None
    pr_url: str | None = None
    reused: bool = False  # an earlier run's pull request or commit was found
    verified: int = 0
    extra_remote: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# The userinfo of a URL (http://user:password@host): credentials, never shown.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")


def redact_urls(text: object) -> str:
    """``text`` with the credentials in its URLs replaced by ``***``."""
    return _USERINFO.sub(r"\1***@", str(text))


class Redactor:
    """Replaces the token, and any credentials in URLs, in any text."""

    def __init__(self, token: str | None):
        self.token = token or None

    def __call__(self, text: object) -> str:
        text = redact_urls(text)
        if self.token:
            text = text.replace(self.token, "***")
        return text


class _RedactFilter(logging.Filter):
    def __init__(self, redact: Redactor):
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        record.msg, record.args = self.redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True


@contextmanager
def redacted_logs(redact: Redactor) -> Iterator[None]:
    """Redact the token from every log record while publishing: a filter on every
    existing logger (records made there) and on every handler (records reaching
    it from anywhere)."""
    filt = _RedactFilter(redact)
    manager = logging.root.manager
    loggers = [logging.root] + [
        lg for lg in list(manager.loggerDict.values()) if isinstance(lg, logging.Logger)
    ]
    touched: list[logging.Filterer] = []
    for lg in loggers:
        for item in (lg, *lg.handlers):
            if filt not in item.filters:
                item.addFilter(filt)
                touched.append(item)
    try:
        yield
    finally:
        for item in touched:
            item.removeFilter(filt)


def uses_hub_storage(endpoint: str) -> bool:
    return endpoint.rstrip("/") in HUB_HOSTS


@contextmanager
def transfer_protocol(endpoint: str) -> Iterator[str]:
    """Xet on the Hub itself; plain LFS anywhere else.

    huggingface_hub 2.4 uploads through Xet whenever the `hf_xet` package is
    installed, without asking the server. Other endpoints (a local or mirror
    server such as the one the tests use) speak the LFS batch protocol only, so
    Xet is switched off for them, the same way ``HF_HUB_DISABLE_XET=1`` does."""
    from huggingface_hub import constants

    before = constants.HF_HUB_DISABLE_XET
    if not uses_hub_storage(endpoint):
        constants.HF_HUB_DISABLE_XET = True
    try:
        yield "lfs" if constants.HF_HUB_DISABLE_XET else "xet"
    finally:
        constants.HF_HUB_DISABLE_XET = before


def is_transient(exc: BaseException) -> bool:
    """A server or network hiccup worth retrying (anywhere in the cause chain)."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, HfHubHTTPError):
            response = current.response
            if response is not None and response.status_code in TRANSIENT_STATUS:
                return True
        if isinstance(current, httpx2.TransportError):
            return True
        current = current.__cause__ or current.__context__
    return False


def http_status(exc: BaseException) -> int | None:
    from huggingface_hub.errors import HfHubHTTPError

    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, HfHubHTTPError) and current.response is not None:
            return current.response.status_code
        current = current.__cause__
    return None


def describe(exc: BaseException, redact: Redactor) -> str:
    """One short, token-free line for an exception."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[:3]) or type(exc).__name__
    cause = exc.__cause__
    if cause is not None:
        inner = " ".join(str(cause).split())[:200]
        if inner and inner not in text:
            text += f" ({type(cause).__name__}: {inner})"
    return redact(f"{type(exc).__name__}: {text}")


class Uploader:
    def __init__(
        self,
        target: Target,
        token: str,
        *,
        retries: int = 5,
        backoff: float = 1.0,
        log: Callable[[str], None] = lambda line: None,
    ):
        from huggingface_hub import HfApi

        import onboard

        self.target = target
        self.redact = Redactor(token)
        self.retries = retries
        self.backoff = backoff
        self.log = lambda line: log(self.redact(line))
        self.api = HfApi(
            endpoint=target.endpoint,
            token=token,
            library_name="onboard",
            library_version=onboard.__version__,
        )

    # -- the steps ---------------------------------------------------------------

    def publish(
        self, files: list[LocalFile], title: str, description: str, marker: str
    ) -> Outcome:
        """Create the repository, commit (or find the earlier commit), verify."""
        failure: Exception | None = None
        with redacted_logs(self.redact), transfer_protocol(self.target.endpoint) as how:
            try:
                self.log(f"transfer protocol: {how}")
                url = self._retry("create the repository", self._ensure_repo)
                outcome = self._retry(
                    "commit",
                    lambda: self._commit(files, title, description, marker, url),
                )
                self._retry("verify", lambda: self._verify(files, outcome))
            except (InputError, CheckFailed) as exc:
                failure = type(exc)(self.redact(exc))
            except Exception as exc:
                failure = self._failure(exc)
        if failure is not None:
            # Raised outside the handler so that no unredacted exception stays
            # attached to it as __context__.
            raise failure
        return outcome

    def _ensure_repo(self) -> str:
        t = self.target
        url = str(self.api.create_repo(t.repo_id, private=t.private, exist_ok=True))
        url = self.redact(url)  # printed: an endpoint's credentials are in it
        info = self.api.model_info(t.repo_id)
        if t.private and not info.private:
            raise InputError(
                f"{t.repo_id} exists and is public; --private asks for a private "
                "repository, so nothing was uploaded (make it private first, or "
                "leave out --private)"
            )
        if t.revision != "main":
            self.api.create_branch(t.repo_id, branch=t.revision, exist_ok=True)
        return url

    def _find_pull_request(self, marker: str):
        for discussion in self.api.get_repo_discussions(
            self.target.repo_id, discussion_type="pull_request"
        ):
            if marker in discussion.title and discussion.status in (
                "open",
                "draft",
                "merged",
            ):
                return discussion
        return None

    def _commit(
        self,
        files: list[LocalFile],
        title: str,
        description: str,
        marker: str,
        url: str,
    ) -> Outcome:
        from huggingface_hub import CommitOperationAdd

        t = self.target
        if t.pull_request:
            found = self._find_pull_request(marker)
            if found is not None:
                merged = found.status == "merged"
                self.log(
                    f"pull request #{found.num} ({found.status}) from an earlier run "
                    "already holds these files; not opening another"
                )
                return Outcome(
                    repo_url=url,
                    ref=t.revision if merged else f"refs/pr/{found.num}",
                    pr_num=found.num,
                    pr_url=f"{url}/discussions/{found.num}",
                    reused=True,
                )
        _check_unchanged(files)
        operations = []
        for f in files:
            op = CommitOperationAdd(
                path_in_repo=f.path,
                path_or_fileobj=str(f.local) if f.local is not None else f.content,
            )
            op.upload_info.sha256 = bytes.fromhex(f.sha256)  # hashed already
            operations.append(op)
        info = self.api.create_commit(
            t.repo_id,
            operations,
            commit_message=title,
            commit_description=description,
            revision=t.revision,
            create_pr=t.pull_request,
        )
        _check_unchanged(files)
        if t.pull_request and info.pr_num is None:
            # huggingface_hub opens nothing when the branch already has every file.
            return Outcome(
                repo_url=url,
                ref=t.revision,
                commit=info.oid,
                reused=True,
                notes=[f"{t.revision} already holds these files: no pull request"],
            )
        return Outcome(
            repo_url=url,
            ref=info.pr_revision or t.revision,
            commit=info.oid,
            pr_num=info.pr_num,
            pr_url=self.redact(info.pr_url) if info.pr_url else None,
        )

    def _verify(self, files: list[LocalFile], outcome: Outcome) -> None:
        """Every file is on the Hub at ``outcome.ref`` with the local checksum:
        sha256 for LFS files, the git blob id for the others."""
        from huggingface_hub.hf_api import RepoFile

        remote = {
            entry.path: entry
            for entry in self.api.list_repo_tree(
                self.target.repo_id, revision=outcome.ref, recursive=True
            )
            if isinstance(entry, RepoFile)
        }
        problems = []
        for f in files:
            r = remote.get(f.path)
            if r is None:
                problems.append(f"{f.path}: missing")
            elif r.lfs is not None:
                if r.lfs.sha256 != f.sha256 or r.lfs.size != f.size:
                    problems.append(
                        f"{f.path}: sha256 {r.lfs.sha256} ({r.lfs.size} bytes) on the "
                        f"Hub, {f.sha256} ({f.size} bytes) here"
                    )
            elif r.blob_id != f.git_blob_id() or r.size != f.size:
                problems.append(
                    f"{f.path}: git blob {r.blob_id} ({r.size} bytes) on the Hub, "
                    f"{f.git_oid} ({f.size} bytes) here"
                )
        if problems:
            raise PublishFailed(
                self.redact(
                    f"{self.target.repo_id}@{outcome.ref} does not match the local "
                    "files:\n" + "\n".join(f"  - {p}" for p in problems)
                )
            )
        outcome.verified = len(files)
        ours = {f.path for f in files}
        outcome.extra_remote = sorted(set(remote) - ours - HUB_FILES)

    # -- retries and errors --------------------------------------------------------

    def _retry(self, what: str, step: Callable[[], T]) -> T:
        for attempt in range(self.retries + 1):
            try:
                return step()
            except Exception as exc:
                if attempt == self.retries or not is_transient(exc):
                    raise
                wait = min(self.backoff * 2**attempt, 60.0)
                self.log(
                    f"{what}: {describe(exc, self.redact)}; retrying in {wait:g}s "
                    f"({attempt + 1}/{self.retries})"
                )
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _failure(self, exc: Exception) -> Exception:
        text = describe(exc, self.redact)
        status = http_status(exc)
        if status in (401, 403):
            return InputError(
                f"the Hub refused the request ({status}): {text}. Check that the "
                "token (HF_TOKEN or `hf auth login`) may write to "
                f"{self.target.repo_id}"
            )
        if is_transient(exc):
            return PublishFailed(
                f"the upload did not complete after {self.retries + 1} attempts: "
                f"{text}. Uploaded files are kept by the Hub: run the same command "
                "again to finish without sending them twice"
            )
        return PublishFailed(f"the upload failed: {text}")


def _check_unchanged(files: list[LocalFile]) -> None:
    """The files must not change between hashing and upload."""
    for f in files:
        if f.local is None:
            continue
        try:
            stat = f.local.stat()
        except OSError as exc:
            raise InputError(
                f"{f.local}: disappeared while publishing ({exc})"
            ) from None
        if stat.st_size != f.size or stat.st_mtime_ns != f.mtime_ns:
            raise InputError(f"{f.local}: changed while publishing; run again")
