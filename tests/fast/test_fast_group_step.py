"""``FastBlockPool.group_step`` (the hybrid fast policy's running step, one kernel call)
against its definition run on the spec pool: each release list freed in turn, then — when
``n + reserve`` blocks are free — ``get_new_blocks(n)`` and each write's one-block
``cache_full_blocks``. Either it returns the spec's new blocks and leaves the spec's state,
or it declines (``None``) with the pool exactly as it was — and then the verbs, run on both
pools, agree as always. It never serves a call the verbs would refuse."""

from __future__ import annotations

import random

import numpy as np
import pytest
from fast_twin import assert_sound, fast_pool, fused_or_definition, request_with_hashes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fast_kernel_twins import (
    ARRAYS,
    built_state,
    copies,
    group_plan,
    pool_arrays,
)

from kvpool import make_pool
from kvpool.fast import kernels
from kvpool.fast.compiled import kernel_set

N = 24
GROUPS = 2  # group 0: full attention (grows, keys); group 1: a window (also frees)


def the_verbs(pool, request, tables, releases, n, reserve, writes):
    """The definition on ``pool``: ``("ok", new)``, ``("refused",)`` (the budget, after the
    releases) or ``("error", type, message)``. ``writes`` are ``(group, position)``."""
    try:
        for ids in releases:
            pool.free_blocks(ids)
        if pool.get_num_free_blocks() < n + reserve:
            return ("refused",)
        new = pool.get_new_blocks(n)
        for group, position in writes:
            pool.cache_full_blocks(request, tables[group], position, position + 1, 16, group)
    except Exception as exc:  # noqa: BLE001 - compared by the caller
        return ("error", type(exc), str(exc))
    return ("ok", new)


def draw_step(rng, tables, keyed):
    """A step as the hybrid fast policy makes them (the window frees its oldest blocks,
    the groups take, each keys the block that filled), and now and then one it never makes:
    a block released twice or released and written, a free block released, a keyed block
    written, a huge reserve."""
    releases, nulled = [], []
    window = tables[1]
    first = next((i for i, b in enumerate(window) if b != 0), len(window))
    count = rng.choice((0, 0, 1, 2))
    if first + count < len(window) - 1:
        releases.append(window[first:first + count][::-1])
        nulled = list(range(first, first + count))
    n = rng.choice((0, 0, 1, 2)) if sum(map(len, tables)) < N else 0
    reserve = rng.choice((0, 0, 0, 1, 3))
    writes = [(g, keyed[g]) for g in range(GROUPS) if keyed[g] < len(tables[g])
              and rng.random() < 0.7 and keyed[g] not in (nulled if g == 1 else ())]
    odd = rng.random() * 4
    if odd < 0.05 and tables[0]:
        releases.append([tables[0][-1], tables[0][-1]])  # twice
    elif odd < 0.1 and writes:
        releases.append([tables[writes[0][0]][writes[0][1]]])  # released and written
    elif odd < 0.15:
        releases.append([rng.randrange(1, N)])  # perhaps a free block
    elif odd < 0.2 and keyed[0]:
        writes.append((0, keyed[0] - 1))  # a keyed block
    elif odd < 0.25:
        reserve = N
    return releases, nulled, n, reserve, writes


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("seed", range(10))
def test_group_step_is_the_verbs_or_declines_changing_nothing(jit, seed) -> None:
    rng = random.Random(seed)
    spec = make_pool(N, enable_caching=True, backend="spec")
    fast = fast_pool(N, jit=jit)  # events off: the quiet pool it serves
    served = declined = 0
    for life in range(10):
        # Requests share leading hashes now and then: their keys collide.
        request = request_with_hashes(30, prefix=rng.choice(("a", "b", f"c{life}")))
        tables: list[list[int]] = [[], []]
        keyed = [0, 0]
        for _ in range(40):
            releases, nulled, n, reserve, writes = draw_step(rng, tables, keyed)
            plan = [(tables[g][p], request.block_hashes[p], p, g) for g, p in writes]
            ok, mine = fused_or_definition(
                fast, spec, "group_step", (releases, n, reserve, plan),
                the_verbs, (request, tables, releases, n, reserve, writes))
            served += ok
            declined += not ok
            assert_sound(fast)
            if mine[0] == "error":  # a doctored step: start the request over
                break
            for p in nulled:
                tables[1][p] = 0
            if mine[0] == "ok":
                half = len(mine[1]) // 2  # the new blocks, split between the groups
                tables[0] += mine[1][:half]
                tables[1] += mine[1][half:]
                for g, p in writes:
                    keyed[g] = max(keyed[g], p + 1)
        for pool in (spec, fast):  # the request finishes: both tables freed, tail first
            for table in tables:
                live = [b for b in table if b]
                try:
                    pool.free_blocks(live[::-1])
                except Exception:  # noqa: BLE001 - a doctored step freed a block early
                    pass
        assert fast.abstract() == spec.abstract()
    assert served > 50 and declined > 5, (served, declined)


def test_a_pool_that_reports_or_has_no_cache_is_never_served() -> None:
    for options in ({"enable_kv_cache_events": True}, {"enable_caching": False}):
        pool = make_pool(N, backend="fast", **options)
        table = pool.get_new_blocks(2)
        before = pool.abstract()
        assert pool.group_step([[table[0]]], 1, 0, []) is None
        assert pool.abstract() == before


@pytest.mark.parametrize("args", [
    ([(1,)], 1, 0, []),  # a release list that is not a list
    ([[True]], 0, 0, []),  # an id that is not an int
    ([[2**64]], 0, 0, []),  # an id beyond int64
    ([], 1.0, 0, []),  # a count that is not an int
    ([], -1, 0, []),
    ([], 0, -1, []),
    ([], N + 1, 0, []),
    ([], 0, 0, [(1, "hash", 0, 0)]),  # a hash that is not bytes
    ([], 0, 0, [(1, b"h" * 32, 0, -1)]),  # a group out of range
    ([], 0, 0, [(0, b"h" * 32, 0, 0)]),  # the null block written
    ([[N + 5]], 0, 0, []),  # an id out of range
])
def test_arguments_off_the_plain_case_are_declined(args) -> None:
    pool = make_pool(N, backend="fast", enable_caching=True)
    pool.get_new_blocks(3)
    before = pool.abstract()
    assert pool.group_step(*args) is None
    assert pool.abstract() == before


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), jit=st.booleans())
def test_group_step_kernel_is_the_frees_the_quiet_pop_and_the_writes(data, jit) -> None:
    """The kernel does what ``free_blocks`` per list, ``get_new_blocks_quiet`` and
    ``cache_one`` per write do on the same state, or refuses, leaving every array exactly as
    it found it."""
    state = built_state(data, events=False)
    fused, split, before = copies(state), copies(state), copies(state)
    held = [b for b in range(1, state.blk.shape[0] - 2) if state.blk[b, kernels.REF] > 0]
    plan, buf = group_plan(data.draw, held)
    n = data.draw(st.sampled_from([0, 1, 2, 3]))
    reserve = data.draw(st.sampled_from([0, 0, 1, 5]))
    ks = kernel_set(jit)
    code = ks.group_step(pool_arrays(fused, jit), True, plan, buf, n, reserve)
    if code != kernels.OK:
        for name in ARRAYS:
            assert np.array_equal(fused[name], before[name]), name
        return
    t, w = int(plan[0]), int(plan[int(plan[0]) + 1])
    freed, start = plan[t + 2 + 4 * w :], 0
    for length in plan[1 : t + 1]:
        ids = freed[start : start + length]
        assert ks.free_blocks(split["blk"], split["meta"], True, False, ids) == kernels.OK
        start += length
    assert split["meta"][kernels.M_NUM_FREE] >= n + reserve
    assert ks.get_new_blocks_quiet(split["blk"], split["blk64"], split["ent"], split["keys"],
                                   split["table"], split["meta"], split["out"], True, n) >= 0
    off = 0
    for i in range(t + 2, t + 2 + 4 * w, 4):
        b, position, group, length = (int(x) for x in plan[i : i + 4])
        assert b not in split["out"][:n]
        key = bytes(buf[off : off + length])
        assert ks.cache_one(pool_arrays(split, jit), b, key, position, group,
                            False) == kernels.OK
        off += length
    for name in ARRAYS:
        assert np.array_equal(fused[name], split[name]), name
