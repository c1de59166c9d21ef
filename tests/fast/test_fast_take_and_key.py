"""``FastBlockPool.take_and_key`` (the fast policy's block boundary and admission, one kernel
call) against its definition run on the spec pool: ``new = get_new_blocks(n)`` then
``cache_full_blocks(request, blocks + new, num_cached, num_full, ...)``. Either it returns
the spec's blocks and leaves the spec's state, or it declines (``None``) with the pool
exactly as it was — and then the two verbs, run on both pools, agree as always. It never
serves a call the two verbs would refuse."""

from __future__ import annotations

import random

import pytest
from fast_twin import (
    assert_sound,
    block_hash,
    fast_pool,
    fused_or_definition,
    request_with_hashes,
)

from kvpool import make_pool
from kvpool.request import Request

N = 24


def two_verbs(pool, request, blocks, n, num_cached, num_full, group):
    """The definition, on ``pool``: ``("ok", new)`` or ``("error", type, message)``."""
    try:
        new = pool.get_new_blocks(n)
    except Exception as exc:  # noqa: BLE001 - compared by the caller
        return ("error", type(exc), str(exc))
    try:
        pool.cache_full_blocks(request, [*blocks, *new], num_cached, num_full, 16, group)
    except Exception as exc:  # noqa: BLE001
        return ("error", type(exc), str(exc), new)
    return ("ok", new)


def draw_call(rng, tables, keyed, requests):
    """A take-and-key call as the fast policy makes them (an admission of a request that
    holds nothing, a decode step's boundary), and now and then one it never makes."""
    i = rng.randrange(len(requests))
    request, blocks = requests[i], list(tables[i])
    held = len(blocks)
    if held == 0:  # an admission: its prompt's full blocks keyed
        n = rng.randrange(1, 5)
        num_cached, num_full = 0, rng.randrange(1, n + 1)
    else:  # the block that filled keyed, the next one taken
        n, num_cached = 1, keyed[i]
        num_full = num_cached + 1
    group = 0
    if rng.random() < 0.3:  # something else
        n = rng.choice((n, 0, 2, N + 1))
        num_cached = rng.choice((num_cached, num_cached - 1, -1, held + 1))
        num_full = num_cached + rng.choice((1, 2, 0, 40))
        group = rng.choice((0, 1, -1, 2**32))
        odd = rng.random()
        if odd < 0.2 and blocks:
            blocks[-1] = rng.choice((0, -1, N, 2**63, True, 3.0))  # null, foreign, not an int
        elif odd < 0.3:
            blocks = tuple(blocks)  # not a list: declined
    return i, request, blocks, n, num_cached, num_full, group


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_take_and_key_is_the_two_verbs_or_declines_changing_nothing(jit, seed) -> None:
    rng = random.Random(seed)
    spec = make_pool(N, enable_caching=True, backend="spec")
    fast = fast_pool(N, jit=jit)  # events off: the quiet pool it serves
    # Requests that share leading hashes (duplicate keys) and one with an odd hash.
    requests = [request_with_hashes(12, prefix=p) for p in ("a", "a", "b", "c")]
    requests.append(Request(request_id="s", prompt_token_ids=list(range(12 * 16))))
    requests[-1].block_hashes.extend(
        [block_hash(f"s:{k}") for k in range(5)] + ["str", *(block_hash(f"t{k}") for k in
                                                           range(6))])
    tables: list[list[int]] = [[] for _ in requests]
    keyed = [0 for _ in requests]  # each table's keyed prefix
    served = declined = 0
    for _ in range(120):
        if rng.random() < 0.15:  # a table freed, tail first (its blocks stay keyed)
            i = rng.randrange(len(tables))
            for pool in (spec, fast):
                pool.free_blocks(tables[i][::-1])
            tables[i], keyed[i] = [], 0
            continue
        i, request, blocks, n, num_cached, num_full, group = draw_call(rng, tables, keyed,
                                                                       requests)
        ok, mine = fused_or_definition(
            fast, spec, "take_and_key", (request, blocks, n, num_cached, num_full, 16, group),
            two_verbs, (request, blocks, n, num_cached, num_full, group))
        served += ok
        declined += not ok
        if mine[0] == "ok" or len(mine) == 4:  # blocks taken (a refused write keeps them)
            new = mine[1] if mine[0] == "ok" else mine[3]
            if type(blocks) is list and blocks == tables[i]:
                tables[i].extend(new)
                if mine[0] == "ok":
                    keyed[i] = max(keyed[i], num_full)
            else:  # a call on a doctored table: give its blocks back at once
                for pool in (spec, fast):
                    pool.free_blocks(new[::-1])
        assert_sound(fast)
    assert served > 20 and declined > 10, (served, declined)


@pytest.mark.parametrize("options", [{"enable_kv_cache_events": True},
                                     {"enable_caching": False},
                                     {"metrics_collector": "collector"}])
def test_a_pool_that_reports_or_counts_is_never_served_in_one_call(options) -> None:
    if options.get("metrics_collector"):
        class Collector:  # what a pool calls on a metrics collector
            def on_block_allocated(self, block_id: int) -> None: ...
            def on_block_accessed(self, block_id: int) -> None: ...
            def on_block_evicted(self, block_id: int) -> None: ...
            def reset(self) -> None: ...

        options = {"metrics_collector": Collector()}
    pool = make_pool(N, backend="fast", **options)
    request = request_with_hashes(4)
    table = pool.get_new_blocks(1)
    before = pool.abstract()
    assert pool.take_and_key(request, table, 1, 0, 1, 16, 0) is None
    assert pool.take_and_key(request, [], 2, 0, 2, 16, 0) is None
    assert pool.abstract() == before
