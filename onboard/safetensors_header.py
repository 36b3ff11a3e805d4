"""The one safetensors header reader: every stage that looks inside a checkpoint's
shards (quantize, publish, MTP training) checks a header the same way.

A safetensors file is an 8-byte little-endian header length, a JSON header
(``{name: {dtype, shape, data_offsets}}`` plus an optional ``__metadata__``), then
the tensor data. :func:`read_header` reads the first two, never the data, and
checks what a truncated or corrupt file breaks: the lengths, the JSON, dtypes,
shapes against byte ranges, contiguous ranges and the file size from ``stat``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit
# Bits per element of each safetensors dtype (sub-byte FP4/FP6 included).
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "U16": 16,
    "I16": 16,
    "F16": 16,
    "BF16": 16,
    "U32": 32,
    "I32": 32,
    "F32": 32,
    "U64": 64,
    "I64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


class HeaderError(Exception):
    """A shard whose header cannot be trusted; the message says why, not which
    file (callers name the file in their own terms)."""


class SizeMismatch(HeaderError):
    """The header parses but the file is shorter or longer than it says (a
    truncated copy, typically, rather than a file of another kind)."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a file: where its bytes are."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute file offset
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Header:
    tensors: list[TensorEntry]  # in file order
    metadata: dict[str, str]
    data_start: int  # 8 + the JSON header's length: the bytes read

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def by_name(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.tensors}


def read_header(path: Path) -> Header:
    """Parse and check ``path``'s header; :class:`HeaderError` on any damage."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise SizeMismatch(f"truncated: {size} bytes, no header length")
            n = int.from_bytes(raw, "little")
            if n > MAX_HEADER:
                raise HeaderError(f"corrupt: header length {n} is over 100 MiB")
            if 8 + n > size:
                raise SizeMismatch(
                    f"truncated: the header needs {8 + n} bytes, the file has {size}"
                )
            head = f.read(n)
    except OSError as exc:
        raise HeaderError(f"cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"corrupt header: {exc}") from None
    if not isinstance(header, dict):
        raise HeaderError("corrupt header: not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + n
    tensors: list[TensorEntry] = []
    for name, entry in header.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(map(int, entry["shape"]))
            begin, end = map(int, entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise HeaderError(f"corrupt header entry for {name!r}") from None
        if dtype not in DTYPE_BITS:
            raise HeaderError(f"{name}: unknown dtype {dtype!r}")
        if min(shape, default=0) < 0 or end < begin:
            raise HeaderError(f"{name}: negative shape or byte range")
        if (end - begin) * 8 != math.prod(shape) * DTYPE_BITS[dtype]:
            raise HeaderError(
                f"{name}: byte range {begin}..{end} does not fit shape "
                f"{list(shape)} of {dtype}"
            )
        tensors.append(TensorEntry(name, dtype, shape, base + begin, base + end))
    tensors.sort(key=lambda t: t.start)
    pos = base
    for t in tensors:
        if t.start != pos:
            raise HeaderError(
                f"corrupt header: {t.name} starts at {t.start - base}, not {pos - base}"
            )
        pos = t.end
    if pos != size:
        what = "truncated" if pos > size else "has trailing bytes"
        raise SizeMismatch(
            f"{what}: the header declares {pos - base} bytes of tensor data, the "
            f"file holds {size - base}"
        )
    return Header(tensors, metadata, base)
