"""The two batch verbs a scheduler needs, taken from the pool when it has them.

A new request needs (1) its longest prefix-cache hit: blocks for ``hashes[0]``,
``hashes[1]``, ... until the first miss (hashes are chained, so nothing after a miss can
hit), and (2) its new blocks, allocated and then keyed. :mod:`kvpool.batch` defines both as
compositions of the protocol verbs (``get_cached_block`` per block; ``get_new_blocks`` then
``cache_full_blocks``); a pool may offer the same verbs as methods doing the work in one step
(``FastBlockPool`` does, one kernel call each) with the same results. These helpers pick the
method when the pool has it and the composition otherwise, so a replay makes the same
decisions on every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from kvpool import batch

GROUP_IDS = (0,)
"""The single KV cache group replays and benchmarks use."""

LongestHit = Callable[[Sequence[bytes], int], list[int]]
"""``(hashes, max_num_blocks) -> hit block ids of group 0``."""


def longest_cache_hit_verb(pool: Any) -> LongestHit:
    """``(hashes, max_num_blocks) -> block ids`` of the all-hit prefix, for group 0."""
    method = getattr(pool, "find_longest_cache_hit", None)
    find = method if method is not None else partial(batch.find_longest_cache_hit, pool)

    def longest_hit(hashes: Sequence[bytes], max_num_blocks: int) -> list[int]:
        return find(hashes, GROUP_IDS, max_num_blocks)[0]

    return longest_hit


def allocate_and_cache_verb(pool: Any) -> Callable[..., list[int]]:
    """``pool.allocate_and_cache`` if the pool has it, else :func:`kvpool.batch.allocate_and_cache`
    bound to ``pool``; same arguments, same result (the new block ids)."""
    method = getattr(pool, "allocate_and_cache", None)
    return method if method is not None else partial(batch.allocate_and_cache, pool)


__all__ = ["GROUP_IDS", "allocate_and_cache_verb", "longest_cache_hit_verb"]
