"""Each kernel, compiled and plain, does the same thing to the same arrays.

A pool state is built with random operations; its arrays are copied twice; one kernel runs
uncompiled on one copy and compiled on the other with the same (often invalid) arguments.
Return values and every byte of every array must match. Also checks that the guard rows
really catch an out-of-bounds write by compiled code.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from fast_twin import block_hash, fast_pool, request_with_hashes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpool.errors import KvPoolError
from kvpool.fast import kernels
from kvpool.fast.compiled import HANDLE_KERNELS, SIGNATURES, kernel_set, pool_arrays_maker
from kvpool.fast.state import FastState

N = 10
ARRAYS = ("blk", "blk64", "ent", "keys", "key_bytes", "table", "meta", "events", "out")


def built_state(data, events: bool | None = None) -> FastState:
    """A plain-kernel pool state after a random, mostly valid, program (with or without
    events: drawn unless given)."""
    if events is None:
        events = data.draw(st.booleans(), label="events")
    pool = fast_pool(N, jit=False, hash_block_size=4, enable_kv_cache_events=events)
    request = request_with_hashes(6, hbs=4)
    request.block_hashes[:] = [block_hash(f"k{data.draw(st.integers(0, 3))}") for _ in range(6)]
    for _ in range(data.draw(st.integers(0, 12), label="setup steps")):
        op = data.draw(st.sampled_from(["alloc", "free", "cache", "partial", "evict", "unpin",
                                        "retire"]))
        held = [b for b, r in enumerate(pool.abstract().state.ref_cnt) if r > 0] or [0]
        pick = st.lists(st.sampled_from(held), max_size=4)
        try:
            if op == "alloc":
                pool.get_new_blocks(data.draw(st.integers(0, 4)))
            elif op == "retire":  # new blocks keyed and freed: cached, evictable
                table = pool.get_new_blocks(data.draw(st.integers(1, 3)))
                pool.cache_full_blocks(request, table, 0, len(table), 4,
                                       data.draw(st.integers(0, 1)))
                pool.free_blocks(table)
            elif op == "free":
                pool.free_blocks(data.draw(pick))
            elif op == "cache":
                table = data.draw(pick)
                group = data.draw(st.integers(0, 1))
                pool.cache_full_blocks(request, table, 0, len(table), 4, group)
            elif op == "partial":
                pool.cache_partial_block(request, data.draw(st.sampled_from(held)),
                                         4 * data.draw(st.integers(1, 6)), 0, 8)
            elif op == "evict":
                pool.evict_blocks(data.draw(pick))
            else:
                pool.unpin_blocks(data.draw(pick), lambda b: None)
        except KvPoolError:
            pass
    st_ = pool._st
    st_.reserve(8, 40)
    return st_


def copies(state: FastState) -> dict[str, np.ndarray]:
    return {name: getattr(state, name).copy() for name in ARRAYS}


ids = st.lists(st.integers(-3, N + 3), max_size=7).map(lambda v: np.array(v, dtype=np.int64))
small = st.integers(-2, N + 2)


one_hash = st.builds(block_hash, st.integers(0, 4).map(lambda i: f"k{i}"),
                     st.sampled_from([32, 16, 0]))


def hash_args(draw, m):
    hashes = [block_hash(f"k{draw(st.integers(0, 4))}", draw(st.sampled_from([32, 16, 0])))
              for _ in range(m)]
    buf = np.frombuffer(b"".join(hashes), np.uint8).copy()
    return buf, np.array([len(h) for h in hashes], dtype=np.int64)


def step_plan(draw) -> tuple:
    """A ``run_step`` plan, its released ids and hashes: mostly well formed, sometimes not."""
    plan, total = [0, draw(st.integers(-1, 4)), 0], 0
    for _ in range(draw(st.integers(0, 3))):
        count = draw(st.integers(0, 3))  # 0 is malformed
        plan += [draw(st.integers(-1, 4)), count]
        plan += [draw(st.integers(-2, N + 1)) for _ in range(count)]
        plan[0] += 1
        total += count
    tables = draw(st.lists(st.lists(st.integers(-1, N), max_size=4), max_size=3))
    plan[2] = len(tables)
    plan += [len(t) for t in tables]
    freed = np.array([b for t in tables for b in t], dtype=np.int64)
    buf, lens = hash_args(draw, total)
    if draw(st.integers(0, 9)) == 0:  # a truncated plan
        plan = plan[: draw(st.integers(0, len(plan)))]
    return np.array(plan, dtype=np.int64), freed, buf, lens


def group_plan(draw, held: list[int]) -> tuple:
    """A ``group_step`` plan (released ids at its end) and its hashes: mostly a step's (held
    blocks, released in small lists, a write or two), sometimes malformed."""
    block = st.one_of(st.sampled_from(held), st.integers(-1, N)) if held else st.integers(-1, N)
    lists = draw(st.lists(st.lists(block, max_size=3), max_size=2))
    writes = draw(st.lists(block, max_size=2))
    hashes = [block_hash(f"k{draw(st.integers(0, 4))}", draw(st.sampled_from([32, 16, 0])))
              for _ in writes]
    plan = [len(lists), *map(len, lists), len(writes)]
    for b, h in zip(writes, hashes, strict=True):
        plan += [b, draw(st.integers(-1, 3)), draw(st.sampled_from([0, 1, -1, 2**32])), len(h)]
    plan += [b for ids in lists for b in ids]
    if draw(st.integers(0, 9)) == 0:  # a truncated plan
        plan = plan[: draw(st.integers(0, len(plan)))]
    buf = np.frombuffer(b"".join(hashes), np.uint8).copy()
    return np.array(plan, dtype=np.int64), buf


def pool_arrays(a: dict, jit: bool = False, caching: bool = True,
                events_on: bool = False) -> object:
    """The ``PoolArrays`` the hash-index and one-op kernels take first, over the array dict
    ``a``: the plain object (``jit=False``) or the compiled one (a structref)."""
    return pool_arrays_maker(jit)(a["blk"], a["blk64"], a["ent"], a["keys"], a["key_bytes"],
                                  a["table"], a["meta"], a["events"], a["out"], caching,
                                  events_on)


def arguments(data, name: str, a: dict, events_on: bool) -> tuple:
    """Arguments of kernel ``name`` over the array dict ``a`` (fresh per call)."""
    draw = data.draw
    arrays = pool_arrays(a)  # plain: _agree builds the compiled one over its own copy
    if name in HANDLE_KERNELS:
        return (arrays, *handle_arguments(data, name))
    if name == "get_new_blocks_unkeyed":
        return a["blk"], a["meta"], a["out"], draw(small)
    if name == "get_new_blocks":
        return (a["blk"], a["blk64"], a["ent"], a["keys"], a["table"], a["meta"], a["events"],
                a["out"], np.zeros(N, np.int64), draw(small), draw(st.booleans()), events_on)
    if name == "get_new_blocks_quiet":
        return (a["blk"], a["blk64"], a["ent"], a["keys"], a["table"], a["meta"], a["out"],
                draw(st.booleans()), draw(small))
    if name == "get_new_blocks_reported":
        # Often every free block (the cached ones sit behind the never-used ones), and
        # records of a size that fits whether or not the state kept events (fresh arrays:
        # both copies get them), sometimes too short.
        used = int(a["meta"][kernels.M_ENT_USED])
        events = np.zeros((draw(st.sampled_from([used + 1, used + 3, used])), 3), np.int64)
        rows = np.zeros((draw(st.sampled_from([used, used + 2, max(used - 1, 0)])), 3), np.int64)
        n = draw(st.one_of(st.just(int(a["meta"][kernels.M_NUM_FREE])), small))
        return (a["blk"], a["blk64"], a["ent"], a["keys"], a["key_bytes"], a["table"],
                a["meta"], events, a["out"], rows, draw(st.booleans()), n)
    if name == "touch":
        return a["blk"], a["meta"], draw(ids)
    if name == "touch_one":
        return a["blk"], a["meta"], draw(small)
    if name == "lookup_one":
        key = block_hash(f"k{draw(st.integers(0, 4))}", draw(st.sampled_from([32, 16, 0])))
        return a["keys"], a["key_bytes"], a["table"], key, draw(st.sampled_from([0, 1]))
    if name == "cache_one":
        return (arrays, draw(small), draw(one_hash), draw(st.integers(-1, 3)),
                draw(st.sampled_from([0, 1, -1, 2**32])), events_on)
    if name == "take_and_key":
        return (arrays, draw(st.integers(0, 4)), draw(small), draw(one_hash),
                draw(st.integers(-1, 3)), draw(st.sampled_from([0, 1, -1, 2**32])))
    if name == "group_step":
        held = [b for b in range(1, N) if a["blk"][b, kernels.REF] > 0]
        return (arrays, draw(st.booleans()), *group_plan(draw, held),
                draw(st.integers(-1, 4)), draw(st.integers(-1, 2)))
    if name == "free_blocks":
        return a["blk"], a["meta"], draw(st.booleans()), draw(st.booleans()), draw(ids)
    if name == "free_one":
        return a["blk"], a["meta"], draw(st.booleans()), draw(small)
    if name == "unpin_blocks":
        return a["blk"], a["blk64"], a["meta"], draw(ids)
    if name in ("lookup_blocks", "lookup_each", "lookup_run_from_end"):
        buf, lens = hash_args(draw, draw(st.integers(0, 4)))
        groups = np.array(draw(st.lists(st.sampled_from([0, 1, -1, 2**32]),
                                        min_size=0 if name != "lookup_blocks" else 1,
                                        max_size=2)), dtype=np.int64)
        out = np.zeros((max(1, groups.shape[0]), max(1, lens.shape[0])), np.int64)
        head = (a["ent"],) if name == "lookup_blocks" else ()
        tail = (draw(st.integers(0, 3)), draw(st.integers(0, 3)), draw(st.integers(-1, 2))) \
            if name == "lookup_run_from_end" else ()
        return (*head, a["keys"], a["key_bytes"], a["table"], a["meta"], buf, lens, groups,
                out, *tail)
    if name in ("cache_full_blocks", "allocate_and_cache"):
        cand = draw(ids)
        m = cand.shape[0]
        buf, lens = hash_args(draw, m)
        mask = np.array(draw(st.lists(st.booleans(), min_size=m, max_size=m)), dtype=np.uint8)
        tail = (draw(st.integers(0, 3)), draw(st.sampled_from([1, 2])), draw(st.integers(0, 1)),
                draw(st.booleans()), events_on)
        if name == "cache_full_blocks":
            return (arrays, cand, mask, buf, lens, *tail)
        num_old = draw(st.integers(0, m))
        n = draw(st.integers(0, 4))
        return (arrays, cand, num_old, draw(st.integers(0, 2)), mask, buf, lens, n,
                *tail, draw(st.booleans()))
    if name == "admit_request":
        buf, lens = hash_args(draw, draw(st.integers(0, 5)))
        # A memo of (key row, generation) pairs: often a real row, sometimes stale or junk.
        memo = np.array([[draw(st.integers(-1, 9)) for _ in range(N)],
                         [draw(st.integers(0, 2)) for _ in range(N)]], dtype=np.int64)
        return (arrays, memo, buf, lens, draw(st.integers(-1, 6)),
                draw(st.integers(-1, 7)), draw(st.integers(-1, 6)), draw(st.integers(-1, N + 2)),
                draw(st.sampled_from([1, 2])), draw(st.integers(0, 1)), draw(st.integers(-1, 6)),
                draw(st.booleans()), events_on)
    if name == "run_step":
        return (arrays, *step_plan(draw), draw(st.sampled_from([1, 2])),
                draw(st.integers(0, 1)), draw(st.booleans()), events_on)
    if name == "cache_partial_block":
        buf, _ = hash_args(draw, 1)
        return (arrays, draw(small), buf, draw(st.integers(0, 6)), draw(st.integers(0, 1)),
                draw(st.booleans()), events_on)
    if name == "move_block_hashes":
        return a["blk"], a["blk64"], a["ent"], a["keys"], a["meta"], draw(small), draw(small)
    if name == "evict_blocks":
        return (a["blk"], a["blk64"], a["ent"], a["keys"], a["table"], a["meta"], a["events"],
                draw(ids), events_on)
    if name == "reset_prefix_cache":
        return (a["blk"], a["blk64"], a["ent"], a["keys"], a["table"], a["meta"], a["events"],
                np.zeros(N, np.int64), events_on)
    if name == "block_is_writable":
        return a["blk"], draw(small)
    if name == "queue_order":
        return a["blk"], a["out"]
    if name == "max_key_tokens":
        return a["blk"], a["blk64"], draw(ids)
    if name == "release_removed_keys":
        return a["keys"], a["meta"], a["events"]
    if name == "report_removals":
        # Records made up over the state's key rows (removals, now and then another kind or
        # a row id out of range), in a fresh events array and meta: both copies see them.
        count = draw(st.integers(0, 6))
        kinds = st.sampled_from([kernels.EV_REMOVED] * 4 + [kernels.EV_STORED])
        rows_with_keys = [kid for kid in range(a["keys"].shape[0])
                          if a["keys"][kid, kernels.K_LEN] >= 4]
        kids = st.one_of(st.integers(-1, a["keys"].shape[0]), *(
            [st.sampled_from(rows_with_keys)] * 4 if rows_with_keys else []))
        events = np.array([[draw(kinds), draw(kids), draw(st.integers(0, 99))]
                           for _ in range(count)] or np.zeros((0, 3)), dtype=np.int64)
        meta = a["meta"].copy()
        meta[kernels.M_EV_LEN] = count
        rows = np.zeros((draw(st.integers(max(0, count - 1), count + 1)), 3), np.int64)
        return a["keys"], a["key_bytes"], meta, events, rows
    if name == "rehash":
        size = 2 * a["table"].shape[0]
        a["table_new"] = np.full(size, -1, np.int64)
        return a["keys"], a["table_new"], a["meta"]
    if name == "init_state":
        return a["blk"], a["meta"]
    raise AssertionError(f"no argument generator for kernel {name}")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(sorted(SIGNATURES)))
def test_compiled_and_plain_kernels_agree_on_the_same_inputs(data, name):
    _agree(data, name)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(["get_new_blocks_reported", "report_removals"]))
def test_the_kernels_that_report_removals_agree_compiled_and_plain(data, name):
    """More examples for the two kernels that read hash bits out of key rows (the sign
    byte of a 64-bit pattern is where compiled and plain integers could part)."""
    _agree(data, name)


def _agree(data, name: str) -> None:
    state = built_state(data)
    plain, compiled = copies(state), copies(state)
    args_plain = arguments(data, name, plain, state.enable_events)
    # The same arguments over the compiled copy: state arrays swapped (the PoolArrays built
    # over the compiled copy's arrays), inputs copied.
    owner = {id(v): key for key, v in plain.items()}
    args_compiled = tuple(
        pool_arrays(compiled, True) if isinstance(x, kernels.PoolArrays)
        else (compiled[owner[id(x)]] if owner[id(x)] in compiled else x.copy())
        if id(x) in owner else (x.copy() if isinstance(x, np.ndarray) else x)
        for x in args_plain
    )
    r_plain = getattr(kernel_set(False), name)(*args_plain)
    r_compiled = getattr(kernel_set(True), name)(*args_compiled)
    assert r_plain == r_compiled and type(r_plain) is type(r_compiled), (name, r_plain)
    for x, y in zip(args_plain, args_compiled, strict=True):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), name
    for key in ARRAYS:  # every state array, the ones read through a PoolArrays included
        assert np.array_equal(plain[key], compiled[key]), (name, key)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), jit=st.booleans())
def test_cache_one_is_the_batch_write_of_one_block(data, jit):
    """``cache_one`` does what ``cache_full_blocks`` does with the one candidate, on the same
    state and arguments, or declines (NEED_FULL: the block has a key; ERR_CAPACITY), leaving
    every array as it found it but the per-call record count."""
    state = built_state(data)
    one, batch, before = copies(state), copies(state), copies(state)
    keyed = [b for b in range(1, N) if kernels._first(state.blk, b) != -1]
    b = data.draw(st.one_of(small, st.sampled_from(keyed)) if keyed else small)
    key = data.draw(one_hash)
    position = data.draw(st.integers(-1, 3))
    group = data.draw(st.sampled_from([0, 1, -1, 2**32]))
    ks = kernel_set(jit)

    got = ks.cache_one(pool_arrays(one, jit), b, key, position, group, state.enable_events)
    if got in (kernels.NEED_FULL, kernels.ERR_CAPACITY):
        before["meta"][kernels.M_EV_LEN] = 0
        for name in ARRAYS:
            assert np.array_equal(one[name], before[name]), name
        if got == kernels.NEED_FULL:
            assert kernels._first(before["blk"], b) != -1
        return
    expected = ks.cache_full_blocks(
        pool_arrays(batch, jit), np.array([b], np.int64), np.zeros(1, np.uint8),
        np.frombuffer(key, np.uint8).copy(), np.array([len(key)], np.int64), position, 1,
        group, False, state.enable_events)
    assert got == expected
    for name in ARRAYS:
        assert np.array_equal(one[name], batch[name]), name


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), jit=st.booleans())
def test_take_and_key_is_the_quiet_pop_then_the_one_block_write(data, jit):
    """``take_and_key`` does what ``get_new_blocks_quiet`` then ``cache_one`` do, on the same
    state and arguments (a prefix-caching pool without events), or refuses, leaving every
    array exactly as it found it; it refuses whenever either of the two would, and more
    (a block it must not key: the null block, one it would have just popped)."""
    state = built_state(data, events=False)
    fused, split, before = copies(state), copies(state), copies(state)
    keyed = [b for b in range(1, N) if kernels._first(state.blk, b) != -1]
    held = [b for b in range(1, N) if state.blk[b, kernels.REF] > 0]
    # Mostly arguments a step passes (a held block, counts in range), sometimes not.
    b = data.draw(st.one_of(small, *(st.sampled_from(x) for x in (keyed, held, held) if x)))
    n = data.draw(st.sampled_from([1, 1, 2, 3, 4, 0]))
    key = data.draw(one_hash)
    position = data.draw(st.sampled_from([0, 1, 2, 3, 0, 1, 2, 3, -1]))
    group = data.draw(st.sampled_from([0, 0, 1, 1, -1, 2**32]))
    ks = kernel_set(jit)

    got = ks.take_and_key(pool_arrays(fused, jit), n, b, key, position, group)
    if got < 0:
        for name in ARRAYS:
            assert np.array_equal(fused[name], before[name]), name
        return
    popped = ks.get_new_blocks_quiet(split["blk"], split["blk64"], split["ent"], split["keys"],
                                     split["table"], split["meta"], split["out"], True, n)
    assert popped == got > 0
    assert b not in split["out"][:n]
    assert ks.cache_one(pool_arrays(split, jit), b, key, position, group, False) == kernels.OK
    for name in ARRAYS:
        assert np.array_equal(fused[name], split[name]), name
    assert np.array_equal(fused["out"][:n], split["out"][:n])


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs compiled code (no bounds checks)")
def test_guard_rows_catch_an_out_of_bounds_write_by_compiled_code():
    state = FastState(4, enable_caching=True, enable_events=False, guard=2)

    @numba.njit
    def write_past_the_end(blk):
        blk[blk.shape[0], 0] = 7  # no bounds check in compiled code

    assert state.guards_intact()
    write_past_the_end(state.blk)
    assert not state.guards_intact()


def test_every_kernel_has_a_plain_twin_and_a_signature():
    public = {n for n in dir(kernels) if callable(getattr(kernels, n)) and not n.startswith("_")
              and getattr(getattr(kernels, n), "__module__", "") == kernels.__name__}
    assert public == set(SIGNATURES) | {"PoolArrays"}
    assert set(HANDLE_KERNELS) <= set(SIGNATURES)


def handle_arguments(data, name: str) -> tuple:
    """The arguments after the PoolArrays of one-op kernel ``name`` (often invalid)."""
    if name == "h_lookup_one":
        key = block_hash(f"k{data.draw(st.integers(0, 4))}",
                         data.draw(st.sampled_from([32, 16, 0])))
        return key, data.draw(st.sampled_from([0, 1, -1, 2**32, 2**40]))
    return (data.draw(small),)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(HANDLE_KERNELS))
def test_one_argument_kernels_agree_compiled_and_plain(data, name):
    """The h_* kernels over a PoolArrays: the compiled one (a structref) and the plain one,
    same inputs, same result and the same bytes in every array."""
    state = built_state(data)
    plain, compiled = copies(state), copies(state)
    extra = handle_arguments(data, name)

    def arrays(jit: bool, a: dict) -> object:
        return pool_arrays(a, jit, state.enable_caching, state.enable_events)

    r_plain = getattr(kernel_set(False), name)(arrays(False, plain), *extra)
    r_compiled = getattr(kernel_set(True), name)(arrays(True, compiled), *extra)
    assert r_plain == r_compiled and type(r_plain) is type(r_compiled), (name, r_plain)
    for key in ARRAYS:
        assert np.array_equal(plain[key], compiled[key]), (name, key)
