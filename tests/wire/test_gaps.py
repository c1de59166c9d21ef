"""The subscriber's classification, batch by batch, against a scripted publisher.

The test plays the publisher with raw sockets: an XPUB (it sees the subscription arrive, so
nothing is sent before the subscriber listens) and a ROUTER replay server in a thread that
answers from a dict of batches. Every message, gap and replay is then exactly the script's.
"""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from kvpool.events import replay
from kvpool.wire import Source, Subscriber
from kvpool.wire.encoding import encode_batch
from kvpool.wire.endpoints import END_SEQ

from .conftest import WAIT_S
from .test_pubsub import _stored


class ScriptedPublisher:
    def __init__(self, ctx, pub_ep, replay_ep):
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.bind(pub_ep)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.bind(replay_ep)
        self.buffer: dict[int, bytes] = {}
        self.requests: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def wait_for_subscriber(self):
        assert self.pub.poll(int(WAIT_S * 1000)), "no subscription arrived"
        assert self.pub.recv()[0] == 1  # a subscribe message

    def batch(self, seq, ts=None):
        payload = encode_batch([_stored(seq)], float(seq) if ts is None else ts, 0)
        self.buffer[seq] = payload
        return payload

    def send(self, seq, payload=None):
        payload = self.buffer[seq] if payload is None else payload
        self.pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))

    def _serve(self):
        while not self.stop.is_set():
            if not self.router.poll(10):
                continue
            client, empty, start = self.router.recv_multipart()
            start = int.from_bytes(start, "big")
            self.requests.append(start)
            for seq in sorted(self.buffer):
                if seq >= start:
                    self.router.send_multipart((client, empty, b"", seq.to_bytes(8, "big"),
                                                self.buffer[seq]))
            self.router.send_multipart((client, empty, b"", END_SEQ, b""))

    def close(self):
        self.stop.set()
        self.thread.join(WAIT_S)
        self.pub.close(linger=0)
        self.router.close(linger=0)


@pytest.fixture
def scripted(ctx, inproc):
    pub_ep, replay_ep = inproc
    publisher = ScriptedPublisher(ctx, pub_ep, replay_ep)
    # A long probe interval: only the script's messages make the subscriber act.
    subscriber = Subscriber([Source(pub_ep, replay_ep, "e")], context=ctx, probe_interval=60)
    publisher.wait_for_subscriber()
    yield publisher, subscriber
    subscriber.close()
    publisher.close()


def _until_next(subscriber, seq):
    assert subscriber.run_until(lambda: subscriber.stats()["e"].next_seq == seq, WAIT_S)
    return subscriber.stats()["e"]


def _index(subscriber):
    return subscriber.index.rank("e", 0).cache_index()


def test_a_gap_is_filled_from_one_batch_before_it(scripted):
    publisher, subscriber = scripted
    for seq in range(4):
        publisher.batch(seq)
    publisher.send(0)
    _until_next(subscriber, 1)
    publisher.send(3)  # 1 and 2 were "dropped"
    stats = _until_next(subscriber, 4)
    assert publisher.requests == [0]  # from 1, one early: batch 0's bytes are checked
    assert (stats.gaps, stats.gaps_recovered, stats.recovered_batches) == (1, 1, 2)
    assert stats.replayed_batches == 3 and stats.duplicates == 1 and stats.exact
    assert _index(subscriber) == replay([_stored(i) for i in range(4)])


def test_a_live_batch_a_replay_already_delivered_is_a_duplicate(scripted):
    publisher, subscriber = scripted
    for seq in range(3):
        publisher.batch(seq)
    publisher.send(0)
    publisher.send(2)
    _until_next(subscriber, 3)
    publisher.send(1)  # arrives late, after the replay brought it
    publisher.send(2)
    publisher.batch(3)
    publisher.send(3)
    stats = _until_next(subscriber, 4)
    assert stats.duplicates == 3 and stats.restarts == 0 and stats.batches == 4


def test_a_step_back_with_other_bytes_is_a_restart(scripted):
    publisher, subscriber = scripted
    for seq in range(3):
        publisher.batch(seq)
        publisher.send(seq)
    _until_next(subscriber, 3)
    publisher.buffer.clear()  # a fresh publisher: numbering and buffer start again
    publisher.batch(0, ts=1e9)
    publisher.batch(1, ts=1e9 + 1)
    publisher.send(1)
    stats = _until_next(subscriber, 2)
    assert stats.restarts == 1 and stats.exact and stats.late_joins == 0
    assert stats.replayed_batches == 2  # 0, and 1 itself: the replay from 0 brought it
    assert _index(subscriber) == replay([_stored(0), _stored(1)])


def test_a_restart_that_reached_the_old_numbering_is_caught_by_the_byte_check(scripted):
    publisher, subscriber = scripted
    for seq in range(2):
        publisher.batch(seq)
        publisher.send(seq)
    _until_next(subscriber, 2)
    publisher.buffer.clear()
    for seq in range(5):
        publisher.batch(seq, ts=1e9 + seq)
    publisher.send(4)  # looks like a gap (2, 3 missing)...
    stats = _until_next(subscriber, 5)
    # ... but batch 1's bytes differ: the whole new history comes from 0.
    assert publisher.requests == [1, 0]
    assert stats.restarts == 1 and stats.gaps == 0 and stats.exact
    assert _index(subscriber) == replay([_stored(i) for i in range(5)])


def test_malformed_messages_are_counted_and_skipped(scripted):
    publisher, subscriber = scripted
    publisher.pub.send_multipart((b"", b"\x00"))  # two frames, short seq
    publisher.batch(0)
    publisher.send(0)
    stats = _until_next(subscriber, 1)
    assert stats.malformed == 1 and stats.batches == 1


def test_a_disconnection_reported_after_the_poll_still_checks_the_next_batch(ctx, ipc):
    # The race CI hit once: a restarted publisher's first batch that the subscriber receives
    # is numbered exactly as the next one expected, and the socket monitor's disconnection
    # report is not in the poll that woke the subscriber. The batch must still be checked.
    pub_ep, replay_ep = ipc
    first = ScriptedPublisher(ctx, pub_ep, replay_ep)
    subscriber = Subscriber([Source(pub_ep, replay_ep, "e")], context=ctx, probe_interval=60)
    second = None
    try:
        first.wait_for_subscriber()
        for seq in range(2):
            first.batch(seq)
            first.send(seq)
        _until_next(subscriber, 2)
        first.close()
        second = ScriptedPublisher(ctx, pub_ep, replay_ep)  # numbering starts again
        (follow,) = subscriber._follows.values()
        # Touch only the SUB socket (it re-subscribes when its thread runs the socket's
        # commands), never the monitor: its disconnection report stays unread.
        deadline = time.monotonic() + WAIT_S
        while not second.pub.poll(10):
            follow.sub.getsockopt(zmq.EVENTS)
            assert time.monotonic() < deadline, "the subscriber never reconnected"
        assert second.pub.recv()[0] == 1  # its subscription: the monitor has reported
        for seq in range(3):
            second.batch(seq, ts=1e9 + seq)
        second.send(2)  # what the subscriber expects next
        assert follow.sub.poll(int(WAIT_S * 1000))
        subscriber._drain(follow)  # as a poll that saw the data but not the report would
        stats = subscriber.stats()["e"]
        assert stats.restarts == 1 and stats.exact and stats.next_seq == 3
        assert _index(subscriber) == replay([_stored(i) for i in range(3)])
    finally:
        subscriber.close()
        first.close()
        if second is not None:
            second.close()
