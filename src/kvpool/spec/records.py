"""Event records: what an operation tells the outside world, before any request is consulted.

The spec (and every backend core) emits these small records; :mod:`kvpool.events` turns them
into vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` by reading token ids and
extra keys from the request. Each record carries the pool's event sequence number.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StoredRecord:
    """``cache_full_blocks`` (or ``emit_cached_block_events``) stored these positions.

    ``positions`` are logical block indices in ``[num_cached, num_full)`` that received a key
    (null and masked-out blocks are skipped); ``hashes`` their block hashes (no group id).
    """

    seq: int
    group_id: int
    block_size: int
    num_cached: int
    num_full: int
    positions: tuple[int, ...]
    hashes: tuple[bytes, ...]


@dataclass(frozen=True)
class PartialStoredRecord:
    """``cache_partial_block`` registered a new entry ending at ``num_tokens``."""

    seq: int
    group_id: int
    num_tokens: int
    block_hash: bytes


@dataclass(frozen=True)
class RemovedRecord:
    """One key left the hash table."""

    seq: int
    key: bytes


@dataclass(frozen=True)
class ClearedRecord:
    """A successful ``reset_prefix_cache`` dropped every key at once."""

    seq: int


EventRecord = StoredRecord | PartialStoredRecord | RemovedRecord | ClearedRecord
