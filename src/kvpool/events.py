"""KV cache events (BEHAVIOUR.md §7), numbered, and their replay.

Field names follow vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``. Beyond
vLLM, every event carries ``seq``: a per-pool sequence number with no gaps, so a consumer can
tell it missed nothing; :func:`replay` turns a stream back into the set of cached keys.

Backend cores emit small records (:mod:`kvpool.spec.records`); :class:`EventLog` turns them
into these events right away, reading token ids and extra keys from the request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from kvpool.errors import EventGap, InvalidArgument, InvalidEvent, KvPoolError
from kvpool.hash_list import BlockHashList
from kvpool.hashing.coarse import resolve_block_hashes
from kvpool.hashing.extra_keys import event_extra_keys, need_extra_keys
from kvpool.hashing.request_view import token_slice
from kvpool.keys import (
    GROUP_ID_BYTES,
    ExternalBlockHash,
    external_block_hash,
    key_group,
    key_hash,
)
from kvpool.spec.records import (
    ClearedRecord,
    EventRecord,
    PartialStoredRecord,
    RemovedRecord,
    StoredRecord,
)

# The two events a pool builds by the thousand keep the dataclass's fields, equality and
# immutability, with an __init__ that fills the instance dict in one update: the generated
# frozen __init__ sets each field through object.__setattr__ (2 µs for BlockStored, more
# than the rest of a one-block cache write's event). tests/events/test_event_building.py
# checks that each signature is the fields' own, defaults included.


@dataclass(frozen=True, init=False)
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

    def __init__(
        self,
        block_hashes: list[ExternalBlockHash],
        parent_block_hash: ExternalBlockHash | None,
        token_ids: list[int],
        block_size: int,
        lora_id: int | None,
        medium: str | None,
        lora_name: str | None = None,
        extra_keys: list[tuple[Any, ...] | None] | None = None,
        group_idx: int | None = None,
        kv_cache_spec_kind: str | None = None,
        kv_cache_spec_sliding_window: int | None = None,
        locality: str | None = None,
        ownership: str | None = None,
        session_id: str | None = None,
        lookahead_token_ids: list[list[int]] | None = None,
        seq: int = -1,
    ) -> None:
        self.__dict__.update(
            block_hashes=block_hashes, parent_block_hash=parent_block_hash,
            token_ids=token_ids, block_size=block_size, lora_id=lora_id, medium=medium,
            lora_name=lora_name, extra_keys=extra_keys, group_idx=group_idx,
            kv_cache_spec_kind=kv_cache_spec_kind,
            kv_cache_spec_sliding_window=kv_cache_spec_sliding_window, locality=locality,
            ownership=ownership, session_id=session_id,
            lookahead_token_ids=lookahead_token_ids, seq=seq,
        )

    def with_spec(self, kind: str | None, sliding_window: int | None) -> BlockStored:
        """A copy annotated with its group's ``kv_cache_spec_kind`` and sliding window (as
        the manager reports it; ``dataclasses.replace`` does the same at ten times the
        cost: it calls ``__init__`` by keyword)."""
        copy = object.__new__(type(self))
        object.__setattr__(copy, "__dict__", {
            **self.__dict__, "kv_cache_spec_kind": kind,
            "kv_cache_spec_sliding_window": sliding_window})
        return copy


@dataclass(frozen=True, init=False)
class BlockRemoved:
    """One key left the prefix cache (``block_hashes`` always holds exactly one hash)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None
    seq: int = -1

    def __init__(
        self,
        block_hashes: list[ExternalBlockHash],
        medium: str | None,
        group_idx: int | None = None,
        locality: str | None = None,
        ownership: str | None = None,
        seq: int = -1,
    ) -> None:
        self.__dict__.update(block_hashes=block_hashes, medium=medium, group_idx=group_idx,
                             locality=locality, ownership=ownership, seq=seq)


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

    def external_of_key(self, key: bytes) -> ExternalBlockHash:
        """:meth:`external` of a key's block hash (``key_hash(key)``), without the slice."""
        if self.use_int_block_hashes:
            return int.from_bytes(key[-GROUP_ID_BYTES - 8 : -GROUP_ID_BYTES], "big")
        return key_hash(key)

    def external_all(self, block_hashes: Iterable[bytes]) -> list[ExternalBlockHash]:
        """:meth:`external` of each hash (one comprehension: events report runs of them)."""
        if self.use_int_block_hashes:
            return [int.from_bytes(h[-8:], "big") for h in block_hashes]
        return [bytes(h) for h in block_hashes]


def _lora(request: Any) -> tuple[int | None, str | None]:
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return None, None
    return lora.lora_int_id, lora.lora_name


def _stored(record: StoredRecord, request: Any, ctx: EventContext,
            stored: Callable[..., Any] = BlockStored) -> Any:
    return stored_event(request, ctx, stored, record.hashes, record.positions,
                        record.num_cached, record.num_full, record.block_size,
                        record.group_id, record.seq)


_PACKED_RUN = 8
"""Positions from which a write's integer hashes are read from the packed companion (fewer:
one ``int.from_bytes`` each costs less than the array view)."""


def stored_event(request: Any, ctx: EventContext, stored: Callable[..., Any],
                 hashes: Sequence[bytes], positions: Sequence[int], num_cached: int,
                 num_full: int, block_size: int, group_id: int, seq: int) -> Any:
    """The ``BlockStored`` of a cache write that keyed ``positions`` (of ``[num_cached,
    num_full)``) with block hashes ``hashes``: what :func:`materialize` builds of the
    write's :class:`~kvpool.spec.records.StoredRecord`, with ``stored`` as its class."""
    bs = block_size
    fine = request.block_hashes
    coarse = fine if bs == ctx.hash_block_size else resolve_block_hashes(
        fine, ctx.hash_block_size, bs)
    parent = None if num_cached == 0 else ctx.external(coarse[num_cached - 1])
    if need_extra_keys(request):
        extra = [event_extra_keys(request, k * bs, (k + 1) * bs, ctx.num_lookahead_tokens)
                 for k in positions]
    else:  # no LoRA, multimodal item, salt or embeddings: no block has extra keys
        extra = [None] * len(positions)
    lookahead = None
    if ctx.num_lookahead_tokens:
        n = ctx.num_lookahead_tokens
        lookahead = [token_slice(request, (k + 1) * bs, (k + 1) * bs + n) for k in positions]
    lora_id, lora_name = _lora(request)
    external = None
    if (len(positions) >= _PACKED_RUN and type(fine) is BlockHashList and ctx.use_int_block_hashes
            and fine is coarse and len(positions) == num_full - num_cached):
        external = fine.tail_words(num_cached, num_full)  # an admission's run, in one pass
    return stored(
        block_hashes=external if external is not None else ctx.external_all(hashes),
        parent_block_hash=parent,
        token_ids=token_slice(request, num_cached * bs, num_full * bs),
        block_size=bs,
        lora_id=lora_id,
        medium=ctx.medium,
        lora_name=lora_name,
        extra_keys=extra or None,
        group_idx=group_id,
        session_id=getattr(request, "session_id", None),
        lookahead_token_ids=lookahead,
        seq=seq,
    )


def _partial_stored(record: PartialStoredRecord, request: Any, ctx: EventContext,
                    stored: Callable[..., Any] = BlockStored) -> Any:
    hbs = ctx.hash_block_size
    end = record.num_tokens
    index = end // hbs - 1
    parent = ctx.external(request.block_hashes[index - 1]) if index > 0 else None
    lookahead = None
    if ctx.num_lookahead_tokens:
        lookahead = [token_slice(request, end, end + ctx.num_lookahead_tokens)]
    lora_id, lora_name = _lora(request)
    return stored(
        block_hashes=[ctx.external(record.block_hash)],
        parent_block_hash=parent,
        token_ids=token_slice(request, end - hbs, end),
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


_U64 = (1 << 64) - 1


def _removal(removed: Callable[..., Any], external: ExternalBlockHash, group: int,
             medium: str | None, seq: int) -> Any:
    """The one place a removal's fields are named (per key, and per burst read in bulk)."""
    return removed(block_hashes=[external], medium=medium, group_idx=group, seq=seq)


def _removed(seq: int, key: bytes, ctx: EventContext,
             removed: Callable[..., Any] = BlockRemoved) -> Any:
    return _removal(removed, ctx.external_of_key(key), key_group(key), ctx.medium, seq)


def materialize(record: EventRecord, request: Any, ctx: EventContext, *,
                stored: Callable[..., Any] = BlockStored,
                removed: Callable[..., Any] = BlockRemoved,
                cleared: Callable[..., Any] = AllBlocksCleared) -> Any:
    """The public event for one core record (``request`` is needed for stored blocks).

    The three constructors are kvpool's event classes unless a caller passes others that
    take the same keyword arguments (the vLLM drop-in builds vLLM's own objects)."""
    if isinstance(record, RemovedRecord):  # the common event: one per evicted key
        return _removed(record.seq, record.key, ctx, removed)
    if isinstance(record, ClearedRecord):
        return cleared(seq=record.seq)
    if isinstance(record, StoredRecord):
        return _stored(record, request, ctx, stored)
    return _partial_stored(record, request, ctx, stored)


def _built_or_error(request: Any, build: Callable[..., Any],
                    *args: Any) -> tuple[Any, KvPoolError | None]:
    """``build(*args)`` (an event), or its failure as a typed error (the arguments are
    passed, not closed over: a decode step's write makes no closure)."""
    try:
        return build(*args), None
    except KvPoolError as error:
        return None, error
    except Exception as exc:  # noqa: BLE001 - whatever the request lacks, typed
        return None, InvalidArgument(
            f"request {getattr(request, 'request_id', request)!r} cannot be reported in a "
            f"BlockStored event: {exc!r} (with events on, a request needs all_token_ids and "
            "well-formed extra-key fields)"
        )


def _write_record(
    block_hashes: Sequence[bytes],
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    hash_block_size: int,
    seq: int,
) -> tuple[StoredRecord | None, KvPoolError | None]:
    """The ``StoredRecord`` of a cache write that keys every position of ``[num_cached,
    num_full)``, or the error its parent hash gives (the event reports it; it must be
    ``bytes``)."""
    ratio = block_size // hash_block_size
    if num_cached > 0 and not isinstance(block_hashes[num_cached * ratio - 1], bytes):
        h = block_hashes[num_cached * ratio - 1]
        return None, InvalidArgument(
            f"block_hashes[{num_cached * ratio - 1}] (the event's parent hash) is "
            f"{type(h).__name__}, not bytes"
        )
    positions = tuple(range(num_cached, num_full))
    # Each block's hash is its last hash block's: every ratio-th, from the block's end.
    if isinstance(block_hashes, (list, tuple)):  # one slice (a decode step keys one block)
        hashes = tuple(block_hashes[(num_cached + 1) * ratio - 1 : num_full * ratio : ratio])
    else:  # any other sequence: by index, as the caller's checks read it
        hashes = tuple(block_hashes[(k + 1) * ratio - 1] for k in positions)
    if len(hashes) != len(positions):  # the caller checked there are enough
        raise IndexError(f"{len(block_hashes)} block hashes for positions {positions}")
    return StoredRecord(seq, group_id, block_size, num_cached, num_full, positions,
                        hashes), None


def stored_rejection(
    request: Any,
    ctx: EventContext,
    block_hashes: Sequence[bytes],
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    build: EventBuilder | None = None,
) -> KvPoolError | None:
    """The error building the ``BlockStored`` of a cache write of positions
    ``[num_cached, num_full)`` would raise, or ``None`` — found *before* the pool moves, so
    that no key is stored and no sequence number taken for an event that cannot exist.

    It builds that very event for every position (a superset of those the write keys: null
    and masked blocks are skipped later), with the pool's builder ``build`` (kvpool's
    :func:`materialize` if ``None``) and ``seq`` -1, so it checks exactly what event
    creation will run. The call's own arguments must have passed their checks.
    O(positions + tokens).
    """
    trial, error = _write_record(block_hashes, num_cached, num_full, block_size, group_id,
                                 ctx.hash_block_size, -1)
    if trial is None:
        return error
    make = build or materialize
    return _built_or_error(request, make, trial, request, ctx)[1]


def build_stored_before(
    request: Any,
    ctx: EventContext,
    build: EventBuilder,
    block_hashes: Sequence[bytes],
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    seq: int,
) -> tuple[Any, KvPoolError | None]:
    """The ``BlockStored`` of a cache write that will key *every* position of
    ``[num_cached, num_full)`` (no null or masked candidate), built by ``build`` before the
    pool moves, with the sequence number the write will take: ``(event, None)``, or
    ``(None, error)`` with the error :func:`stored_rejection` would return.

    One build where :func:`stored_rejection`'s trial and the event after the write are two
    (the trial is this event up to ``seq``); the caller checks that the write's one record
    has that ``seq``."""
    record, error = _write_record(block_hashes, num_cached, num_full, block_size, group_id,
                                  ctx.hash_block_size, seq)
    if record is None:
        return None, error
    return _built_or_error(request, build, record, request, ctx)


def partial_stored_rejection(
    request: Any, ctx: EventContext, block_hashes: Sequence[bytes], num_tokens: object,
    group_id: object, build: EventBuilder | None = None,
) -> KvPoolError | None:
    """:func:`stored_rejection` for ``cache_partial_block`` (its arguments unchecked: an
    invalid call is left for the core to reject, in the spec's order)."""
    hbs = ctx.hash_block_size
    if (
        not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens <= 0
        or num_tokens % hbs or num_tokens // hbs > len(block_hashes)
        or not isinstance(group_id, int)
    ):
        return None
    block_hash = block_hashes[num_tokens // hbs - 1]
    if not isinstance(block_hash, bytes):
        return None
    trial = PartialStoredRecord(seq=-1, group_id=group_id, num_tokens=num_tokens,
                                block_hash=block_hash)
    make = build or materialize
    return _built_or_error(request, make, trial, request, ctx)[1]


EventBuilder = Callable[[EventRecord, Any, EventContext], Any]
"""Builds the public event of one core record: ``build(record, request, ctx)``."""


class EventLog:
    """Pending events of one pool; ``take`` hands them over and starts a new list.

    Events are built when recorded (a stored block's event reads its request, which changes
    later) by ``build``: :func:`materialize`, kvpool's event classes, unless the pool's owner
    chose another (:meth:`kvpool.shell.PoolShell.use_event_builder`)."""

    def __init__(self, ctx: EventContext, build: EventBuilder | None = None) -> None:
        self.ctx = ctx
        self.build = build or materialize
        self._pending: list[Any] = []

    @property
    def build(self) -> EventBuilder:
        return self._build

    @build.setter
    def build(self, build: EventBuilder) -> None:
        self._build = build
        # materialize's constructor of removals (its own or a partial's), for the bulk path
        # of record_removed; None for another builder, which gets the records one by one.
        self._removed: Callable[..., Any] | None = None
        # and its constructor of stored blocks, for stored_before's direct build.
        self._stored: Callable[..., Any] | None = None
        if build is materialize:
            self._removed, self._stored = BlockRemoved, BlockStored
        elif isinstance(build, partial) and build.func is materialize and not build.args:
            self._removed = build.keywords.get("removed", BlockRemoved)
            self._stored = build.keywords.get("stored", BlockStored)

    def record(self, records: Iterable[EventRecord], request: Any = None) -> None:
        build, ctx = self._build, self.ctx
        self._pending.extend([build(r, request, ctx) for r in records])

    @property
    def builds_removals_in_bulk(self) -> bool:
        """Whether :meth:`record_removals` may be used (the builder is materialize's)."""
        return self._removed is not None

    def record_removals(self, seqs: Sequence[int], hashes: Sequence[ExternalBlockHash],
                        groups: Sequence[int]) -> None:
        """An eviction burst read in bulk (external hashes and group ids already taken
        from the keys): the events :func:`materialize` builds of its removal records."""
        make, medium = self._removed, self.ctx.medium
        assert make is not None, "record_removals needs materialize's builder"
        self._pending.extend([_removal(make, h, g, medium, seq)
                              for seq, h, g in zip(seqs, hashes, groups, strict=True)])

    def record_removal_rows(self, rows: Sequence[Sequence[int]]) -> None:
        """Removals read by a kernel as ``(group id, hash bits, seq)`` rows (integer
        hashes; the bits are the hash's int64 pattern): what :func:`materialize` builds of
        their removal records."""
        make, medium = self._removed, self.ctx.medium
        assert make is not None, "record_removal_rows needs materialize's builder"
        self._pending.extend([_removal(make, bits & _U64, group, medium, seq)
                              for group, bits, seq in rows])

    def record_removed(self, removed: Sequence[tuple[int, bytes]]) -> None:
        """Evicted keys as ``(seq, key)``, in order: what :meth:`record` makes of their
        removal records, without building the records (an eviction burst removes
        thousands of keys, a decode step one or two)."""
        make, ctx = self._removed, self.ctx
        if make is None:
            self.record([RemovedRecord(seq, key) for seq, key in removed])
        else:
            self._pending.extend([_removed(seq, key, ctx, make) for seq, key in removed])

    def stored_before(self, request: Any, block_hashes: Sequence[bytes], num_cached: int,
                      num_full: int, block_size: int, group_id: int,
                      seq: int) -> tuple[Any, KvPoolError | None]:
        """:func:`build_stored_before` with this log's builder. With materialize's, the
        common write (one hash per block, hashes in a list, a ``bytes`` parent) is built
        straight from its fields, as :func:`materialize` builds it from the record, without
        the record (a decode step's write: half the cost of an event)."""
        ctx, make = self.ctx, self._stored
        hashes = block_hashes[num_cached:num_full] if isinstance(block_hashes, list) else ()
        if (make is None or block_size != ctx.hash_block_size
                or len(hashes) != num_full - num_cached or not hashes  # (sliced as the record)
                or (num_cached > 0 and not isinstance(block_hashes[num_cached - 1], bytes))):
            return build_stored_before(request, ctx, self._build, block_hashes, num_cached,
                                       num_full, block_size, group_id, seq)
        return _built_or_error(request, stored_event, request, ctx, make, hashes,
                               range(num_cached, num_full), num_cached, num_full, block_size,
                               group_id, seq)

    def append(self, event: Any) -> None:
        """One event built by :attr:`build` beforehand (:meth:`stored_before`)."""
        self._pending.append(event)

    def take(self) -> list[KVCacheEvent]:
        events, self._pending = self._pending, []
        return events

    def pending(self) -> tuple[KVCacheEvent, ...]:
        return tuple(self._pending)


CacheIndex = Counter
"""``Counter[(external hash, group)] → number of blocks under that key``."""


def replay(events: Iterable[KVCacheEvent], *, start_seq: int = 0) -> CacheIndex:
    """Rebuild the cache index from an event stream (from the pool's first event).

    Each stored hash adds one (key, block) pair, each removal drops one, a clear drops all;
    the result counts blocks per key, so duplicates under one key are accounted for. Raises
    :class:`~kvpool.errors.EventGap` when sequence numbers are not consecutive from
    ``start_seq``, and :class:`~kvpool.errors.InvalidEvent` for an object that is not an
    event (``events`` itself not iterable, e.g. ``None``), an event whose fields have the
    wrong type (:func:`_malformed`), a removal that does not carry exactly one hash, or —
    once the stream is known to be complete (``start_seq == 0``, or after a clear) — the
    removal of a key it never stored. A stream joined mid-way (``start_seq > 0``) may
    remove keys stored before it began; those removals are ignored until the first clear.
    A ``start_seq`` that is not an int raises :class:`~kvpool.errors.InvalidArgument`.
    """
    if type(start_seq) is not int:
        raise InvalidArgument(f"start_seq must be an int, got {start_seq!r}")
    if isinstance(events, (str, bytes, bytearray)) or not isinstance(events, Iterable):
        raise InvalidEvent(f"replay needs a sequence of KV events, got {events!r}")
    index: Counter = Counter()
    expected = start_seq
    complete = start_seq == 0
    for position, event in enumerate(events):
        if not isinstance(event, (BlockStored, BlockRemoved, AllBlocksCleared)):
            raise InvalidEvent(f"event {position} is a {type(event).__name__}, not a KV event")
        error = _malformed(event)
        if error:
            raise InvalidEvent(f"event {position} ({type(event).__name__}) {error}")
        if event.seq != expected:
            raise EventGap(f"expected event seq {expected}, got {event.seq}")
        expected += 1
        if isinstance(event, AllBlocksCleared):
            index.clear()
            complete = True
        elif isinstance(event, BlockRemoved):
            if len(event.block_hashes) != 1:
                raise InvalidEvent(
                    f"BlockRemoved seq {event.seq} carries {len(event.block_hashes)} hashes; "
                    "a removal names exactly one key"
                )
            key = (event.block_hashes[0], event.group_idx)
            if index[key] <= 0:
                del index[key]
                if complete:
                    raise InvalidEvent(
                        f"BlockRemoved seq {event.seq} removes {key}, which the stream never "
                        "stored"
                    )
                continue
            index[key] -= 1
            if index[key] == 0:
                del index[key]
        else:
            for h in event.block_hashes:
                index[(h, event.group_idx)] += 1
    return index


def _is_external_hash(value: object) -> bool:
    return (type(value) is int or type(value) is bytes) or (
        isinstance(value, (int, bytes)) and not isinstance(value, bool)
    )


def _malformed(event: KVCacheEvent) -> str | None:
    """What makes ``event`` unreplayable (fields of the wrong type), or ``None``: a ``seq``
    that is not an int, ``block_hashes`` that is not a list or tuple of hashes (ints or
    bytes), a ``group_idx`` that is neither ``None`` nor an int. O(hashes)."""
    seq = event.seq
    if type(seq) is not int:
        return f"has seq {seq!r}, not an int"
    if isinstance(event, AllBlocksCleared):
        return None
    hashes = event.block_hashes
    if not isinstance(hashes, (list, tuple)):
        return f"has block_hashes {hashes!r}, not a list of hashes"
    for i, h in enumerate(hashes):
        if not _is_external_hash(h):
            return f"has block_hashes[{i}] = {h!r}, not an int or bytes hash"
    group = event.group_idx
    if group is not None and (type(group) is not int):
        return f"has group_idx {group!r}, not an int or None"
    return None


def cache_index_of(cache: dict[bytes, tuple[int, ...]], ctx: EventContext) -> CacheIndex:
    """The index :func:`replay` should produce, computed from a pool's hash table."""
    return Counter(
        {(ctx.external(key_hash(k)), key_group(k)): len(ids) for k, ids in cache.items()}
    )
