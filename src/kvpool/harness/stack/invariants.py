"""Manager-level invariants (BEHAVIOUR.md §11.21–27) as named predicates over one stack.

Each predicate is a claim about a :class:`~kvpool.policy.KVCacheManager` at a step boundary
and returns the list of problems it found (empty = holds), naming requests, groups and block
ids. They read the facade's public queries and the pool's ``observe()`` query only.

==============================================  =====================================
predicate                                       BEHAVIOUR.md
==============================================  =====================================
every_reference_is_counted_once                  §11.22 (copy endpoints included)
copy_endpoints_stay_out_of_the_free_queue        §10.4 (pending and retained copies)
mamba_states_keyed_as_computed                   §10.4 (a keyed state is not overwritten)
running_tables_are_append_only                   §11.23
keyed_blocks_cover_their_table_position          §11.24 (and Mamba checkpoints)
no_block_twice_in_a_table                        §11.22/23 (one position per block)
hit_lengths_agree_across_groups                  §11.26 (checked at every lookup)
each_group_counts_in_its_own_block_size          §11.26 / §8 sizing
failed_allocation_touched_and_allocated_nothing  §11.27 (checked at every ``None``)
==============================================  =====================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from kvpool.policy.mamba import MambaManager
from kvpool.policy.specs import CircularBufferSpec, CrossAttentionSpec, MambaSpec, cdiv


def all_tables(manager: Any, request_ids: Sequence[str]) -> dict[tuple[str, int], list[int]]:
    """(request, group) → table, for the given live requests."""
    out = {}
    for rid in request_ids:
        for g, table in enumerate(manager.get_block_ids(rid)):
            out[(rid, g)] = table
    return out


def every_reference_is_counted_once(manager: Any, request_ids: Sequence[str],
                                    popped: Sequence[Sequence[int]]) -> list[str]:
    """Every non-null block's ref count = table slots holding it + popped, unfreed tables
    + its copy-on-write retentions (each endpoint of a pending copy once, each retained
    endpoint handed out and not yet released once).

    Why: a reference nobody holds is a leak (the block never returns); a holder the count
    misses is a use-after-free waiting to happen."""
    pool = manager.block_pool
    holds: Counter[int] = Counter()
    table: Sequence[int]
    for table in all_tables(manager, request_ids).values():
        holds.update(b for b in table if b != pool.null_block)
    for table in popped:
        holds.update(b for b in table if b != pool.null_block)
    holds.update(copy_endpoints(manager))
    ids = list(range(1, pool.num_gpu_blocks))
    refs = pool.observe().ref_cnts(ids)
    return [f"block {b}: ref_cnt {r} but {holds[b]} holders"
            for b, r in zip(ids, refs, strict=True) if r != holds[b]]


def copy_endpoints(manager: Any) -> Counter[int]:
    """Block → holds for copies: pending copies' endpoints and retained, unreleased ones."""
    holds: Counter[int] = Counter()
    for copy in getattr(manager, "pending_kv_cache_block_copies", ()):
        holds.update((copy.src_block_id, copy.dst_block_id))
    holds.update(getattr(manager, "retained_copy_endpoints", {}))
    return holds


def copy_endpoints_stay_out_of_the_free_queue(manager: Any) -> list[str]:
    """No endpoint of a pending or unreleased copy is in the free queue.

    Why: the GPU layer reads the source and writes the destination after scheduling; a
    queued endpoint could be handed to another request (and overwritten) first."""
    pool = manager.block_pool
    endpoints = copy_endpoints(manager)
    if not endpoints:
        return []
    queued = set(pool.observe().queue_front(pool.get_num_free_blocks()))
    return [f"copy endpoint {b} is in the free queue" for b in endpoints if b in queued]


def mamba_states_keyed_as_computed(manager: Any,
                                   computed: Sequence[tuple[str, int]]) -> list[str]:
    """A running request's current Mamba state block (align mode, no speculative blocks:
    position ``cdiv(c, bs) − 1`` after ``c`` computed tokens) carries no key for other than
    ``c`` tokens.

    Why: the state is overwritten in place each step; a key left on it (a boundary state
    whose entry did not move to its copy, §10.4) serves a later request another state."""
    observer = manager.block_pool.observe()
    null = manager.block_pool.null_block
    problems = []
    for g, mgr in enumerate(manager.coordinator.single_type_managers):
        if not isinstance(mgr, MambaManager) or not mgr.align or mgr.num_speculative_blocks:
            continue
        for rid, c in computed:
            table = mgr.req_to_blocks.get(rid) or []
            position = cdiv(c, mgr.block_size) - 1
            if not 0 <= position < len(table) or table[position] == null:
                continue
            tokens = observer.key_tokens(table[position])
            if tokens is not None and tokens != c:
                problems.append(f"{rid!r} group {g}: state block {table[position]} was "
                                f"overwritten at {c} tokens but is keyed for {tokens}")
    return problems


def no_block_twice_in_a_table(manager: Any, request_ids: Sequence[str]) -> list[str]:
    """No block sits at two positions of one request's table in one group.

    Why: two positions are two different token ranges; one block cannot hold both (a
    touch after an allocation that evicted the hit produces exactly this)."""
    null = manager.block_pool.null_block
    problems = []
    for key, table in all_tables(manager, request_ids).items():
        counts = Counter(b for b in table if b != null)
        problems += [f"{key}: block {b} at {n} positions" for b, n in counts.items() if n > 1]
    return problems


def running_tables_are_append_only(before: dict[tuple[str, int], list[int]],
                                   after: dict[tuple[str, int], list[int]],
                                   null_block: int) -> list[str]:
    """A running request's table only grows at the end; positions may turn null (and, in
    Mamba align mode, a speculative block may move to the end).

    Why: the worker's block table is append-only; rewriting a position would point
    attention at another block's KV."""
    problems = []
    for key, old in before.items():
        new = after.get(key)
        if new is None:
            continue
        if len(new) < len(old):
            problems.append(f"{key}: table shrank from {len(old)} to {len(new)}")
            continue
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            if a == b or b == null_block:  # kept, or skipped / relocated to the end
                continue
            problems.append(f"{key}: position {i} changed {a} -> {b}")
    return problems


def keyed_blocks_cover_their_table_position(manager: Any, request_ids: Sequence[str]) -> list[str]:
    """A keyed block at table position p of group g covers exactly ``(p+1)·bs_g`` tokens;
    in particular a Mamba state is checkpointed only at a block boundary. With partial
    hits (§10.4) a key may also end at a hash boundary inside the block.

    Why: a key claims "this block holds the KV (or state) of the first k tokens"; anything
    else serves a later request the wrong prefix."""
    pool = manager.block_pool
    observer = pool.observe()
    partial = getattr(manager, "partial_hash_hits_enabled", False)
    hbs = pool.hash_block_size
    problems = []
    for g, mgr in enumerate(manager.coordinator.single_type_managers):
        bs = mgr.block_size
        for rid in request_ids:
            table = mgr.req_to_blocks.get(rid) or []
            for p, b in enumerate(table):
                if b == pool.null_block:
                    continue
                tokens = observer.key_tokens(b)
                if tokens is not None and partial and p * bs < tokens <= (p + 1) * bs \
                        and tokens % hbs == 0:
                    continue
                if tokens is not None and tokens != (p + 1) * bs:
                    kind = "Mamba state" if isinstance(mgr, MambaManager) else "block"
                    problems.append(f"{kind} {b} of {rid!r} group {g} at position {p} "
                                    f"is keyed for {tokens} tokens, not {(p + 1) * bs}")
    return problems


def hit_lengths_agree_across_groups(manager: Any, hits: Sequence[Sequence[int]],
                                    num_tokens: int, max_length: int) -> list[str]:
    """A hit is ≤ the cap, a multiple of the alignment, and ``len(hits[g]) × bs_g`` for
    every group with hits (§11.26).

    Why: the scheduler skips ``num_tokens`` tokens for every group at once; a group that
    covers less would serve never-computed KV."""
    coordinator = manager.coordinator
    alignment = getattr(coordinator, "block_size", coordinator.scheduler_block_size)
    partial = getattr(coordinator, "partial_hash_hits", False)
    if partial:
        alignment = coordinator.hash_block_size
    problems = []
    if num_tokens > max(max_length, 0):
        problems.append(f"hit {num_tokens} exceeds the cap {max_length}")
    if num_tokens % alignment:
        problems.append(f"hit {num_tokens} is not a multiple of {alignment}")
    for g, (blocks, mgr) in enumerate(zip(hits, coordinator.single_type_managers,
                                          strict=True)):
        if partial:
            if blocks and len(blocks) != cdiv(num_tokens, mgr.block_size):
                problems.append(f"group {g}: {len(blocks)} blocks of {mgr.block_size} do not "
                                f"end in hit {num_tokens}")
        elif blocks and len(blocks) * mgr.block_size != num_tokens:
            problems.append(f"group {g}: {len(blocks)} blocks × {mgr.block_size} != hit "
                            f"{num_tokens}")
    return problems


def each_group_counts_in_its_own_block_size(manager: Any, request_id: str,
                                            need_slots: int, previous: Sequence[int]) -> list[str]:
    """After a successful allocation for ``need_slots`` slots, every attention group's table
    has ``max(previous, cdiv(need_slots, bs_g))`` positions — in its own block size.

    Why: groups of different block sizes need different numbers of blocks for the same
    tokens; sizing one group by another's block size over- or under-allocates."""
    problems = []
    for g, (mgr, table) in enumerate(zip(manager.coordinator.single_type_managers,
                                         manager.get_block_ids(request_id), strict=True)):
        spec = mgr.kv_cache_spec
        if isinstance(spec, (MambaSpec, CrossAttentionSpec, CircularBufferSpec)):
            continue
        want = max(previous[g], cdiv(need_slots, mgr.block_size))
        if len(table) != want:
            problems.append(f"{request_id!r} group {g}: {len(table)} blocks for {need_slots} "
                            f"slots at block size {mgr.block_size} (expected {want})")
    return problems


def failed_allocation_touched_and_allocated_nothing(refs_before: Sequence[int],
                                                    refs_after: Sequence[int],
                                                    free_before: int,
                                                    free_after: int) -> list[str]:
    """``allocate_slots`` returning ``None`` touched nothing and allocated nothing: no ref
    count rose and the free count did not fall (out-of-window frees may raise it).

    Why: a failed step is retried later; a touch or allocation it left behind leaks."""
    problems = [f"block {b}: ref_cnt rose {x} -> {y} in a failed allocation"
                for b, (x, y) in enumerate(zip(refs_before, refs_after, strict=True), start=1)
                if y > x]
    if free_after < free_before:
        problems.append(f"free count fell {free_before} -> {free_after} in a failed allocation")
    return problems


__all__ = [
    "all_tables",
    "copy_endpoints",
    "copy_endpoints_stay_out_of_the_free_queue",
    "each_group_counts_in_its_own_block_size",
    "every_reference_is_counted_once",
    "failed_allocation_touched_and_allocated_nothing",
    "hit_lengths_agree_across_groups",
    "keyed_blocks_cover_their_table_position",
    "mamba_states_keyed_as_computed",
    "no_block_twice_in_a_table",
    "running_tables_are_append_only",
]
