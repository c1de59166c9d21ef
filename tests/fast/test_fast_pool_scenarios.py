"""The fast pool agrees with the spec on every operation, scenario by scenario.

Each test runs a :class:`FastTwin` (spec + compiled fast + plain-Python fast) and also asserts
the concrete expectation from BEHAVIOUR.md, so pools that agree on something wrong still fail.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from fast_twin import FastTwin, block_hash, fast_pool, request_with_hashes

from kvpool import make_pool
from kvpool.errors import (
    CachingDisabled,
    DoubleFree,
    ForeignBlock,
    HashStateError,
    InvalidArgument,
    InvalidBlockId,
    InvalidGroupId,
    NoFreeBlocks,
    NullBlockMisuse,
    WatcherError,
)
from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvpool.keys import pack_key


def test_allocation_pops_ids_in_order_and_skips_the_null_block():
    t = FastTwin(6)
    assert t.get_new_blocks(2) == [1, 2]
    assert t.get_new_blocks(0) == []
    assert t.get_new_blocks(3) == [3, 4, 5]
    with pytest.raises(NoFreeBlocks, match="Cannot get 1 free blocks"):
        t.get_new_blocks(1)
    for bad in (-1, 1.0, True, "2"):
        with pytest.raises(InvalidArgument):
            t.get_new_blocks(bad)
    assert t.get_new_blocks(np.int64(0)) == []


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("n", [1, 2, 3, 10_000])
def test_construction_writes_five_block_rows_whatever_the_size(n, jit):
    # The relative encoding (kernels.py): a zero row is a fresh free block, so building a
    # pool touches only block 0, block 1, block N-1 and the two sentinels.
    pool = make_pool(n, backend="fast", jit=jit)
    rows = np.flatnonzero(pool._st.blk.any(axis=1)).tolist()
    assert set(rows) <= {0, 1, n - 1, n, n + 1}
    assert pool.abstract().state.free_queue == tuple(range(1, n))
    assert pool.check_invariants() == []
    blocks = pool.get_new_blocks(n - 1)  # every block, in id order
    assert blocks == list(range(1, n))
    pool.free_blocks(blocks[::-1])
    assert pool.check_invariants() == []


def test_free_puts_unkeyed_blocks_in_front_and_keyed_blocks_at_the_tail():
    t = FastTwin(8)
    r = request_with_hashes(4)
    blocks = t.get_new_blocks(6)
    t.cache_full_blocks(r, blocks[:2], 0, 2, 16, 0)
    t.free_blocks([blocks[0], blocks[2], blocks[1], blocks[3]])  # keyed, free, keyed, free
    assert t.state.free_queue == (3, 4, 7, 1, 2)
    t.free_blocks(np.array([blocks[5], blocks[4]], dtype=np.int32))
    assert t.state.free_queue == (6, 5, 3, 4, 7, 1, 2)


def test_double_free_is_counted_per_batch_and_changes_nothing():
    t = FastTwin(6)
    a, b = t.get_new_blocks(2)
    t.touch([a])
    with pytest.raises(DoubleFree, match=f"block {b} is released 2"):
        t.free_blocks([a, b, a, b])
    with pytest.raises(InvalidBlockId):
        t.free_blocks([a, 99])
    with pytest.raises(InvalidBlockId):
        t.free_blocks(np.array([a, 2**64 - 1], dtype=np.uint64))
    with pytest.raises(InvalidBlockId):
        t.free_blocks([a, -1])
    with pytest.raises(InvalidBlockId):
        t.free_blocks([True])
    t.free_blocks([0, a, a, 0, b])
    assert t.state.ref_cnt == (0,) * 6


def test_touch_takes_cached_blocks_out_of_the_queue():
    t = FastTwin(6)
    r = request_with_hashes(2)
    blocks = t.get_new_blocks(2)
    t.cache_full_blocks(r, blocks, 0, 2, 16, 0)
    t.free_blocks(blocks[::-1])
    assert t.get_cached_block(r.block_hashes[0], [0]) == [blocks[0]]
    t.touch([blocks[0], 0, blocks[0]])
    assert t.state.ref_cnt[blocks[0]] == 2
    assert blocks[0] not in t.state.free_queue
    with pytest.raises(InvalidBlockId):
        t.touch([blocks[1], 6])
    assert t.state.ref_cnt[blocks[1]] == 0


@pytest.mark.parametrize("events", [False, True])
def test_duplicates_under_one_key_answer_earliest_first(events):
    t = FastTwin(8, enable_kv_cache_events=events)
    r = request_with_hashes(2)
    first = t.get_new_blocks(2)
    second = t.get_new_blocks(2)
    t.cache_full_blocks(r, first, 0, 2, 16, 0)
    t.cache_full_blocks(r, second, 0, 2, 16, 0)
    key = pack_key(r.block_hashes[0], 0)
    assert t.state.cache[key] == (first[0], second[0])
    assert t.get_cached_block(r.block_hashes[0], [0]) == [first[0]]
    t.evict_blocks([first[0]])
    assert t.get_cached_block(r.block_hashes[0], [0]) == [second[0]]
    events_seen = t.take_events()
    assert len(events_seen) == (3 if events else 0)
    if events:
        assert [e.seq for e in events_seen] == [0, 1, 2]
        assert isinstance(events_seen[2], BlockRemoved)


def test_group_ids_are_part_of_the_key_and_validated():
    t = FastTwin(8)
    r = request_with_hashes(1)
    a, b = t.get_new_blocks(2)
    t.cache_full_blocks(r, [a], 0, 1, 16, 0)
    t.cache_full_blocks(r, [b], 0, 1, 16, 2**32 - 1)
    assert t.get_cached_block(r.block_hashes[0], [2**32 - 1, 0]) == [b, a]
    assert t.get_cached_block(r.block_hashes[0], [1]) is None
    with pytest.raises(InvalidGroupId):
        t.get_cached_block(r.block_hashes[0], [2**32])
    with pytest.raises(InvalidArgument):
        t.get_cached_block(r.block_hashes[0], [])
    with pytest.raises(InvalidArgument):
        t.get_cached_block("not bytes", [0])


@pytest.mark.parametrize("events", [False, True])
def test_partial_entries_grow_and_become_secondaries_in_insertion_order(events):
    t = FastTwin(8, enable_kv_cache_events=events)
    r = request_with_hashes(6)
    (b,) = t.get_new_blocks(1)
    k1 = t.cache_partial_block(r, b, 16, 0, 64)
    k2 = t.cache_partial_block(r, b, 32, 0, 64)  # grows: k1 removed
    assert t.state.primary_key[b] == k2 and t.state.primary_tokens[b] == 32
    assert t.cache_partial_block(r, b, 16, 0, 64) == k1  # shorter: a secondary
    assert t.cache_partial_block(r, b, 16, 1, 64) == pack_key(r.block_hashes[0], 1)
    assert t.state.secondary_keys[b] == (k1, pack_key(r.block_hashes[0], 1))
    assert t.cache_partial_block(r, b, 16, 0, 64) == k1  # already there: no event
    assert t.cache_partial_block(r, 0, 16, 0, 64) is None
    t.evict_blocks([b])  # primary first, then secondaries in insertion order
    if events:
        removed = [e for e in t.take_events() if isinstance(e, BlockRemoved)]
        assert [e.group_idx for e in removed] == [0, 0, 0, 1]
    t.cache_partial_block(r, b, 64, 0, 64)
    t.cache_partial_block(r, b, 32, 0, 64, replace_existing_hashes=True)
    assert t.state.primary_tokens[b] == 32
    for args in [(r, b, 8, 0, 64), (r, b, 0, 0, 64), (r, b, 16 * 7, 0, 64), (r, b, 16, 0, 24)]:
        with pytest.raises(InvalidArgument):
            t.cache_partial_block(*args)
    with pytest.raises(InvalidBlockId):
        t.cache_partial_block(r, 8, 16, 0, 64)
    t.free_blocks([b])
    with pytest.raises(HashStateError):
        t.cache_partial_block(r, b, 16, 0, 64)


@pytest.mark.parametrize("events", [False, True])
def test_full_caching_promotes_a_partial_entry_and_emits_one_stored_event(events):
    t = FastTwin(8, enable_kv_cache_events=events)
    r = request_with_hashes(8)
    blocks = t.get_new_blocks(3)
    t.cache_partial_block(r, blocks[1], 48, 0, 32)  # inside position 1 (tokens 32..64)
    t.take_events()
    t.cache_full_blocks(r, [blocks[0], 0, blocks[1], blocks[2]], 0, 3, 32, 0,
                        block_mask=[True, True, False])
    assert t.state.primary_tokens[blocks[0]] == 32
    assert t.state.primary_key[blocks[1]] == pack_key(r.block_hashes[2], 0)  # untouched
    t.cache_full_blocks(r, [blocks[0], 0, blocks[1], blocks[2]], 2, 4, 32, 0)
    assert t.state.primary_tokens[blocks[1]] == 96
    assert t.state.primary_key[blocks[2]] == pack_key(r.block_hashes[7], 0)
    if events:
        got = t.take_events()
        assert [type(e) for e in got] == [BlockStored, BlockRemoved, BlockStored]
        assert got[2].parent_block_hash is not None and len(got[2].block_hashes) == 2
    with pytest.raises(HashStateError):  # already carries that key
        t.cache_full_blocks(r, [blocks[0]], 0, 1, 32, 0)
    (fresh,) = t.get_new_blocks(1)
    with pytest.raises(InvalidArgument, match="twice"):
        t.cache_full_blocks(r, [fresh, fresh], 0, 2, 16, 0)
    with pytest.raises(InvalidArgument):
        t.cache_full_blocks(r, blocks, 0, 3, 16, 0, block_mask=[True])
    with pytest.raises(InvalidArgument):
        t.cache_full_blocks(r, blocks * 3, 0, 9, 16, 0)  # hashes too short
    with pytest.raises(InvalidArgument):
        t.cache_full_blocks(r, blocks, 0, 3, 24, 0)
    with pytest.raises(InvalidBlockId):
        t.cache_full_blocks(r, [blocks[0], -3], 1, 2, 16, 0)
    with pytest.raises(InvalidBlockId):  # a candidate is converted before any check
        t.cache_full_blocks(r, [blocks[0], "junk"], 1, 2, 16, 0)
    # Only the candidates are read (shell.candidate_table): junk elsewhere is not looked at.
    t.cache_full_blocks(r, [blocks[0], "junk"], 2, 2, 16, 0)
    t.cache_full_blocks(r, blocks, 3, 1, 16, 0)  # num_cached >= num_full: no-op
    t.free_blocks([blocks[2]])
    with pytest.raises(HashStateError):
        t.cache_full_blocks(r, [blocks[2]], 0, 1, 16, 3)


def test_keys_of_any_length_work_and_the_index_grows():
    t = FastTwin(200, enable_kv_cache_events=True)
    small = t.fast[0].memory_bytes()
    for size in (0, 1, 16, 100):
        r = request_with_hashes(40, prefix=f"s{size}", size=size if size else 1)
        if size == 0:
            r.block_hashes[:] = [b""] * 40
        blocks = t.get_new_blocks(40)
        t.cache_full_blocks(r, blocks, 0, 40, 16, 7)
        assert t.get_cached_block(r.block_hashes[39], [7]) == [blocks[39 if size else 0]]
        t.free_blocks(blocks[::-1])
    t.get_new_blocks(150)  # evicts most keys
    assert len(t.take_events()) > 100
    assert t.fast[0].memory_bytes() > small  # the index grew on demand
    assert t.fast[0].check_invariants() == t.fast[1].check_invariants() == []


def test_move_block_hashes_hands_every_key_over_in_order():
    t = FastTwin(8, enable_kv_cache_events=True)
    r = request_with_hashes(4)
    src, dst, other = t.get_new_blocks(3)
    t.cache_full_blocks(r, [other], 0, 1, 16, 0)
    t.cache_partial_block(r, src, 32, 0, 64)
    t.cache_partial_block(r, src, 16, 0, 64)
    t.move_block_hashes(src, dst)
    s = t.state
    assert s.primary_key[dst] == pack_key(r.block_hashes[1], 0) and s.primary_tokens[dst] == 32
    assert s.secondary_keys == {dst: (pack_key(r.block_hashes[0], 0),)}
    assert s.cache[pack_key(r.block_hashes[0], 0)] == (other, dst)
    for bad, error in [((dst, other), HashStateError), ((0, src), NullBlockMisuse),
                       ((src, src), InvalidArgument), ((src, 9), InvalidBlockId),
                       ((-1, src), InvalidBlockId)]:
        with pytest.raises(error):
            t.move_block_hashes(*bad)
    t.free_blocks([src])
    with pytest.raises(HashStateError, match=f"free block {src}"):
        t.move_block_hashes(src, 5 if src != 5 else 6)
    assert t.take_events()[-1].seq == 2  # moves emit nothing
    u = FastTwin(4, enable_caching=False)
    with pytest.raises(CachingDisabled):
        u.move_block_hashes(1, 2)


def test_watchers_fire_once_in_pop_order_and_at_reset_in_table_order():
    t = FastTwin(6)
    blocks = t.get_new_blocks(4)
    t.touch(blocks[:2])
    t.unpin_blocks([blocks[2], blocks[0]])
    t.unpin_blocks([blocks[1], blocks[0]])  # blocks[0] keeps its place in the table
    assert t.state.watchers == (blocks[2], blocks[0], blocks[1])
    assert t.get_new_blocks(2) == [5, blocks[2]]
    assert t.fired_spec == [blocks[2]]
    for bad, error in [([0], NullBlockMisuse), ([blocks[3], blocks[3]], DoubleFree),
                       ([7], InvalidBlockId)]:
        with pytest.raises(error):
            t.unpin_blocks(bad)
    assert t.reset_prefix_cache() is False
    t.free_blocks([5, blocks[2], blocks[3], blocks[1]])
    assert t.reset_prefix_cache() is True
    assert t.fired_spec == [blocks[2], blocks[0], blocks[1]]
    assert t.state.watchers == ()


def test_a_raising_watcher_surfaces_after_the_allocation_completed():
    pools = [make_pool(4, backend="spec"), fast_pool(4, jit=True), fast_pool(4, jit=False)]
    for pool in pools:
        (b,) = pool.get_new_blocks(1)

        def boom(_b):
            raise KeyError("x")

        pool.unpin_blocks([b], boom)
        pool.get_new_blocks(2)
        with pytest.raises(WatcherError) as info:
            pool.get_new_blocks(1)
        assert info.value.result == [b]
    assert pools[1].abstract() == pools[0].abstract() == pools[2].abstract()


@pytest.mark.parametrize("events", [False, True])
def test_reset_is_refused_while_blocks_are_held_and_clears_everything_after(events):
    t = FastTwin(6, enable_kv_cache_events=events)
    r = request_with_hashes(3)
    blocks = t.get_new_blocks(3)
    t.cache_full_blocks(r, blocks, 0, 3, 16, 0)
    assert t.reset_prefix_cache() is False
    t.free_blocks(blocks[::-1])
    assert t.reset_prefix_cache() is True
    assert t.state.cache == {} and t.state.free_queue == (4, 5, 3, 2, 1)
    got = t.take_events()
    if events:
        assert isinstance(got[-1], AllBlocksCleared) and got[-1].seq == 1
    assert t.get_cached_block(r.block_hashes[0], [0]) is None


def test_caching_disabled_frees_to_the_front_and_refuses_cache_writes():
    t = FastTwin(5, enable_caching=False)
    r = request_with_hashes(2)
    blocks = t.get_new_blocks(3)
    for call in (lambda: t.cache_full_blocks(r, blocks, 0, 2, 16, 0),
                 lambda: t.cache_partial_block(r, blocks[0], 16, 0, 16)):
        with pytest.raises(CachingDisabled):
            call()
    t.free_blocks(blocks)
    assert t.state.free_queue == (1, 2, 3, 4)
    assert t.get_cached_block(r.block_hashes[0], [0]) is None


def test_queries_and_emitted_events_agree():
    t = FastTwin(5, enable_kv_cache_events=True)
    r = request_with_hashes(4)
    (b,) = t.get_new_blocks(1)
    assert t.is_block_writable(b) is True
    assert t.is_block_writable(0) is False
    with pytest.raises(InvalidBlockId):
        t.is_block_writable(5)
    t.cache_full_blocks(r, [b], 0, 1, 16, 0)
    assert t.is_block_writable(b) is False
    assert t.get_num_free_blocks() == 3 and t.get_usage() == 0.25
    t.emit_cached_block_events(r, 2, 32, 1)
    t.emit_cached_block_events(r, 0, 32, 1)
    with pytest.raises(InvalidArgument):
        t.emit_cached_block_events(r, 3, 32, 1)
    assert [e.seq for e in t.take_events()] == [0, 1]


def test_metrics_callbacks_match():
    class Recorder:
        def __init__(self):
            self.calls = []

        def on_block_allocated(self, b):
            self.calls.append(("alloc", b))

        def on_block_accessed(self, b):
            self.calls.append(("access", b))

        def on_block_evicted(self, b):
            self.calls.append(("evict", b))

        def reset(self):
            self.calls.append(("reset",))

    recorders = [Recorder() for _ in range(3)]
    pools = [make_pool(6, backend="spec", metrics_collector=recorders[0]),
             fast_pool(6, jit=True, metrics_collector=recorders[1]),
             fast_pool(6, jit=False, metrics_collector=recorders[2])]
    r = request_with_hashes(2)
    for pool in pools:
        blocks = pool.get_new_blocks(2)
        pool.touch(blocks)
        pool.cache_full_blocks(r, blocks, 0, 2, 16, 0)
        pool.free_blocks(blocks + blocks)
        pool.evict_blocks([blocks[0]])
        pool.reset_prefix_cache()
        pool.get_new_blocks(3)
    assert recorders[0].calls == recorders[1].calls == recorders[2].calls
    assert pools[0].abstract() == pools[1].abstract() == pools[2].abstract()


def test_blockrefs_route_frees_to_their_owner_pool():
    spec_a, spec_b = make_pool(4, backend="spec"), make_pool(4, backend="spec")
    fast_a, fast_b = fast_pool(4, jit=True), fast_pool(4, jit=False)
    for a, b in ((spec_a, spec_b), (fast_a, fast_b), (fast_a, spec_b)):
        (x,) = a.get_new_blocks(1)
        (y,) = b.get_new_blocks(1)
        with pytest.raises(DoubleFree):  # validated on every pool first
            a.free_blocks([x, b.ref(y), b.ref(y)])
        with pytest.raises(ForeignBlock):
            a.touch([b.ref(y)])
        a.free_blocks([a.ref(x), b.ref(y)])
        assert a.get_num_free_blocks() == 3 and b.get_num_free_blocks() == 3
    assert fast_a.abstract().state == spec_a.abstract().state


def test_numpy_id_arrays_of_any_integer_dtype_are_accepted():
    t = FastTwin(10)
    for dtype in (np.int8, np.uint16, np.int32, np.int64, np.uint64):
        blocks = t.get_new_blocks(3)
        t.touch(np.array(blocks, dtype=dtype))
        t.free_blocks(np.array(blocks * 2, dtype=dtype)[::-1])
    for bad in (np.array([1.0]), np.array([[1]]), np.array([True])):
        with pytest.raises(InvalidBlockId):
            t.free_blocks(bad)
    arr = t.fast[0].get_new_blocks_array(2)
    assert arr.dtype == np.int64 and arr.tolist() == [3, 2]
    t.fast[0].free_blocks(arr)


def test_hashes_that_are_not_bytes_are_rejected_like_the_spec():
    # bytearray and memoryview are refused too: a stored key must not change afterwards.
    t = FastTwin(6)
    r = request_with_hashes(2)
    blocks = t.get_new_blocks(2)
    for bad in (bytearray(block_hash("b")), memoryview(block_hash("b")), 7):
        r.block_hashes[:] = [block_hash("a"), bad]
        with pytest.raises(InvalidArgument, match=r"block_hashes\[1\]"):
            t.cache_full_blocks(r, blocks, 0, 2, 16, 0)
    assert t.get_cached_block(block_hash("a"), [0]) is None


def test_without_numba_make_pool_reports_the_backend_unavailable():
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import kvpool\n"
        "try:\n"
        "    kvpool.make_pool(4, backend='fast')\n"
        "except kvpool.BackendUnavailable as e:\n"
        "    print('unavailable:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.startswith("unavailable:") and "numba" in out.stdout
    assert make_pool(4, backend="fast").get_new_blocks(1) == [1]
