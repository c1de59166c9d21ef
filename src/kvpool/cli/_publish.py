"""``kvpool simulate --publish``: the options and the publisher they start.

Kept apart from :mod:`kvpool.cli.simulate` so that command only gains a few lines: it adds
these arguments, opens :func:`publishing` around its replay, passes
:meth:`Publishing.simulate_options` to :func:`kvpool.workload.simulate` and prints
:meth:`Publishing.summary`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvpool.cli._args import non_negative_int
from kvpool.errors import BackendUnavailable, InvalidConfig


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_publish_arguments(parser: argparse.ArgumentParser) -> None:
    wire = parser.add_argument_group("publishing KV events (needs the wire extra)")
    wire.add_argument("--publish", metavar="ENDPOINT",
                      help="publish KV events on this ZeroMQ endpoint, e.g. tcp://127.0.0.1:5557")
    wire.add_argument("--replay", metavar="ENDPOINT",
                      help="replay endpoint (default: PUB port + 1000, or NAME-replay)")
    wire.add_argument("--dp-rank", type=non_negative_int, default=0, metavar="R",
                      help="data-parallel rank: offsets both ports by R, stamps batches (0)")
    wire.add_argument("--block-hashes", choices=("int", "bytes"), default="int",
                      help="hashes in events: low 64 bits as int (vLLM's default) or raw bytes")
    wire.add_argument("--linger", type=_seconds, default=2.0, metavar="S",
                      help="keep answering replay requests S seconds after the replay (2)")


def _linger(seconds: float) -> None:
    """Keep the publisher up after the run (a seam: tests end it when their subscriber is done)."""
    time.sleep(seconds)


class Publishing:
    """A running publisher and the time the pool's thread spent handing events to it."""

    def __init__(self, publisher: Any, args: argparse.Namespace) -> None:
        self.publisher = publisher
        self.args = args
        self.seconds = 0.0
        self.calls = 0

    def sink(self, events: list[Any]) -> None:
        began = time.perf_counter()
        self.publisher.publish(events)
        self.seconds += time.perf_counter() - began
        self.calls += 1

    def simulate_options(self) -> dict[str, Any]:
        """Keyword arguments for :func:`kvpool.workload.simulate`."""
        return {"pool_options": {"use_int_block_hashes": self.args.block_hashes == "int"},
                "event_sink": self.sink}

    def finish(self) -> dict[str, Any]:
        """Send what is queued, linger for replays; the publisher's figures."""
        self.publisher.flush()
        _linger(self.args.linger)  # late or lossy subscribers still get their replays
        return {**self.publisher.stats().to_dict(), "publish_s": self.seconds,
                "publish_calls": self.calls}


def _check_flags_need_publish(args: argparse.Namespace) -> None:
    for flag, given in (("--replay", args.replay is not None), ("--dp-rank", args.dp_rank),
                        ("--block-hashes", args.block_hashes != "int")):
        if given:
            raise InvalidConfig(f"{flag} needs --publish")


@contextmanager
def publishing(args: argparse.Namespace) -> Iterator[Publishing | None]:
    """The publisher ``--publish`` asks for (``None`` without it), closed on exit.

    Raises :class:`~kvpool.errors.KvPoolError` subclasses for bad endpoints, a port in use or
    a missing wire extra.
    """
    if args.publish is None:
        _check_flags_need_publish(args)
        yield None
        return
    try:
        from kvpool.wire import EventPublisher, PublisherConfig, default_replay_endpoint
    except ModuleNotFoundError as exc:
        raise BackendUnavailable(
            f"--publish needs the wire extra ({exc.name} missing): pip install 'kvpool[wire]'"
        ) from exc
    replay = args.replay if args.replay is not None else default_replay_endpoint(args.publish)
    publisher = EventPublisher(PublisherConfig(endpoint=args.publish, replay_endpoint=replay,
                                               data_parallel_rank=args.dp_rank))
    try:
        yield Publishing(publisher, args)
    finally:
        publisher.close()


def published_rows(p: dict[str, Any]) -> list[tuple[str, str]]:
    """The publishing rows of the summary, as (what, value)."""
    per_call = p["publish_s"] / p["publish_calls"] * 1e6 if p["publish_calls"] else 0.0
    rows = [
        ("published", f"{p['published_batches']} batches, {p['published_events']} events on "
                      f"{p['endpoints']['pub']} (replay {p['endpoints']['replay']})"),
        ("publish time", f"{p['publish_s']:.3f} s on the pool's thread ({per_call:.2f} us/step)"
                         f", {p['send_s']:.3f} s CPU on the publisher thread"),
        ("queue full", f"{p['queue_full']} times ({p['carried_events']} events carried, "
                       f"{p['dropped_events']} dropped)"),
        ("replays", f"{p['replay_requests']} requests, {p['replayed_batches']} batches resent"),
    ]
    return rows
