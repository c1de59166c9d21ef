"""``kvpool simulate``: replay a serving trace through a pool and summarise what happened.

Calls :func:`kvpool.workload.simulate` and formats its report. Without ``--trace`` it replays
the built-in chat-service trace (``--requests``, ``--seed``). Exit status: 0 on success, 2 for
bad input (malformed trace line, unreadable file, impossible sizes, backend not installed),
reported as one line on stderr without a traceback.

``--publish ENDPOINT`` also publishes the pool's KV events on vLLM's ZeroMQ wire while it
replays, one batch per scheduler step (:mod:`kvpool.cli._publish`, :mod:`kvpool.wire`).
"""

from __future__ import annotations

import argparse
import json
import sys

from kvpool.backends import BACKENDS
from kvpool.cli._args import block_count, non_negative_int, pool_fits, positive_int
from kvpool.cli._publish import add_publish_arguments, format_published, publishing
from kvpool.errors import KvPoolError
from kvpool.workload.driver import SimulationReport
from kvpool.workload.simulate import DEFAULT_MAX_RUNNING, DEFAULT_NUM_BLOCKS, simulate


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="replay a serving trace through the pool",
        description="Replay a trace (default: the built-in chat trace) through a block pool; "
        "print requests, prefix-hit rate, evictions, peak usage, pool time and wall time.",
    )
    parser.add_argument("--trace", metavar="FILE", help="JSONL trace (default: built-in chat)")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="fast")
    parser.add_argument("--num-blocks", type=block_count, default=DEFAULT_NUM_BLOCKS,
                        metavar="N", help=f"pool size, null block included ({DEFAULT_NUM_BLOCKS})")
    parser.add_argument("--block-size", type=positive_int, default=16, metavar="B")
    parser.add_argument("--max-running", type=positive_int, default=DEFAULT_MAX_RUNNING,
                        metavar="R",
                        help=f"concurrent requests ({DEFAULT_MAX_RUNNING})")
    parser.add_argument("--seed", type=non_negative_int, default=0, metavar="S",
                        help="seed of the built-in trace (0)")
    parser.add_argument("--requests", type=positive_int, default=2000, metavar="N",
                        help="requests in the built-in trace (2000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_publish_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    why = pool_fits("--num-blocks", [args.backend], args.num_blocks)
    if why:
        print(f"kvpool simulate: {why}", file=sys.stderr)
        return 2
    try:
        with publishing(args) as pub:
            report = simulate(
                args.trace,
                backend=args.backend,
                num_blocks=args.num_blocks,
                block_size=args.block_size,
                max_running=args.max_running,
                seed=args.seed,
                num_requests=args.requests,
                **({} if pub is None else pub.simulate_options()),
            )
            published = None if pub is None else pub.finish()
    except (KvPoolError, OSError) as exc:
        print(f"kvpool simulate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        record = report.to_dict()
        if published is not None:
            record["publisher"] = published
        print(json.dumps(record))
    else:
        source = args.trace or f"built-in chat trace (seed {args.seed})"
        print(format_report(report, source))
        if published is not None:
            print(format_published(published, len("blocks allocated")))
    return 0


def format_report(report: SimulationReport, source: str) -> str:
    """The human-readable summary of one replay."""
    r = report
    per_call_us = r.pool_s / r.pool_calls * 1e6 if r.pool_calls else 0.0
    rows = [
        ("trace", source),
        ("backend", f"{r.backend}  ({r.num_blocks} blocks of {r.block_size} tokens, "
                    f"<= {r.max_running} running)"),
        ("requests", f"{r.requests}  ({r.steps} steps, {r.decode_tokens} decoded tokens)"),
        ("prompt tokens", f"{r.prompt_tokens}"),
        ("prefix hits", f"{r.hit_tokens} tokens = {r.hit_rate:.1%} of prompt tokens"),
        ("blocks allocated", f"{r.blocks_allocated}"),
        ("evictions", f"{r.evictions} cached blocks reallocated"),
        ("peak usage", f"{r.peak_usage:.1%}"),
        ("pool time", f"{r.pool_s:.3f} s  ({r.pool_calls} calls, {per_call_us:.2f} us/call)"),
        ("wall time", f"{r.wall_s:.3f} s  (+ warm-up {r.warmup_s:.3f} s)"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
