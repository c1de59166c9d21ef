"""Workloads: serving traces (JSONL), the built-in chat trace, and their replay through a pool.

* :mod:`~kvpool.workload.trace` – the trace format, its validating loader and a writer;
* :mod:`~kvpool.workload.synthetic` – the seeded chat-service trace;
* :mod:`~kvpool.workload.tokens` – the tokens a replayed request generates;
* :mod:`~kvpool.workload.driver` – the scheduler-shaped replay driver;
* :mod:`~kvpool.workload.verbs` – the batch verbs it calls (the pool's own, or
  :mod:`kvpool.batch`'s compositions);
* :mod:`~kvpool.workload.simulate` – :func:`simulate`, what ``kvpool simulate`` runs.
"""

from kvpool.workload.driver import SimulationReport, replay
from kvpool.workload.simulate import simulate, warm_up
from kvpool.workload.synthetic import ChatWorkload, synthetic_trace
from kvpool.workload.tokens import output_tokens
from kvpool.workload.trace import (
    TraceError,
    TraceRequest,
    load_trace,
    parse_lines,
    write_trace,
)

__all__ = [
    "ChatWorkload",
    "SimulationReport",
    "TraceError",
    "TraceRequest",
    "load_trace",
    "output_tokens",
    "parse_lines",
    "replay",
    "simulate",
    "synthetic_trace",
    "warm_up",
    "write_trace",
]
