"""The wire format of KV events: vLLM 0.33's msgpack encoding, byte for byte.

A published message carries one **batch**: a msgpack array ``[ts, events, data_parallel_rank]``
(``ts`` a float64 from ``time.time()``, the rank ``nil`` when unset). Array-like structs keep
every field, defaults included, so the rank is always there. Each **event** is a msgpack map
whose first entry is ``"type": <event name>``. The fields follow in declaration order, and an
optional field is left out while it holds its default (``None``). The required ones
(``block_hashes`` … ``lora_name`` of ``BlockStored``, ``block_hashes`` and ``medium`` of
``BlockRemoved``) are always written, even when they are ``None``.

Block hashes are written as the events carry them: an ``int`` (the low 64 bits of the digest,
vLLM's default) becomes a msgpack uint, ``bytes`` (a pool built with
``use_int_block_hashes=False``) a msgpack bin. The structs below mirror vLLM's field lists;
:func:`encode_batch` converts kvpool's events (:mod:`kvpool.events`) to them, and
:func:`decode_batch` reads any conforming payload, vLLM's included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from kvpool import events as ev
from kvpool.keys import ExternalBlockHash


class WireBlockStored(msgspec.Struct, tag="BlockStored", omit_defaults=True, gc=False):
    """``BlockStored`` on the wire; the first seven fields are always written."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class WireBlockRemoved(msgspec.Struct, tag="BlockRemoved", omit_defaults=True, gc=False):
    """``BlockRemoved`` on the wire (kvpool always sends exactly one hash)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class WireAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", omit_defaults=True, gc=False):
    """``AllBlocksCleared`` on the wire: just its tag."""


WireEvent = WireBlockStored | WireBlockRemoved | WireAllBlocksCleared


class WireBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One published batch: ``[ts, events, data_parallel_rank]``."""

    ts: float
    events: list[WireEvent]
    data_parallel_rank: int | None = None


def to_wire(event: ev.KVCacheEvent) -> WireEvent:
    """The wire struct of one kvpool event (its ``seq`` stays behind: the wire numbers batches)."""
    if isinstance(event, ev.BlockStored):
        return WireBlockStored(
            event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size,
            event.lora_id, event.medium, event.lora_name, event.extra_keys, event.group_idx,
            event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window, event.locality,
            event.ownership, event.session_id, event.lookahead_token_ids,
        )
    if isinstance(event, ev.BlockRemoved):
        return WireBlockRemoved(event.block_hashes, event.medium, event.group_idx,
                                event.locality, event.ownership)
    if isinstance(event, ev.AllBlocksCleared):
        return WireAllBlocksCleared()
    raise TypeError(f"not a kvpool KV event: {type(event).__name__}")


def from_wire(event: WireEvent, seq: int = -1) -> ev.KVCacheEvent:
    """The kvpool event of one wire struct, numbered ``seq`` (for :func:`kvpool.events.replay`)."""
    if isinstance(event, WireBlockStored):
        fields = msgspec.structs.asdict(event)
        return ev.BlockStored(**fields, seq=seq)
    if isinstance(event, WireBlockRemoved):
        return ev.BlockRemoved(**msgspec.structs.asdict(event), seq=seq)
    return ev.AllBlocksCleared(seq=seq)


def _numpy_scalars(obj: Any) -> Any:
    """Token ids may arrive as numpy integers; they go on the wire as the same msgpack ints."""
    item = getattr(obj, "item", None)
    if item is not None:
        value = item()
        if isinstance(value, (int, float)):
            return value
    raise TypeError(f"cannot encode {type(obj).__name__} in a KV event")


class BatchEncoder:
    """Encodes batches of kvpool events; one per thread (msgspec encoders keep a buffer)."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_numpy_scalars)

    def encode(self, events: Sequence[ev.KVCacheEvent], ts: float,
               data_parallel_rank: int | None = None) -> bytes:
        """The payload of one batch, as vLLM's publisher would send it."""
        batch = WireBatch(float(ts), [to_wire(e) for e in events], data_parallel_rank)
        return self._encoder.encode(batch)


_DEFAULT_ENCODER = BatchEncoder()
_DECODER = msgspec.msgpack.Decoder(WireBatch)


def encode_batch(events: Sequence[ev.KVCacheEvent], ts: float,
                 data_parallel_rank: int | None = None) -> bytes:
    """The payload of one batch (a module-level encoder: use :class:`BatchEncoder` per thread).

    >>> from kvpool.events import AllBlocksCleared
    >>> encode_batch([AllBlocksCleared(seq=0)], ts=1.5, data_parallel_rank=0).hex()
    '93cb3ff80000000000009181a474797065b0416c6c426c6f636b73436c656172656400'
    """
    return _DEFAULT_ENCODER.encode(events, ts, data_parallel_rank)


def decode_batch(payload: bytes) -> WireBatch:
    """Decode one payload; :class:`msgspec.DecodeError` if it is not a KV event batch."""
    return _DECODER.decode(payload)


__all__ = [
    "BatchEncoder",
    "WireAllBlocksCleared",
    "WireBatch",
    "WireBlockRemoved",
    "WireBlockStored",
    "WireEvent",
    "decode_batch",
    "encode_batch",
    "from_wire",
    "to_wire",
]
