"""CPU MLA beside linear attention: the hybrid cache's block size.

vLLM 0.32 aligns the cache blocks of a model with MLA beside linear attention to
a multiple of 128 tokens (for its GPU MLA decode kernels), and its CPU MLA
backend accepts 16-token blocks only ('Aligned KV cache block size 256 is not
supported by attention backend(s): CPU_MLA'). Its kernel takes 16-token blocks
(``get_supported_kernel_block_sizes``), and the model runner splits a larger
cache block into kernel blocks of that size: so the backend may accept any
multiple of 16.
"""

from __future__ import annotations

LIMITATION = (
    "vLLM 0.32's CPU MLA backend accepts 16-token cache blocks only, while the "
    "hybrid cache of MLA beside linear attention uses multiples of 128; its kernel "
    "runs 16-token kernel blocks of any larger block"
)


def install() -> None:
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend

    def supports_block_size(cls, block_size: int | None) -> bool:
        return block_size is None or block_size % 16 == 0

    CPUMLABackend.supports_block_size = classmethod(supports_block_size)
