"""Safe file handling: atomic writes (outputs appear complete or not at all),
output directories checked before any work, and the shard names a checkpoint's
index gives checked before any reader or writer joins them to a directory."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from onboard.errors import InputError

INDEX_FILE = "model.safetensors.index.json"
SHARD_SUFFIX = ".safetensors"


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_directory(path: str | Path, *, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling directory; rename it to ``path`` on success.

    With ``replace`` an existing ``path`` is swapped out only once the new one is
    complete; on any error the temporary directory is removed and ``path`` is left
    as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(
        tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    )
    try:
        yield tmp
        if path.exists():
            if not replace:
                raise FileExistsError(path)
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def shard_name_problem(name: object) -> str | None:
    """Why ``name`` (a shard named by a checkpoint) is not a plain ``*.safetensors``
    file name in the checkpoint directory, or None when it is.

    Readers and ``quantize`` (which names its output shards after the input's) join
    the name to a directory: an absolute path, ``../`` or a directory part would
    read, or overwrite, files outside it.
    """
    if not isinstance(name, str):
        return f"{name!r} is not a file name"
    if any(sep in name for sep in ("/", "\\", "\0")):
        return f"{name!r} has a directory part (a shard must be a plain file name)"
    if name.startswith("."):
        return f"{name!r} is a hidden file name or a parent directory"
    if not name.endswith(SHARD_SUFFIX) or name == SHARD_SUFFIX:
        return f"{name!r} is not a {SHARD_SUFFIX} file name"
    return None


def weight_map_problem(index: object) -> str | None:
    """What is wrong with a parsed ``model.safetensors.index.json``: no
    ``{tensor: shard}`` weight_map, or a shard that is not a plain file name (the
    first such entry, named); None when it can be trusted."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return "no weight_map object ({tensor: shard file})"
    for tensor, shard in weight_map.items():
        problem = shard_name_problem(shard)
        if problem is not None:
            return f"weight_map[{tensor!r}]: {problem}"
    return None


class BadIndex(InputError):
    """A safetensors index that cannot be trusted; ``problem`` says why."""

    def __init__(self, index_path: Path, problem: str):
        super().__init__(f"{index_path}: {problem}")
        self.problem = problem


def read_weight_map(index_path: Path) -> dict[str, str]:
    """The checked weight_map of a safetensors index; :class:`BadIndex` (exit 2),
    naming the index and the entry, for anything :func:`weight_map_problem`
    refuses."""
    try:
        index = json.loads(Path(index_path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadIndex(index_path, f"corrupt index: {exc}") from None
    problem = weight_map_problem(index)
    if problem is not None:
        raise BadIndex(index_path, problem)
    return index["weight_map"]


def check_output_dir(path: str | Path, *, must_be_empty: bool = False) -> Path:
    """Refuse (InputError) an output directory that cannot be made: a file, a path
    under a file, a parent without write permission; with ``must_be_empty``, a
    directory holding anything. Creates nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: is a file, not a directory; nothing was written")
    if must_be_empty and path.is_dir() and any(path.iterdir()):
        raise InputError(f"{path}: exists and is not empty; nothing was written")
    _check_writable_place(path)
    return path


def check_output_file(path: str | Path) -> Path:
    """Refuse (InputError) an output file path that cannot be written: a
    directory, or a place under a file or without write permission."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a file; nothing was written")
    _check_writable_place(path)
    return path


def _check_writable_place(path: Path) -> None:
    """The nearest existing ancestor of ``path`` is a directory one may write."""
    ancestor = path.absolute().parent if not path.is_dir() else path.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(
            f"{path}: cannot be created: {ancestor} is a file; nothing was written"
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(
            f"{path}: cannot be created: {ancestor} is not writable; nothing was "
            "written"
        )


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: after ``./``, ``..`` and symlinks, or as
    hard links of one inode."""
    a, b = Path(a), Path(b)
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False
