"""The one-op lean paths (one lookup, one touch, an evicting allocation without events) give
the spec's results and errors, and leave the spec's state, across hash-table growth."""

from __future__ import annotations

import copy
import pickle

import pytest
from fast_twin import assert_sound, fast_pool, request_with_hashes

from kvpool import make_pool
from kvpool.errors import InvalidArgument, InvalidBlockId, InvalidGroupId


def outcome(method, args):
    try:
        return ("ok", method(*args))
    except Exception as error:  # noqa: BLE001 - the type and message are compared
        return (type(error).__name__, str(error))


@pytest.mark.parametrize("jit", [True, False])
def test_lean_single_op_paths_match_the_spec(jit):
    fast, spec = fast_pool(12, jit=jit), make_pool(12, backend="spec")
    request = request_with_hashes(10)
    for pool in (fast, spec):
        blocks = pool.get_new_blocks(10)
        pool.cache_full_blocks(request, blocks, 0, 10, 16, 0)  # the table grows several times
        pool.free_blocks(blocks[::-1])
    calls = [
        *[("get_cached_block", (h, [0])) for h in request.block_hashes],
        ("get_cached_block", (request.block_hashes[0], (0,))),
        ("get_cached_block", (request.block_hashes[0], [1])),  # another group: a miss
        ("get_cached_block", (b"absent", [0])),
        ("get_cached_block", (b"", [0])),
        ("get_cached_block", (request.block_hashes[0], [2**32])),
        ("get_cached_block", (request.block_hashes[0], [2**64])),  # beyond int64
        ("get_cached_block", (request.block_hashes[0], [-1])),
        ("get_cached_block", (request.block_hashes[0], [True])),
        ("get_cached_block", ("not bytes", [0])),
        ("touch", ([3],)), ("touch", ([0],)), ("touch", ([-1],)), ("touch", ([12],)),
        ("touch", ([2**70],)), ("free_blocks", ([3],)),
        *[("get_new_blocks", (1,))] * 11,  # every pop evicts a cached block
        ("get_new_blocks", (1,)),  # none left
    ]
    for name, args in calls:
        before = fast.abstract()
        got = outcome(getattr(fast, name), args)
        expected = outcome(getattr(spec, name), args)
        assert got == expected, (name, args)
        if got[0] != "ok":
            assert fast.abstract() == before  # a refused call changes nothing
        assert fast.abstract() == spec.abstract(), (name, args)
    assert_sound(fast)


def test_lean_error_types():
    pool = fast_pool(4, jit=True)
    with pytest.raises(InvalidBlockId):
        pool.touch([4])
    with pytest.raises(InvalidGroupId):
        pool.get_cached_block(b"x", [-1])
    with pytest.raises(InvalidArgument):
        pool.get_cached_block(None, [0])


@pytest.mark.parametrize("jit", [True, False])
def test_a_deep_copy_is_an_independent_pool_with_working_one_op_paths(jit):
    """The one-op verbs run over a PoolArrays of the pool's arrays, which cannot be copied:
    a copy rebuilds it over its own arrays (the exhaustive checker copies pools)."""
    pool = fast_pool(12, jit=jit)
    request = request_with_hashes(4)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(request, blocks, 0, 4, 16, 0)
    pool.free_blocks(blocks[::-1])
    twin = copy.deepcopy(pool)
    assert twin.abstract() == pool.abstract()
    assert twin.get_cached_block(request.block_hashes[0], [0]) == [blocks[0]]
    got = twin.get_new_blocks(11)  # evicts every cached block of the copy
    twin.touch([got[0]])
    twin.free_blocks([got[0]])
    assert twin.get_cached_block(request.block_hashes[0], [0]) is None
    assert pool.get_cached_block(request.block_hashes[0], [0]) == [blocks[0]]
    assert pool.get_num_free_blocks() == 11 and twin.get_num_free_blocks() == 0
    assert_sound(pool)
    assert_sound(twin)


@pytest.mark.parametrize("events", [True, False])
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_used_pool_pickles_and_copies_and_both_go_on_alike(events, how):
    """Every compiled verb a pool has bound (one-op, lean, evicting, cache write) is rebuilt
    by the copy over its own arrays: pickling used to fail on them, and a deep copy to
    share them. Both pools then take the same calls and end equal, events included."""
    pool = fast_pool(12, jit=True, enable_kv_cache_events=events)
    request = request_with_hashes(8)
    blocks = pool.get_new_blocks(8)
    pool.cache_full_blocks(request, blocks, 0, 8, 16, 0)
    pool.free_blocks(blocks[::-1])
    pool.get_new_blocks(6)  # evicts: the lean reported pop, or the quiet one
    pool.get_cached_block(request.block_hashes[7], [0])
    pool.take_events()
    twin = pickle.loads(pickle.dumps(pool)) if how == "pickle" else copy.deepcopy(pool)
    for p in (pool, twin):
        got = p.get_new_blocks(4)  # evicts again, in each pool's own arrays
        p.cache_full_blocks(request, got, 0, 4, 16, 1)
        p.free_blocks(got)
    assert twin.abstract() == pool.abstract()
    assert twin.take_events() == pool.take_events()
    assert_sound(pool)
    assert_sound(twin)


@pytest.mark.parametrize("jit", [True, False])
def test_the_one_op_state_is_built_on_first_use_and_follows_every_growth(jit):
    pool = fast_pool(40, jit=jit)
    pool.free_blocks(pool.get_new_blocks_array(3))  # array paths: no one-op state
    assert pool._st.arrays is None
    request = request_with_hashes(30)
    assert pool.get_cached_block(request.block_hashes[0], [0]) is None  # built here
    assert pool._st.arrays is not None
    blocks = pool.get_new_blocks(30)
    pool.cache_full_blocks(request, blocks, 0, 30, 16, 0)  # the index arrays grow
    for h, b in zip(request.block_hashes, blocks, strict=True):
        assert pool.get_cached_block(h, [0]) == [b]
    pool.free_blocks(blocks[::-1])
    for _ in range(39):  # one block at a time, the last 30 evicting a cached block
        pool.get_new_blocks(1)
    assert pool.get_cached_block(request.block_hashes[0], [0]) is None
    assert_sound(pool)


@pytest.mark.parametrize("events", [False, True])
def test_one_block_cache_writes_match_the_spec(events, monkeypatch):
    """A decode step's write (one block, ``cache_one``) gives the spec's results, errors,
    state and events, through every refusal: a promotion, a full index that must grow, bad
    ids, groups, hashes and positions, the null block (the general path serves it)."""
    from fast_twin import FastTwin

    from kvpool.fast import kernels
    from kvpool.fast.state import FastState

    served: list[int] = []
    bind = FastState.cache_one_kernel

    def spied(state):
        kernel = bind(state)

        def counted(*args):
            code = kernel(*args)
            served.append(code)
            return code
        state._cache_one = counted  # kept until the index grows, as the kernel would be
        return counted

    monkeypatch.setattr(FastState, "cache_one_kernel", spied)
    twin = FastTwin(12, enable_kv_cache_events=events)
    request = request_with_hashes(8)
    table = twin.get_new_blocks(8)
    for i in range(5):  # one block at a time, each write growing the tiny index
        twin.cache_full_blocks(request, table, i, i + 1, 16, 0)
    # The one-block kernel served them; it refused only to let the tiny index grow (the
    # general path grew it and wrote).
    assert set(served) == {kernels.OK, kernels.ERR_CAPACITY}, served
    assert served.count(kernels.OK) >= 2 * len(twin.fast)
    other = request_with_hashes(8, prefix="other")
    bad_calls = [
        (request, table, 0, 1, 16, 0),  # already keyed, as long: refused
        (request, [*table[:5], 0], 5, 6, 16, 0),  # the null block: skipped
        (request, table, 5, 6, 16, -1), (request, table, 5, 6, 16, 2**32),
        (request, table, 5, 6, 16, 2**70), (request, table, 5, 6, 16, True),
        (request, [*table[:5], -1], 5, 6, 16, 0), (request, [*table[:5], 12], 5, 6, 16, 0),
        (request, [*table[:5], 2**63], 5, 6, 16, 0), (request, [*table[:5], 2**70], 5, 6, 16, 0),
        (request, [*table[:5], True], 5, 6, 16, 0), (request, [*table[:5], 3.0], 5, 6, 16, 0),
        (request, table, -1, 0, 16, 0), (request, table, 8, 9, 16, 0),
        (request, table, 5, 6, 32, 0), (request, table, 5, 6, 16.0, 0),
    ]
    for args in bad_calls:
        try:
            twin.cache_full_blocks(*args)
        except Exception:  # noqa: BLE001, S110 - the twin compared type, message and state
            pass
    free = twin.get_new_blocks(1)
    twin.free_blocks(free)
    with pytest.raises(Exception):  # noqa: B017, PT011 - the twin compares the error itself
        twin.cache_full_blocks(request, [*table[:5], *free], 5, 6, 16, 0)  # ref 0
    for hash_value in ("str", bytearray(32), 7):
        odd = request_with_hashes(8, prefix="odd")
        odd.block_hashes[5] = hash_value
        with pytest.raises(Exception):  # noqa: B017, PT011
            twin.cache_full_blocks(odd, table, 5, 6, 16, 0)
    # A promotion: block 5 keyed at position 5 under another request's hash, then written
    # at position 6 (a longer key) by this one: the general path serves it.
    twin.cache_full_blocks(other, table, 5, 6, 16, 0)
    twin.cache_full_blocks(request, [*table[:6], table[5]], 6, 7, 16, 0)
    twin.cache_full_blocks(request, table, 7, 8, 16, 1)  # another group
    assert twin.state.ref_cnt[table[0]] == 1


def test_a_compiled_pool_arrays_keeps_the_arrays_alive_without_its_state():
    """The handle Python holds of a compiled PoolArrays (an int plus the object that owns
    the struct) keeps every array alive on its own, and each kernel call reads them."""
    import gc

    numba = pytest.importorskip("numba")
    if numba.config.DISABLE_JIT:
        pytest.skip("about compiled code")
    from kvpool.fast import kernels
    from kvpool.fast.compiled import PoolArraysRef, kernel_set
    from kvpool.fast.state import FastState

    state = FastState(8, enable_caching=True, enable_events=False)
    arrays = state.pool_arrays()
    assert type(arrays) is PoolArraysRef and arrays == state.pool_arrays()  # one per state
    del state
    gc.collect()
    ks = kernel_set(True)
    assert ks.h_pop(arrays, 3) == 1  # the fresh queue's front: blocks 1, 2, 3
    assert ks.h_free_one(arrays, 2) == kernels.OK
    assert ks.h_touch_one(arrays, 8) == kernels.ERR_BLOCK_ID  # the blk array's real bounds


def test_a_compiled_kernel_refuses_a_plain_pool_arrays_with_a_type_error():
    """Only the compiled handle converts: anything else passed where a kernel takes its
    PoolArrays is a TypeError from the call, and no kernel code runs."""
    numba = pytest.importorskip("numba")
    if numba.config.DISABLE_JIT:
        pytest.skip("about compiled code")
    from kvpool.fast import kernels
    from kvpool.fast.compiled import kernel_set
    from kvpool.fast.state import FastState

    state = FastState(8, enable_caching=True, enable_events=False, jit=False)
    plain = state.pool_arrays()
    assert type(plain) is kernels.PoolArrays
    before = state.meta.copy(), state.blk.copy()
    with pytest.raises(TypeError):
        kernel_set(True).h_pop(plain, 1)
    assert (state.meta == before[0]).all() and (state.blk == before[1]).all()  # nothing ran
