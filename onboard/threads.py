"""torch's intra-op thread count, set for a block and put back after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads; the previous count is restored
    however the block ends."""
    import torch  # imported here: torch takes seconds to import, most commands skip it

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def one_thread() -> Iterator[None]:
    # On a shared two-core machine OpenMP threads waiting for each other slow the
    # tiny models down many times; one thread also makes training reproducible.
    with torch_threads(1):
        yield
