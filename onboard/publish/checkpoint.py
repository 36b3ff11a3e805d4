"""What a checkpoint directory holds, which of its files may be published, and
whether it is complete (the index against the shards).

Only an allow-list of top-level files leaves the machine: the config files, the
weights the index names, the tokenizer files and onboard's own records. Anything
else (caches, temporary files, subdirectories, stray shards, links to elsewhere)
is skipped or, where it means the checkpoint is not what it claims, refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onboard.errors import InputError
from onboard.fsutil import INDEX_FILE as INDEX
from onboard.fsutil import shard_name_problem
from onboard.safetensors_header import HeaderError, SizeMismatch, read_header

SINGLE = "model.safetensors"
QUANTIZE_RECORD = "onboard-quantize.json"

# Files published as they are, besides the weights the index names.
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
ONBOARD_FILES = ("spec.yaml", QUANTIZE_RECORD)
ALLOWED = frozenset((*CONFIG_FILES, *TOKENIZER_FILES, *ONBOARD_FILES, INDEX))
# The model card is generated; a local one is not published.
CARD = "README.md"

_READ = 1 << 20
# The Hub stores files above 10 MiB in LFS whatever their name.
GIT_SIZE = 10 << 20


@dataclass
class LocalFile:
    """A file to publish: its path in the repository and its checksums."""

    path: str
    local: Path | None  # None for generated content (the card)
    size: int
    sha256: str
    git_oid: str  # git blob id, what the Hub reports for non-LFS files
    content: bytes | None = None  # generated content
    mtime_ns: int = 0  # to notice a file changing while it is published

    @classmethod
    def from_path(cls, path: str, local: Path, *, hashed: bool = True) -> LocalFile:
        stat = local.stat()
        size = stat.st_size
        if not hashed:  # a dry run reads sizes only
            return cls(path, local, size, "", "", mtime_ns=stat.st_mtime_ns)
        # The git blob id only matters for files the Hub keeps in git (not LFS):
        # small ones. Large files skip that second hash (computed on demand).
        sha256 = hashlib.sha256()
        sha1 = hashlib.sha1(b"blob %d\0" % size) if size <= GIT_SIZE else None
        with local.open("rb") as f:
            while chunk := f.read(_READ):
                sha256.update(chunk)
                if sha1 is not None:
                    sha1.update(chunk)
        return cls(
            path,
            local,
            size,
            sha256.hexdigest(),
            sha1.hexdigest() if sha1 is not None else "",
            mtime_ns=stat.st_mtime_ns,
        )

    def git_blob_id(self) -> str:
        if not self.git_oid:
            sha1 = hashlib.sha1(b"blob %d\0" % self.size)
            assert self.local is not None
            with self.local.open("rb") as f:
                while chunk := f.read(_READ):
                    sha1.update(chunk)
            self.git_oid = sha1.hexdigest()
        return self.git_oid

    @classmethod
    def from_bytes(cls, path: str, data: bytes) -> LocalFile:
        return cls(
            path,
            None,
            len(data),
            hashlib.sha256(data).hexdigest(),
            hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
            data,
        )


@dataclass
class Checkpoint:
    dir: Path
    config: dict[str, Any]
    files: list[LocalFile]
    skipped: list[tuple[str, str]]  # (name, why it is not published)
    weights: list[str]  # safetensors files, in index order
    scheme: str | None  # quantization scheme, None for 16-bit checkpoints
    quantize_record: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        return self.config.get("quantization_config")

    @property
    def variant(self) -> str:
        """`bf16`, or the quantization scheme: the new-model directory name."""
        return self.scheme or str(self.config.get("dtype") or "bf16").replace(
            "bfloat16", "bf16"
        ).replace("float16", "fp16")

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)


def inspect_checkpoint(directory: str | Path, *, hashed: bool = True) -> Checkpoint:
    """Read ``directory``, check it is complete, and hash the files to publish
    (sizes only without ``hashed``).

    Raises InputError listing every problem: a missing or unreadable config, shards
    missing from or not matching the index (truncated, extra or absent tensors), a
    shard the index does not name, no tokenizer, a link leading out of the
    directory, or shards that differ from what `onboard quantize` recorded.
    """
    root = Path(directory)
    if not root.is_dir():
        raise InputError(f"{root}: no such checkpoint directory")
    problems: list[str] = []
    config = _read_json(root / "config.json", problems)
    entries = sorted(p for p in root.iterdir())
    weights = _weights(root, entries, problems)

    chosen: list[str] = []
    skipped: list[tuple[str, str]] = []
    for entry in entries:
        name = entry.name
        reason = _skip_reason(entry, name, weights)
        if reason:
            skipped.append((name, reason))
            continue
        if entry.is_symlink() and not _inside(entry, root):
            problems.append(
                f"{entry}: a link to {entry.resolve()}, outside the checkpoint "
                "(copy the file in to publish it)"
            )
            continue
        chosen.append(name)

    if not any(n in chosen for n in ("tokenizer.json", "tokenizer.model")):
        problems.append(f"{root}: no tokenizer (tokenizer.json or tokenizer.model)")
    if problems:
        raise InputError(_problem_text(root, problems))

    files = [LocalFile.from_path(name, root / name, hashed=hashed) for name in chosen]
    record = (
        _read_json(root / QUANTIZE_RECORD, problems)
        if (root / QUANTIZE_RECORD).is_file()
        else None
    )
    if record is not None:
        _check_record(root, record, {f.path: f for f in files}, problems)
    if problems:
        raise InputError(_problem_text(root, problems))
    assert config is not None
    return Checkpoint(
        dir=root,
        config=config,
        files=files,
        skipped=skipped,
        weights=weights,
        scheme=_scheme(config, record),
        quantize_record=record,
    )


def _problem_text(root: Path, problems: list[str]) -> str:
    lines = [f"{root}: not a complete checkpoint, refusing to publish it:"]
    return "\n".join(lines + [f"  - {p}" for p in problems])


def _read_json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        problems.append(f"{path}: missing")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{path}: not readable JSON ({exc})")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path}: expected a JSON object")
        return None
    return data


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def _skip_reason(entry: Path, name: str, weights: list[str]) -> str:
    if name.startswith("."):
        return "hidden file or cache"
    if entry.is_dir():
        return "directory (only top-level checkpoint files are published)"
    if name == CARD:
        return "replaced by the generated model card"
    if name in ALLOWED or name in weights:
        return ""
    if name.endswith((".tmp", ".part", ".partial", ".incomplete", ".lock", "~")):
        return "temporary file"
    return "not a checkpoint file"


def _weights(root: Path, entries: list[Path], problems: list[str]) -> list[str]:
    """The safetensors files the checkpoint consists of, checked against the
    index: every shard present, holding exactly the tensors the index maps to it,
    its data complete; no other shard lying beside them."""
    on_disk = {p.name for p in entries if p.name.endswith(".safetensors")}
    if (root / INDEX).is_file():
        index = _read_json(root / INDEX, problems)
        if index is None:
            return []
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            problems.append(f"{root / INDEX}: no weight_map")
            return []
        by_shard: dict[str, set[str]] = {}
        for tensor, shard in weight_map.items():
            problem = shard_name_problem(shard)
            if problem is not None:
                problems.append(f"{root / INDEX}: weight_map[{tensor!r}]: {problem}")
                return []
            by_shard.setdefault(shard, set()).add(tensor)
        for shard, tensors in by_shard.items():
            if shard not in on_disk:
                problems.append(
                    f"{shard}: listed in {INDEX} ({len(tensors)} tensors) but missing"
                )
            else:
                _check_shard(root / shard, tensors, problems)
        for stray in sorted(on_disk - set(by_shard)):
            problems.append(
                f"{stray}: not listed in {INDEX} (a leftover from another run?)"
            )
        return list(by_shard)
    if on_disk == {SINGLE}:
        _check_shard(root / SINGLE, None, problems)
        return [SINGLE]
    if not on_disk:
        problems.append(f"{root}: no *.safetensors weights")
    else:
        problems.append(
            f"{root}: {len(on_disk)} safetensors files but no {INDEX} to say how "
            "they make up the model"
        )
    return []


def _check_shard(path: Path, expected: set[str] | None, problems: list[str]) -> None:
    """The header parses, the data section is exactly as long as the header says,
    and the tensors are the ones the index maps to this shard."""
    try:
        header = read_header(path)
    except SizeMismatch as exc:
        problems.append(f"{path.name}: {exc}")
        return
    except HeaderError as exc:
        problems.append(f"{path.name}: not a safetensors file ({exc})")
        return
    if expected is None:
        return
    names = {t.name for t in header.tensors}
    if missing := sorted(expected - names):
        problems.append(
            f"{path.name}: {len(missing)} tensors the index maps here are missing, "
            f"e.g. {missing[0]}"
        )
    if extra := sorted(names - expected):
        problems.append(
            f"{path.name}: {len(extra)} tensors not in the index, e.g. {extra[0]}"
        )


def _check_record(
    root: Path,
    record: dict[str, Any],
    files: dict[str, LocalFile],
    problems: list[str],
) -> None:
    """Shards must be the ones `onboard quantize` wrote (sizes and sha256)."""
    shards = record.get("shards")
    if not isinstance(shards, dict):
        return
    for name, want in shards.items():
        have = files.get(name)
        if have is None or not isinstance(want, dict):
            continue  # a missing shard is reported against the index
        sha_differs = have.sha256 and want.get("sha256") not in (None, have.sha256)
        if want.get("size") not in (None, have.size) or sha_differs:
            problems.append(
                f"{name}: differs from what onboard quantize wrote "
                f"(recorded in {QUANTIZE_RECORD}); was it modified or truncated?"
            )


def _scheme(config: dict[str, Any], record: dict[str, Any] | None) -> str | None:
    """The quantization scheme: onboard's record, else read off the config."""
    if record and isinstance(record.get("scheme"), str):
        return record["scheme"]
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    return describe_scheme(qc)


def describe_scheme(qc: dict[str, Any]) -> str:
    """A short name for a compressed-tensors config: fp8-dynamic, fp8-block,
    nvfp4, nvfp4a16, mxfp4, w4a16, w4a16-asym, w8a8-int8; else the method's own
    name."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return str(qc.get("quant_method") or "quantized")
    group = next(iter(groups.values()))
    weights = group.get("weights") or {}
    acts = group.get("input_activations")
    bits, kind = weights.get("num_bits"), weights.get("type")
    if bits == 8 and kind == "float":
        return "fp8-block" if weights.get("block_structure") else "fp8-dynamic"
    if bits == 4 and kind == "float":
        if weights.get("group_size") == 32:
            return "mxfp4"
        return "nvfp4" if acts else "nvfp4a16"
    if bits == 4 and kind == "int" and not acts:
        return "w4a16" if weights.get("symmetric", True) else "w4a16-asym"
    if bits == 8 and kind == "int" and acts:
        return "w8a8-int8"
    return str(qc.get("quant_method") or "quantized")
