"""KV cache events (BEHAVIOUR.md §7), numbered, and their replay.

Field names follow vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``. Beyond
vLLM, every event carries ``seq``: a per-pool sequence number with no gaps, so a consumer can
tell it missed nothing; :func:`replay` turns a stream back into the set of cached keys.

Backend cores emit small records (:mod:`kvpool.spec.records`); :class:`EventLog` turns them
into these events right away, reading token ids and extra keys from the request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.keys import ExternalBlockHash, external_block_hash, key_group, key_hash
from kvpool.spec.records import (
    ClearedRecord,
    EventRecord,
    PartialStoredRecord,
    RemovedRecord,
    StoredRecord,
)


@dataclass(frozen=True)
class BlockStored:
    """Blocks entered the prefix cache (one event per ``cache_full_blocks`` call)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None
    seq: int = -1


@dataclass(frozen=True)
class BlockRemoved:
    """One key left the prefix cache (``block_hashes`` always holds exactly one hash)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None
    seq: int = -1


@dataclass(frozen=True)
class AllBlocksCleared:
    """A successful ``reset_prefix_cache``: every key is gone."""

    seq: int = -1


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventContext:
    """Pool-wide settings events are built with."""

    medium: str = "GPU"
    hash_block_size: int = 16
    num_lookahead_tokens: int = 0
    use_int_block_hashes: bool = True

    def external(self, block_hash: bytes) -> ExternalBlockHash:
        return external_block_hash(block_hash, use_int=self.use_int_block_hashes)


def _lora(request: Any) -> tuple[int | None, str | None]:
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return None, None
    return lora.lora_int_id, lora.lora_name


def _stored(record: StoredRecord, request: Any, ctx: EventContext) -> BlockStored:
    from kvpool.hashing import event_extra_keys, resolve_block_hashes

    bs = record.block_size
    hashes = resolve_block_hashes(request.block_hashes, ctx.hash_block_size, bs)
    tokens = list(request.all_token_ids)
    parent = None if record.num_cached == 0 else ctx.external(hashes[record.num_cached - 1])
    extra = [
        event_extra_keys(request, k * bs, (k + 1) * bs, ctx.num_lookahead_tokens)
        for k in record.positions
    ]
    lookahead = None
    if ctx.num_lookahead_tokens:
        n = ctx.num_lookahead_tokens
        lookahead = [tokens[(k + 1) * bs : (k + 1) * bs + n] for k in record.positions]
    lora_id, lora_name = _lora(request)
    return BlockStored(
        block_hashes=[ctx.external(h) for h in record.hashes],
        parent_block_hash=parent,
        token_ids=tokens[record.num_cached * bs : record.num_full * bs],
        block_size=bs,
        lora_id=lora_id,
        medium=ctx.medium,
        lora_name=lora_name,
        extra_keys=extra or None,
        group_idx=record.group_id,
        session_id=getattr(request, "session_id", None),
        lookahead_token_ids=lookahead,
        seq=record.seq,
    )


def _partial_stored(record: PartialStoredRecord, request: Any, ctx: EventContext) -> BlockStored:
    from kvpool.hashing import event_extra_keys

    hbs = ctx.hash_block_size
    end = record.num_tokens
    index = end // hbs - 1
    parent = ctx.external(request.block_hashes[index - 1]) if index > 0 else None
    tokens = list(request.all_token_ids)
    lookahead = None
    if ctx.num_lookahead_tokens:
        lookahead = [tokens[end : end + ctx.num_lookahead_tokens]]
    lora_id, lora_name = _lora(request)
    return BlockStored(
        block_hashes=[ctx.external(record.block_hash)],
        parent_block_hash=parent,
        token_ids=tokens[end - hbs : end],
        block_size=hbs,
        lora_id=lora_id,
        medium=ctx.medium,
        lora_name=lora_name,
        extra_keys=[event_extra_keys(request, end - hbs, end, ctx.num_lookahead_tokens)],
        group_idx=record.group_id,
        session_id=getattr(request, "session_id", None),
        lookahead_token_ids=lookahead,
        seq=record.seq,
    )


def materialize(record: EventRecord, request: Any, ctx: EventContext) -> KVCacheEvent:
    """The public event for one core record (``request`` is needed for stored blocks)."""
    if isinstance(record, RemovedRecord):
        return BlockRemoved(
            block_hashes=[ctx.external(key_hash(record.key))],
            medium=ctx.medium,
            group_idx=key_group(record.key),
            seq=record.seq,
        )
    if isinstance(record, ClearedRecord):
        return AllBlocksCleared(seq=record.seq)
    if isinstance(record, StoredRecord):
        return _stored(record, request, ctx)
    return _partial_stored(record, request, ctx)


class EventLog:
    """Pending events of one pool; ``take`` hands them over and starts a new list."""

    def __init__(self, ctx: EventContext) -> None:
        self.ctx = ctx
        self._pending: list[KVCacheEvent] = []

    def record(self, records: Iterable[EventRecord], request: Any = None) -> None:
        for r in records:
            self._pending.append(materialize(r, request, self.ctx))

    def take(self) -> list[KVCacheEvent]:
        events, self._pending = self._pending, []
        return events

    def pending(self) -> tuple[KVCacheEvent, ...]:
        return tuple(self._pending)


CacheIndex = Counter
"""``Counter[(external hash, group)] → number of blocks under that key``."""


class EventGap(ValueError):
    """An event stream skipped or repeated a sequence number."""


def replay(events: Sequence[KVCacheEvent], *, start_seq: int = 0) -> CacheIndex:
    """Rebuild the cache index from an event stream (from the pool's first event).

    Each stored hash adds one (key, block) pair, each removal drops one, a clear drops all;
    the result counts blocks per key, so duplicates under one key are accounted for. Raises
    :class:`EventGap` when sequence numbers are not consecutive from ``start_seq``.
    """
    index: Counter = Counter()
    expected = start_seq
    for event in events:
        if event.seq != expected:
            raise EventGap(f"expected event seq {expected}, got {event.seq}")
        expected += 1
        if isinstance(event, AllBlocksCleared):
            index.clear()
        elif isinstance(event, BlockRemoved):
            key = (event.block_hashes[0], event.group_idx)
            index[key] -= 1
            if index[key] <= 0:
                del index[key]
        else:
            for h in event.block_hashes:
                index[(h, event.group_idx)] += 1
    return index


def cache_index_of(cache: dict[bytes, tuple[int, ...]], ctx: EventContext) -> CacheIndex:
    """The index :func:`replay` should produce, computed from a pool's hash table."""
    return Counter(
        {(ctx.external(key_hash(k)), key_group(k)): len(ids) for k, ids in cache.items()}
    )
