"""Publisher and subscriber over loopback: the index equals the pool's after every batch.

Every wait is bounded (``WAIT_S``) and waits for a condition, never for a fixed time.
"""

from __future__ import annotations

import threading

import pytest

from kvpool.events import BlockStored, replay
from kvpool.wire import (
    EndpointUnavailable,
    EventPublisher,
    PublisherClosed,
    PublisherConfig,
    Source,
    Subscriber,
)

from .conftest import WAIT_S, IndexCheck, drive_pool


def _caught_up(subscriber, engine, publisher):
    return lambda: subscriber.stats()[engine].next_seq == publisher.stats().next_seq


def test_a_subscriber_follows_a_pool_batch_by_batch(ctx, inproc):
    pub_ep, replay_ep = inproc
    check = IndexCheck()
    with EventPublisher(PublisherConfig(pub_ep, replay_ep), context=ctx) as publisher, \
            Subscriber([Source(pub_ep, replay_ep, "e")], context=ctx,
                       on_batch=check) as subscriber:
        check.subscriber = subscriber
        check.generation(drive_pool(publisher.publish))
        assert publisher.flush(WAIT_S)
        assert subscriber.run_until(_caught_up(subscriber, "e", publisher), WAIT_S)
        stats = subscriber.stats()["e"]
    assert check.mismatches == [] and check.all_checked()
    assert stats.exact and stats.lost_batches == 0
    assert stats.batches == len(check.expected[0]) > 50  # with evictions: see drive_pool


def test_a_late_joiner_replays_the_history_it_missed(ctx, inproc):
    pub_ep, replay_ep = inproc
    check = IndexCheck()
    with EventPublisher(PublisherConfig(pub_ep, replay_ep), context=ctx) as publisher:
        check.generation(drive_pool(publisher.publish))
        assert publisher.flush(WAIT_S)
        with Subscriber([Source(pub_ep, replay_ep, "e")], context=ctx, on_batch=check,
                        probe_interval=0.01) as subscriber:
            check.subscriber = subscriber
            assert subscriber.run_until(_caught_up(subscriber, "e", publisher), WAIT_S)
            stats = subscriber.stats()["e"]
    assert check.mismatches == [] and check.all_checked()
    assert stats.late_joins == 1 and stats.exact


def test_a_subscriber_that_drops_at_its_high_water_mark_recovers_through_replay(ctx, inproc):
    pub_ep, replay_ep = inproc
    check = IndexCheck()
    config = PublisherConfig(pub_ep, replay_ep, hwm=1)
    with EventPublisher(config, context=ctx) as publisher, \
            Subscriber([Source(pub_ep, replay_ep, "e")], context=ctx, rcvhwm=1,
                       on_batch=check, probe_interval=0.05) as subscriber:
        check.subscriber = subscriber
        # Nobody reads while the pool runs: all but a couple of batches are dropped (which
        # ones depends on when the PUB socket takes the subscription in; any will do).
        check.generation(drive_pool(publisher.publish))
        assert publisher.flush(WAIT_S)
        assert subscriber.run_until(_caught_up(subscriber, "e", publisher), WAIT_S)
        stats = subscriber.stats()["e"]
    assert check.mismatches == [] and check.all_checked()
    assert stats.replayed_batches > len(check.expected[0]) // 2
    assert stats.exact and stats.lost_batches == 0


def test_batches_older_than_the_replay_buffer_are_counted_lost_and_the_index_inexact(ctx, inproc):
    pub_ep, replay_ep = inproc
    with EventPublisher(PublisherConfig(pub_ep, replay_ep, buffer_steps=5),
                        context=ctx) as publisher:
        expected = drive_pool(publisher.publish, num_requests=6)
        assert publisher.flush(WAIT_S)
        with Subscriber([Source(pub_ep, replay_ep, "e")], context=ctx,
                        probe_interval=0.01) as subscriber:
            assert subscriber.run_until(_caught_up(subscriber, "e", publisher), WAIT_S)
            stats = subscriber.stats()["e"]
    assert stats.lost_batches == len(expected) - 5 and not stats.exact
    assert stats.batches == 5


@pytest.mark.parametrize("second_run_requests", [4, 40], ids=["shorter", "longer"])
def test_a_restarted_publisher_is_detected_and_its_fresh_pool_indexed(ipc, second_run_requests):
    """The second publisher numbers from 0 again: fewer batches than the first (seen as a step
    back) or more (seen by the byte check after the disconnection)."""
    pub_ep, replay_ep = ipc
    check = IndexCheck()
    with Subscriber([Source(pub_ep, replay_ep, "e")], on_batch=check,
                    probe_interval=0.05) as subscriber:
        check.subscriber = subscriber
        first = EventPublisher(PublisherConfig(pub_ep, replay_ep))
        try:
            check.generation(drive_pool(first.publish, num_requests=12, seed=1))
            assert first.flush(WAIT_S)
            assert subscriber.run_until(_caught_up(subscriber, "e", first), WAIT_S)
        finally:
            first.close()
        with EventPublisher(PublisherConfig(pub_ep, replay_ep)) as second:
            check.generation(drive_pool(second.publish, num_requests=second_run_requests,
                                        seed=2))
            assert second.flush(WAIT_S)
            done = _caught_up(subscriber, "e", second)
            assert subscriber.run_until(lambda: subscriber.stats()["e"].restarts == 1
                                        and done(), WAIT_S)
            stats = subscriber.stats()["e"]
    assert check.mismatches == []
    assert check.all_checked(0) and check.all_checked(1)
    assert stats.restarts == 1 and stats.exact


def test_two_ranks_on_tcp_loopback_are_indexed_apart():
    publishers = [EventPublisher(PublisherConfig("tcp://127.0.0.1:0", "tcp://127.0.0.1:0",
                                                 data_parallel_rank=r)) for r in (0, 1)]
    try:
        sources = [Source(p.endpoint, p.replay_endpoint, f"rank{r}")
                   for r, p in enumerate(publishers)]
        with Subscriber(sources, probe_interval=0.05) as subscriber:
            expected = [drive_pool(p.publish, num_requests=8, seed=r)
                        for r, p in enumerate(publishers)]
            for p in publishers:
                assert p.flush(WAIT_S)
            assert subscriber.run_until(
                lambda: all(_caught_up(subscriber, f"rank{r}", p)()
                            for r, p in enumerate(publishers)), WAIT_S)
            for r in (0, 1):
                assert subscriber.index.rank(f"rank{r}", r).cache_index() == expected[r][-1]
            assert subscriber.stats()["rank0"].exact and subscriber.stats()["rank1"].exact
    finally:
        for p in publishers:
            p.close()


class _Stalled(EventPublisher):
    """A publisher whose thread waits on ``release`` before sending its first batch."""

    def __init__(self, *args, **kwargs):
        self.release = threading.Event()
        self.holding = threading.Event()
        super().__init__(*args, **kwargs)

    def _send(self, encoder, item):
        self.holding.set()
        assert self.release.wait(WAIT_S)
        super()._send(encoder, item)


def _stored(i: int) -> BlockStored:
    return BlockStored(block_hashes=[i], parent_block_hash=None, token_ids=[i] * 16,
                       block_size=16, lora_id=None, medium="GPU", group_idx=0, seq=i)


def test_a_full_queue_never_blocks_the_pool_and_carries_its_events_into_a_later_batch(
        ctx, inproc):
    pub_ep, replay_ep = inproc
    publisher = _Stalled(PublisherConfig(pub_ep, replay_ep, max_queue_size=2), context=ctx)
    with Subscriber([Source(pub_ep, replay_ep, "e")], context=ctx,
                    probe_interval=0.01) as subscriber:
        publisher.publish([_stored(0)])
        assert publisher.holding.wait(WAIT_S)  # the thread holds batch 0
        for i in range(1, 7):  # 1, 2 queue; 3..6 find the queue full
            publisher.publish([_stored(i)])
        stats = publisher.stats()
        assert stats.queue_full == 4 and stats.carried_events == 4 and stats.dropped_events == 0
        publisher.release.set()
        assert publisher.flush(WAIT_S)
        assert publisher.stats().published_events == 7
        assert subscriber.run_until(_caught_up(subscriber, "e", publisher), WAIT_S)
        index = subscriber.index.rank("e", 0).cache_index()
    publisher.close()
    assert index == replay([_stored(i) for i in range(7)])


def test_past_the_carry_cap_events_are_dropped_counted_and_seen_as_a_gap(ctx, inproc):
    pub_ep, replay_ep = inproc
    config = PublisherConfig(pub_ep, replay_ep, max_queue_size=1, max_carry_events=2)
    publisher = _Stalled(config, context=ctx)
    with Subscriber([Source(pub_ep, replay_ep, "e")], context=ctx,
                    probe_interval=0.01) as subscriber:
        publisher.publish([_stored(0)])
        assert publisher.holding.wait(WAIT_S)
        publisher.publish([_stored(1)])  # queued
        publisher.publish([_stored(2), _stored(3)])  # carried (2 events, at the cap)
        publisher.publish([_stored(4)])  # would pass the cap: all three carried events go
        stats = publisher.stats()
        assert stats.dropped_events == 3 and stats.dropped_batches == 1
        publisher.release.set()
        publisher.publish([_stored(5)])
        assert publisher.flush(WAIT_S)
        assert subscriber.run_until(_caught_up(subscriber, "e", publisher), WAIT_S)
        sub_stats = subscriber.stats()["e"]
    publisher.close()
    assert publisher.stats().next_seq == 4  # batches 0, 1, the burnt number, 5's batch
    assert sub_stats.lost_batches == 1 and not sub_stats.exact


def test_publish_after_close_is_refused():
    publisher = EventPublisher(PublisherConfig("tcp://127.0.0.1:0"))
    publisher.close()
    with pytest.raises(PublisherClosed):
        publisher.publish([_stored(0)])


def test_an_endpoint_in_use_is_a_typed_error(monkeypatch):
    monkeypatch.setattr("kvpool.wire.publisher.BIND_RETRY_S", 0.05)
    with EventPublisher(PublisherConfig("tcp://127.0.0.1:0")) as first:
        with pytest.raises(EndpointUnavailable, match="cannot bind"):
            EventPublisher(PublisherConfig(first.endpoint))


def test_a_malformed_replay_request_is_ignored_and_counted(ctx, inproc):
    import zmq

    pub_ep, replay_ep = inproc
    with EventPublisher(PublisherConfig(pub_ep, replay_ep), context=ctx) as publisher:
        publisher.publish([_stored(0)])
        assert publisher.flush(WAIT_S)
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay_ep)
        dealer.send_multipart((b"", b"\x00"))  # a 1-byte start
        dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        assert dealer.poll(int(WAIT_S * 1000))
        frames = dealer.recv_multipart()
        dealer.close(linger=0)
        assert int.from_bytes(frames[2], "big") == 0
        assert publisher.stats().bad_replay_requests == 1


def test_a_rank_binds_its_offset_endpoints_and_stamps_its_batches(ctx, inproc):
    pub_ep, replay_ep = inproc
    config = PublisherConfig(pub_ep, replay_ep, data_parallel_rank=2)
    with EventPublisher(config, context=ctx) as publisher:
        assert (publisher.endpoint, publisher.replay_endpoint) == (f"{pub_ep}_dp2",
                                                                  f"{replay_ep}_dp2")
        with Subscriber([Source(f"{pub_ep}_dp2", f"{replay_ep}_dp2", "e")], context=ctx,
                        probe_interval=0.01) as subscriber:
            publisher.publish([_stored(0)])
            assert publisher.flush(WAIT_S)
            assert subscriber.run_until(_caught_up(subscriber, "e", publisher), WAIT_S)
            assert list(subscriber.index.ranks) == [("e", 2)]


@pytest.mark.parametrize("field, value", [("buffer_steps", 0), ("max_queue_size", -1),
                                          ("hwm", -1), ("topic", b"kv"),
                                          ("data_parallel_rank", 1.5)])
def test_a_bad_setting_is_refused_before_anything_binds(field, value):
    from kvpool.errors import InvalidConfig

    with pytest.raises(InvalidConfig, match=field.split("_")[0]):
        EventPublisher(PublisherConfig("tcp://127.0.0.1:0", **{field: value}))
