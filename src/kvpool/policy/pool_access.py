"""The pool verbs the policy layer uses beyond the protocol's single-block ones.

Managers are written once over :class:`kvpool.protocol.BlockPool`. Where a backend offers a
batch primitive (the fast pool's one-kernel longest-hit scan and run lookup) the policy
layer calls it;
otherwise it calls the generic composition in :mod:`kvpool.batch`, which *defines* the verb.
Both give the same result (tests in ``tests/fast`` compare them), so which one runs is not
observable. Per-block facts (ref counts, whether a block has a key) come from the protocol's
``observe()`` query, never from backend internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool import batch


def longest_prefix_hit(pool: Any, hashes: Sequence[bytes], group_ids: Sequence[int],
                       max_num_blocks: int) -> list[list[int]]:
    """One list per group of the blocks of the longest prefix of ``hashes`` (at most
    ``max_num_blocks`` positions) that hits in every group. Pure."""
    if max_num_blocks <= 0:
        return [[] for _ in group_ids]
    # The limit, not a slice: the fast pool then reads a request's packed companion in place.
    own = getattr(pool, "find_longest_cache_hit", None)
    if own is not None:
        return own(hashes, list(group_ids), max_num_blocks)  # type: ignore[no-any-return]
    return batch.find_longest_cache_hit(pool, hashes, list(group_ids), max_num_blocks)


def cached_run_from_end(pool: Any, hashes: Sequence[bytes], group_ids: Sequence[int],
                        stop: int, run_length: int, end_every: int, end_shift: int
                        ) -> tuple[int, list[list[int]]]:
    """The rightmost run of ``run_length`` hits below ``stop`` that may end where it ends, or
    the run from position 0 (:func:`kvpool.batch.cached_run_from_end`): its first position
    and its blocks per group. The fast pool's is one kernel call. Pure."""
    own = getattr(pool, "cached_run_from_end", None)
    if own is not None:
        return own(hashes, list(group_ids), stop, run_length, end_every,  # type: ignore[no-any-return]
                   end_shift)
    return batch.cached_run_from_end(pool, hashes, list(group_ids), stop, run_length,
                                     end_every, end_shift)


def num_evictable(pool: Any, blocks: Sequence[int]) -> int:
    """How many of ``blocks`` are free cached candidates (ref 0, not null): a touch takes
    each out of the free count, so an allocation budget must count them."""
    live = [b for b in blocks if b != pool.null_block]
    if not live:
        return 0
    return pool.observe().ref_cnts(live).count(0)


def ref_cnts(pool: Any, blocks: Sequence[int]) -> list[int]:
    """The ref count of each block (the null block reads as 0)."""
    live = [b for b in blocks if b != pool.null_block]
    counts = dict(zip(live, pool.observe().ref_cnts(live), strict=True)) if live else {}
    return [counts.get(b, 0) for b in blocks]


def ref_cnt(pool: Any, block: int) -> int:
    """One block's ref count (the null block reads as 0): the pool's scalar query where it
    has one (the fast pool's reads one array cell), else ``observe()``."""
    if block == pool.null_block:
        return 0
    own = getattr(pool, "ref_cnt", None)
    if own is not None:
        return own(block)  # type: ignore[no-any-return]
    return pool.observe().ref_cnts([block])[0]  # type: ignore[no-any-return]


def has_key(pool: Any, block: int) -> bool:
    """Whether ``block`` carries a primary key now."""
    return block != pool.null_block and pool.observe().key_tokens(block) is not None


__all__ = ["cached_run_from_end", "has_key", "longest_prefix_hit", "num_evictable", "ref_cnt",
           "ref_cnts"]
