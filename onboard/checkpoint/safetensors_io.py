"""Write safetensors files from numpy arrays, bf16 included, byte-for-byte stable.

numpy has no bfloat16 and the ``safetensors`` package's numpy API cannot write it,
so this writes the (simple) format itself: an 8-byte little-endian header length,
a JSON header naming each tensor's dtype, shape and byte range, then the raw data.
Tensors are laid out in sorted name order, so equal inputs give identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

DTYPES = ("bfloat16", "float32")


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def encode(x: np.ndarray, dtype: str) -> tuple[str, bytes]:
    """The safetensors dtype tag and little-endian bytes of ``x`` stored as dtype."""
    if dtype == "bfloat16":
        return "BF16", to_bf16_bits(x).astype("<u2").tobytes()
    if dtype == "float32":
        return "F32", np.ascontiguousarray(x, dtype="<f4").tobytes()
    raise ValueError(f"unsupported dtype {dtype!r} (choose from {DTYPES})")


def save_file(tensors: dict[str, np.ndarray], path: Path, dtype: str) -> int:
    """Write ``tensors`` to ``path`` as ``dtype``; return the data size in bytes."""
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        tag, data = encode(tensors[name], dtype)
        header[name] = {
            "dtype": tag,
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # readers expect 8-byte aligned data
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for blob in blobs:
            f.write(blob)
    return offset
