"""Benchmark settings: one frozen value, full size or ``quick`` (for tests and smoke runs)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from kvpool.errors import InvalidConfig
from kvpool.workload.trace import TraceRequest

SUITES = ("construct", "micro", "trace", "hashing")
"""Every suite, in the order ``all`` runs them."""

ALLOC_BATCHES = (1, 16, 64, 256)
"""Batch sizes of the ``get_new_blocks`` + ``free_blocks`` micro-benchmark."""


@dataclass(frozen=True)
class BenchConfig:
    """What to run and how big.

    Attributes:
        backends: backend names; ratios are computed against ``"reference"`` when present.
        repeat: timed runs per figure; every figure is the median of them.
        quick: tiny sizes (seconds in total); targets are then not evaluated.
        trace: a JSONL path or a list of requests for the trace suite (default: the
            built-in chat trace of ``trace_requests`` requests drawn with ``seed``).
        seed: seed of every generated workload (tokens, hashes, the chat trace).
    """

    backends: tuple[str, ...] = ("fast", "reference")
    repeat: int = 5
    quick: bool = False
    trace: str | os.PathLike[str] | Sequence[TraceRequest] | None = None
    seed: int = 0
    trace_requests: int | None = None

    def validate(self) -> None:
        if not self.backends:
            raise InvalidConfig("at least one backend is needed")
        if len(set(self.backends)) != len(self.backends):
            raise InvalidConfig(f"backends listed twice: {self.backends}")
        if self.repeat < 1:
            raise InvalidConfig(f"repeat must be >= 1, got {self.repeat}")

    @property
    def construct_sizes(self) -> tuple[int, ...]:
        """Pool sizes the construct suite builds."""
        return (1_000, 10_000) if self.quick else (100_000, 1_000_000)

    @property
    def micro_num_blocks(self) -> int:
        """Pool size of every micro-benchmark."""
        return 4_096 if self.quick else 100_000

    @property
    def micro_ops(self) -> int:
        """Blocks (or lookups) processed per timed micro run."""
        return 2_048 if self.quick else 131_072

    @property
    def num_trace_requests(self) -> int:
        """Requests of the built-in trace replayed by the trace suite."""
        if self.trace_requests is not None:
            return self.trace_requests
        return 40 if self.quick else 2000

    @property
    def trace_num_blocks(self) -> int:
        """Pool size of the trace suite (the ``kvpool simulate`` default at full size)."""
        return 1024 if self.quick else 4096

    @property
    def hashing_blocks(self) -> int:
        """Blocks hashed per timed run of the hashing suite."""
        return 512 if self.quick else 20_000


def size_label(n: int) -> str:
    """``100000 -> "100k"``, ``1000000 -> "1M"``: figure names carry the size."""
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


__all__ = ["ALLOC_BATCHES", "SUITES", "BenchConfig", "size_label"]
