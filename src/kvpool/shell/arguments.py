"""Argument conversion: what callers may pass for ids, tables, group ids, masks and hashes.

Block ids come as ints, numpy integers or 1-D integer arrays; blocks of another pool come as
:class:`BlockRef`; a request's hashes come from ``request.block_hashes``. Each converter
returns plain Python values or raises the typed error the docs name — never ``TypeError``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpool.errors import InvalidArgument, InvalidBlockId
from kvpool.hash_list import BlockHashList
from kvpool.spec import preconditions as pre
from kvpool.spec.state import NULL_BLOCK_ID


@dataclass(frozen=True)
class BlockRef:
    """A block named together with its owning pool (multi-pool routing, vLLM 0.30+).

    Plain ints always mean "a block of the pool I am calling". A ``BlockRef`` lets one
    ``free_blocks`` batch carry blocks of other pools: they are forwarded to their owner, in
    first-seen pool order, after the local blocks. Every other operation only takes local
    blocks and raises :class:`ForeignBlock` for a ``BlockRef`` to another pool.
    """

    pool: Any
    block_id: int



def request_block_hashes(request: object) -> Sequence[bytes]:
    """``request.block_hashes``, which must be a sequence (a list or tuple; a one-shot
    iterator would be consumed by the first backend that reads it). Entries are checked
    where they are read (:func:`kvpool.spec.preconditions.bad_block_hashes`)."""
    try:
        hashes = request.block_hashes  # type: ignore[attr-defined]
    except AttributeError:
        raise InvalidArgument(
            f"request {request!r} has no block_hashes (a list of bytes)"
        ) from None
    if type(hashes) is list or type(hashes) is BlockHashList or type(hashes) is tuple:
        return hashes
    if not isinstance(hashes, Sequence) or isinstance(hashes, (str, bytes, bytearray)):
        raise InvalidArgument(
            f"request.block_hashes must be a list of bytes, got {type(hashes).__name__}"
        )
    return hashes


def as_block_id(value: object) -> int:
    """One block id as a Python int (numpy integers accepted, bools and floats rejected)."""
    if type(value) is int:  # the common case; the ABC check below costs ~1 µs per id
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise InvalidBlockId(f"block id must be an int, got {value!r}")
    return int(value)


def as_block_ids(blocks: Iterable[object]) -> tuple[int, ...]:
    """A batch of local block ids as a tuple of ints (numpy arrays take a fast path)."""
    if isinstance(blocks, np.ndarray):
        check_id_array(blocks)
        return tuple(blocks.tolist())
    return tuple(as_block_id(b) for b in blocks)


def as_pool_block_ids(blocks: Iterable[object], num_blocks: int) -> tuple[int, ...]:
    """:func:`as_block_ids`, each also an id of a pool of ``num_blocks`` blocks (the reads of
    :class:`kvpool.protocol.BlockObserver` that take a batch)."""
    ids = as_block_ids(blocks)
    for b in ids:
        if not 0 <= b < num_blocks:
            raise InvalidBlockId(f"block id {b} is out of range [0, {num_blocks})")
    return ids


def check_id_array(blocks: np.ndarray) -> None:
    """Raise :class:`InvalidBlockId` unless ``blocks`` is a 1-D integer array."""
    if blocks.ndim != 1 or blocks.dtype.kind not in "iu":
        raise InvalidBlockId(
            f"block id array must be 1-D integer, got {blocks.dtype} {blocks.shape}"
        )


def candidate_table(to_ids: Callable[[Any], tuple[int, ...]], blocks: Iterable[object],
                    num_cached: object, num_full: object) -> tuple[int, ...]:
    """A block table as ``cache_full_blocks`` reads it: its length and its candidates.

    Only the candidates ``blocks[num_cached:num_full]`` are read (BEHAVIOUR.md §6.6 step 2,
    as in vLLM), so only they are converted, by ``to_ids``; every other position holds the
    null id, which no check and no write reads. Converting the whole table instead made a
    decode step's one-block cache write O(table length). Counts that are not a valid
    non-empty range convert nothing: the spec's count checks raise, or the call is a no-op.
    """
    if isinstance(blocks, np.ndarray):
        check_id_array(blocks)
        table: Any = blocks
    else:
        table = blocks if type(blocks) is list or type(blocks) is tuple else tuple(blocks)
    n = len(table)
    if not (pre.is_count(num_cached) and pre.is_count(num_full) and num_cached < num_full):
        return (NULL_BLOCK_ID,) * n
    lo, hi = min(num_cached, n), min(num_full, n)
    return (NULL_BLOCK_ID,) * lo + to_ids(table[lo:hi]) + (NULL_BLOCK_ID,) * (n - hi)


def as_group_id(value: object) -> Any:
    """A numpy integer group id as a Python int; anything else is left for validation (so
    the result is typed ``Any``: an ``int`` once the call's checks have passed)."""
    if isinstance(value, np.integer):
        return int(value)
    return value


def as_group_ids(values: Iterable[object]) -> tuple[Any, ...]:
    """A lookup's group ids as a tuple (numpy integers as Python ints; each id is validated
    where it is read). ``None``, a single int, a string or anything else that is not a
    collection of ids raises :class:`InvalidArgument`."""
    if type(values) is tuple or type(values) is list:
        groups: tuple[Any, ...] = tuple(values)
        for g in groups:
            if type(g) is not int:  # numpy ints to convert (or bad ids, checked later)
                return tuple(as_group_id(g) for g in groups)
        return groups  # the common case: a few plain ints (~60 ns, no generator)
    if isinstance(values, (str, bytes, bytearray)) or not isinstance(values, Iterable):
        raise InvalidArgument(
            f"kv_cache_group_ids must be a sequence of group ids, got {values!r}"
        )
    return tuple(as_group_id(g) for g in values)


def as_mask(mask: Sequence[object] | None) -> tuple[bool, ...] | None:
    """A block mask as a tuple of bools: entries are bools (numpy's too) or the ints 0/1;
    a 1-D array of them works. Anything else raises :class:`InvalidArgument` (a truthy
    string or a row of a 2-D array is not a yes/no)."""
    if mask is None:
        return None
    if isinstance(mask, np.ndarray):
        if mask.ndim != 1 or mask.dtype.kind not in "biu":
            raise InvalidArgument(
                f"block_mask must be a 1-D bool array, got {mask.dtype} {mask.shape}"
            )
        mask = mask.tolist()
    elif isinstance(mask, (str, bytes)) or not isinstance(mask, Iterable):
        raise InvalidArgument(f"block_mask must be a sequence of bools, got {mask!r}")
    out: tuple[Any, ...] = tuple(mask)
    if set(map(type, out)) <= {bool}:
        return out
    for i, m in enumerate(out):
        if not (isinstance(m, (bool, np.bool_)) or (
            isinstance(m, (numbers.Integral, np.integer)) and m in (0, 1)
        )):
            raise InvalidArgument(f"block_mask[{i}] is {m!r}, not a bool")
    return tuple(bool(m) for m in out)
