"""The abstract pool state: everything a block pool observably holds, as plain values.

A pool of ``num_blocks`` blocks is fully described by:

* ``ref_cnt[b]`` — how many holders block ``b`` has (``0`` ⇔ free). The null block's entry is
  always 0: its count is not maintained.
* ``free_queue`` — the free blocks, front first. The front is the next block to be allocated
  (and so evicted); freed uncached blocks enter at the front, freed cached blocks at the tail.
* ``primary_key[b]`` / ``primary_tokens[b]`` — the block's one primary prefix-cache key and
  how many prefix tokens it covers (both ``None`` when the block has no cache identity).
* ``secondary_keys[b]`` — further keys of the block, in insertion order (no empty entries).
* ``cache`` — the hash table: key → block ids under that key, earliest inserted first. No
  content de-duplication: block tables are append-only, so two equal blocks coexist.
* ``watchers`` — blocks with a pending reuse watcher, in watcher-table order.
* ``event_count`` — how many events this pool has emitted; the next event's sequence number.

The state is an immutable dataclass whose fields can be set directly, so CrossHair can build
arbitrary states and the spec's operations can be pure functions ``state -> state``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import NewType, Protocol

NULL_BLOCK_ID = 0
"""Block 0 is the null block: a placeholder for skipped positions, never handed out."""

MAX_REF_CNT = 2**31 - 1
"""Most references one block may hold: the fast backend counts in int32, and every backend
refuses a ``touch`` beyond it (``RefCountOverflow``) so that all stay identical."""

BlockIds = NewType("BlockIds", tuple[int, ...])
"""A batch of block ids as one call passes it (a plain tuple at runtime). Its own name so that
the CrossHair plugin can build batches its own way: short, often with a repeated id
(``docs/contracts.md``). Only the contracted wrappers use it."""

GroupIds = NewType("GroupIds", tuple[int, ...])
"""The group ids of one ``get_cached_block`` call (a plain tuple at runtime); see ``BlockIds``.
Only its precondition contract uses it: the operation contract keeps symbolic group ids, with
which the solver lines a group up with a key of the state (measured: a hit on the newest
duplicate found in 68 paths with them, not in 1,241 with drawn groups)."""

# The argument types of the focused contracts (kvpool.spec.focused_contracts): plain values at
# runtime, their own names only so that the CrossHair plugin draws each from a small domain.

ReleasedBatch = NewType("ReleasedBatch", tuple[int, ...])
"""Two to four distinct held non-null blocks (a batch each of whose blocks a release empties)."""

KeyedBatch = NewType("KeyedBatch", tuple[int, ...])
"""Two to four distinct blocks that carry a primary key."""

PopCount = NewType("PopCount", int)
"""A number of blocks to pop: two up to the length of the free queue."""

CachedHash = NewType("CachedHash", bytes)
"""A block hash that the keys of a built state use."""

HitGroups = NewType("HitGroups", tuple[int, ...])
"""Two to four group ids among the key alphabet's groups (0 and 1), repeats allowed."""

BlockId = NewType("BlockId", int)
"""One block id: an id of the pool, or one of the two just outside it (-1, ``num_blocks``)."""

CacheFullCall = NewType("CacheFullCall", tuple)
"""The arguments of one well-formed ``cache_full_blocks`` call after ``state``, as a tuple
(hashes, ids, num_cached, num_full, block_size, group_id, mask)."""

CacheFullProbe = NewType("CacheFullProbe", tuple)
"""A ``CacheFullCall`` with at most one of its parts broken (one §12 row at a time)."""


@dataclass(frozen=True)
class PoolState:
    """One pool, as a value. Two pools agree iff their states are equal."""

    num_blocks: int
    enable_caching: bool
    hash_block_size: int
    enable_events: bool
    ref_cnt: tuple[int, ...]
    free_queue: tuple[int, ...]
    primary_key: tuple[bytes | None, ...]
    primary_tokens: tuple[int | None, ...]
    secondary_keys: dict[int, tuple[bytes, ...]] = field(default_factory=dict)
    cache: dict[bytes, tuple[int, ...]] = field(default_factory=dict)
    watchers: tuple[int, ...] = ()
    event_count: int = 0


def initial_state(
    num_blocks: int,
    *,
    enable_caching: bool = True,
    hash_block_size: int = 16,
    enable_events: bool = False,
) -> PoolState:
    """A fresh pool: every block free in id order, the null block taken out of the queue."""
    return PoolState(
        num_blocks=num_blocks,
        enable_caching=enable_caching,
        hash_block_size=hash_block_size,
        enable_events=enable_events,
        ref_cnt=(0,) * num_blocks,
        free_queue=tuple(range(1, num_blocks)),
        primary_key=(None,) * num_blocks,
        primary_tokens=(None,) * num_blocks,
    )


class PoolView(Protocol):
    """The reads the preconditions make. A :class:`PoolState` is one; a backend with another
    representation (the reference's object graph) offers a live view and so runs the spec's
    own checks instead of a copy of them."""

    @property
    def num_blocks(self) -> int: ...
    @property
    def enable_caching(self) -> bool: ...
    @property
    def hash_block_size(self) -> int: ...
    @property
    def ref_cnt(self) -> Sequence[int]: ...
    @property
    def primary_key(self) -> Sequence[bytes | None]: ...
    @property
    def primary_tokens(self) -> Sequence[int | None]: ...
    @property
    def secondary_keys(self) -> Mapping[int, Iterable[bytes]]: ...
    @property
    def free_queue(self) -> Sized: ...


def keys_of_block(state: PoolView, block_id: int) -> tuple[bytes, ...]:
    """All keys a block carries: primary first, then secondaries in insertion order."""
    primary = state.primary_key[block_id]
    if primary is None:
        return ()
    return (primary, *state.secondary_keys.get(block_id, ()))


def is_free(state: PoolState, block_id: int) -> bool:
    """Whether a non-null block is free (in the queue, no holder)."""
    return state.ref_cnt[block_id] == 0


def replace_at(values: tuple, index: int, value: object) -> tuple:
    """``values`` with position ``index`` replaced (tuples are immutable)."""
    return values[:index] + (value,) + values[index + 1 :]
