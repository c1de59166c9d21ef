"""KV events on the wire: what KV-aware routers consume when one engine is not enough.

vLLM publishes its KV cache events over ZeroMQ as msgpack; routers such as llm-d's KV cache
indexer or NVIDIA Dynamo's router subscribe to every engine and learn which engine holds which
prefix. This package speaks the same wire (vLLM 0.33, byte for byte), so such a router can
follow a kvpool pool unchanged:

* :mod:`~kvpool.wire.encoding` — the msgpack structs and ``encode_batch`` / ``decode_batch``;
* :mod:`~kvpool.wire.publisher` — ``EventPublisher``: PUB + replay ROUTER, off the pool's thread;
* :mod:`~kvpool.wire.subscriber` — ``Subscriber``: gap detection, replay, restart detection;
* :mod:`~kvpool.wire.index` — ``FleetIndex``: the cache index per engine and rank, and the
  hit rate a router would predict.

Needs the ``wire`` extra (``pip install 'kvpool[wire]'``: msgspec, pyzmq, rich). See
``docs/wire.md``.
"""

from __future__ import annotations

from kvpool.wire.encoding import BatchEncoder, WireBatch, decode_batch, encode_batch
from kvpool.wire.endpoints import (
    EndpointError,
    EndpointUnavailable,
    default_replay_endpoint,
    offset_endpoint,
)
from kvpool.wire.index import FleetIndex, RankIndex
from kvpool.wire.publisher import EventPublisher, PublisherClosed, PublisherConfig, PublisherStats
from kvpool.wire.subscriber import Source, SourceStats, Subscriber

__all__ = [
    "BatchEncoder",
    "EndpointError",
    "EndpointUnavailable",
    "EventPublisher",
    "FleetIndex",
    "PublisherClosed",
    "PublisherConfig",
    "PublisherStats",
    "RankIndex",
    "Source",
    "SourceStats",
    "Subscriber",
    "WireBatch",
    "decode_batch",
    "default_replay_endpoint",
    "encode_batch",
    "offset_endpoint",
]
