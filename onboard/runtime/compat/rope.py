"""The CPU rotary kernel on queries of several heads.

vLLM's MLA layers rotate the rope part of the query as a ``[tokens, heads, dims]``
tensor (a strided slice of the whole query). vLLM 0.32's CPU kernel
(``ops.rotary_embedding``, behind ``RotaryEmbedding.forward_cpu``) rotates such a
tensor wrongly when it has more than one head, contiguous or not, while it
rotates the same values exactly as ``[tokens, heads * dims]``
(``tests/test_cpu_compat.py`` shows both). The shim flattens the heads before
the kernel and writes the result back in place, as the kernel does.
"""

from __future__ import annotations

LIMITATION = (
    "vLLM 0.32's CPU rotary kernel rotates a [tokens, heads, dims] query with more "
    "than one head wrongly (MLA's rope slice); flattened to [tokens, heads * dims] "
    "it is exact"
)


def install() -> None:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    original = RotaryEmbedding.forward_cpu
    if getattr(original, "onboard_shim", False):
        return

    def forward_cpu(self, positions, query, key=None):
        if query.dim() != 3 and (key is None or key.dim() != 3):
            return original(self, positions, query, key)
        tokens = query.shape[0]
        flat_q = query.reshape(tokens, -1)
        flat_k = None if key is None else key.reshape(tokens, -1)
        flat_q, flat_k = original(self, positions, flat_q, flat_k)
        # In place, as the kernel works: callers may read the tensors they passed.
        _write_back(query, flat_q)
        if key is not None:
            _write_back(key, flat_k)
        return query, key

    forward_cpu.onboard_shim = True
    RotaryEmbedding.forward_cpu = forward_cpu


def _write_back(dst, flat) -> None:
    """``flat``'s values into ``dst``, unless ``flat`` is ``dst``'s own memory (its
    reshape was a view, rotated in place): copying a tensor onto a view of itself
    with other strides (one token: its size-1 dims' strides differ) is refused
    as an overlapping write."""
    if flat.data_ptr() != dst.data_ptr():
        dst.copy_(flat.view(dst.shape))
