"""Subscribe to KV event publishers, recover what was missed, keep the fleet's cache index.

One :class:`Subscriber` follows any number of publishers (:class:`Source`: one engine rank
each, with its PUB endpoint and optional replay endpoint) and applies their batches, in
sequence order, to a :class:`~kvpool.wire.index.FleetIndex`. For each source it expects the
next batch number and classifies every batch it receives:

* **next in line** → applied;
* **ahead** (a gap: the PUB socket dropped messages at its high-water mark, or the network
  did) → it asks the replay socket for everything from the missing number, applies it, and
  counts the gap as recovered; what the bounded replay buffer no longer holds is counted as
  lost and the source's index marked inexact;
* **behind** → a duplicate if its bytes equal the batch applied under that number (live
  messages that a replay already delivered); otherwise the publisher **restarted** (its
  numbering began again at 0): the index of that engine is dropped and rebuilt by a replay
  from 0.

A restarted publisher whose numbering has already reached the old one's looks like a gap, or
even like the next batch. So a replay request starts one batch early and compares that batch's
bytes with the one applied (timestamps make them differ across publishers; a publisher that
has not reached that number yet answers with nothing, which it never does for its own newest
batch), and after the SUB
socket reports a disconnection (a socket monitor; ``tcp://`` and ``ipc://``) the next live
batch is applied only after such a check.
A subscriber that joins late (its first batch is not number 0) replays from 0 first. When a
source has been quiet for ``probe_interval`` seconds, the subscriber asks its replay socket
for anything newer, so losing the last messages of a run is recovered too.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from kvpool.errors import InvalidConfig
from kvpool.wire.encoding import WireBatch, decode_batch
from kvpool.wire.endpoints import END_SEQ, SEQ_BYTES, EndpointError, check_endpoint
from kvpool.wire.index import FleetIndex, RankIndex


@dataclass(frozen=True)
class Source:
    """One publisher: its PUB endpoint, its replay endpoint, and the engine name to index under."""

    endpoint: str
    replay_endpoint: str | None = None
    name: str = ""

    @property
    def engine(self) -> str:
        return self.name or self.endpoint


@dataclass
class SourceStats:
    """How following one source went.

    ``exact`` stays ``True`` while every batch since the publisher's batch 0 was applied once,
    in order (the index then equals the pool's); ``gaps`` counts gaps seen, ``gaps_recovered``
    those a replay filled completely, ``lost_batches`` the batches no replay could deliver,
    ``replayed_batches`` the batches applied from replay answers (gaps, late joins, restarts,
    probes alike).
    """

    batches: int = 0
    events: int = 0
    gaps: int = 0
    gaps_recovered: int = 0
    recovered_batches: int = 0
    lost_batches: int = 0
    replayed_batches: int = 0
    duplicates: int = 0
    restarts: int = 0
    late_joins: int = 0
    probes: int = 0
    replay_requests: int = 0
    replay_timeouts: int = 0
    malformed: int = 0
    exact: bool = True
    next_seq: int | None = None


BatchHook = Callable[[Source, int, WireBatch, RankIndex], None]
"""Called after each applied batch: ``(source, seq, batch, the rank's index after it)``."""


class _Follow:
    """The per-source state: sockets, the next expected number, fingerprints of recent batches."""

    def __init__(self, source: Source, sub: zmq.Socket, window: int) -> None:
        self.source = source
        self.sub = sub
        self.dealer: zmq.Socket | None = None
        self.expected: int | None = None
        self.recent: OrderedDict[int, int] = OrderedDict()
        self.window = window
        self.stats = SourceStats()
        self.last_live = time.monotonic()
        self.last_probe = 0.0
        self.monitor: zmq.Socket | None = None
        self.suspect = False  # disconnected since the last batch: check before applying

    def remember(self, seq: int, payload: bytes) -> None:
        self.recent[seq] = hash(payload)
        if len(self.recent) > self.window:
            self.recent.popitem(last=False)

    def forget(self) -> None:
        self.expected = None
        self.recent.clear()


class Subscriber:
    """Follows ``sources`` and maintains :attr:`index` (see the module docstring).

    Drive it with :meth:`poll` (or :meth:`run_until`); it owns no thread. ``context`` must be
    the publisher's for ``inproc://`` endpoints. ``rcvhwm`` is the SUB socket's high-water
    mark (lower it to make a slow subscriber drop), ``replay_timeout`` bounds each replay
    request, ``dedup_window`` is how many recent batch fingerprints are kept per source.
    """

    def __init__(
        self,
        sources: Iterable[Source | str],
        *,
        context: zmq.Context | None = None,
        topic: str = "",
        rcvhwm: int = 100_000,
        replay_timeout: float = 2.0,
        probe_interval: float = 0.5,
        dedup_window: int = 100_000,
        on_batch: BatchHook | None = None,
    ) -> None:
        resolved = [Source(s) if isinstance(s, str) else s for s in sources]
        if not resolved:
            raise InvalidConfig("a subscriber needs at least one source")
        for source in resolved:
            check_endpoint(source.endpoint)
            if source.replay_endpoint is not None:
                check_endpoint(source.replay_endpoint)
        engines = [s.engine for s in resolved]
        if len(set(engines)) != len(engines):
            raise InvalidConfig(f"two sources share an engine name: {engines}")
        self._ctx = context or zmq.Context.instance()
        self._topic = topic.encode("utf-8")
        self.replay_timeout = replay_timeout
        self.probe_interval = probe_interval
        self.on_batch = on_batch
        self.index = FleetIndex()
        self._closed = False
        self._poller = zmq.Poller()
        self._follows: dict[zmq.Socket, _Follow] = {}
        self._monitors: dict[zmq.Socket, _Follow] = {}
        for source in resolved:
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, rcvhwm)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, self._topic)
            try:
                sub.connect(source.endpoint)
            except zmq.ZMQError as exc:  # e.g. a wildcard host: one binds those, never connects
                sub.close(linger=0)
                self.close()
                raise EndpointError(f"cannot connect to {source.endpoint}: {exc}") from exc
            follow = _Follow(source, sub, dedup_window)
            self._follows[sub] = follow
            self._poller.register(sub, zmq.POLLIN)
            if not source.endpoint.startswith("inproc://"):  # inproc peers never disconnect
                follow.monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                self._monitors[follow.monitor] = follow
                self._poller.register(follow.monitor, zmq.POLLIN)

    # -- public ------------------------------------------------------------------------

    def stats(self) -> dict[str, SourceStats]:
        """Per engine name, a copy of its counters."""
        return {f.source.engine: SourceStats(**vars(f.stats)) for f in self._follows.values()}

    def poll(self, timeout: float = 0.1) -> int:
        """Wait up to ``timeout`` seconds for batches, apply all that are there; how many."""
        applied = 0
        ready = dict(self._poller.poll(int(timeout * 1000)))
        for monitor, follow in self._monitors.items():
            if monitor in ready:
                self._watch(monitor, follow)
        now = time.monotonic()
        for sock, follow in self._follows.items():
            if sock in ready:
                follow.last_live = now
                applied += self._drain(follow)
            elif self._due_probe(follow, now):
                applied += self._probe(follow)
        return applied

    def run_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Poll until ``done()`` holds or ``timeout`` seconds pass; whether it held."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.poll(min(left, 0.05))
        return True

    def sources(self) -> Iterator[Source]:
        return (f.source for f in self._follows.values())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for follow in self._follows.values():
            if follow.monitor is not None:
                follow.sub.disable_monitor()
                follow.monitor.close(linger=0)
            follow.sub.close(linger=0)
            if follow.dealer is not None:
                follow.dealer.close(linger=0)

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- live messages -----------------------------------------------------------------

    def _watch(self, monitor: zmq.Socket, follow: _Follow) -> None:
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                follow.suspect = True

    def _drain(self, follow: _Follow, limit: int = 10_000) -> int:
        applied = 0
        for _ in range(limit):
            try:
                frames = follow.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if follow.monitor is not None:
                # The monitor reports a disconnection before any batch of the connection
                # that follows it can arrive, but the poll that woke us may predate that
                # report: read it now, so that this batch is checked before it is applied.
                self._watch(follow.monitor, follow)
            if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
                follow.stats.malformed += 1
                continue
            applied += self._live(follow, int.from_bytes(frames[1], "big"), frames[2])
        return applied

    def _live(self, follow: _Follow, seq: int, payload: bytes) -> int:
        applied = 0
        if follow.suspect:
            follow.suspect = False
            if follow.expected and seq >= follow.expected:
                applied += self._check_same_publisher(follow)
        if follow.expected is None:
            applied += self._join(follow, seq)
        if seq > follow.expected:  # type: ignore[operator]
            missing = seq - follow.expected  # type: ignore[operator]
            restarts = follow.stats.restarts
            applied += self._recover(follow, follow.expected)  # type: ignore[arg-type]
            if follow.stats.restarts == restarts:
                follow.stats.gaps += 1
                if follow.expected is not None and follow.expected > seq:
                    follow.stats.gaps_recovered += 1
                    follow.stats.recovered_batches += missing
        if follow.expected is not None and seq < follow.expected:
            if follow.recent.get(seq) == hash(payload):
                follow.stats.duplicates += 1
                return applied
            self._restarted(follow)
            applied += self._join(follow, seq, late=False)
            if seq < follow.expected:  # type: ignore[operator]
                return applied  # the replay from 0 delivered it
        if follow.expected is not None and seq > follow.expected:
            self._lost(follow, seq - follow.expected)
        return applied + self._apply(follow, seq, payload)

    def _check_same_publisher(self, follow: _Follow) -> int:
        """After a disconnection: replay from the last applied batch, which detects a restart
        (and fills any gap on the way); how many batches that applied."""
        return self._recover(follow, follow.expected)  # type: ignore[arg-type]

    def _join(self, follow: _Follow, seq: int, late: bool = True) -> int:
        """First batch seen from a publisher: fetch its history from 0 if it is not batch 0."""
        follow.expected = 0
        if seq == 0:
            return 0
        follow.stats.late_joins += late
        return self._recover(follow, 0)

    def _restarted(self, follow: _Follow) -> None:
        follow.stats.restarts += 1
        follow.stats.exact = True  # a fresh pool: exact again once rebuilt from its batch 0
        follow.forget()
        self.index.reset_engine(follow.source.engine)

    def _lost(self, follow: _Follow, count: int) -> None:
        follow.stats.lost_batches += count
        follow.stats.exact = False
        follow.expected = (follow.expected or 0) + count

    def _apply(self, follow: _Follow, seq: int, payload: bytes) -> int:
        try:
            batch = decode_batch(payload)
        except msgspec.DecodeError:
            follow.stats.malformed += 1
            self._lost(follow, 1)
            return 0
        index = self.index.apply_batch(follow.source.engine, batch)
        follow.remember(seq, payload)
        follow.expected = seq + 1
        follow.stats.next_seq = seq + 1
        follow.stats.batches += 1
        follow.stats.events += len(batch.events)
        if self.on_batch is not None:
            self.on_batch(follow.source, seq, batch, index)
        return 1

    # -- replay ------------------------------------------------------------------------

    def _due_probe(self, follow: _Follow, now: float) -> bool:
        return (follow.source.replay_endpoint is not None
                and now - follow.last_live >= self.probe_interval
                and now - follow.last_probe >= self.probe_interval)

    def _probe(self, follow: _Follow) -> int:
        """A quiet source: ask for anything after what was applied (a lost tail), or for its
        whole history if nothing came yet (a late joiner on a quiet publisher)."""
        follow.last_probe = time.monotonic()
        follow.stats.probes += 1
        before = follow.expected
        timeout = min(self.replay_timeout, 0.25)
        if before is None:
            follow.expected = 0
            applied = self._recover(follow, 0, timeout=timeout)
            if applied:
                follow.stats.late_joins += 1
            else:
                follow.expected = None  # nothing published yet: the first batch decides
            return applied
        applied = self._recover(follow, before, timeout=timeout)
        if applied:
            follow.stats.gaps += 1
            follow.stats.gaps_recovered += 1
            follow.stats.recovered_batches += applied
        return applied

    def _recover(self, follow: _Follow, start: int, timeout: float | None = None,
                 allow_restart: bool = True) -> int:
        """Replay from ``start`` and apply what comes; how many batches were applied.

        Without a replay endpoint, or when the request times out, nothing is applied (the
        caller then counts the gap as lost).
        """
        source = follow.source
        if source.replay_endpoint is None:
            return 0
        check = start - 1 if start > 0 and (start - 1) in follow.recent else None
        answer = self._request(follow, start if check is None else check,
                               self.replay_timeout if timeout is None else timeout)
        if answer is None:
            return 0
        # A publisher's newest batch never leaves its buffer, so the one that sent batch
        # `check` answers with at least that batch; nothing, or other bytes, means another one.
        if check is not None and allow_restart and (
                not answer or (answer[0][0] == check
                               and follow.recent.get(check) != hash(answer[0][1]))):
            self._restarted(follow)
            follow.expected = 0
            return self._recover(follow, 0, timeout, allow_restart=False)
        applied = 0
        for seq, payload in answer:
            if check is not None and seq == check:
                continue
            expected = follow.expected if follow.expected is not None else 0
            if seq < expected:
                continue
            if seq > expected:
                self._lost(follow, seq - expected)
            applied += self._apply(follow, seq, payload)
        follow.stats.replayed_batches += applied
        return applied

    def _request(self, follow: _Follow, start: int,
                 timeout: float) -> list[tuple[int, bytes]] | None:
        """The replay answer for ``start`` (``None`` on timeout; the socket is then renewed)."""
        endpoint = follow.source.replay_endpoint
        if endpoint is None:  # _recover asks only sources that have one
            return None
        if follow.dealer is None:
            follow.dealer = self._ctx.socket(zmq.DEALER)
            follow.dealer.setsockopt(zmq.LINGER, 0)
            follow.dealer.connect(endpoint)
        dealer = follow.dealer
        follow.stats.replay_requests += 1
        dealer.send_multipart((b"", start.to_bytes(SEQ_BYTES, "big")))
        answer: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not dealer.poll(int(left * 1000) + 1):
                follow.stats.replay_timeouts += 1
                dealer.close(linger=0)  # a late answer must not be read as the next one
                follow.dealer = None
                return None
            frames = dealer.recv_multipart()
            if len(frames) != 4 or len(frames[2]) != SEQ_BYTES:
                follow.stats.malformed += 1
                continue
            _, _topic, seq_bytes, payload = frames
            if seq_bytes == END_SEQ:
                return answer
            answer.append((int.from_bytes(seq_bytes, "big"), payload))


__all__ = ["BatchHook", "Source", "SourceStats", "Subscriber"]

