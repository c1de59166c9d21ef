"""The replay driver: scheduler-shaped use of the pool, identical decisions on every backend."""

from __future__ import annotations

import importlib.util

import pytest

from kvpool import make_pool
from kvpool.errors import InvalidConfig
from kvpool.events import BlockRemoved
from kvpool.workload.driver import replay
from kvpool.workload.synthetic import ChatWorkload
from kvpool.workload.trace import TraceError, TraceRequest

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
BACKENDS = ["spec", "reference"] + (["fast"] if HAVE_NUMBA else [])

SMALL_CHAT = ChatWorkload(
    num_requests=40,
    seed=11,
    system_prompt_tokens=(40, 120),
    user_message_tokens=24,
    output_tokens=24,
    max_prompt_tokens=600,
    conversation_rate=0.3,
    think_steps=5.0,
)


def _run(backend, trace, num_blocks, *, block_size=16, max_running=8, **pool_options):
    pool = make_pool(num_blocks, backend=backend, hash_block_size=block_size, **pool_options)
    report = replay(pool, trace, block_size=block_size, max_running=max_running)
    return pool, report


@pytest.mark.parametrize("num_blocks", [96, 2048], ids=["pressure", "roomy"])
def test_every_backend_makes_the_same_decisions_and_ends_in_the_same_state(num_blocks):
    trace = SMALL_CHAT.generate()
    outcomes = {}
    for backend in BACKENDS:
        pool, report = _run(backend, trace, num_blocks)
        outcomes[backend] = (report.decisions(), pool.abstract())
    first = outcomes[BACKENDS[0]]
    for backend in BACKENDS[1:]:
        assert outcomes[backend][0] == first[0], backend
        assert outcomes[backend][1] == first[1], backend
    decisions = first[0]
    assert decisions["requests"] == len(trace)
    assert decisions["hit_tokens"] > 0
    if num_blocks == 96:
        assert decisions["evictions"] > 0
    else:
        assert decisions["evictions"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_driver_never_leaks_blocks(backend):
    pool, report = _run(backend, SMALL_CHAT.generate(), 96)
    assert report.blocks_allocated > pool.num_gpu_blocks  # blocks really were recycled
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    assert pool.abstract().state.ref_cnt == (0,) * pool.num_gpu_blocks


def test_evictions_equal_the_block_removed_events_of_the_pool():
    pool, report = _run("spec", SMALL_CHAT.generate(), 96, enable_kv_cache_events=True)
    removed = [e for e in pool.take_events() if isinstance(e, BlockRemoved)]
    assert report.evictions > 0
    assert report.evictions == len(removed)


def _request(request_id, prompt, output_len=0, arrival=0):
    return TraceRequest(request_id, arrival, tuple(prompt), output_len)


def test_the_last_prompt_token_is_always_recomputed():
    prompt = list(range(100, 132))  # exactly two full blocks of 16
    trace = [_request("a", prompt), _request("b", prompt, arrival=5)]
    _, report = _run("spec", trace, 32)
    assert report.hit_tokens == 16  # not 32: b computes its last block again


def test_a_longer_prompt_hits_every_cached_full_block():
    prompt = list(range(100, 133))  # two full blocks and one token
    trace = [_request("a", prompt), _request("b", prompt, arrival=5)]
    _, report = _run("spec", trace, 32)
    assert report.hit_tokens == 32
    assert report.hit_rate == pytest.approx(32 / 66)


def test_a_finished_request_frees_its_table_tail_first():
    prompt = list(range(200, 240))  # blocks: 2 full (cached) + 1 partial (8 tokens)
    pool, _ = _run("spec", [_request("a", prompt)], 8)
    # Table [1, 2, 3] freed as [3, 2, 1]: the partial block 3 has no key and goes to the
    # front; the cached blocks go to the tail in release order, so 2 is evicted before 1.
    assert pool.abstract().state.free_queue == (3, 4, 5, 6, 7, 2, 1)


def test_decode_allocates_a_block_every_block_size_tokens_and_caches_full_ones():
    prompt = list(range(300, 316))  # one full block
    pool, report = _run("spec", [_request("a", prompt, output_len=33)], 16)
    # KV for 16 + 32 tokens (the 33rd output is never computed) = 3 blocks, all full and
    # cached; 16 + 34 outputs would have needed a 4th.
    assert report.blocks_allocated == 3
    assert report.decode_tokens == 33
    state = pool.abstract().state
    assert sum(key is not None for key in state.primary_key) == 3


def test_a_request_that_does_not_fit_waits_and_the_next_allocation_evicts():
    # 10 usable blocks; each request reserves 8 (20 prompt + 12 output tokens, block size 4).
    trace = [_request("a", range(1000, 1020), 12), _request("b", range(2000, 2020), 12)]
    _, report = _run("spec", trace, 11, block_size=4)
    assert report.requests == 2
    assert report.peak_usage == pytest.approx(0.8)  # never both at once
    assert report.steps == 2 * 12  # b waited for a to finish (each spans 12 steps)
    assert report.evictions > 0  # b's blocks came from a's cached ones


def test_max_running_bounds_concurrency():
    trace = [_request(f"r{i}", range(100 * i + 1, 100 * i + 9), 10) for i in range(4)]
    _, serial = _run("spec", trace, 64, block_size=4, max_running=1)
    _, parallel = _run("spec", trace, 64, block_size=4, max_running=4)
    assert serial.steps >= 4 * 10
    assert parallel.steps < serial.steps
    assert serial.decisions()["blocks_allocated"] == parallel.decisions()["blocks_allocated"]


def test_a_pool_without_caching_has_no_hits_and_no_leaks():
    pool, report = _run("reference", SMALL_CHAT.generate(), 96, enable_caching=False)
    assert report.hit_tokens == 0 and report.evictions == 0
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def test_a_request_larger_than_the_pool_is_rejected_up_front():
    with pytest.raises(InvalidConfig, match="'big' needs 5 blocks"):
        _run("spec", [_request("big", range(1, 70))], 5)


def test_block_size_must_equal_the_pools_hash_block_size():
    pool = make_pool(16, backend="spec", hash_block_size=16)
    with pytest.raises(InvalidConfig):
        replay(pool, [_request("a", [1, 2])], block_size=32)


def test_duplicate_ids_in_memory_are_rejected():
    with pytest.raises(TraceError, match="duplicate"):
        _run("spec", [_request("a", [1]), _request("a", [2])], 16)


def test_arrival_order_not_file_order_decides():
    a, b = _request("a", range(1, 40), 3, arrival=7), _request("b", range(1, 40), 3, arrival=0)
    _, report_ab = _run("spec", [a, b], 32)
    _, report_ba = _run("spec", [b, a], 32)
    assert report_ab.decisions() == report_ba.decisions()
