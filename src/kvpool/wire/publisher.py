"""Publish a pool's KV events over ZeroMQ, off the pool's thread, as vLLM 0.33 does.

:meth:`EventPublisher.publish` is all the pool's thread does: it appends ``(ts, events)`` to a
bounded queue and returns. A background thread numbers each batch (0, 1, 2, … per
publisher), encodes it (:mod:`kvpool.wire.encoding`), sends ``(topic, seq, payload)`` on a PUB
socket, keeps it in a bounded replay buffer and answers replay requests on a ROUTER socket
(frames in :mod:`kvpool.wire.endpoints`).

**Never blocking the pool.** A PUB socket never blocks: a subscriber that lags past the
high-water mark loses messages (and recovers them through replay). The queue between the two
threads is bounded; where vLLM's ``publish`` would block on a full queue, kvpool's
*coalesces*: the events wait on the pool's side and travel with the next batch that finds room
(counted in :attr:`PublisherStats.queue_full`). Only if that backlog passes ``max_carry_events``
(the publisher thread is stuck) are events dropped, counted and logged; the publisher then
skips one sequence number, so every subscriber sees a gap that no replay fills and knows its
index is no longer exact. Nothing is dropped silently.

**Binding.** The publisher binds both sockets and subscribers connect (vLLM connects a PUB whose
endpoint has no wildcard; kvpool always binds what it is given, so ``tcp://127.0.0.1:5557``
serves loopback only). Each data-parallel rank offsets its ports
(:func:`~kvpool.wire.endpoints.offset_endpoint`) and stamps its batches with its rank.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import zmq

from kvpool.errors import InvalidConfig, KvPoolError
from kvpool.events import KVCacheEvent
from kvpool.wire.encoding import BatchEncoder
from kvpool.wire.endpoints import (
    END_SEQ,
    SEQ_BYTES,
    EndpointUnavailable,
    check_endpoint,
    offset_endpoint,
)

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 2
"""How long the publisher thread waits on the replay socket when its queue is empty."""

BIND_RETRY_S = 1.0
"""How long a bind retries an address in use: a closed socket frees its port asynchronously
(ZeroMQ's I/O thread), so a publisher restarted on the same endpoint may find it still taken."""


def _bind_retrying(sock: zmq.Socket, endpoint: str) -> str:
    """Bind; the endpoint actually bound (``tcp://host:0`` gets its port filled in)."""
    deadline = time.monotonic() + BIND_RETRY_S
    while True:
        try:
            sock.bind(endpoint)
            return sock.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class PublisherClosed(KvPoolError, RuntimeError):
    """``publish`` was called after ``close``."""


@dataclass(frozen=True)
class PublisherConfig:
    """Where and how to publish; the defaults are vLLM's (``buffer_steps``, ``hwm``, queue).

    ``endpoint`` and ``replay_endpoint`` are rank 0's; rank ``r`` binds them offset by ``r``.
    ``max_queue_size`` bounds the batches waiting for the publisher thread, and
    ``max_carry_events`` bounds the events held back on the pool's side when that queue is full.
    """

    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None
    data_parallel_rank: int = 0
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    max_carry_events: int = 1_000_000
    topic: str = ""
    linger_ms: int = 200

    def validate(self) -> None:
        check_endpoint(self.endpoint)
        if self.replay_endpoint is not None:
            check_endpoint(self.replay_endpoint)
        for name in ("buffer_steps", "max_queue_size", "max_carry_events"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidConfig(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.topic, str):
            raise InvalidConfig(f"topic must be a str, got {type(self.topic).__name__}")
        for name in ("data_parallel_rank", "hwm", "linger_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise InvalidConfig(f"{name} must be an int >= 0, got {value!r}")


@dataclass
class PublisherStats:
    """Counters of one publisher (a snapshot; see :meth:`EventPublisher.stats`).

    ``queue_full``: ``publish`` calls that found the queue full (their events were carried
    into a later batch); ``dropped_events``/``dropped_batches``: what the carry cap discarded
    (each drop burns one sequence number); ``send_s``: publisher-thread CPU time spent
    encoding, sending and buffering.
    """

    published_batches: int = 0
    published_events: int = 0
    queue_full: int = 0
    carried_events: int = 0
    dropped_events: int = 0
    dropped_batches: int = 0
    replay_requests: int = 0
    replayed_batches: int = 0
    bad_replay_requests: int = 0
    send_errors: int = 0
    queue_depth: int = 0
    next_seq: int = 0
    send_s: float = 0.0
    endpoints: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return dict(vars(self))


_LOST = object()
"""Queue marker: events were dropped here; the thread skips one sequence number."""


class EventPublisher:
    """A PUB + ROUTER publisher of KV event batches (see the module docstring).

    Use as a context manager, or call :meth:`close`. ``context`` lets tests share a ZeroMQ
    context (needed for ``inproc://``); by default the process-wide one is used.
    """

    def __init__(self, config: PublisherConfig | None = None, *,
                 context: zmq.Context | None = None) -> None:
        config = config or PublisherConfig()
        config.validate()
        self.config = config
        rank = config.data_parallel_rank
        self.endpoint = offset_endpoint(config.endpoint, rank)
        self.replay_endpoint = (None if config.replay_endpoint is None
                                else offset_endpoint(config.replay_endpoint, rank))
        self._topic = config.topic.encode("utf-8")
        self._queue: deque = deque()
        self._handed = 0  # queue items appended (pool side) ...
        self._done = 0  # ... and fully sent (publisher thread): flush() waits for equality
        self._carry: list[KVCacheEvent] = []
        self._lost_pending = False
        self._stats = PublisherStats()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._stop = threading.Event()
        self._closed = False
        self._lock = threading.Lock()  # publish() may be called from several threads
        ctx = context or zmq.Context.instance()
        self._pub, self._replay = self._bind(ctx)
        self._stats.endpoints = {"pub": self.endpoint, "replay": self.replay_endpoint or ""}
        self._thread = threading.Thread(target=self._run, name="kvpool-publisher", daemon=True)
        self._thread.start()

    def _bind(self, ctx: zmq.Context) -> tuple[zmq.Socket, zmq.Socket | None]:
        pub = ctx.socket(zmq.PUB)
        pub.set_hwm(self.config.hwm)
        pub.setsockopt(zmq.LINGER, self.config.linger_ms)
        replay = None
        try:
            self.endpoint = _bind_retrying(pub, self.endpoint)
            if self.replay_endpoint is not None:
                replay = ctx.socket(zmq.ROUTER)
                # A full replay plus its marker must fit: ZeroMQ may count up to HWM/2 messages
                # the peer already read, hence twice the buffer.
                replay.setsockopt(zmq.SNDHWM, 2 * (self.config.buffer_steps + 1))
                replay.setsockopt(zmq.LINGER, self.config.linger_ms)
                self.replay_endpoint = _bind_retrying(replay, self.replay_endpoint)
        except zmq.ZMQError as exc:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)
            where = self.replay_endpoint if replay is not None else self.endpoint
            raise EndpointUnavailable(f"cannot bind {where}: {exc}") from exc
        return pub, replay

    # -- the pool's side ---------------------------------------------------------------

    def publish(self, events: Sequence[KVCacheEvent], ts: float | None = None) -> None:
        """Hand one step's events to the publisher thread; returns at once, never blocks.

        An empty list publishes nothing (vLLM publishes a batch only when there are events).
        The list is handed over, not copied: pass a fresh one (``take_events`` returns one).
        """
        if self._closed:
            raise PublisherClosed("publish() after close()")
        if not events:
            return
        stamp = time.time() if ts is None else ts
        with self._lock:
            if len(self._queue) >= self.config.max_queue_size:
                self._hold_back(events)
                return
            if self._carry:
                events, self._carry = [*self._carry, *events], []
            if self._lost_pending:
                self._enqueue(_LOST)
                self._lost_pending = False
            self._enqueue((stamp, events))

    def _enqueue(self, item: object) -> None:
        self._handed += 1
        self._queue.append(item)

    def _hold_back(self, events: Sequence[KVCacheEvent]) -> None:
        stats = self._stats
        stats.queue_full += 1
        if len(self._carry) + len(events) > self.config.max_carry_events:
            stats.dropped_events += len(self._carry) + len(events)
            stats.dropped_batches += 1
            logger.warning(
                "KV event publisher stuck: dropped %d events (queue and carry full); "
                "subscribers will see an unrecoverable gap", len(self._carry) + len(events))
            self._carry = []
            self._lost_pending = True
            return
        self._carry.extend(events)
        stats.carried_events += len(events)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every batch handed over has been sent; whether it was within ``timeout``."""
        with self._lock:
            if self._carry or self._lost_pending:
                if self._lost_pending:
                    self._enqueue(_LOST)
                    self._lost_pending = False
                if self._carry:
                    self._enqueue((time.time(), self._carry))
                    self._carry = []
            handed = self._handed
        deadline = time.monotonic() + timeout
        while self._done < handed and self._thread.is_alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0005)
        return self._done >= handed

    def stats(self) -> PublisherStats:
        """A snapshot of the counters."""
        snapshot = PublisherStats(**vars(self._stats))
        snapshot.queue_depth = len(self._queue)
        snapshot.endpoints = dict(self._stats.endpoints)
        return snapshot

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (up to ``timeout`` seconds), stop the thread, close the sockets."""
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():  # cannot happen unless a send hangs: never close under it
            logger.warning("KV event publisher thread did not stop within %.1f s", timeout)
            return
        self._pub.close()
        if self._replay is not None:
            self._replay.close()

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the publisher thread ------------------------------------------------------------

    def _run(self) -> None:
        encoder = BatchEncoder()
        queue, replay = self._queue, self._replay
        while True:
            if replay is not None and replay.poll(0):
                self._serve_replay()
            if queue:
                began = time.thread_time()
                self._send(encoder, queue.popleft())
                self._stats.send_s += time.thread_time() - began
                self._done += 1
                continue
            if self._stop.is_set():
                return
            if replay is not None:
                replay.poll(IDLE_POLL_MS)
            else:
                self._stop.wait(IDLE_POLL_MS / 1000)

    def _send(self, encoder: BatchEncoder, item: object) -> None:
        stats = self._stats
        if item is _LOST:
            stats.next_seq += 1
            return
        ts, events = cast("tuple[float, list[Any]]", item)  # anything but _LOST is a batch
        seq = stats.next_seq
        try:
            payload = encoder.encode(events, ts, self.config.data_parallel_rank)
        except (TypeError, ValueError, OverflowError):
            # An event the wire cannot carry: say so, and leave a gap rather than lie.
            logger.exception("KV event batch %d cannot be encoded; skipped", seq)
            stats.dropped_batches += 1
            stats.dropped_events += len(events)
            stats.next_seq += 1
            return
        seq_bytes = seq.to_bytes(SEQ_BYTES, "big")
        try:
            self._pub.send_multipart((self._topic, seq_bytes, payload), copy=False)
        except zmq.ZMQError:
            # Kept for replay all the same: subscribers see the gap and fetch it.
            logger.exception("KV event batch %d could not be sent; it stays replayable", seq)
            stats.send_errors += 1
        self._buffer.append((seq, payload))
        stats.next_seq = seq + 1
        stats.published_batches += 1
        stats.published_events += len(events)

    def _serve_replay(self) -> None:
        assert self._replay is not None
        stats = self._stats
        try:
            frames = self._replay.recv_multipart()
        except zmq.ZMQError:
            logger.exception("replay request could not be read")
            return
        if len(frames) != 3 or len(frames[2]) != SEQ_BYTES:
            stats.bad_replay_requests += 1
            logger.warning("ignored a malformed replay request (%d frames)", len(frames))
            return
        client, empty, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        stats.replay_requests += 1
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart(
                    (client, empty, self._topic, seq.to_bytes(SEQ_BYTES, "big"), payload),
                    copy=False)
                stats.replayed_batches += 1
        self._replay.send_multipart((client, empty, b"", END_SEQ, b""))


__all__ = ["EventPublisher", "PublisherClosed", "PublisherConfig", "PublisherStats"]
