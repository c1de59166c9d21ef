"""Batch verbs: a request's admission, or a whole scheduler step, as one pool call.

Contract: each function here is the *definition* of a batch verb, written as a sequence of
:class:`~kvpool.protocol.BlockPool` verbs, so it works on every backend. A backend may offer
the same verb as a method that does the work in one step (``FastBlockPool`` does, one kernel
call each); it must then return the same result and leave the same state, events (sequence
numbers included), metrics calls and watcher calls. Tests compare the two.

* :func:`find_longest_cache_hit` — blocks of the longest prefix every group has cached. Pure.
* :func:`get_cached_blocks` — ``get_cached_block`` for each position of a range. Pure.
* :func:`cached_run_from_end` — the rightmost run of hits of a given length (a sliding
  window's lookup). Pure.
* :func:`admit` — a new request: lookup, admission test, touch, allocate, cache; or nothing.
  :func:`admit_into` is the same admission writing the table into the caller's array.
* :func:`step` — one decode step: cache the blocks that filled, allocate, free finished
  requests. :func:`cache_full_blocks_batch` and :func:`free_tables` are its two halves.
* :func:`allocate_and_cache` — ``get_new_blocks`` then ``cache_full_blocks`` for one request.

**Atomic.** A batch verb either does all of its work or raises and changes nothing. The
composed verbs validate only their own input, so a composition validates the *whole* batch up
front (:mod:`kvpool.batch.checks`) — simulating the effect of its earlier parts on the later
checks — and raises the error the first failing verb of the sequence would raise (same type,
same message). Only then does it call the verbs, which can no longer fail. That validation
is the price of atomicity: the composition checks what its verbs check again. The checks
that depend on the pool's state read it through :mod:`kvpool.batch.observe`.

A reuse watcher or metrics collector that raises does not cut a composition short: the verb
it fires in has completed, so the rest of the sequence runs and the first
:class:`~kvpool.errors.CallbackError` (``WatcherError`` or ``MetricsCollectorError``) is
re-raised at the end with the batch verb's result as ``.result``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from kvpool.batch.checks import (
    Simulation,
    admit_rejection,
    allocation_rejection,
    candidates_rejection,
    check_lookup_arguments,
    check_range_lookup_arguments,
    check_run_lookup_arguments,
    checked_step,
    coarse_hashes,
    count,
    table_ids,
    table_rejection,
    write_rejection,
)
from kvpool.batch.observe import Observer, observe
from kvpool.errors import CallbackError
from kvpool.shell.arguments import as_group_ids, as_mask, candidate_table, request_block_hashes
from kvpool.shell.cache_checks import cache_arguments_rejection
from kvpool.shell.dims import dims
from kvpool.spec import preconditions as pre
from kvpool.spec.state import NULL_BLOCK_ID


def find_longest_cache_hit(
    pool: Any,
    block_hashes: Any,
    kv_cache_group_ids: Sequence[int],
    max_num_blocks: int | None = None,
) -> list[list[int]]:
    """One list per group id (in the order given) of the blocks of the longest prefix of
    ``block_hashes`` whose every position hits in every group; the lists have equal length.

    Position ``i`` is a hit iff ``get_cached_block(block_hashes[i], groups)`` is; the scan
    stops at the first miss (hashes are chained, so nothing after a miss can hit) or after
    ``max_num_blocks`` positions. Pure: nothing is touched. O(hits · groups).
    """
    ids = kv_cache_group_ids  # a list or tuple as it is (the fast verb does the same)
    groups = tuple(ids) if type(ids) is list or type(ids) is tuple else as_group_ids(ids)
    hashes = check_lookup_arguments(block_hashes, groups, max_num_blocks)
    if not isinstance(hashes, list):
        hashes = [row.tobytes() for row in hashes]
    result: list[list[int]] = [[] for _ in groups]
    for block_hash in hashes:
        hit = pool.get_cached_block(block_hash, groups)
        if hit is None:
            break
        for blocks, b in zip(result, hit, strict=True):
            blocks.append(int(b))
    return result


def get_cached_blocks(
    pool: Any,
    block_hashes: Any,
    kv_cache_group_ids: Sequence[int],
    start: int,
    stop: int,
) -> list[list[int] | None]:
    """``get_cached_block(block_hashes[i], groups)`` for each ``i`` in ``[start, stop)``, in
    order: one list of blocks (one per group id, in the order given) per position that hits
    in every group, ``None`` per position that does not.

    Unlike :func:`find_longest_cache_hit` every position is read, whatever the ones before
    it: a sliding-window lookup reads a prompt's hashes from the end and needs the run of
    hits that covers its window (``SlidingWindowManager.find_longest_cache_hit`` asks for
    one window's worth at a time). Pure. O((stop - start) · groups).
    """
    ids = kv_cache_group_ids
    groups = tuple(ids) if type(ids) is list or type(ids) is tuple else as_group_ids(ids)
    hashes = check_range_lookup_arguments(block_hashes, groups, start, stop)
    group_list = list(groups)
    result: list[list[int] | None] = []
    for block_hash in hashes:
        hit = pool.get_cached_block(block_hash, group_list)
        result.append(None if hit is None else [int(b) for b in hit])
    return result


def cached_run_from_end(
    pool: Any,
    block_hashes: Any,
    kv_cache_group_ids: Sequence[int],
    stop: int,
    run_length: int,
    end_every: int = 1,
    end_shift: int = 0,
) -> tuple[int, list[list[int]]]:
    """The rightmost run of ``run_length`` consecutive positions below ``stop`` whose hashes
    hit in every group (``get_cached_block``) and whose last position ``p`` may end a run,
    ``(p + 1 - end_shift) % end_every == 0``: its first position and its blocks, one list
    per group id in the order given. Without such a run, the longest run from position 0
    whose end may end one, possibly empty: ``(0, blocks)``.

    A sliding window's hit is such a run: it needs the blocks of one window before the hit's
    end, and the end must be where an aligned hit can end (``end_shift`` 1: an EAGLE lookup
    drops the run's last block, so the end is one block earlier). Positions are read from
    the end back, each at most once, and only where a run may end or one is under way.
    Pure. O(positions read · groups).
    """
    ids = kv_cache_group_ids
    groups = tuple(ids) if type(ids) is list or type(ids) is tuple else as_group_ids(ids)
    hashes = check_run_lookup_arguments(block_hashes, groups, stop, run_length, end_every,
                                        end_shift)
    group_list = list(groups)
    found: list[list[int]] = []  # the run under way, last position first
    for p in range(len(hashes) - 1, -1, -1):
        if not found and (p + 1 - end_shift) % end_every:
            continue  # a run cannot end here
        hit = pool.get_cached_block(hashes[p], group_list)
        if hit is None:
            found = []
            continue
        found.append([int(b) for b in hit])
        if len(found) == run_length:
            return p, [list(blocks) for blocks in zip(*reversed(found), strict=True)]
    return 0, [list(blocks) for blocks in zip(*reversed(found), strict=True)] if found \
        else [[] for _ in group_list]


def _allocate(pool: Any, n: int, held: list[CallbackError]) -> list[int]:
    """``get_new_blocks(n)``; a callback's error is held back (the allocation completed)."""
    return [int(b) for b in _call(held, pool.get_new_blocks, n)]


def _call(held: list[CallbackError], verb: Any, *args: Any) -> Any:
    """``verb(*args)``; a :class:`CallbackError` (the verb completed) is kept in ``held`` —
    the first one only — and its ``.result`` returned instead."""
    try:
        return verb(*args)
    except CallbackError as error:
        if not held:
            held.append(error)
        return error.result


def _raise_held(held: list[CallbackError], result: object) -> None:
    if held:
        held[0].result = result
        raise held[0]


def admit(
    pool: Any,
    request: Any,
    max_hit_blocks: int,
    num_blocks: int,
    num_full_blocks: int,
    reserve_blocks: int,
    block_size: int,
    kv_cache_group_id: int,
) -> tuple[list[int], list[int]] | None:
    """Admit a new request: ``(hits, new)`` — its table is ``hits + new`` — or ``None``.

    Equivalent to this sequence of protocol calls (``g`` the group, ``hashes`` the request's
    hashes at ``block_size`` granularity, see :func:`coarse_hashes`)::

        hits = find_longest_cache_hit(pool, hashes, [g], max_hit_blocks)[0]  # caching on
        evictable = number of hits with ref_cnt 0                 # free, cached blocks
        num_new = num_blocks - len(hits)
        if num_new + evictable + reserve_blocks > pool.get_num_free_blocks():
            return None                                           # nothing changed
        pool.touch(hits)                     # before allocating: it could evict them
        new = pool.get_new_blocks(num_new)
        if num_full_blocks > len(hits):                           # caching on
            pool.cache_full_blocks(request, hits + new, len(hits), num_full_blocks,
                                   block_size, g)
        return hits, new

    With caching off there is no lookup (``hits = []``) and no caching. ``evictable`` is
    what the hits will take out of the free count when touched, so the test asks whether
    ``num_new + reserve_blocks`` blocks remain free after the touch (vLLM's
    ``allocate_slots`` test; ``reserve_blocks`` is what the caller keeps for later). When
    even a scan that hit every position with a held block would fail the test, the lookup
    is skipped: it is pure, so skipping it is not observable.

    Errors, checked before anything happens (state-free): counts not non-negative ints
    (numpy integers included) → InvalidArgument; bad group id → InvalidGroupId; bad
    ``block_size`` → InvalidArgument; ``max_hit_blocks`` or ``num_full_blocks`` above
    ``num_blocks`` → InvalidArgument; with caching on, fewer than ``num_full_blocks``
    hashes, or a hash among the first ``max(max_hit_blocks, num_full_blocks)`` that is not
    bytes → InvalidArgument. O(hits + num_blocks).
    """
    args = [count(a) for a in (max_hit_blocks, num_blocks, num_full_blocks, reserve_blocks)]
    error = admit_rejection(pool, request, args[0], args[1], args[2], args[3], block_size,
                            kv_cache_group_id)
    if error:
        raise error
    max_hit, num, num_full, reserve = (cast(int, a) for a in args)
    caching = pool.enable_caching
    hashes = coarse_hashes(request.block_hashes, block_size // pool.hash_block_size) \
        if caching else ()
    if num - min(max_hit, len(hashes)) + reserve > pool.get_num_free_blocks():
        return None
    hits: list[int] = []
    if caching:
        hits = find_longest_cache_hit(pool, hashes, [kv_cache_group_id], max_hit)[0]
    evictable = observe(pool).ref_cnts(hits).count(0) if hits else 0
    if num - len(hits) + evictable + reserve > pool.get_num_free_blocks():
        return None
    held: list[CallbackError] = []
    if hits:
        _call(held, pool.touch, hits)
    new = _allocate(pool, num - len(hits), held)
    if caching and num_full > len(hits):
        pool.cache_full_blocks(request, hits + new, len(hits), num_full, block_size,
                               kv_cache_group_id)
    _raise_held(held, (hits, new))
    return hits, new


def admit_into(
    pool: Any,
    request: Any,
    table: Any,
    max_hit_blocks: int,
    num_blocks: int,
    num_full_blocks: int,
    reserve_blocks: int,
    block_size: int,
    kv_cache_group_id: int,
) -> int | None:
    """:func:`admit`, with the table written into ``table[:num_blocks]`` (the hits, then the
    new blocks) and the number of hits returned; ``None`` when the request does not fit.

    For a scheduler that keeps its block tables as int64 arrays (vLLM's ``BlockTable``
    does): no list of ids is built and none is copied. Equivalent to::

        result = admit(pool, request, max_hit_blocks, num_blocks, num_full_blocks,
                       reserve_blocks, block_size, kv_cache_group_id)
        if result is None:
            return None
        hits, new = result
        table[:num_blocks] = hits + new
        return len(hits)

    ``table`` must be a writable 1-D int64 numpy array with at least ``num_blocks`` entries,
    else InvalidArgument, checked first; then :func:`admit`'s errors. ``table`` is written
    only when the request is admitted: a refusal or an error leaves it as it was. A callback
    error (the admission completed) carries the number of hits as ``.result``, the table
    written. O(hits + num_blocks).
    """
    error = table_rejection(table, count(num_blocks))
    if error:
        raise error
    held: list[CallbackError] = []
    result = _call(held, admit, pool, request, max_hit_blocks, num_blocks, num_full_blocks,
                   reserve_blocks, block_size, kv_cache_group_id)
    if result is None:
        return None
    hits, new = result
    table[: len(hits) + len(new)] = hits + new
    _raise_held(held, len(hits))
    return len(hits)


def step_rejection(
    pool: Any, cache_items: Sequence[Any], num_new_blocks: object, free_tables: Sequence[Any],
    block_size: object, kv_cache_group_id: object,
) -> Any:
    """The error :func:`step` raises for these arguments, or ``None``. Pure.

    The parts are checked in the order they run, each against the state its predecessors
    leave: item by item (table conversion, then the checks of ``cache_full_blocks``), the
    allocation, then table by table (conversion, ids, over-release).
    """
    return checked_step(pool, cache_items, num_new_blocks, free_tables, block_size,
                        kv_cache_group_id)[0]


def step(
    pool: Any,
    cache_items: Sequence[tuple[Any, Any, int, int]],
    num_new_blocks: int,
    free_tables: Sequence[Any],
    block_size: int,
    kv_cache_group_id: int,
) -> list[int]:
    """One decode step's pool work: cache what filled, allocate, free; the new block ids.

    Equivalent to this sequence of protocol calls::

        for request, blocks, num_cached, num_full in cache_items:
            pool.cache_full_blocks(request, blocks, num_cached, num_full, block_size,
                                   kv_cache_group_id)
        new = pool.get_new_blocks(num_new_blocks)
        for table in free_tables:
            pool.free_blocks(table[::-1])        # one call per table: tail first
        return new

    One ``free_blocks`` per table, not one for all: each call puts its uncached blocks at
    the front in its own order, so a concatenated free would order the queue differently.
    Caching comes before the allocation so that the allocation cannot hand out a block the
    caller still names in a table (the blocks it caches are held, so for valid tables the
    order changes nothing but the order of events). Tables hold this pool's blocks: a
    :class:`BlockRef` to another pool raises ``ForeignBlock`` (``free_blocks`` would route
    it). The whole call is validated first (see :func:`step_rejection`): an error changes
    nothing. O(candidates + new + table lengths).
    """
    error, items, tables = checked_step(pool, cache_items, num_new_blocks, free_tables,
                                        block_size, kv_cache_group_id)
    if error:
        raise error
    for request, blocks, num_cached, num_full in items:
        pool.cache_full_blocks(request, blocks, num_cached, num_full, block_size,
                               kv_cache_group_id)
    held: list[CallbackError] = []
    new = _allocate(pool, count(num_new_blocks), held)  # type: ignore[arg-type]
    for table in tables:
        pool.free_blocks(table)
    _raise_held(held, new)
    return new


def cache_full_blocks_batch(
    pool: Any, cache_items: Sequence[tuple[Any, Any, int, int]], block_size: int,
    kv_cache_group_id: int,
) -> None:
    """``cache_full_blocks(request, blocks, num_cached, num_full, block_size, group)`` for
    each item, in order, validated first: :func:`step` with nothing to allocate or free."""
    step(pool, cache_items, 0, (), block_size, kv_cache_group_id)


def free_tables(pool: Any, tables: Sequence[Any]) -> None:
    """``free_blocks(table[::-1])`` for each table, in order, validated first: :func:`step`
    with nothing to cache or allocate (tail first: the least reusable block goes first)."""
    step(pool, (), 0, tables, pool.hash_block_size, 0)


def allocate_and_cache(
    pool: Any,
    request: Any,
    blocks: Sequence[object],
    num_new_blocks: int,
    num_cached_blocks: int,
    num_full_blocks: int,
    block_size: int,
    kv_cache_group_id: int,
    block_mask: Sequence[object] | None = None,
) -> list[int]:
    """Allocate ``num_new_blocks`` blocks for a request whose table is ``blocks``, then key
    positions ``[num_cached_blocks, num_full_blocks)`` of the table ``blocks + new``.

    Equivalent to ``new = pool.get_new_blocks(num_new_blocks)`` followed by
    ``pool.cache_full_blocks(request, [*blocks, *new], num_cached_blocks, num_full_blocks,
    block_size, kv_cache_group_id, block_mask)``; returns ``new``. Validated first, in this
    order: the allocation's checks, the caching's argument checks, the conversion of
    ``blocks``, then the caching's checks on the candidates against the state the
    allocation leaves. O(new + candidates).
    """
    n = count(num_new_blocks)
    error = allocation_rejection(n, pool.get_num_free_blocks())
    if error:
        raise error
    assert isinstance(n, int)
    hashes = request_block_hashes(request)
    table = list(blocks)
    # The mask as cache_full_blocks reads it (shell.as_mask): a truthy string or an int
    # other than 0/1 is InvalidArgument, on every backend, before anything changes.
    mask = as_mask(block_mask)
    error = cache_arguments_rejection(
        pool.enable_caching, pool.hash_block_size, len(hashes),
        len(table) + n, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id, mask,
    )
    if error:
        raise error
    old = candidate_table(lambda part: table_ids(pool, part), table, num_cached_blocks,
                          num_full_blocks)
    error = write_rejection(pool, request, hashes, num_cached_blocks, num_full_blocks,
                            block_size, kv_cache_group_id)
    if error:
        raise error
    if num_cached_blocks < num_full_blocks:
        sim = Simulation(pool)
        sim.pending = n
        cands = list(old[num_cached_blocks:num_full_blocks])
        error = pre.bad_block_id(dims(pool), tuple(cands))
        if error:
            raise error
        # The new blocks are fresh and distinct: they can only fail a check by colliding
        # with an old candidate, which takes an old candidate the allocation pops.
        missing = num_full_blocks - num_cached_blocks - len(cands)
        live = [b for b in cands if b != NULL_BLOCK_ID]
        popped = set(sim.fresh()) if missing and n and 0 in sim.observer.ref_cnts(live) else ()
        if any(b in popped for b in live):
            start = max(0, num_cached_blocks - len(old))
            cands += sim.fresh()[start : start + missing]
        error = candidates_rejection(sim, cands, num_cached_blocks, block_size, mask)
        if error:
            raise error
    held: list[CallbackError] = []
    new = _allocate(pool, n, held)
    pool.cache_full_blocks(request, [*old, *new], num_cached_blocks, num_full_blocks,
                           block_size, kv_cache_group_id, mask)
    _raise_held(held, new)
    return new


__all__ = [
    "Observer",
    "admit",
    "admit_into",
    "admit_rejection",
    "allocate_and_cache",
    "allocation_rejection",
    "cache_arguments_rejection",
    "cache_full_blocks_batch",
    "cached_run_from_end",
    "check_lookup_arguments",
    "check_range_lookup_arguments",
    "coarse_hashes",
    "find_longest_cache_hit",
    "free_tables",
    "get_cached_blocks",
    "observe",
    "step",
    "step_rejection",
    "table_ids",
    "table_rejection",
]
