"""A local server speaking the part of the Hugging Face Hub HTTP API that
`onboard publish` (through huggingface_hub 2.4) uses, with failure injection.

The real Hub is not reachable from the machines these tests run on, so the tests
start this server on 127.0.0.1 and point huggingface_hub at it. It keeps git-like
state in memory: repositories, branches, commits (each a full tree), pull requests
(``refs/pr/N``) and an LFS object store, and answers:

- ``POST /api/repos/create``, ``GET /api/models/{repo}[/revision/{rev}]``
- ``POST /api/validate-yaml`` (the README.md metadata check)
- ``POST /api/models/{repo}/preupload/{rev}``
- ``POST /{repo}.git/info/lfs/objects/batch`` (basic and multipart transfers), the
  upload URLs it hands out, multipart completion and ``.../objects/verify``
- ``POST /api/models/{repo}/commit/{rev}[?create_pr=1]`` (ndjson)
- ``POST /api/models/{repo}/branch/{branch}``
- ``GET /api/models/{repo}/tree/{rev}[/{path}]`` (paginated with a Link header),
  ``POST /api/models/{repo}/paths-info/{rev}``, ``GET /api/models/{repo}/refs``
- ``GET /api/models/{repo}/discussions[/{num}]``
- ``GET|HEAD /{repo}/resolve/{rev}/{path}`` (downloads, for byte comparisons)

Every API call needs ``Authorization: Bearer <token>`` (the upload URLs are signed
instead, like presigned storage URLs). Xet storage is not offered: the client must
run with Xet disabled (``onboard.publish`` does so for endpoints other than the Hub).

Failures are injected with :meth:`HubServer.inject`: a status code (optionally
after reading part of the request body, i.e. in the middle of an upload), a dropped
connection, a response lost after the request took effect, or a stall the test can
observe and release.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import yaml

DEFAULT_GITATTRIBUTES = (
    "*.bin filter=lfs diff=lfs merge=lfs -text\n"
    "*.pt filter=lfs diff=lfs merge=lfs -text\n"
    "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    "*.model filter=lfs diff=lfs merge=lfs -text\n"
)
LFS_SUFFIXES = (".bin", ".pt", ".safetensors", ".model", ".gguf", ".h5")
LFS_SIZE = 10 * 1024 * 1024  # the Hub's threshold for LFS by size


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\n"
        f"size {size}\n"
    ).encode()


@dataclass(frozen=True)
class Blob:
    size: int
    sha256: str
    lfs: bool
    content: bytes | None = None  # regular files only; LFS content is in the store

    @property
    def oid(self) -> str:
        """The git object id (of the pointer file for LFS blobs)."""
        if self.lfs:
            return git_blob_oid(lfs_pointer(self.sha256, self.size))
        return git_blob_oid(self.content or b"")


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    description: str
    tree: dict[str, Blob]
    date: str


@dataclass
class PullRequest:
    num: int
    title: str
    description: str
    base: str  # branch name
    status: str = "open"
    author: str = "onboard-test"
    created_at: str = ""


@dataclass
class Repo:
    repo_id: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    prs: dict[int, PullRequest] = field(default_factory=dict)
    pr_refs: dict[int, str] = field(default_factory=dict)
    lfs: dict[str, bytes] = field(default_factory=dict)
    # multipart uploads in progress: oid -> {part number: bytes}
    parts: dict[str, dict[int, bytes]] = field(default_factory=dict)

    def head(self, revision: str) -> Commit | None:
        revision = unquote(revision)
        if revision.startswith("refs/heads/"):
            revision = revision[len("refs/heads/") :]
        if m := re.fullmatch(r"refs/pr/(\d+)", revision):
            oid = self.pr_refs.get(int(m.group(1)))
        elif revision in self.branches:
            oid = self.branches[revision]
        else:
            oid = revision if revision in self.commits else None
        return self.commits.get(oid) if oid else None


@dataclass
class Fault:
    """One injected failure; see :meth:`HubServer.inject`."""

    method: str
    path: re.Pattern
    action: str  # "status" | "drop" | "drop_after" | "stall"
    status: int = 500
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    read_bytes: int | None = None  # read this much of the body first (None: all)
    times: int = 1  # fire this many times (-1: until cleared)
    skip: int = 0  # let this many matching requests through first
    fired: int = 0
    stalled: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def wants(self, method: str, path: str) -> bool:
        if self.method != method or not self.path.search(path):
            return False
        if self.skip > 0:
            self.skip -= 1
            return False
        return self.times < 0 or self.fired < self.times


class _Drop(Exception):
    """Close the connection without a response."""


class HubServer:
    """Start with ``with HubServer(token=...) as hub:``; ``hub.url`` is the endpoint."""

    def __init__(self, token: str, *, page_size: int = 1000, part_size: int = 0):
        self.token = token
        self.page_size = page_size
        # Objects larger than this get multipart upload instructions (0: never).
        self.part_size = part_size
        self.repos: dict[str, Repo] = {}
        self.faults: list[Fault] = []
        self.log: list[tuple[str, str, int | str]] = []
        self.lock = threading.RLock()
        self._signatures: dict[str, str] = {}
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.hub = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for fault in self.faults:
            fault.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- test helpers ------------------------------------------------------------

    def inject(
        self, method: str, path_regex: str, action: str = "status", **kwargs: Any
    ) -> Fault:
        """Fail matching requests: ``action`` is ``status`` (answer ``status`` with
        ``body``), ``drop`` (close the connection without answering), ``drop_after``
        (handle the request, then close without answering: the client cannot know
        it took effect) or ``stall`` (set ``fault.stalled`` and wait for
        ``fault.release``, then drop). ``read_bytes`` reads only that much of the
        request body first (a failure in the middle of an upload)."""
        fault = Fault(method.upper(), re.compile(path_regex), action, **kwargs)
        with self.lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self.lock:
            for fault in self.faults:
                fault.release.set()
            self.faults.clear()

    def requests(self, method: str, path_regex: str = "") -> list[tuple[str, str, Any]]:
        with self.lock:
            return [
                r for r in self.log if r[0] == method and re.search(path_regex, r[1])
            ]

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """Every file at ``revision`` with its content, as a client would download."""
        with self.lock:
            repo = self.repos[repo_id]
            commit = repo.head(revision)
            assert commit is not None, f"no revision {revision}"
            return {
                path: repo.lfs[blob.sha256] if blob.lfs else (blob.content or b"")
                for path, blob in commit.tree.items()
            }

    def commit_count(self, repo_id: str) -> int:
        with self.lock:
            return len(self.repos[repo_id].commits)

    def pull_requests(self, repo_id: str) -> list[PullRequest]:
        with self.lock:
            return list(self.repos[repo_id].prs.values())

    # -- state changes (called with the lock held) -----------------------------

    def create_repo(self, repo_id: str, private: bool) -> Repo:
        repo = Repo(repo_id, private)
        content = DEFAULT_GITATTRIBUTES.encode()
        blob = Blob(len(content), hashlib.sha256(content).hexdigest(), False, content)
        commit = self._new_commit(
            repo, None, "initial commit", "", {".gitattributes": blob}
        )
        repo.branches["main"] = commit.oid
        self.repos[repo_id] = repo
        return repo

    def _new_commit(
        self,
        repo: Repo,
        parent: Commit | None,
        title: str,
        description: str,
        tree: dict[str, Blob],
    ) -> Commit:
        listing = json.dumps(
            [parent.oid if parent else None, title, description, time.time_ns()]
            + sorted((p, b.oid) for p, b in tree.items())
        )
        oid = hashlib.sha1(listing.encode()).hexdigest()
        commit = Commit(
            oid, parent.oid if parent else None, title, description, dict(tree), _now()
        )
        repo.commits[oid] = commit
        return commit

    def sign(self, repo_id: str, oid: str) -> str:
        sig = secrets.token_hex(8)
        self._signatures[sig] = f"{repo_id}:{oid}"
        return sig


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


_REPO = r"(?P<repo>[^/]+/[^/]+)"
_ROUTES: list[tuple[str, re.Pattern, str]] = [
    ("POST", re.compile(r"^/api/repos/create$"), "create_repo"),
    ("POST", re.compile(r"^/api/validate-yaml$"), "validate_yaml"),
    (
        "POST",
        re.compile(rf"^/api/models/{_REPO}/preupload/(?P<rev>[^/]+)$"),
        "preupload",
    ),
    (
        "POST",
        re.compile(rf"^/api/models/{_REPO}/commit/(?P<rev>[^/]+)$"),
        "commit_endpoint",
    ),
    (
        "POST",
        re.compile(rf"^/api/models/{_REPO}/branch/(?P<branch>[^/]+)$"),
        "create_branch",
    ),
    (
        "GET",
        re.compile(rf"^/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?P<path>/.*)?$"),
        "tree",
    ),
    (
        "POST",
        re.compile(rf"^/api/models/{_REPO}/paths-info/(?P<rev>[^/]+)$"),
        "paths_info",
    ),
    ("GET", re.compile(rf"^/api/models/{_REPO}/refs$"), "refs"),
    ("GET", re.compile(rf"^/api/models/{_REPO}/discussions$"), "discussions"),
    (
        "GET",
        re.compile(rf"^/api/models/{_REPO}/discussions/(?P<num>\d+)$"),
        "discussion",
    ),
    (
        "GET",
        re.compile(rf"^/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?$"),
        "model_info",
    ),
    ("POST", re.compile(rf"^/{_REPO}\.git/info/lfs/objects/batch$"), "lfs_batch"),
    ("POST", re.compile(rf"^/{_REPO}\.git/info/lfs/objects/verify$"), "lfs_verify"),
    ("PUT", re.compile(rf"^/lfs-upload/{_REPO}/(?P<oid>[0-9a-f]{{64}})$"), "lfs_put"),
    (
        "PUT",
        re.compile(rf"^/lfs-upload/{_REPO}/(?P<oid>[0-9a-f]{{64}})/(?P<part>\d+)$"),
        "lfs_put_part",
    ),
    (
        "POST",
        re.compile(rf"^/lfs-upload/{_REPO}/(?P<oid>[0-9a-f]{{64}})$"),
        "lfs_complete",
    ),
    ("GET", re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
    ("HEAD", re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
]
# Routes whose URLs are signed instead of authenticated.
_SIGNED = {"lfs_put", "lfs_put_part", "lfs_complete"}


class HttpError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # the hub keeps its own request log

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    # -- plumbing ------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        path, self.query = split.path, parse_qs(split.query)
        self._body: bytes | None = None
        try:
            fault = self._fault(method, path)
            if fault is not None:
                self._apply_fault(fault, method, path)
                return
            status = self._route(method, path)
            self.hub.log.append((method, path, status))
        except _Drop:
            self.hub.log.append((method, path, "dropped"))
            self._drop()
        except (ConnectionError, TimeoutError):
            self.hub.log.append((method, path, "client-gone"))
            self.close_connection = True

    def _fault(self, method: str, path: str) -> Fault | None:
        with self.hub.lock:
            for fault in self.hub.faults:
                if fault.wants(method, path):
                    fault.fired += 1
                    return fault
        return None

    def _apply_fault(self, fault: Fault, method: str, path: str) -> None:
        if fault.action == "drop_after":
            status = self._route(method, path, respond=False)
            self.hub.log.append((method, path, f"applied {status}, dropped"))
            self._drop()
            return
        self._read_body(limit=fault.read_bytes)
        if fault.action == "status":
            self.hub.log.append((method, path, f"injected {fault.status}"))
            self.close_connection = True  # the body may be half read
            self._send(
                fault.status,
                json.dumps({"error": fault.body or "injected failure"}).encode(),
                "application/json",
                {**fault.headers, "Connection": "close"},
            )
        elif fault.action == "drop":
            self.hub.log.append((method, path, "injected drop"))
            self._drop()
        elif fault.action == "stall":
            self.hub.log.append((method, path, "stalled"))
            fault.stalled.set()
            fault.release.wait(timeout=120)
            self._drop()
        else:
            raise ValueError(fault.action)

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _read_body(self, limit: int | None = None) -> bytes:
        if self._body is not None:
            return self._body
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            total = 0
            while limit is None or total < limit:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                total += size
                self.rfile.readline()
            body = b"".join(chunks)
        else:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length if limit is None else min(limit, length))
        self._body = body
        return body

    def _json_body(self) -> Any:
        try:
            return json.loads(self._read_body() or b"null")
        except json.JSONDecodeError as exc:
            raise HttpError(400, f"invalid JSON body: {exc}") from None

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        head_only: bool = False,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head_only:
            self.wfile.write(body)
        self.wfile.flush()

    def _route(self, method: str, path: str, respond: bool = True) -> int:
        for route_method, pattern, name in _ROUTES:
            if route_method != method:
                continue
            m = pattern.match(path)
            if m is None:
                continue
            args = {k: unquote(v) for k, v in m.groupdict().items() if v is not None}
            try:
                if name not in _SIGNED:
                    self._authenticate()
                with self.hub.lock:
                    result = getattr(self, f"_{name}")(**args)
            except HttpError as exc:
                self._read_body()
                headers = {"X-Error-Message": exc.message}
                if exc.code:
                    headers["X-Error-Code"] = exc.code
                if respond:
                    self._send(
                        exc.status,
                        json.dumps({"error": exc.message}).encode(),
                        headers=headers,
                    )
                return exc.status
            status, payload, headers = result if len(result) == 3 else (*result, {})
            if respond:
                if isinstance(payload, bytes):
                    self._send(
                        status,
                        payload,
                        "application/octet-stream",
                        headers,
                        head_only=method == "HEAD",
                    )
                else:
                    self._send(status, json.dumps(payload).encode(), headers=headers)
            return status
        self._read_body()
        if respond:
            self._send(404, json.dumps({"error": f"no route {method} {path}"}).encode())
        return 404

    def _authenticate(self) -> None:
        header = self.headers.get("Authorization", "")
        if header != f"Bearer {self.hub.token}":
            raise HttpError(401, "Invalid credentials in Authorization header")

    def _repo(self, repo: str) -> Repo:
        found = self.hub.repos.get(repo)
        if found is None:
            raise HttpError(404, "Repository not found", "RepoNotFound")
        return found

    def _at(self, repo: Repo, rev: str) -> Commit:
        commit = repo.head(rev)
        if commit is None:
            raise HttpError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return commit

    def _base(self) -> str:
        return self.hub.url

    # -- endpoints -----------------------------------------------------------------

    def _create_repo(self):
        body = self._json_body()
        repo_id = f"{body.get('organization')}/{body['name']}"
        if body.get("type", "model") != "model":
            raise HttpError(400, "only model repositories are served here")
        url = f"{self._base()}/{repo_id}"
        if repo_id in self.hub.repos:
            return 409, {"error": "You already created this model repo", "url": url}
        private = body.get("visibility") == "private" or bool(body.get("private"))
        self.hub.create_repo(repo_id, private)
        return 200, {"url": url, "name": repo_id, "id": repo_id}

    def _model_info(self, repo: str, rev: str = "main"):
        r = self._repo(repo)
        commit = self._at(r, rev)
        return 200, {
            "id": repo,
            "modelId": repo,
            "sha": commit.oid,
            "private": r.private,
            "siblings": [{"rfilename": p} for p in sorted(commit.tree)],
            "lastModified": commit.date,
            "tags": [],
        }

    def _validate_yaml(self):
        content = self._json_body().get("content", "")
        errors = []
        m = re.match(r"^---\n(.*?)\n---\n", content, re.S)
        if m:
            try:
                meta = yaml.safe_load(m.group(1))
                if not isinstance(meta, dict):
                    errors.append({"message": "metadata must be a YAML mapping"})
            except yaml.YAMLError as exc:
                errors.append({"message": f"invalid YAML: {exc}"})
        if errors:
            return 400, {"errors": errors, "warnings": []}
        return 200, {"errors": [], "warnings": []}

    def _preupload(self, repo: str, rev: str):
        r = self._repo(repo)
        commit = self._at(r, rev)
        files = []
        for f in self._json_body()["files"]:
            sample = base64.b64decode(f["sample"])
            lfs = (
                f["path"].endswith(LFS_SUFFIXES)
                or f["size"] >= LFS_SIZE
                or b"\0" in sample
            )
            existing = commit.tree.get(f["path"])
            oid = None
            if existing is not None:
                oid = existing.sha256 if existing.lfs else existing.oid
            files.append(
                {
                    "path": f["path"],
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": False,
                    "oid": oid,
                }
            )
        return 200, {"files": files, "commitOid": commit.oid}

    def _lfs_batch(self, repo: str):
        r = self._repo(repo)
        body = self._json_body()
        if body.get("operation") != "upload":
            raise HttpError(400, "only uploads are supported")
        objects = []
        for obj in body["objects"]:
            oid, size = obj["oid"], obj["size"]
            entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if oid not in r.lfs:
                href = f"{self._base()}/lfs-upload/{quote(repo)}/{oid}"
                sig = self.hub.sign(repo, oid)
                header: dict[str, str] = {}
                if self.hub.part_size and size > self.hub.part_size:
                    header["chunk_size"] = str(self.hub.part_size)
                    count = -(-size // self.hub.part_size)
                    for i in range(1, count + 1):
                        header[str(i)] = f"{href}/{i}?sig={sig}"
                entry["actions"] = {
                    "upload": {"href": f"{href}?sig={sig}", "header": header},
                    "verify": {
                        "href": f"{self._base()}/{repo}.git/info/lfs/objects/verify",
                        "header": {},
                    },
                }
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}

    def _check_signature(self, repo: str, oid: str) -> None:
        sig = (self.query.get("sig") or [""])[0]
        if self.hub._signatures.get(sig) != f"{repo}:{oid}":
            raise HttpError(403, "invalid or missing upload signature")

    def _store(self, r: Repo, oid: str, data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() != oid:
            raise HttpError(400, f"content does not match sha256 {oid}")
        r.lfs[oid] = data

    def _lfs_put(self, repo: str, oid: str):
        self._check_signature(repo, oid)
        r = self._repo(repo)
        self._store(r, oid, self._read_body())
        return 200, {}

    def _lfs_put_part(self, repo: str, oid: str, part: str):
        self._check_signature(repo, oid)
        r = self._repo(repo)
        data = self._read_body()
        r.parts.setdefault(oid, {})[int(part)] = data
        return 200, {}, {"ETag": f'"{hashlib.md5(data).hexdigest()}"'}

    def _lfs_complete(self, repo: str, oid: str):
        self._check_signature(repo, oid)
        r = self._repo(repo)
        body = self._json_body()
        stored = r.parts.get(oid, {})
        chunks = []
        for part in body["parts"]:
            data = stored.get(part["partNumber"])
            if data is None or part["etag"] != f'"{hashlib.md5(data).hexdigest()}"':
                raise HttpError(400, f"part {part['partNumber']} missing or wrong")
            chunks.append(data)
        self._store(r, oid, b"".join(chunks))
        r.parts.pop(oid, None)
        return 200, {}

    def _lfs_verify(self, repo: str):
        r = self._repo(repo)
        body = self._json_body()
        data = r.lfs.get(body["oid"])
        if data is None or len(data) != body["size"]:
            raise HttpError(404, f"object {body['oid']} not found")
        return 200, {}

    def _commit_endpoint(self, repo: str, rev: str):
        r = self._repo(repo)
        lines = [json.loads(line) for line in self._read_body().splitlines() if line]
        header = next(x["value"] for x in lines if x["key"] == "header")
        create_pr = (self.query.get("create_pr") or ["0"])[0] == "1"
        base = self._at(r, rev)
        pr_match = re.fullmatch(r"refs/pr/(\d+)", rev)
        if create_pr and (pr_match or rev not in r.branches):
            raise HttpError(400, "pull requests can only target a branch")
        parent_oid = header.get("parentCommit")
        if parent_oid and not create_pr and parent_oid != base.oid:
            raise HttpError(
                412, "A commit has happened since. Please refresh and try again."
            )
        tree = dict(base.tree)
        for item in lines:
            key, value = item["key"], item["value"]
            if key == "file":
                content = base64.b64decode(value["content"])
                tree[value["path"]] = Blob(
                    len(content), hashlib.sha256(content).hexdigest(), False, content
                )
            elif key == "lfsFile":
                data = r.lfs.get(value["oid"])
                if data is None:
                    raise HttpError(
                        422,
                        f"LFS object {value['oid']} was never uploaded",
                        "LfsObjectMissing",
                    )
                tree[value["path"]] = Blob(len(data), value["oid"], True)
            elif key == "deletedFile":
                tree.pop(value["path"], None)
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                for p in [p for p in tree if p.startswith(prefix)]:
                    del tree[p]
        commit = self.hub._new_commit(
            r, base, header["summary"], header.get("description", ""), tree
        )
        pr_url = None
        if create_pr:
            num = max([0, *r.prs]) + 1
            r.prs[num] = PullRequest(
                num,
                header["summary"],
                header.get("description", ""),
                rev,
                created_at=_now(),
            )
            r.pr_refs[num] = commit.oid
            pr_url = f"{self._base()}/{repo}/discussions/{num}"
        elif pr_match:
            r.pr_refs[int(pr_match.group(1))] = commit.oid
        else:
            r.branches[rev] = commit.oid
        return 200, {
            "commitUrl": f"{self._base()}/{repo}/commit/{commit.oid}",
            "commitOid": commit.oid,
            "pullRequestUrl": pr_url,
            "success": True,
        }

    def _create_branch(self, repo: str, branch: str):
        r = self._repo(repo)
        body = self._json_body() or {}
        if branch in r.branches:
            raise HttpError(409, f"Reference refs/heads/{branch} already exists")
        start = self._at(r, body.get("startingPoint") or "main")
        r.branches[branch] = start.oid
        return 200, {}

    def _entry(self, path: str, blob: Blob) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "type": "file",
            "oid": blob.oid,
            "size": blob.size,
            "path": path,
        }
        if blob.lfs:
            entry["lfs"] = {
                "oid": blob.sha256,
                "size": blob.size,
                "pointerSize": len(lfs_pointer(blob.sha256, blob.size)),
            }
        return entry

    def _tree(self, repo: str, rev: str, path: str = ""):
        r = self._repo(repo)
        commit = self._at(r, rev)
        prefix = path.strip("/")
        recursive = (self.query.get("recursive") or ["False"])[0].lower() == "true"
        entries: dict[str, dict[str, Any]] = {}
        for p, blob in sorted(commit.tree.items()):
            if prefix and not p.startswith(prefix + "/"):
                continue
            rest = p[len(prefix) + 1 :] if prefix else p
            parts = rest.split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(([prefix] if prefix else []) + parts[:depth])
                if recursive or depth == 1:
                    entries.setdefault(
                        folder,
                        {
                            "type": "directory",
                            "path": folder,
                            "size": 0,
                            "oid": hashlib.sha1(folder.encode()).hexdigest(),
                        },
                    )
            if recursive or len(parts) == 1:
                entries[p] = self._entry(p, blob)
        if prefix and not entries:
            raise HttpError(404, f"{prefix} does not exist", "EntryNotFound")
        listing = list(entries.values())
        start = int((self.query.get("cursor") or ["0"])[0])
        page = listing[start : start + self.hub.page_size]
        headers = {}
        if start + self.hub.page_size < len(listing):
            query = f"recursive={recursive}&cursor={start + self.hub.page_size}"
            url = f"{self._base()}{urlsplit(self.path).path}?{query}"
            headers["Link"] = f'<{url}>; rel="next"'
        return 200, page, headers

    def _paths_info(self, repo: str, rev: str):
        r = self._repo(repo)
        commit = self._at(r, rev)
        form = parse_qs(self._read_body().decode())
        return 200, [
            self._entry(p, commit.tree[p])
            for p in form.get("paths", [])
            if p in commit.tree
        ]

    def _refs(self, repo: str):
        r = self._repo(repo)
        include_prs = bool(self.query.get("include_prs"))
        data: dict[str, Any] = {
            "branches": [
                {"name": b, "ref": f"refs/heads/{b}", "targetCommit": oid}
                for b, oid in sorted(r.branches.items())
            ],
            "converts": [],
            "tags": [],
        }
        data["pullRequests"] = (
            [
                {"name": f"refs/pr/{n}", "ref": f"refs/pr/{n}", "targetCommit": oid}
                for n, oid in sorted(r.pr_refs.items())
            ]
            if include_prs
            else []
        )
        return 200, data

    def _discussion_json(self, repo: str, pr: PullRequest) -> dict[str, Any]:
        return {
            "num": pr.num,
            "title": pr.title,
            "status": pr.status,
            "isPullRequest": True,
            "createdAt": pr.created_at,
            "author": {"name": pr.author},
            "repo": {"name": repo, "type": "model"},
        }

    def _discussions(self, repo: str):
        r = self._repo(repo)
        kind = (self.query.get("type") or ["all"])[0]
        status = (self.query.get("status") or ["all"])[0]
        page = int((self.query.get("p") or ["0"])[0])
        items = [
            pr
            for pr in sorted(r.prs.values(), key=lambda p: -p.num)
            if kind in ("all", "pull_request") and status in ("all", pr.status)
        ]
        size = 50
        chunk = items[page * size : (page + 1) * size]
        return 200, {
            "discussions": [self._discussion_json(repo, pr) for pr in chunk],
            "count": len(items),
            "start": page * size,
            "numClosedDiscussions": 0,
        }

    def _discussion(self, repo: str, num: str):
        r = self._repo(repo)
        pr = r.prs.get(int(num))
        if pr is None:
            raise HttpError(404, f"discussion {num} not found")
        return 200, {
            **self._discussion_json(repo, pr),
            "events": [],
            "changes": {"base": f"refs/heads/{pr.base}"},
            "filesWithConflicts": [],
            "diff": "",
        }

    def _resolve(self, repo: str, rev: str, path: str):
        r = self._repo(repo)
        commit = self._at(r, rev)
        blob = commit.tree.get(path)
        if blob is None:
            raise HttpError(404, f"{path} not found", "EntryNotFound")
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{blob.oid}"'}
        if blob.lfs:
            headers["X-Linked-Etag"] = f'"{blob.sha256}"'
            headers["X-Linked-Size"] = str(blob.size)
            data = r.lfs[blob.sha256]
        else:
            data = blob.content or b""
        return 200, data, headers
