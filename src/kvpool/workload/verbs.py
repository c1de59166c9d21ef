"""The batch verbs a replay needs, taken from the pool when it has them.

A scheduler step needs (1) per new request, its admission: the longest prefix-cache hit, the
admission test, and its blocks (:func:`kvpool.batch.admit`); and (2) per step, the caching
of the blocks that filled, the decode allocation and the release of finished requests
(:func:`kvpool.batch.step`). :mod:`kvpool.batch` defines each as a composition of protocol
verbs; a pool may offer the same verb as a method doing the work in one step
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


def _verb(pool: Any, name: str) -> Callable[..., Any]:
    """``pool.<name>`` if the pool has it, else ``kvpool.batch.<name>`` bound to ``pool``."""
    method = getattr(pool, name, None)
    return method if method is not None else partial(getattr(batch, name), pool)


def longest_cache_hit_verb(pool: Any) -> LongestHit:
    """``(hashes, max_num_blocks) -> block ids`` of the all-hit prefix, for group 0."""
    find = _verb(pool, "find_longest_cache_hit")

    def longest_hit(hashes: Sequence[bytes], max_num_blocks: int) -> list[int]:
        return find(hashes, GROUP_IDS, max_num_blocks)[0]

    return longest_hit


def allocate_and_cache_verb(pool: Any) -> Callable[..., list[int]]:
    """:func:`kvpool.batch.allocate_and_cache` for ``pool``; same arguments, same result."""
    return _verb(pool, "allocate_and_cache")


def admit_verb(pool: Any) -> Callable[..., tuple[list[int], list[int]] | None]:
    """:func:`kvpool.batch.admit` for ``pool``: ``(request, max_hit_blocks, num_blocks,
    num_full_blocks, reserve_blocks, block_size, group) -> (hits, new) | None``."""
    return _verb(pool, "admit")


def admit_into_verb(pool: Any) -> Callable[..., int | None]:
    """:func:`kvpool.batch.admit_into` for ``pool``: ``(request, table, max_hit_blocks,
    num_blocks, num_full_blocks, reserve_blocks, block_size, group) -> hits | None``."""
    return _verb(pool, "admit_into")


def step_verb(pool: Any) -> Callable[..., list[int]]:
    """:func:`kvpool.batch.step` for ``pool``: ``(cache_items, num_new_blocks, free_tables,
    block_size, group) -> new block ids``."""
    return _verb(pool, "step")


def free_tables_verb(pool: Any) -> Callable[[Sequence[Any]], None]:
    """:func:`kvpool.batch.free_tables` for ``pool``: ``(tables) -> None``."""
    return _verb(pool, "free_tables")


__all__ = [
    "GROUP_IDS",
    "admit_into_verb",
    "admit_verb",
    "allocate_and_cache_verb",
    "free_tables_verb",
    "longest_cache_hit_verb",
    "step_verb",
]
