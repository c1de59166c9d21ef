"""Invariant checks of the reference pool: the spec's predicates plus what only objects can break.

:func:`check_invariants` converts the object graph into a spec
:class:`~kvpool.spec.state.PoolState` and runs :func:`kvpool.spec.invariants.violated_invariants`
on it — the predicates exist once, in the spec. A state value cannot express how the objects
are wired, so the structural claims of the object graph are checked here, each a named
predicate returning its witnesses (empty = holds):

* queue links (§11.6-7): forward and backward walks agree, queued ⇔ both links set, the
  counter equals the walk length;
* ids in place (§11.1), one null block flagged (§11.2), blocks owned by this pool;
* the hash map files each block under its own id; the secondary index has no empty entries;
* the core's watcher table and the shell's callbacks name the same blocks in the same order.

The queue walks are bounded, so a corrupted (cyclic) list is reported rather than looped on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvpool.reference.parts import ReferenceParts
from kvpool.spec.invariants import violated_invariants

if TYPE_CHECKING:
    from kvpool.reference.block import KVCacheBlock


def walk_forward(pool: ReferenceParts) -> tuple[list[KVCacheBlock], bool]:
    """The blocks from the head onwards (at most N+1), and whether the tail was reached."""
    queue = pool.free_block_queue
    tail = queue.fake_free_list_tail
    limit = len(pool.blocks) + 1
    walked: list[KVCacheBlock] = []
    curr = queue.fake_free_list_head.next_free_block
    while curr is not None and curr is not tail and len(walked) < limit:
        walked.append(curr)
        curr = curr.next_free_block
    return walked, curr is tail


def walk_backward(pool: ReferenceParts) -> tuple[list[KVCacheBlock], bool]:
    """The blocks from the tail backwards (at most N+1), and whether the head was reached."""
    queue = pool.free_block_queue
    head = queue.fake_free_list_head
    limit = len(pool.blocks) + 1
    walked: list[KVCacheBlock] = []
    curr = queue.fake_free_list_tail.prev_free_block
    while curr is not None and curr is not head and len(walked) < limit:
        walked.append(curr)
        curr = curr.prev_free_block
    return walked, curr is head


def free_queue_links_are_consistent(pool: ReferenceParts) -> tuple:
    """§11.7 A queued block has both links set, an unqueued one both cleared; walks agree.

    Why: membership is read from the links, so a half-linked block is both free and held.
    """
    forward, reached_tail = walk_forward(pool)
    backward, reached_head = walk_backward(pool)
    bad: list[object] = []
    if not reached_tail:
        bad.append("forward walk does not reach the tail sentinel")
    if not reached_head:
        bad.append("backward walk does not reach the head sentinel")
    if [b.block_id for b in forward] != [b.block_id for b in reversed(backward)]:
        bad.append("forward and backward walks differ")
    queued = {id(b) for b in forward}
    for block in pool.blocks:
        linked = (block.prev_free_block is not None, block.next_free_block is not None)
        if linked != ((True, True) if id(block) in queued else (False, False)):
            bad.append(block.block_id)
    return tuple(bad)


def free_count_matches_queue(pool: ReferenceParts) -> tuple:
    """§11.6 ``num_free_blocks`` equals the number of blocks in the queue.

    Why: allocation trusts the counter; a drifted one hands out blocks that are not there.
    """
    forward, _ = walk_forward(pool)
    counter = pool.free_block_queue.num_free_blocks
    return () if counter == len(forward) else (counter, len(forward))


def block_ids_match_positions(pool: ReferenceParts) -> tuple:
    """§11.1 ``blocks[i].block_id == i`` and every block is owned by this pool.

    Why: block tables hold ids; an id naming the wrong object aliases two requests' KV data.
    """
    return tuple(
        i for i, block in enumerate(pool.blocks) if block.block_id != i or block.pool is not pool
    )


def null_block_is_flagged(pool: ReferenceParts) -> tuple:
    """§11.2 Block 0, and only block 0, is flagged ``is_null``.

    Why: ``touch``/``free_blocks`` skip by the flag; a wrong flag makes a real block inert.
    """
    return tuple(i for i, block in enumerate(pool.blocks) if block.is_null != (i == 0))


def hash_map_files_blocks_under_their_ids(pool: ReferenceParts) -> tuple:
    """§5 Every map entry stores this pool's block under that block's own id.

    Why: ``pop(key, block_id)`` finds entries by id; a misfiled one could never be removed.
    """
    blocks = pool.blocks
    return tuple(
        key
        for key, block_id, block in pool.cached_block_hash_to_block.entries()
        if block.block_id != block_id
        or not 0 <= block_id < len(blocks)
        or blocks[block_id] is not block
    )


def secondary_index_has_no_empty_entries(pool: ReferenceParts) -> tuple:
    """§11.11 The secondary index holds no block with an empty key collection.

    Why: the state conversion omits empty entries, so this is the only place they show.
    """
    return tuple(b for b, keys in pool.cached_block_hashes_by_block.items() if not keys)


def watcher_table_matches_callbacks(pool: ReferenceParts) -> tuple:
    """§6.4 The core's watcher table and the shell's callbacks list the same blocks, in order.

    Why: the core decides which watchers fire; the shell must have a callback for each.
    """
    core, shell = tuple(pool.reuse_watcher_ids), pool.watched_blocks()
    return () if core == shell else tuple(sorted(set(core) ^ set(shell))) or ("order",)


StructuralCheck = Callable[["ReferenceParts"], tuple]

CORE_STRUCTURAL_CHECKS: tuple[StructuralCheck, ...] = (
    block_ids_match_positions,
    null_block_is_flagged,
    free_queue_links_are_consistent,
    free_count_matches_queue,
    hash_map_files_blocks_under_their_ids,
    secondary_index_has_no_empty_entries,
)
"""Checks of the core's own objects; they hold after every core call (contract checking)."""

STRUCTURAL_CHECKS: tuple[StructuralCheck, ...] = (
    *CORE_STRUCTURAL_CHECKS,
    watcher_table_matches_callbacks,
)
"""All structural checks; the last one also holds only between public calls."""


def structural_violations(
    pool: ReferenceParts, checks: tuple[StructuralCheck, ...] = STRUCTURAL_CHECKS
) -> list[tuple[str, tuple]]:
    """``[(check name, witnesses)]`` for every structural check ``pool`` fails, in order."""
    return [(check.__name__, w) for check in checks if (w := check(pool))]


def check_invariants(pool: ReferenceParts) -> list[tuple[str, tuple]]:
    """Every broken invariant of ``pool``: the spec's in checklist order, then structural ones."""
    forward, _ = walk_forward(pool)
    state = pool.state_with_queue(tuple(b.block_id for b in forward))
    return violated_invariants(state) + structural_violations(pool)
