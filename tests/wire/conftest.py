"""Loopback fixtures for the wire tests: a pool that publishes, and checks after every batch."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections import Counter
from collections.abc import Callable

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgspec")

import zmq  # noqa: E402

from kvpool.backends import make_pool  # noqa: E402
from kvpool.events import cache_index_of  # noqa: E402
from kvpool.hashing import BlockHasher  # noqa: E402
from kvpool.workload.driver import HASH_SEED, replay  # noqa: E402
from kvpool.workload.synthetic import ChatWorkload  # noqa: E402

_names = itertools.count()

WAIT_S = 10.0
"""Upper bound on any wait in these tests (they finish in well under a second each when
healthy); a wait that runs out fails the test instead of hanging it."""


def drive_pool(publish: Callable[[list], None], *, num_requests: int = 24, seed: int = 0,
               num_blocks: int = 48) -> list[Counter]:
    """Replay a small chat trace through a fresh reference pool with events on, publishing
    each step's events; the pool's own cache index after each published batch, in order.

    48 blocks keep the pool under pressure, so batches carry removals (evictions) too.
    """
    pool = make_pool(num_blocks, backend="reference", enable_kv_cache_events=True)
    expected: list[Counter] = []

    def on_step() -> None:
        events = pool.take_events()
        if events:
            publish(events)
            expected.append(cache_index_of(pool.abstract().state.cache, pool.event_context))

    trace = ChatWorkload(num_requests=num_requests, seed=seed, system_prompt_tokens=(32, 96),
                         user_message_tokens=24, output_tokens=20, max_output_tokens=40,
                         max_prompt_tokens=400, think_steps=4.0).generate()
    replay(pool, trace, block_size=16, max_running=6,
           hasher=BlockHasher("sha256", seed=HASH_SEED), on_step=on_step)
    return expected


class IndexCheck:
    """An ``on_batch`` hook: the subscriber's index must equal the pool's after each batch.

    ``expected[generation][seq]`` is the pool's index after its batch ``seq``; a publisher
    restart moves to the next generation (the subscriber counts restarts).
    """

    def __init__(self) -> None:
        self.expected: list[list[Counter]] = []
        self.checked: list[set[int]] = []
        self.mismatches: list[tuple[int, int]] = []
        self.subscriber = None

    def generation(self, expected: list[Counter]) -> None:
        self.expected.append(expected)
        self.checked.append(set())

    def __call__(self, source, seq, batch, index) -> None:
        generation = self.subscriber.stats()[source.engine].restarts
        if index.cache_index() != self.expected[generation][seq]:
            self.mismatches.append((generation, seq))
        self.checked[generation].add(seq)

    def all_checked(self, generation: int = -1) -> bool:
        return self.checked[generation] == set(range(len(self.expected[generation])))


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.term()


@pytest.fixture
def inproc():
    """Fresh ``(pub, replay)`` inproc names."""
    n = next(_names)
    return f"inproc://kv-{os.getpid()}-{n}", f"inproc://kv-{os.getpid()}-{n}-replay"


@pytest.fixture
def ipc():
    """Fresh ``(pub, replay)`` ipc paths in a short temporary directory."""
    with tempfile.TemporaryDirectory(prefix="kvw", dir="/tmp") as where:
        yield f"ipc://{where}/pub", f"ipc://{where}/replay"
