"""Publish a checkpoint to the Hugging Face Hub with a generated model card.

``prepare_upload(...)`` reads and checks everything locally (the checkpoint's
completeness, the files allowed out, the validation verdict, the card) without
touching the network; ``publish(...)`` then uploads it as one commit, a pull
request by default, and verifies the remote files. See docs/publish.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from onboard.errors import InputError
from onboard.publish.card import CardInputs, human_size, render_card, speculators_for
from onboard.publish.checkpoint import CARD, Checkpoint, LocalFile, inspect_checkpoint
from onboard.publish.hub import (
    Outcome,
    PublishFailed,
    Target,
    Uploader,
    redact_urls,
)
from onboard.publish.validation import Verdict, find_validation, judge, layout_root

__all__ = [
    "Upload",
    "PublishFailed",
    "PublishReport",
    "prepare_upload",
    "publish",
]

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}"
_REPO_ID = re.compile(rf"^{_NAME}/{_NAME}$")
_BRANCH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,199}$")
# A Hugging Face access token (hf_ and 34 letters and digits); shorter runs are
# accepted as branch names.
_TOKEN = re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}")


@dataclass
class Upload:
    checkpoint: Checkpoint
    verdict: Verdict
    card: str
    files: list[LocalFile]  # the checkpoint's files and the card
    target: Target
    title: str
    description: str
    marker: str
    forced: bool

    def lines(self) -> list[str]:
        """What would be uploaded: files, sizes, skipped files, the verdict."""
        t = self.target
        how = "a pull request against" if t.pull_request else "a commit on"
        size = human_size(sum(f.size for f in self.files))
        out = [
            f"repository {t.repo_id} at {redact_urls(t.endpoint)} "
            f"({'private' if t.private else 'public if created'}), {how} {t.revision}",
            f"commit: {self.title}",
            f"files ({len(self.files)}, {size}):",
        ]
        width = max(len(f.path) for f in self.files)
        out += [f"  {f.path:<{width}}  {f.size:>14,d} B" for f in self.files]
        if self.checkpoint.skipped:
            out.append("not uploaded:")
            out += [f"  {name}: {why}" for name, why in self.checkpoint.skipped]
        v = self.verdict
        if v.ok:
            out.append(f"validation: {v.path} passed ({v.covered_by})")
        else:
            out.append(f"validation: {v.problem}")
            if self.forced:
                out.append("  --force: publishing anyway; the card says so")
        return out


@dataclass
class PublishReport:
    upload: Upload
    outcome: Outcome | None  # None for a dry run


def _load_spec(ckpt_dir: Path):
    """The checkpoint's spec.yaml, else its new-model directory's (or None)."""
    from onboard.spec import load_spec
    from onboard.spec.loader import SpecError

    root = layout_root(ckpt_dir)
    for path in (ckpt_dir / "spec.yaml", root / "spec.yaml" if root else None):
        if path is not None and path.is_file():
            try:
                return load_spec(path)
            except SpecError as exc:
                raise InputError(str(exc)) from None
    return None


def _is_tiny(spec) -> bool:
    """Whether the spec is that of a tiny random checkpoint (`onboard checkpoint
    tiny`): its 512-token vocabulary is far below any real model's."""
    from onboard.spec.shrink import TINY_VOCAB, TINY_WIDTH

    return (
        spec is not None
        and spec.vocab_size <= TINY_VOCAB
        and spec.hidden_size <= 4 * TINY_WIDTH
    )


def _marker(target: Target, files: list[LocalFile]) -> str:
    """Identifies this exact upload (files and destination) across reruns."""
    payload = {
        "repo": target.repo_id,
        "revision": target.revision,
        "files": sorted((f.path, f.sha256) for f in files),
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    return f"onboard:{digest.hexdigest()[:16]}"


def _license(given: str | None, spec) -> str:
    """The card's licence: --license, else the spec's; never a default, since a
    card that names the wrong licence misstates what users may do."""
    if given is not None:
        if not re.match(r"^[a-z0-9][a-z0-9.\-]*$", given):
            raise InputError(
                f"--license: expected a licence id such as apache-2.0, got {given!r}"
            )
        return given
    if spec is not None and spec.license is not None:
        return spec.license
    where = "its spec.yaml states none" if spec is not None else "it has no spec.yaml"
    raise InputError(
        f"no licence for the model card: {where} (config.json carries none). Pass "
        "--license with the weights' own licence id (e.g. apache-2.0, llama3.1, "
        "gemma), or set `license:` in the spec"
    )


def prepare_upload(
    checkpoint_dir: str | Path,
    repo_id: str,
    *,
    endpoint: str | None = None,
    private: bool = False,
    revision: str = "main",
    pull_request: bool = True,
    force: bool = False,
    validation: str | Path | None = None,
    base_model: str | None = None,
    license: str | None = None,
    hashed: bool = True,
) -> Upload:
    """Check everything locally and build the card; touches no network."""
    from huggingface_hub import constants

    if _TOKEN.search(revision):
        # Not echoed: it would land in logs, and in the card's serve command.
        raise InputError(
            "--revision: this looks like a Hugging Face token (hf_...), not a branch "
            "name; nothing was printed or uploaded (pass the token as HF_TOKEN)"
        )
    if not _REPO_ID.match(repo_id) or ".." in repo_id:
        raise InputError(f"--repo: expected ORG/NAME, got {repo_id!r}")
    if not _BRANCH.match(revision) or revision.startswith("refs/") or ".." in revision:
        raise InputError(f"--revision: expected a branch name, got {revision!r}")
    if base_model is not None and not _REPO_ID.match(base_model):
        raise InputError(f"--base-model: expected ORG/NAME, got {base_model!r}")
    endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
    if not re.match(r"^https?://[^/\s]+", endpoint):
        raise InputError(
            f"--endpoint: expected an http(s) URL, got {redact_urls(endpoint)!r}"
        )
    target = Target(repo_id, endpoint, private, revision, pull_request)

    ckpt_dir = Path(checkpoint_dir)
    checkpoint = inspect_checkpoint(ckpt_dir, hashed=hashed)
    verdict = judge(checkpoint, find_validation(ckpt_dir, _path(validation)))
    if not verdict.ok and not force:
        raise InputError(
            f"{verdict.problem}\nrefusing to publish an unvalidated checkpoint "
            "(--force publishes it anyway, and the card says so)"
        )
    spec = _load_spec(ckpt_dir)
    license = _license(license, spec)
    tiny = _is_tiny(spec)
    if base_model is None and checkpoint.scheme and spec is not None and not tiny:
        base_model = spec.base_checkpoint
    card = render_card(
        CardInputs(
            checkpoint=checkpoint,
            spec=spec,
            verdict=verdict,
            repo_id=repo_id,
            forced=not verdict.ok,
            revision=revision,
            base_model=base_model,
            speculators=speculators_for(spec, checkpoint.config, layout_root(ckpt_dir)),
            tiny=tiny,
            license=license,
        )
    )
    files = [*checkpoint.files, LocalFile.from_bytes(CARD, card.encode("utf-8"))]
    # Without hashes (a dry run) the marker cannot be known yet.
    marker = _marker(target, files) if hashed else "onboard:<sha256 of the files>"
    what = f"{checkpoint.scheme} checkpoint" if checkpoint.scheme else "checkpoint"
    name = spec.name if spec is not None else checkpoint.dir.name
    title = f"Add {name} {what} [{marker}]"
    description = "\n".join(
        [
            f"Uploaded by `onboard publish` from `{checkpoint.dir.name}`: "
            f"{len(files)} files, {human_size(sum(f.size for f in files))}.",
            "",
            f"Validation: {verdict.covered_by or verdict.problem}"
            + (" (published with --force)" if not verdict.ok else ""),
            "",
            f"`{marker}` identifies this upload; rerunning the same command "
            "finds this pull request instead of opening another.",
        ]
    )
    return Upload(
        checkpoint,
        verdict,
        card,
        files,
        target,
        title,
        description,
        marker,
        forced=not verdict.ok,
    )


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None


def publish(
    checkpoint_dir: str | Path,
    repo_id: str,
    *,
    endpoint: str | None = None,
    private: bool = False,
    revision: str = "main",
    pull_request: bool = True,
    dry_run: bool = False,
    force: bool = False,
    validation: str | Path | None = None,
    base_model: str | None = None,
    license: str | None = None,
    retries: int = 5,
    backoff: float = 1.0,
    log: Callable[[str], None] = lambda line: None,
    on_prepared: Callable[[Upload], None] = lambda upload: None,
) -> PublishReport:
    """Publish ``checkpoint_dir`` to ``repo_id``; see the module docstring.

    Raises InputError (exit 2) for anything wrong locally, a missing token, or a
    token the Hub refuses; PublishFailed (exit 1) when the upload does not complete
    or the remote files do not match. The token never appears in any message.
    ``on_prepared`` sees the upload before anything is uploaded."""
    upload = prepare_upload(
        checkpoint_dir,
        repo_id,
        endpoint=endpoint,
        private=private,
        revision=revision,
        pull_request=pull_request,
        force=force,
        validation=validation,
        base_model=base_model,
        license=license,
        hashed=not dry_run,
    )
    on_prepared(upload)  # e.g. show what will be uploaded before the upload starts
    if dry_run:
        return PublishReport(upload, None)
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise InputError(
            "no Hugging Face token: set HF_TOKEN or run `hf auth login` "
            "(a token that may write to the repository)"
        )
    uploader = Uploader(upload.target, token, retries=retries, backoff=backoff, log=log)
    outcome = uploader.publish(
        upload.files, upload.title, upload.description, upload.marker
    )
    return PublishReport(upload, outcome)
