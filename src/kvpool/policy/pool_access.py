"""The pool verbs the policy layer uses beyond the protocol's single-block ones.

Managers are written once over :class:`kvpool.protocol.BlockPool`. Where a backend offers a
batch primitive (the fast pool's one-kernel longest-hit scan) the policy layer calls it;
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
    window = hashes[:max_num_blocks]
    own = getattr(pool, "find_longest_cache_hit", None)
    if own is not None:
        return own(window, list(group_ids))
    return batch.find_longest_cache_hit(pool, window, list(group_ids))


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


def has_key(pool: Any, block: int) -> bool:
    """Whether ``block`` carries a primary key now."""
    return block != pool.null_block and pool.observe().key_tokens(block) is not None


__all__ = ["has_key", "longest_prefix_hit", "num_evictable", "ref_cnts"]
