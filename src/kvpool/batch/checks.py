"""The up-front checks of the batch verbs: a composition's first error, before any change.

Contract: every ``*_rejection`` function is pure and returns the error the composed protocol
verbs would raise first — same type, same message, checks in
:mod:`kvpool.spec.preconditions` order — or ``None``. A check that depends on the pool's
state reads it through :mod:`kvpool.batch.observe` and sees the effect of the composition's
earlier parts (:class:`Simulation`: keys set by earlier cache calls, blocks popped by its
allocation, references dropped by earlier frees). Where a cheap test proves a part valid
(distinct ids, all held) the exact, slower recount is skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any, cast

import numpy as np

from kvpool.batch.observe import Observer, observe
from kvpool.errors import (
    DoubleFree,
    ForeignBlock,
    HashStateError,
    InvalidArgument,
    KvPoolError,
    NoFreeBlocks,
)
from kvpool.events import stored_rejection
from kvpool.shell.arguments import (
    BlockRef,
    as_block_id,
    as_block_ids,
    candidate_table,
    request_block_hashes,
)
from kvpool.shell.cache_checks import cache_arguments_rejection
from kvpool.shell.dims import dims
from kvpool.spec import preconditions as pre
from kvpool.spec.state import NULL_BLOCK_ID


def count(value: object) -> object:
    """A numpy integer count as an int (``get_new_blocks`` accepts them); else unchanged."""
    return int(value) if isinstance(value, np.integer) else value


def is_int_array(blocks: object) -> bool:
    """A 1-D integer array: the shell converts it without any per-entry check."""
    return type(blocks) is np.ndarray and blocks.ndim == 1 and blocks.dtype.kind in "iu"


def table_ids(pool: Any, blocks: Iterable[object]) -> tuple[int, ...]:
    """A block table as the shell converts it for ``cache_full_blocks`` (ints, numpy integers,
    a 1-D integer array, :class:`BlockRef` to ``pool``); raises ``InvalidBlockId`` or
    ``ForeignBlock`` for anything else, at the first offending entry."""
    if isinstance(blocks, np.ndarray):
        return as_block_ids(blocks)
    ids = tuple(blocks)
    if set(map(type, ids)) <= {int}:
        return cast(tuple[int, ...], ids)
    out = []
    for b in ids:
        if isinstance(b, BlockRef):
            if b.pool is not pool:
                raise ForeignBlock(f"block {b.block_id} belongs to another pool ({b.pool!r})")
            b = b.block_id
        out.append(as_block_id(b))
    return tuple(out)


def table_rejection(table: object, num_blocks: object) -> KvPoolError | None:
    """``admit_into``'s check of the array it writes: a writable 1-D int64 numpy array (a
    subclass such as ``np.memmap`` too) with
    room for ``num_blocks`` ids (the length is checked only when ``num_blocks`` is a valid
    count; otherwise the count's own check reports it). Pure."""
    if not isinstance(table, np.ndarray):
        return InvalidArgument(f"table must be a numpy int64 array, got {type(table).__name__}")
    if table.dtype != np.int64 or table.ndim != 1:
        return InvalidArgument(f"table must be a 1-D int64 array, got {table.ndim}-D "
                               f"{table.dtype}")
    if not table.flags.writeable:
        return InvalidArgument("table must be writable")
    if type(num_blocks) is int and 0 <= num_blocks and table.shape[0] < num_blocks:
        return InvalidArgument(f"table has room for {table.shape[0]} block ids, "
                               f"{num_blocks} are admitted")
    return None


def check_bytes(hashes: Sequence[object]) -> None:
    """Raise InvalidArgument at the first hash that is not ``bytes``."""
    if set(map(type, hashes)) - {bytes}:
        for h in hashes:
            if not isinstance(h, bytes):
                raise InvalidArgument(f"block hashes must be bytes, got {type(h).__name__}")


def check_lookup_arguments(
    block_hashes: Any, group_ids: tuple[int, ...], max_num_blocks: int | None
) -> list[bytes] | np.ndarray:
    """Validate a lookup; return the hashes to scan (at most ``max_num_blocks`` of them).

    ``block_hashes``: a sequence of ``bytes`` or a 2-D uint8 array (one hash per row).
    Errors: no group → InvalidArgument; a bad group id → InvalidGroupId; a bad limit or a
    hash that is not bytes → InvalidArgument.
    """
    _check_group_ids(group_ids, "find_longest_cache_hit")
    if max_num_blocks is not None and not pre.is_count(max_num_blocks):
        raise InvalidArgument(f"max_num_blocks must be a non-negative int, got {max_num_blocks!r}")
    if isinstance(block_hashes, np.ndarray):
        if block_hashes.ndim != 2 or block_hashes.dtype != np.uint8:
            raise InvalidArgument(
                f"a hash array must be 2-D uint8, got {block_hashes.dtype} {block_hashes.shape}"
            )
        return block_hashes if max_num_blocks is None else block_hashes[:max_num_blocks]
    hashes = list(block_hashes if max_num_blocks is None else islice(block_hashes, max_num_blocks))
    check_bytes(hashes)
    return hashes


def check_range_lookup_arguments(block_hashes: Any, group_ids: tuple[int, ...], start: object,
                                 stop: object) -> list[bytes]:
    """Validate ``get_cached_blocks``; return the hashes at positions ``[start, stop)``.

    ``block_hashes``: a sequence of ``bytes`` (only the range is read). Errors: no group →
    InvalidArgument; a bad group id → InvalidGroupId; ``start``/``stop`` not ints with
    ``0 <= start <= stop <= len(block_hashes)``, or a hash in the range that is not bytes →
    InvalidArgument.
    """
    _check_group_ids(group_ids, "get_cached_blocks")
    if not isinstance(block_hashes, Sequence) or isinstance(block_hashes,
                                                            (str, bytes, bytearray)):
        raise InvalidArgument(f"block_hashes must be a sequence of bytes, got "
                              f"{type(block_hashes).__name__}")
    n = len(block_hashes)
    if not (pre.is_count(start) and pre.is_count(stop) and start <= stop <= n):
        raise InvalidArgument(f"positions [{start!r}, {stop!r}) are not a range of the {n} "
                              f"block hashes")
    hashes = list(block_hashes[start:stop])
    check_bytes(hashes)
    return hashes


def check_run_lookup_arguments(block_hashes: Any, group_ids: tuple[int, ...], stop: object,
                               run_length: object, end_every: object,
                               end_shift: object) -> list[bytes]:
    """Validate ``cached_run_from_end``; return the hashes at positions ``[0, stop)``.

    As :func:`check_range_lookup_arguments` for the range ``[0, stop)`` (its errors, in its
    order), then ``run_length`` and ``end_every`` ints >= 1 and ``end_shift`` an int >= 0,
    else InvalidArgument.
    """
    hashes = check_range_lookup_arguments(block_hashes, group_ids, 0, stop)
    for name, value, least in (("run_length", run_length, 1), ("end_every", end_every, 1),
                               ("end_shift", end_shift, 0)):
        if not (pre.is_count(value) and value >= least):
            raise InvalidArgument(f"{name} must be an int >= {least}, got {value!r}")
    return hashes


def _check_group_ids(group_ids: tuple[int, ...], verb: str) -> None:
    if not group_ids:
        raise InvalidArgument(f"{verb} needs at least one group id")
    for g in group_ids:
        error = pre.bad_group_id(g)
        if error:
            raise error


def allocation_rejection(num_blocks: object, num_free: int) -> KvPoolError | None:
    """The checks of ``get_new_blocks`` (pass numpy integers through :func:`count` first)."""
    if not pre.is_count(num_blocks):
        return InvalidArgument(f"num_blocks must be a non-negative int, got {num_blocks!r}")
    assert isinstance(num_blocks, int)
    if num_blocks > num_free:
        return NoFreeBlocks(f"Cannot get {num_blocks} free blocks from the pool")
    return None


def coarse_hashes(hashes: Sequence[Any], ratio: int) -> Sequence[Any]:
    """A request's hashes at ``ratio × hash_block_size`` granularity (the last fine hash
    inside each coarse block: the key ``cache_full_blocks`` stores for that position)."""
    if ratio == 1:
        return hashes
    return [hashes[(i + 1) * ratio - 1] for i in range(len(hashes) // ratio)]


class Simulation:
    """The state the checks of a composition see: the pool's, plus its own earlier parts.

    ``keyed`` holds the key length each block got from an earlier cache call of the same
    composition; ``released`` the references its earlier frees dropped; ``pending`` the
    size of its allocation. The blocks the allocation pops (ref 1, no key afterwards) are
    read only when a check meets a block the pool has free, the one case where they matter.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.dims = dims(pool)
        self._observer: Observer | None = None
        self.keyed: dict[int, int] = {}
        self.released: Counter[int] = Counter()
        self.pending = 0
        self._fresh: list[int] | None = None

    @property
    def observer(self) -> Observer:
        if self._observer is None:
            self._observer = observe(self.pool)
        return self._observer

    def fresh(self) -> list[int]:
        """The blocks the allocation pops, in pop order."""
        if self._fresh is None:
            self._fresh = self.observer.queue_front(self.pending) if self.pending else []
        return self._fresh

    def ref_cnts(self, ids: list[int]) -> list[int]:
        refs = self.observer.ref_cnts(ids)
        if self.pending and 0 in refs:
            fresh = set(self.fresh())
            refs = [r + 1 if r == 0 and b in fresh else r for b, r in zip(ids, refs, strict=True)]
        if self.released:
            released = self.released
            refs = [r - released[b] for b, r in zip(ids, refs, strict=True)]
        return refs

    def key_tokens(self, b: int) -> int | None:
        if b in self.keyed:
            return self.keyed[b]
        if self.pending and self.observer.ref_cnts([b])[0] == 0 and b in self.fresh():
            return None  # popped by the allocation: its keys are evicted
        return self.observer.key_tokens(b)


def candidates_rejection(
    sim: Simulation, cands: Sequence[int], num_cached: int, block_size: int,
    mask: Sequence[bool] | None,
) -> KvPoolError | None:
    """The state checks of ``cache_full_blocks`` on its candidates, in spec order; on
    success the simulation records the keys the call will set."""
    if len(cands) == 1 and mask is None:  # one block filled: the common case, in short
        b = cands[0]
        if not 0 <= b < sim.dims.num_blocks:
            return pre.bad_block_id(sim.dims, (b,))
        if b == NULL_BLOCK_ID:
            return None
        if sim.ref_cnts([b])[0] == 0:
            return HashStateError(f"cannot cache free block {b} (ref_cnt 0)")
        tokens, need = sim.key_tokens(b), (num_cached + 1) * block_size
        if tokens is not None and tokens >= need:
            return HashStateError(
                f"block {b} already carries a key covering {tokens} tokens "
                f"(caching it at position {num_cached} would cover {need})"
            )
        sim.keyed[b] = need
        return None
    error = pre.bad_block_id(sim.dims, tuple(cands))
    if error:
        return error
    seen: set[int] = set()
    selected = [b for i, b in enumerate(cands)
                if b != NULL_BLOCK_ID and (mask is None or mask[i])]
    refs = dict(zip(selected, sim.ref_cnts(selected), strict=True))
    for i, b in enumerate(cands):
        if b == NULL_BLOCK_ID or (mask is not None and not mask[i]):
            continue
        k = num_cached + i
        if b in seen:
            return InvalidArgument(f"block {b} appears twice among the blocks to cache")
        seen.add(b)
        if refs[b] == 0:
            return HashStateError(f"cannot cache free block {b} (ref_cnt 0)")
        tokens = sim.key_tokens(b)
        if tokens is not None and tokens >= (k + 1) * block_size:
            return HashStateError(
                f"block {b} already carries a key covering {tokens} tokens "
                f"(caching it at position {k} would cover {(k + 1) * block_size})"
            )
    for i, b in enumerate(cands):
        if b in seen:
            sim.keyed[b] = (num_cached + i + 1) * block_size
    return None


def release_rejection(sim: Simulation, ids: tuple[int, ...],
                      more: bool = True) -> KvPoolError | None:
    """The checks of ``free_blocks(ids)`` against the simulated state; records the release
    when ``more`` checks follow."""
    if ids and (min(ids) < 0 or max(ids) >= sim.dims.num_blocks):
        return pre.bad_block_id(sim.dims, ids)
    held = [b for b in ids if b != NULL_BLOCK_ID] if NULL_BLOCK_ID in ids else list(ids)
    refs = sim.ref_cnts(held)
    if len(set(held)) < len(held) or (refs and min(refs) < 1):  # the exact recount
        releases = Counter(held)
        current = dict(zip(held, refs, strict=True))
        for b in held:
            if releases[b] > current[b]:
                return DoubleFree(
                    f"block {b} is released {releases[b]} time(s) but has ref_cnt {current[b]}"
                )
    if more:
        sim.released.update(held)
    return None


def admit_rejection(
    pool: Any, request: Any, max_hit_blocks: object, num_blocks: object,
    num_full_blocks: object, reserve_blocks: object, block_size: object,
    kv_cache_group_id: object,
) -> KvPoolError | None:
    """The argument checks of ``admit``, in its documented order (all state-free)."""
    counts = (max_hit_blocks, num_blocks, num_full_blocks, reserve_blocks)
    if not all(pre.is_count(c) for c in counts):
        return InvalidArgument(
            "max_hit_blocks, num_blocks, num_full_blocks and reserve_blocks must be "
            f"non-negative ints, got {counts!r}"
        )
    assert isinstance(num_blocks, int) and isinstance(max_hit_blocks, int)
    assert isinstance(num_full_blocks, int)
    error = pre.bad_group_id(kv_cache_group_id) or pre.bad_block_size(dims(pool), block_size)
    if error:
        return error
    assert isinstance(block_size, int)
    if max_hit_blocks > num_blocks or num_full_blocks > num_blocks:
        return InvalidArgument(
            f"max_hit_blocks {max_hit_blocks} and num_full_blocks {num_full_blocks} must not "
            f"exceed num_blocks {num_blocks}"
        )
    if not pool.enable_caching:
        return None
    fine = request_block_hashes(request)
    hashes = coarse_hashes(fine, block_size // pool.hash_block_size)
    if len(hashes) < num_full_blocks:
        return InvalidArgument(
            f"request has {len(hashes)} block hashes at block_size {block_size}, "
            f"needs {num_full_blocks}"
        )
    try:
        check_bytes(hashes[: max(max_hit_blocks, num_full_blocks)])
    except InvalidArgument as error:
        return error
    # Every position the call may key: the hits it finds are not known before the scan.
    return write_rejection(pool, request, fine, 0, num_full_blocks, block_size,
                           kv_cache_group_id)  # type: ignore[arg-type]


def write_rejection(
    pool: Any, request: Any, hashes: Sequence[Any], num_cached: int, num_full: int,
    block_size: int, group_id: int,
) -> KvPoolError | None:
    """What ``cache_full_blocks`` checks of the hashes it reads — ``bytes``, and with events
    on, everything its ``BlockStored`` needs — once its arguments passed. Pure."""
    if num_cached >= num_full:
        return None
    ratio = block_size // pool.hash_block_size
    error = pre.bad_block_hashes(hashes, num_cached, num_full, ratio)
    if error is None and getattr(pool, "enable_kv_cache_events", False):
        error = stored_rejection(request, pool.event_context, hashes, num_cached, num_full,
                                 block_size, group_id, getattr(pool, "event_builder", None))
    return error


def cache_item(item: Any) -> tuple[Any, Any, Any, Any]:
    """``(request, blocks, num_cached, num_full)`` of a cache item, or InvalidArgument."""
    try:
        request, blocks, num_cached, num_full = item
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"a cache item is (request, blocks, num_cached, num_full), got {item!r}"
        ) from None
    return request, blocks, num_cached, num_full


def checked_step(
    pool: Any, cache_items: Sequence[Any], num_new_blocks: object, free_tables: Sequence[Any],
    block_size: object, kv_cache_group_id: object,
) -> tuple[KvPoolError | None, list[tuple[Any, Any, Any, Any]], list[Any]]:
    """``(error, items, tables)``: the first error of ``step`` (parts checked in the order
    they run, each against the state its predecessors leave), or the items and reversed
    tables in the form to pass on (an integer array as it came: the shell converts those
    fastest)."""
    sim = Simulation(pool)
    items: list[tuple[Any, Any, Any, Any]] = []
    tables: list[Any] = []
    if not isinstance(free_tables, (list, tuple)):
        free_tables = list(free_tables)  # a one-shot iterator: read here, passed on converted
    try:
        for item in cache_items:
            request, blocks, num_cached, num_full = cache_item(item)
            hashes = request_block_hashes(request)
            ids = blocks if is_int_array(blocks) else candidate_table(
                lambda part: table_ids(pool, part), blocks, num_cached, num_full)
            error = cache_arguments_rejection(
                pool.enable_caching, pool.hash_block_size, len(hashes),
                len(ids), num_cached, num_full, block_size, kv_cache_group_id, None,
            ) or write_rejection(pool, request, hashes, num_cached, num_full,  # type: ignore[arg-type]
                                 block_size, kv_cache_group_id)  # type: ignore[arg-type]
            if error:
                return error, items, tables
            if num_cached < num_full:  # type: ignore[operator]
                cands = ids[num_cached:num_full]  # type: ignore[misc]
                cands = cands.tolist() if isinstance(cands, np.ndarray) else list(cands)
                error = candidates_rejection(sim, cands, num_cached,  # type: ignore[arg-type]
                                             block_size, None)  # type: ignore[arg-type]
                if error:
                    return error, items, tables
            items.append((request, ids, num_cached, num_full))
        n = count(num_new_blocks)
        error = allocation_rejection(n, pool.get_num_free_blocks())
        if error:
            return error, items, tables
        sim.pending = n  # type: ignore[assignment]
        last = len(free_tables) - 1
        for i, table in enumerate(free_tables):
            if is_int_array(table):
                reverse = table[::-1]
                ids = tuple(reverse.tolist())
            else:
                ids = reverse = table_ids(pool, table)[::-1]
            error = release_rejection(sim, ids, i < last)  # type: ignore[arg-type]
            if error:
                return error, items, tables
            tables.append(reverse)
    except KvPoolError as error:  # a table that does not convert
        return error, items, tables
    return None, items, tables
