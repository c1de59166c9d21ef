"""Classes 1 and 2 of issue 7: callbacks that call back into the pool, or raise.

Semantics (docs/api.md, "Callbacks"): every callback of an operation runs after the operation
completed; a state-changing call made from inside one is refused with ``ReentrantCall``
before anything changes (queries are answered); the first callback failure is re-raised
afterwards as ``WatcherError`` / ``MetricsCollectorError`` carrying the result.
"""

from __future__ import annotations

import numpy as np
import pytest
from hostile import BACKENDS, Recorder, pool_of, request

from kvpool import batch
from kvpool.errors import (
    CallbackError,
    InvalidConfig,
    MetricsCollectorError,
    ReentrantCall,
    WatcherError,
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_watcher_unpinning_another_block_is_refused_and_every_watcher_still_fires(backend):
    pool = pool_of(backend)
    a, b, c = pool.get_new_blocks(3)
    fired: list[int] = []
    seen: list[object] = []

    def reentrant(block_id: int) -> None:
        fired.append(block_id)
        seen.append(pool.get_num_free_blocks())  # queries are answered
        pool.unpin_blocks([c], fired.append)  # refused: the pool is delivering callbacks

    pool.unpin_blocks([a], reentrant)
    pool.unpin_blocks([b], fired.append)
    free = pool.get_num_free_blocks()
    with pytest.raises(WatcherError) as caught:
        pool.get_new_blocks(free)  # pops a and b (both watched) among the free blocks
    assert isinstance(caught.value.__cause__, ReentrantCall)
    assert sorted(fired) == [a, b]  # b's watcher ran although a's raised
    assert sorted(caught.value.result) == [x for x in range(1, 8) if x != c]
    assert pool.watched_blocks() == () and pool.abstract().state.watchers == ()
    assert pool.abstract().state.ref_cnt[c] == 1  # the refused unpin changed nothing
    pool.free_blocks(caught.value.result)
    assert len(pool.get_new_blocks(pool.get_num_free_blocks())) == 6  # no KeyError, no loss


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("verb", ["get_new_blocks", "free_blocks", "touch", "evict_blocks",
                                  "reset_prefix_cache", "cache_full_blocks", "admit", "admit_into",
                                  "step"])
def test_every_state_changing_call_from_a_collector_is_refused(backend, verb):
    pool = pool_of(backend, metrics_collector=None)
    r = request()
    held = pool.get_new_blocks(2)
    calls = {
        "get_new_blocks": lambda: pool.get_new_blocks(1),
        "free_blocks": lambda: pool.free_blocks(held[:1]),
        "touch": lambda: pool.touch(held[:1]),
        "evict_blocks": lambda: pool.evict_blocks(held[:1]),
        "reset_prefix_cache": pool.reset_prefix_cache,
        "cache_full_blocks": lambda: pool.cache_full_blocks(r, held, 0, 1, 2, 0),
        "admit": lambda: (pool.admit if hasattr(pool, "admit") else
                          lambda *a: batch.admit(pool, *a))(r, 0, 1, 0, 0, 2, 0),
        "admit_into": lambda: (pool.admit_into if hasattr(pool, "admit_into") else
                               lambda *a: batch.admit_into(pool, *a))(
                                   r, np.zeros(1, np.int64), 0, 1, 0, 0, 2, 0),
        "step": lambda: (pool.step if hasattr(pool, "step") else
                         lambda *a: batch.step(pool, *a))([], 1, [], 2, 0),
    }
    errors: list[BaseException] = []

    class Reentrant(Recorder):
        def on_block_allocated(self, block_id: int) -> None:
            super().on_block_allocated(block_id)
            try:
                calls[verb]()
            except ReentrantCall as exc:
                errors.append(exc)

    pool.metrics_collector = Reentrant()
    before = pool.abstract()
    new = pool.get_new_blocks(1)
    assert len(errors) == 1  # (a composed batch verb is refused at its first verb)
    after = pool.abstract()
    assert after.state.ref_cnt[new[0]] == 1
    assert [after.state.ref_cnt[b] for b in held] == [before.state.ref_cnt[b] for b in held]
    assert after.state.cache == before.state.cache


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_raising_collector_lets_the_allocation_complete_and_every_callback_run(backend):
    collector = Recorder()
    pool = pool_of(backend, metrics_collector=collector)
    a = pool.get_new_blocks(1)[0]
    fired: list[int] = []
    pool.unpin_blocks([a], fired.append)
    collector.fail = ("on_block_allocated",)
    with pytest.raises(MetricsCollectorError) as caught:
        pool.get_new_blocks(7)
    assert isinstance(caught.value, CallbackError)
    assert caught.value.result == list(range(2, 8)) + [a]
    assert fired == [a]  # the pending watcher was not dropped
    allocated = [args[0] for name, args in collector.calls if name == "on_block_allocated"]
    assert allocated == [a, *caught.value.result]  # every callback ran
    assert pool.get_num_free_blocks() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_admit_and_step_finish_when_a_collector_raises(backend):
    collector = Recorder(fail=("on_block_accessed", "on_block_allocated"))
    pool = pool_of(backend, metrics_collector=collector)
    r = request()
    admit = getattr(pool, "admit", None) or (lambda *a: batch.admit(pool, *a))
    step = getattr(pool, "step", None) or (lambda *a: batch.step(pool, *a))
    with pytest.raises(MetricsCollectorError) as caught:
        admit(r, 4, 4, 4, 0, 2, 0)
    hits, new = caught.value.result
    assert hits == [] and len(new) == 4
    assert len(pool.abstract().state.cache) == 4  # the caching after the allocation ran
    with pytest.raises(MetricsCollectorError) as caught:
        admit(r, 4, 4, 4, 0, 2, 0)  # now a hit: touch raises, allocation and rest still run
    assert caught.value.result == (new, [])
    with pytest.raises(MetricsCollectorError) as caught:
        step([], 2, [new, new], 2, 0)
    assert len(caught.value.result) == 2
    assert pool.abstract().state.ref_cnt[new[0]] == 0  # both frees ran


@pytest.mark.parametrize("backend", BACKENDS)
def test_admit_into_writes_its_table_when_a_collector_raises(backend):
    collector = Recorder(fail=("on_block_allocated",))
    pool = pool_of(backend, metrics_collector=collector)
    admit_into = getattr(pool, "admit_into", None) or (
        lambda *a: batch.admit_into(pool, *a))
    table = np.full(5, -1, np.int64)
    with pytest.raises(MetricsCollectorError) as caught:
        admit_into(request(), table, 4, 4, 4, 0, 2, 0)
    assert caught.value.result == 0  # no hits; the admission completed
    allocated = [args[0] for name, args in collector.calls if name == "on_block_allocated"]
    assert table.tolist() == [*allocated, -1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [object(), "collector", 3])
def test_a_metrics_collector_that_is_not_one_is_rejected_at_construction(backend, bad):
    with pytest.raises(InvalidConfig, match="metrics_collector"):
        pool_of(backend, metrics_collector=bad)
