"""``admit``, ``admit_into``, ``step``, ``cache_full_blocks_batch`` and ``free_tables``: the fast
pool's one-kernel
verbs equal their generic compositions in :mod:`kvpool.batch`.

Five pools run every call in lockstep: the generic composition on a spec, a reference and a
compiled fast pool, and the fast pool's own verb with compiled and with plain-Python
kernels. After each call the results (or error types and messages), ``abstract()`` (state
and pending events, sequence numbers included), metrics calls and reuse-watcher calls must
agree, and a call that raised must have changed nothing on any pool: the compositions
validate up front too. Programs mix valid scheduler traffic with corrupt tables, junk ids,
double frees across tables, promotions, refusals, pending watchers and metrics collectors.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from fast_twin import assert_sound, block_hash, fast_pool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpool import batch, make_pool
from kvpool.errors import (
    CachingDisabled,
    DoubleFree,
    ForeignBlock,
    HashStateError,
    InvalidArgument,
    InvalidBlockId,
    KvPoolError,
    NoFreeBlocks,
    WatcherError,
)
from kvpool.request import Request

HBS = 4
VERBS = ("admit", "admit_into", "step", "cache_full_blocks_batch", "free_tables",
         "allocate_and_cache")


class Recorder:
    """A metrics collector that logs every call."""

    def __init__(self, log: list) -> None:
        self.log = log

    def __getattr__(self, name: str):
        return lambda *args: self.log.append((name, *args))


class Lockstep:
    """Five pools driven with the same calls (see the module docstring)."""

    MODES = (("spec", "generic"), ("reference", "generic"), ("fast", "generic"),
             ("fast", "own"), ("plain", "own"))

    def __init__(self, n: int = 12, *, metrics: bool = False, **options) -> None:
        options.setdefault("hash_block_size", HBS)
        self.logs: list[list] = [[] for _ in self.MODES]
        self.pools = []
        for (backend, _), log in zip(self.MODES, self.logs, strict=True):
            collector = Recorder(log) if metrics else None
            if backend in ("fast", "plain"):
                pool = fast_pool(n, jit=backend == "fast", metrics_collector=collector,
                                 **options)
            else:
                pool = make_pool(n, backend=backend, metrics_collector=collector, **options)
            self.pools.append(pool)

    @property
    def spec(self):
        return self.pools[0]

    def call(self, verb: str, *args, per_pool=None):
        """Run ``verb`` everywhere; check agreement; return the spec's result or raise."""
        outcomes = []
        for pool, (_, mode), log in zip(self.pools, self.MODES, self.logs, strict=True):
            before = pool.abstract()
            if verb in VERBS and mode == "generic":
                fn = partial(getattr(batch, verb), pool)
            else:
                fn = getattr(pool, verb)
            try:
                result = fn(*(per_pool(pool, log) if per_pool else args))
                outcomes.append(("ok", result))
            except KvPoolError as error:
                outcomes.append(("error", type(error), str(error), error))
                if not isinstance(error, WatcherError):  # a watcher runs after the work
                    assert pool.abstract() == before, (verb, pool.backend_name)
        first = outcomes[0]
        for got, (backend, mode) in zip(outcomes[1:], self.MODES[1:], strict=True):
            assert got[:3] == first[:3], (verb, backend, mode, first[:3], got[:3])
        abstracts = [p.abstract() for p in self.pools]
        assert all(a == abstracts[0] for a in abstracts), verb
        assert all(log == self.logs[0] for log in self.logs), verb
        for pool in self.pools[2:]:
            assert_sound(pool)
        if first[0] == "error":
            raise first[3]
        return first[1]

    def __getattr__(self, verb: str):
        if verb.startswith("_"):
            raise AttributeError(verb)
        return lambda *args, **kw: self.call(verb, *args, **kw)

    def admit_into(self, request, table, *args):
        """``admit_into`` everywhere, each pool writing into its own copy of ``table``; the
        copies must agree afterwards (written alike, or left alike). Returns the spec's
        result and its copy."""
        copies = [table.copy() for _ in self.pools]
        for copy in copies:
            copy.flags.writeable = table.flags.writeable
        mine = iter(copies)
        try:
            result = self.call("admit_into", per_pool=lambda pool, log: (
                request, next(mine), *args))
        finally:
            for copy in copies[1:]:
                assert np.array_equal(copy, copies[0]), (copy, copies[0])
        return result, copies[0]

    def unpin(self, blocks) -> None:
        """Unpin everywhere; each pool's watcher calls go to its log."""
        self.call("unpin_blocks", per_pool=lambda pool, log: (
            blocks, lambda b: log.append(("watcher", b))))


def request(name: str, labels: list[str], size: int = 32) -> Request:
    r = Request(name, list(range(len(labels) * HBS + 1)))
    r.block_hashes.extend(block_hash(label, size) for label in labels)
    return r


def cached_and_freed(pools: Lockstep, r: Request, count: int) -> list[int]:
    """Cache ``count`` blocks of ``r`` and free them (tail first): cached candidates."""
    blocks = pools.get_new_blocks(count)
    pools.cache_full_blocks(r, blocks, 0, count, HBS, 0)
    pools.free_blocks(blocks[::-1])
    return blocks


# -- admit ----------------------------------------------------------------------------------


@pytest.mark.parametrize("events", [False, True])
def test_admit_hits_touches_allocates_caches_and_counts_evictable_hits(events):
    pools = Lockstep(12, enable_kv_cache_events=events)
    a = request("a", ["p0", "p1", "p2", "a3", "a4"])
    cached_and_freed(pools, a, 4)  # 4 free cached blocks; 7 free uncached
    b = request("b", ["p0", "p1", "p2", "b3", "b4", "b5"])
    # 3 evictable hits + 3 new + reserve 6 = 12 > 11 free: refused, nothing changes.
    assert pools.admit(b, 5, 6, 6, 6, HBS, 0) is None
    hits, new = pools.admit(b, 5, 6, 6, 5, HBS, 0)
    assert len(hits) == 3 and len(new) == 3
    state = pools.spec.abstract().state
    assert [state.ref_cnt[x] for x in hits + new] == [1] * 6
    assert all(state.primary_key[x] is not None for x in hits + new)
    # A second holder: hits are held now, so they are not evictable and the test passes.
    hits2, new2 = pools.admit(b, 5, 6, 6, 2, HBS, 0)
    assert hits2 == hits + new[:2] and len(new2) == 1
    # New blocks are popped from the front and evict cached ones (events: removals).
    c = request("c", ["c0", "c1", "c2", "c3"])
    pools.admit(c, 3, 4, 4, 0, HBS, 0)


def test_admit_without_caching_allocates_only_and_refuses_on_the_count():
    pools = Lockstep(8, enable_caching=False)
    r = request("r", ["x0", "x1", "x2"])
    assert pools.admit(r, 2, 3, 3, 5, HBS, 0) is None
    hits, new = pools.admit(r, 2, 3, 3, 4, HBS, 0)
    assert hits == [] and new == [1, 2, 3]


def test_admit_at_a_coarser_block_size_reads_the_coarse_hashes():
    pools = Lockstep(12)
    r = request("r", [f"h{i}" for i in range(8)])  # 4 blocks of 2·hbs tokens
    hits, new = pools.admit(r, 3, 4, 4, 0, 2 * HBS, 0)
    assert hits == [] and len(new) == 4
    pools.free_blocks(new[::-1])
    hits, new = pools.admit(r, 3, 4, 4, 0, 2 * HBS, 0)
    assert len(hits) == 3


def test_admit_rejects_bad_arguments_before_anything_happens():
    pools = Lockstep(8)
    r = request("r", ["x0", "x1", "x2"])
    cases = [
        ((r, -1, 3, 3, 0, HBS, 0), InvalidArgument),
        ((r, 2, 3, 3, True, HBS, 0), InvalidArgument),
        ((r, 2, 3, 3, 0, HBS, -1), KvPoolError),
        ((r, 2, 3, 3, 0, 3, 0), InvalidArgument),
        ((r, 4, 3, 3, 0, HBS, 0), InvalidArgument),  # more hits allowed than blocks
        ((r, 2, 3, 4, 0, HBS, 0), InvalidArgument),  # caches beyond the table
        ((r, 2, 5, 5, 0, HBS, 0), InvalidArgument),  # caches beyond the hashes
        ((request("s", ["x0"]), 1, 2, 1, 0, HBS, 0), None),  # fine: fewer hashes than hits
    ]
    for args, error in cases:
        if error is None:
            pools.admit(*args)
            continue
        with pytest.raises(error):
            pools.admit(*args)
    bad = request("bad", ["x0", "x1"])
    bad.block_hashes[1] = bytearray(bad.block_hashes[1])
    with pytest.raises(InvalidArgument):
        pools.admit(bad, 2, 2, 2, 0, HBS, 0)
    assert pools.admit(bad, 1, 2, 1, 0, HBS, 0) is not None  # the bytearray is never read
    assert pools.admit(r, 2, 3, 3, 2**70, HBS, 0) is None  # a huge reserve never fits


def test_admit_with_watchers_and_metrics_calls_back_like_the_composition():
    pools = Lockstep(10, metrics=True)
    a = request("a", ["p0", "p1", "p2"])
    cached_and_freed(pools, a, 3)
    blocks = pools.get_new_blocks(2)
    pools.unpin(blocks)  # watched, at the tail
    hits, new = pools.admit(request("b", ["p0", "p1", "q2", "q3"]), 3, 8, 4, 0, HBS, 0)
    assert len(hits) == 2 and len(new) == 6
    assert ("watcher", blocks[0]) in pools.logs[0]


def held_block_with_a_raising_watcher() -> tuple[Lockstep, int]:
    """Pools in lockstep (six blocks each), one block held and unpinned with a watcher that
    raises (each pool's watcher logs to that pool's log first)."""
    pools = Lockstep(6)
    (b,) = pools.get_new_blocks(1)

    def unpin(pool, log):
        def watcher(block):
            log.append(("watcher", block))
            raise RuntimeError("boom")

        return [b], watcher

    pools.call("unpin_blocks", per_pool=unpin)
    return pools, b


def test_a_raising_watcher_does_not_cut_admit_short():
    pools, b = held_block_with_a_raising_watcher()
    r = request("r", ["x0", "x1", "x2", "x3", "x4"])
    with pytest.raises(WatcherError) as caught:
        pools.admit(r, 4, 5, 5, 0, HBS, 0)
    hits, new = caught.value.result
    assert hits == [] and b in new
    assert all(key is not None for key in pools.spec.abstract().state.primary_key[1:])


@pytest.mark.parametrize("events", [False, True])
def test_admit_into_writes_what_admit_returns_into_the_table(events):
    twins = Lockstep(12, enable_kv_cache_events=events)  # admit, for the expected values
    pools = Lockstep(12, enable_kv_cache_events=events)
    a = request("a", ["p0", "p1", "p2", "a3", "a4"])
    for p in (twins, pools):
        cached_and_freed(p, a, 4)
    b = request("b", ["p0", "p1", "p2", "b3", "b4", "b5"])
    table = np.full(8, -7, np.int64)
    assert twins.admit(b, 5, 6, 6, 6, HBS, 0) is None
    result, written = pools.admit_into(b, table, 5, 6, 6, 6, HBS, 0)
    assert result is None and (written == -7).all()  # refused: the table is left as it was
    hits, new = twins.admit(b, 5, 6, 6, 5, HBS, 0)
    result, written = pools.admit_into(b, table, 5, 6, 6, 5, HBS, 0)
    assert result == len(hits) == 3
    assert written.tolist() == hits + new + [-7, -7]  # only table[:num_blocks] is written
    assert pools.spec.abstract() == twins.spec.abstract()


def test_admit_into_writes_a_strided_row_of_a_block_table():
    # A scheduler's 2-D block table: a row, or a strided view of one, is a valid table.
    pools = [make_pool(12, backend="spec", hash_block_size=HBS),
             fast_pool(12, jit=True, hash_block_size=HBS),
             fast_pool(12, jit=False, hash_block_size=HBS)]
    rows = [np.full((2, 12), -1, np.int64) for _ in pools]
    for pool, table in zip(pools, rows, strict=True):
        admit_into = getattr(pool, "admit_into", partial(batch.admit_into, pool))
        r = request("r", ["x0", "x1", "x2", "x3"])
        assert admit_into(r, table[1, ::2], 3, 4, 4, 0, HBS, 0) == 0
        batch.free_tables(pool, [table[1, :8:2]])
        assert admit_into(r, table[0, 1:], 3, 5, 4, 0, HBS, 0) == 3
    assert all(np.array_equal(t, rows[0]) for t in rows)
    assert all(p.abstract() == pools[0].abstract() for p in pools)
    first, second = rows[0][1, :8:2].tolist(), rows[0][0].tolist()
    assert second[1:4] == first[:3] and -1 not in second[1:6] and second[6:] == [-1] * 6


def test_admit_into_writes_an_ndarray_subclass_through_the_generic_path():
    class Rows(np.ndarray):  # as np.memmap is: the lean path takes exact arrays only
        pass

    pools = Lockstep(8)
    r = request("r", ["x0", "x1", "x2"])
    result, written = pools.admit_into(r, np.zeros(3, np.int64).view(Rows), 2, 3, 3, 0, HBS, 0)
    assert result == 0 and type(written) is Rows and written.tolist() == [1, 2, 3]


def test_admit_into_without_caching_and_of_nothing():
    pools = Lockstep(8, enable_caching=False)
    r = request("r", ["x0", "x1", "x2"])
    result, written = pools.admit_into(r, np.zeros(3, np.int64), 2, 3, 3, 0, HBS, 0)
    assert result == 0 and written.tolist() == [1, 2, 3]
    result, written = pools.admit_into(r, np.zeros(0, np.int64), 0, 0, 0, 0, HBS, 0)
    assert result == 0 and written.size == 0


def test_admit_into_rejects_a_bad_table_before_anything_happens():
    pools = Lockstep(8)
    r = request("r", ["x0", "x1", "x2"])
    read_only = np.zeros(3, np.int64)
    read_only.flags.writeable = False
    for table, message in [
        (np.zeros(2, np.int64), "room for 2 block ids, 3 are admitted"),
        (np.zeros(3, np.int32), "1-D int64"),
        (np.zeros(3, np.dtype(">i8")), "1-D int64"),
        (np.zeros((1, 3), np.int64), "1-D int64"),
        (read_only, "writable"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            pools.admit_into(r, table, 2, 3, 3, 0, HBS, 0)
    for table in ([0, 0, 0], None):
        with pytest.raises(InvalidArgument, match="numpy int64 array"):
            pools.call("admit_into", r, table, 2, 3, 3, 0, HBS, 0)
    # The table is checked first, then admit's own checks, with admit's messages.
    with pytest.raises(InvalidArgument, match="num_full_blocks"):
        pools.admit_into(r, np.zeros(3, np.int64), 2, 3, 4, 0, HBS, 0)
    with pytest.raises(InvalidArgument):
        pools.admit_into(r, np.zeros(3, np.int64), 2, -3, 0, 0, HBS, 0)
    assert all(p.abstract().state.ref_cnt.count(0) == 8 for p in pools.pools)


def test_a_raising_watcher_does_not_cut_admit_into_short():
    pools, b = held_block_with_a_raising_watcher()
    r = request("r", ["x0", "x1", "x2", "x3", "x4"])
    tables = []

    def per_pool(pool, log):
        tables.append(np.full(5, -1, np.int64))
        return r, tables[-1], 4, 5, 5, 0, HBS, 0

    with pytest.raises(WatcherError) as caught:
        pools.call("admit_into", per_pool=per_pool)
    assert caught.value.result == 0  # the hits; the table is written all the same
    assert all(t.tolist() == tables[0].tolist() for t in tables) and b in tables[0]
    assert -1 not in tables[0]


def test_a_waiting_request_asking_again_sees_every_change_to_its_hits():
    # The fast pool remembers the key rows a refused scan matched (a waiting request asks
    # again every step); every change to those keys must show on the next attempt.
    pools = Lockstep(12)
    a = request("a", ["p0", "p1", "p2", "p3", "a4"])
    blocks = cached_and_freed(pools, a, 4)  # p0..p3 on four free, cached blocks
    pools.get_new_blocks(5)  # 6 free left, 4 of them the cached ones
    b = request("b", ["p0", "p1", "p2", "p3", "b4", "b5"])
    assert pools.admit(b, 5, 6, 6, 1, HBS, 0) is None  # 4 evictable + 2 new + 1 > 6
    pools.evict_blocks([blocks[2]])  # p2 leaves: its key row is freed
    z = request("z", ["z0", "z1", "z2"])
    (t,) = pools.get_new_blocks(1)
    pools.cache_full_blocks(z, [0, 0, t], 2, 3, HBS, 0)  # a new key, in p2's old row
    assert pools.admit(b, 5, 6, 6, 0, HBS, 0) is None  # 2 hits: 2 + 4 new > 5 free
    pools.free_blocks([t])
    (u,) = pools.get_new_blocks(1)
    pools.cache_full_blocks(a, [0, 0, u], 2, 3, HBS, 0)  # p2 again, on another block
    pools.free_blocks([u])
    b.block_hashes[0] = block_hash("p0")  # an equal hash, another object: packed anew
    hits, new = pools.admit(b, 5, 6, 6, 0, HBS, 0)
    assert hits[:3] == [blocks[0], blocks[1], u] and len(hits) == 4
    pools.free_tables([hits + new])
    pools.call("free_blocks", per_pool=lambda pool, log: (
        [x for x, r in enumerate(pool.abstract().state.ref_cnt) if r > 0],))
    assert pools.reset_prefix_cache()
    hits, new = pools.admit(b, 5, 6, 6, 0, HBS, 0)  # every key is gone: no hits
    assert hits == [] and len(new) == 6


# -- step, cache_full_blocks_batch, free_tables ------------------------------------------------


def test_free_tables_is_one_free_per_table_not_one_concatenated_free():
    pools = Lockstep(12)
    r = request("r", ["k0", "k1"])
    t1 = pools.get_new_blocks(3)
    t2 = pools.get_new_blocks(3)
    pools.cache_full_blocks(r, t1, 0, 2, HBS, 0)
    pools.free_tables([np.array(t1), t2])
    sequential = make_pool(12, backend="spec", hash_block_size=HBS)
    s1, s2 = sequential.get_new_blocks(3), sequential.get_new_blocks(3)
    sequential.cache_full_blocks(r, s1, 0, 2, HBS, 0)
    sequential.free_blocks(s1[::-1])
    sequential.free_blocks(s2[::-1])
    assert pools.spec.abstract() == sequential.abstract()
    concatenated = make_pool(12, backend="spec", hash_block_size=HBS)
    c1, c2 = concatenated.get_new_blocks(3), concatenated.get_new_blocks(3)
    concatenated.cache_full_blocks(r, c1, 0, 2, HBS, 0)
    concatenated.free_blocks(c1[::-1] + c2[::-1])
    assert concatenated.abstract() != sequential.abstract()


@pytest.mark.parametrize("events", [False, True])
def test_step_caches_then_allocates_then_frees(events):
    pools = Lockstep(16, enable_kv_cache_events=events)
    a = request("a", ["a0", "a1", "a2"])
    b = request("b", ["b0", "b1", "b2"])
    old = request("old", ["o0", "o1", "o2"])
    cached_and_freed(pools, old, 3)  # at the tail: the allocation evicts some of them
    ta = np.array(pools.get_new_blocks(3))
    tb = pools.get_new_blocks(2)
    done = pools.get_new_blocks(2)
    new = pools.step([(a, ta, 0, 3), (b, tb, 1, 2), (a, ta, 3, 3)], 8, [done, []], HBS, 0)
    assert len(new) == 8
    state = pools.spec.abstract().state
    assert all(state.primary_key[x] is not None for x in [*ta.tolist(), tb[1]])
    assert state.primary_key[tb[0]] is None
    assert set(done) <= set(state.free_queue)
    pools.cache_full_blocks_batch([(b, tb, 0, 1)], HBS, 0)
    pools.step([], 0, [ta, tb, new], HBS, 0)
    assert pools.spec.get_num_free_blocks() == 15


def test_step_sees_earlier_items_keys_and_earlier_tables_releases():
    pools = Lockstep(10)
    r = request("r", ["x0", "x1", "x2", "x3"])
    t = pools.get_new_blocks(4)
    # Item 2 caches t[1] at position 1 after item 1 keyed it at position 3: not longer.
    with pytest.raises(HashStateError):
        pools.step([(r, [0, 0, 0, t[1]], 3, 4), (r, t, 1, 2)], 0, [], HBS, 0)
    # The other way round it is a promotion (a longer key replaces the shorter one).
    pools.step([(r, t, 1, 2), (r, [0, 0, 0, t[1]], 3, 4)], 0, [], HBS, 0)
    assert pools.spec.abstract().state.primary_tokens[t[1]] == 4 * HBS
    # A block released by two tables: the second one over-releases it.
    with pytest.raises(DoubleFree):
        pools.free_tables([[t[0]], [t[0]]])
    # A block freed in the same step may be allocated again by it... after the frees only.
    with pytest.raises(DoubleFree):
        pools.step([], 1, [[t[0]], [t[0]]], HBS, 0)


def test_step_may_free_a_block_its_own_allocation_pops():
    pools = Lockstep(6)
    front = pools.spec.abstract().state.free_queue[0]
    # Not held before the step; the allocation pops it (ref 1), then the table frees it.
    new = pools.step([], 1, [[front]], HBS, 0)
    assert new == [front]
    assert pools.spec.abstract().state.free_queue[0] == front
    with pytest.raises(DoubleFree):
        pools.step([], 1, [[front, front]], HBS, 0)
    with pytest.raises(DoubleFree):
        pools.step([], 0, [[front]], HBS, 0)


def test_step_errors_are_those_of_the_first_failing_verb_and_change_nothing():
    pools = Lockstep(10)
    r = request("r", ["x0", "x1", "x2"])
    held = pools.get_new_blocks(3)
    free = pools.spec.abstract().state.free_queue[-1]
    cases = [
        ([(r, held, 0, 2)], 0, [[held[0], "junk"]], InvalidBlockId),
        ([(r, held, 0, 2)], 0, [[held[0], 99]], InvalidBlockId),
        ([(r, held, 0, 2)], 0, [[held[0], held[0]]], DoubleFree),
        ([(r, [held[0], 99], 0, 2)], 0, [], InvalidBlockId),
        ([(r, [held[0], held[0]], 0, 2)], 0, [], InvalidArgument),
        ([(r, [held[0], free], 0, 2)], 0, [], HashStateError),
        ([(r, [1.5, held[1]], 0, 1)], 0, [], InvalidBlockId),  # junk among the candidates
        ([(r, held, 0, 4)], 0, [], InvalidArgument),
        ([(r, held, -1, 2)], 0, [], InvalidArgument),
        ([(r, held, 0, 2)], 99, [], NoFreeBlocks),
        ([(r, held, 0, 2)], -1, [], InvalidArgument),
        ([(r, held, 0, 2, 5)], 0, [], InvalidArgument),
        ([(r, held, 0, 2)], 0, [np.zeros(2, np.float64)], InvalidBlockId),
        ([(r, held, 0, 2)], 0, [[make_pool(10, backend="spec").ref(1)]], ForeignBlock),
    ]
    for items, n, tables, error in cases:
        with pytest.raises(error):
            pools.step(items, n, tables, HBS, 0)
    with pytest.raises(InvalidArgument):
        pools.step([(r, held, 0, 1)], 0, [], 3, 0)
    # Only the candidates of a table are read (shell.candidate_table): junk outside them,
    # or in the table of an item that caches nothing, is not looked at.
    pools.step([(r, ["junk"], 1, 1)], 0, [], HBS, 0)
    pools.step([(r, [1.5, "junk", held[2]], 2, 3)], 0, [], HBS, 0)
    pools.step([(r, held, 1, 1)], 0, [], HBS, 0)
    # A BlockRef to the pool itself is one of its blocks.
    pools.call("step", per_pool=lambda pool, log: (
        [(r, [pool.ref(held[0]), held[1]], 0, 2)], 0, [[held[2], pool.ref(held[1])]], HBS, 0))
    off = Lockstep(6, enable_caching=False)
    with pytest.raises(CachingDisabled):
        off.step([(r, [1], 1, 1)], 0, [], HBS, 0)
    t = off.get_new_blocks(2)
    off.step([], 2, [t], HBS, 0)


def test_step_with_watchers_and_metrics_calls_back_like_the_composition():
    pools = Lockstep(8, metrics=True)
    r = request("r", ["x0", "x1"])
    t = pools.get_new_blocks(2)
    watched = pools.get_new_blocks(1)
    pools.unpin(watched)
    rest = pools.spec.get_num_free_blocks()
    new = pools.step([(r, t, 0, 2)], rest, [t], HBS, 0)
    assert watched[0] in new and ("watcher", watched[0]) in pools.logs[0]


# -- random programs --------------------------------------------------------------------------

LABELS = ["s0", "s1", "s2", "u0", "u1", "u2", "u3"]


@st.composite
def junk(draw):
    return draw(st.sampled_from(["x", 1.5, None, True, -1, 99, 2**70, np.int64(2)]))


@st.composite
def tables_from(draw, known):
    """A known table (as a list or an int64 array), sometimes cut short or corrupted."""
    table = list(draw(st.sampled_from(known))) if known else []
    kind = draw(st.sampled_from(["list", "array", "array", "array", "corrupt", "slice"]))
    if kind == "corrupt" and table:
        table[draw(st.integers(0, len(table) - 1))] = draw(junk())
    if kind == "slice":
        table = table[: draw(st.integers(0, len(table)))]
    if kind == "array":
        return np.array(table, dtype=np.int64)
    return table


@st.composite
def cache_items(draw, known, requests):
    """``(request, table, num_cached, num_full)``: mostly in range, sometimes not."""
    table = draw(tables_from(known))
    size = len(table)
    if draw(st.integers(0, 7)):
        c = draw(st.integers(0, size))
        f = draw(st.integers(c, size))
    else:
        c, f = draw(st.integers(-1, 6)), draw(st.integers(-1, 7))
    return draw(st.sampled_from(requests)), table, c, f


def rehash(hashes, draw) -> None:
    """Change a request's ``block_hashes`` in place: a new hash, one of another width or
    type, or a reordering (the pools must read the list as it is now)."""
    value = draw(st.sampled_from([block_hash(draw(st.sampled_from(LABELS))),
                                  block_hash("w", 16), bytearray(block_hash("b")), "x"]))
    i = draw(st.integers(0, max(len(hashes) - 1, 0)))
    how = draw(st.sampled_from(["set", "append", "reverse", "pop", "insert"]))
    if how == "append" or not hashes:
        hashes.append(value)
    elif how == "set":
        hashes[i] = value
    elif how == "reverse":
        hashes.reverse()
    elif how == "pop":
        hashes.pop(i)
    else:
        hashes.insert(i, value)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), events=st.booleans(), metrics=st.sampled_from([False, False, True]),
       caching=st.sampled_from([True, True, True, False]))
def test_random_programs_agree_on_every_pool(data, events, metrics, caching):
    pools = Lockstep(12, enable_kv_cache_events=events, metrics=metrics,
                     enable_caching=caching)
    draw = data.draw
    requests = [request(f"r{i}", [draw(st.sampled_from(LABELS)) for _ in range(5)])
                for i in range(3)]
    tables: list[list[int]] = []
    for _ in range(draw(st.integers(1, 8), label="calls")):
        op = draw(st.sampled_from(["admit", "admit_into", "step", "step", "free", "cache",
                                   "unpin", "partial", "rehash"]), label="op")
        r = draw(st.sampled_from(requests))
        try:
            if op == "rehash":  # the packed companion must follow (or drop) every change
                rehash(r.block_hashes, draw)
            elif op == "admit":
                num = draw(st.integers(0, 5))
                result = pools.admit(r, draw(st.integers(0, num)), num,
                                     draw(st.integers(0, num)), draw(st.integers(0, 6)),
                                     HBS, draw(st.integers(0, 1)))
                if result is not None:
                    tables.append(result[0] + result[1])
            elif op == "admit_into":
                num = draw(st.integers(0, 5))
                table = np.full(draw(st.integers(num, num + 2)), -1, np.int64)
                hits, written = pools.admit_into(r, table, draw(st.integers(0, num)), num,
                                                 draw(st.integers(0, num)),
                                                 draw(st.integers(0, 6)), HBS,
                                                 draw(st.integers(0, 1)))
                if hits is not None:
                    tables.append(written[:num].tolist())
            elif op in ("step", "cache", "free"):
                items = []
                if op != "free" and tables:
                    items = draw(st.lists(cache_items(tables, requests), max_size=3))
                n = draw(st.integers(0, 4)) if op == "step" else 0
                freed = []
                if op != "cache" and tables:
                    freed = [draw(tables_from(tables)) for _ in range(draw(st.integers(0, 2)))]
                if op == "cache":
                    pools.cache_full_blocks_batch(items, HBS, draw(st.integers(0, 1)))
                elif op == "free":
                    pools.free_tables(freed)
                else:
                    new = pools.step(items, n, freed, HBS, 0)
                    if new:
                        tables.append(new)
            elif op == "unpin" and tables:
                pools.unpin(draw(st.sampled_from(tables))[:1])
            elif op == "partial" and tables and caching:
                table = draw(st.sampled_from(tables))
                if table:
                    pools.cache_partial_block(r, table[0], HBS * draw(st.integers(1, 5)), 0,
                                              2 * HBS)
        except KvPoolError:
            pass
