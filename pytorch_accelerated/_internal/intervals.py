"""The one rule for what is done every N optimizer updates (or every N evaluation batches, or
epochs), as Ignite's ``every=N`` event filter."""

from __future__ import annotations


def every(n: int | None, count: int) -> bool:
    """Whether ``count`` falls on the interval: a multiple of ``n`` (N, 2N, 3N, ...; the counts
    passed start at 1); never when ``n`` is None (not asked for).

    >>> [count for count in range(1, 11) if every(4, count)]
    [4, 8]
    >>> every(None, 4)
    False
    """
    return n is not None and count % n == 0
