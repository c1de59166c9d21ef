"""``kvpool subscribe``: follow KV event publishers and show the index a router would build.

Connects to each ENDPOINT (and, per ``--ranks N``, to the N data-parallel ranks behind it,
ports offset by rank), recovers missed batches through each replay endpoint (``--replay``;
default derived as in :func:`kvpool.wire.default_replay_endpoint`; ``--no-replay`` to go
without) and shows, live: index size, events/s, gaps seen and recovered, and the prefix-hit
rate a router would predict. Stops on Ctrl-C, after ``--duration`` seconds, or after
``--idle-exit`` seconds without a batch (once one has arrived). ``--json`` prints one summary
object at the end instead of the live view. Exit status: 0, or 2 for bad arguments (one line
on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from kvpool.errors import KvPoolError


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "subscribe",
        help="follow KV event publishers and show the cache index a router would build",
        description="Subscribe to KV event publishers (vLLM's ZeroMQ wire, e.g. "
        "`kvpool simulate --publish tcp://127.0.0.1:5557`); rebuild each engine's cache "
        "index, recover missed batches through replay, show index size, events/s, gaps "
        "recovered and the prefix-hit rate a router would predict.",
    )
    parser.add_argument("endpoints", nargs="+", metavar="ENDPOINT",
                        help="PUB endpoint of an engine (rank 0), e.g. tcp://127.0.0.1:5557")
    parser.add_argument("--replay", action="append", metavar="ENDPOINT", default=None,
                        help="replay endpoint, one per ENDPOINT in order "
                        "(default: PUB port + 1000, or NAME-replay)")
    parser.add_argument("--no-replay", action="store_true",
                        help="do not ask for missed batches (count them as lost)")
    parser.add_argument("--ranks", type=int, default=1, metavar="N",
                        help="data-parallel ranks per engine, ports offset by rank (1)")
    parser.add_argument("--topic", default="", help="topic to subscribe to ('')")
    parser.add_argument("--duration", type=_positive_float, metavar="S",
                        help="stop after S seconds")
    parser.add_argument("--idle-exit", type=_positive_float, metavar="S",
                        help="stop S seconds after the last batch (once one has arrived)")
    parser.add_argument("--json", action="store_true",
                        help="no live view; print one JSON summary at the end")
    parser.set_defaults(func=run)

    def one_line_error(message: str) -> None:
        """Bad arguments: one line and exit 2 (argparse would print the usage first)."""
        print(f"kvpool subscribe: {message} (see kvpool subscribe --help)", file=sys.stderr)
        sys.exit(2)

    parser.error = one_line_error  # type: ignore[method-assign]


def _sources(args: argparse.Namespace) -> list[Any]:
    from kvpool.wire import Source, default_replay_endpoint, offset_endpoint
    from kvpool.wire.endpoints import EndpointError, check_endpoint

    if args.ranks < 1:
        raise EndpointError(f"--ranks must be >= 1, got {args.ranks}")
    replays = args.replay or []
    if args.no_replay and replays:
        raise EndpointError("--replay and --no-replay exclude each other")
    if replays and len(replays) != len(args.endpoints):
        raise EndpointError(f"{len(replays)} --replay endpoint(s) for "
                            f"{len(args.endpoints)} ENDPOINT(s); give one per endpoint")
    sources = []
    for i, endpoint in enumerate(args.endpoints):
        check_endpoint(endpoint)
        replay = None
        if not args.no_replay:
            replay = check_endpoint(replays[i]) if replays else default_replay_endpoint(endpoint)
        for rank in range(args.ranks):
            name = endpoint if args.ranks == 1 else f"{endpoint}#dp{rank}"
            sources.append(Source(offset_endpoint(endpoint, rank),
                                  None if replay is None else offset_endpoint(replay, rank),
                                  name=name))
    return sources


def run(args: argparse.Namespace) -> int:
    try:
        from kvpool.wire import Subscriber
    except ModuleNotFoundError as exc:
        print(f"kvpool subscribe: needs the wire extra ({exc.name} missing): "
              "pip install 'kvpool[wire]'", file=sys.stderr)
        return 2
    try:
        sources = _sources(args)
        subscriber = Subscriber(sources, topic=args.topic)
    except KvPoolError as exc:
        print(f"kvpool subscribe: {exc}", file=sys.stderr)
        return 2
    with subscriber:
        follow = _Follow(subscriber, args.duration, args.idle_exit)
        try:
            if args.json:
                follow.run(None)
            else:
                follow.run_live()
        except KeyboardInterrupt:
            pass
        if args.json:
            print(json.dumps(follow.summary()))
    return 0


class _Follow:
    """The polling loop and the figures it shows (events/s over the last second)."""

    def __init__(self, subscriber: Any, duration: float | None, idle_exit: float | None):
        self.subscriber = subscriber
        self.duration = duration
        self.idle_exit = idle_exit
        self.began = time.monotonic()
        self.last_batch: float | None = None
        self.window: list[tuple[float, int]] = []  # (time, total events) samples
        self.rate = 0.0

    def _done(self, now: float) -> bool:
        if self.duration is not None and now - self.began >= self.duration:
            return True
        return (self.idle_exit is not None and self.last_batch is not None
                and now - self.last_batch >= self.idle_exit)

    def step(self) -> bool:
        """One poll; whether to stop."""
        if self.subscriber.poll(0.1):
            self.last_batch = time.monotonic()
        now = time.monotonic()
        total = sum(s.events for s in self.subscriber.stats().values())
        self.window.append((now, total))
        while len(self.window) > 2 and now - self.window[0][0] > 1.0:
            self.window.pop(0)
        span = now - self.window[0][0]
        self.rate = (total - self.window[0][1]) / span if span > 0 else 0.0
        return self._done(now)

    def run(self, on_step: Any) -> None:
        while not self.step():
            if on_step is not None:
                on_step()

    def run_live(self) -> None:
        from rich.live import Live

        with Live(self.table(), refresh_per_second=4, transient=False) as live:
            self.run(lambda: live.update(self.table()))
            live.update(self.table())

    def summary(self) -> dict[str, Any]:
        index = self.subscriber.index
        sources = {}
        for engine, stats in self.subscriber.stats().items():
            ranks = {str(rank): {"keys": ri.num_keys, "blocks": ri.num_blocks,
                                 "batches": ri.batches, "events": ri.events,
                                 "unknown_removals": ri.unknown_removals}
                     for (name, rank), ri in index.items() if name == engine}
            sources[engine] = {**vars(stats), "ranks": ranks}
        return {
            "keys": index.num_keys(),
            "blocks": index.num_blocks(),
            "events": sum(s["events"] for s in sources.values()),
            "predicted_hit_rate": index.predicted_hit_rate(),
            "seconds": time.monotonic() - self.began,
            "sources": sources,
        }

    def table(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        index = self.subscriber.index
        stats = self.subscriber.stats()
        recovered = sum(s.gaps_recovered for s in stats.values())
        gaps = sum(s.gaps for s in stats.values())
        lost = sum(s.lost_batches for s in stats.values())
        header = Text.assemble(
            ("index ", "bold"), f"{index.num_keys():,} keys, {index.num_blocks():,} blocks   ",
            ("events/s ", "bold"), f"{self.rate:,.0f}   ",
            ("gaps recovered ", "bold"), f"{recovered}/{gaps} ({lost} batches lost)   ",
            ("predicted prefix-hit rate ", "bold"), f"{index.predicted_hit_rate():.1%}",
        )
        table = Table(box=None, padding=(0, 1))
        table.add_column("engine", overflow="fold", ratio=1)
        for column in ("rank", "keys", "batches", "events", "gaps", "recov", "lost",
                       "restarts", "exact"):
            table.add_column(column, justify="right", no_wrap=True)
        for engine, s in stats.items():
            ranks = [(rank, ri) for (name, rank), ri in index.items() if name == engine]
            for rank, ri in ranks or [(None, None)]:
                table.add_row(
                    engine, "-" if rank is None else str(rank), str(ri.num_keys if ri else 0),
                    str(s.batches), str(s.events), str(s.gaps), str(s.gaps_recovered),
                    str(s.lost_batches), str(s.restarts), "yes" if s.exact else "no",
                )
        return Group(header, table)
