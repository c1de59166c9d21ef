"""Long seeded workloads with heavy key churn agree on the spec and both fast pools.

The Hypothesis machine (test_fast_differential) explores short programs and every rejection;
this test runs long, mostly valid, serving-like programs — shared prefixes, caching,
eviction by allocation, promotions, moves, watchers — so that the hash table fills, collides,
grows and deletes with probe chains in place. Every step goes through :class:`FastTwin`.
The seed is in the test id; a failure replays with that seed alone.
"""

from __future__ import annotations

import random

import pytest
from fast_twin import FastTwin, block_hash

from kvpool import batch
from kvpool.errors import KvPoolError
from kvpool.request import Request

HBS = 4


def shared_prefix_request(rng: random.Random, name: str) -> Request:
    """A request whose hashes follow one of a few prompt prefixes, then diverge."""
    prefix = rng.randrange(3)
    length = rng.randrange(1, 9)
    split = rng.randrange(0, length + 1)
    labels = [f"p{prefix}:{i}" for i in range(split)]
    labels += [f"{name}:{i}" for i in range(split, length)]
    size = rng.choice([32, 32, 16])
    request = Request(name, list(range(length * HBS + 2)))
    request.block_hashes.extend(block_hash(label, size) for label in labels)
    return request


def run_workload(seed: int, steps: int, *, events: bool) -> FastTwin:
    rng = random.Random(seed)
    twin = FastTwin(24, hash_block_size=HBS, enable_kv_cache_events=events)
    tables: list[tuple[Request, list[int]]] = []
    twin.peak_keys = twin.key_drops = 0

    def attempt(name: str, *args, **kwargs):
        try:
            return twin.call(name, *args, **kwargs)
        except KvPoolError:
            return None

    for step in range(steps):
        op = rng.random()
        request = shared_prefix_request(rng, f"s{seed}-{step}")
        if op < 0.30:  # admit a request: lookup, touch hits, allocate the rest, cache
            groups = rng.choice([[0], [0, 1]])
            hits = batch.find_longest_cache_hit(twin.spec, request.block_hashes, groups)
            for fast in twin.fast:
                assert fast.find_longest_cache_hit(request.block_hashes, groups) == hits
            table = list(hits[0])
            attempt("touch", table)
            need = len(request.block_hashes) - len(table) + rng.randrange(2)
            new = attempt("get_new_blocks", need)
            if new is None:
                if table:
                    attempt("free_blocks", table[::-1])
                continue
            table += new
            attempt("cache_full_blocks", request, table, len(hits[0]),
                    min(len(table), len(request.block_hashes)), HBS, groups[0])
            tables.append((request, table))
        elif op < 0.55 and tables:  # finish a request: free its table tail first
            request, table = tables.pop(rng.randrange(len(tables)))
            attempt("free_blocks", table[::-1])
        elif op < 0.62 and tables and tables[-1][1]:  # a partial entry in a last block
            request, table = tables[-1]
            tokens = HBS * rng.randrange(1, len(request.block_hashes) + 1)
            attempt("cache_partial_block", request, table[-1], tokens, rng.randrange(2),
                    2 * HBS, rng.random() < 0.3)
        elif op < 0.67 and tables and tables[-1][1]:  # copy-on-write: keys to a fresh copy
            request, table = tables[-1]
            new = attempt("get_new_blocks", 1)
            if new:
                attempt("move_block_hashes", table[-1], new[0])
                table.append(new[0])
        elif op < 0.72:
            attempt("evict_blocks", [rng.randrange(24) for _ in range(rng.randrange(4))])
        elif op < 0.77 and tables:  # async read: unpin one reference, watcher fires later
            request, table = tables.pop(rng.randrange(len(tables)))
            twin.unpin_blocks(sorted(set(table)) if rng.random() < 0.5 else table[:0])
            attempt("free_blocks", [b for b in table if twin.state.ref_cnt[b] > 0])
        elif op < 0.85:
            n_new = rng.randrange(0, 4)
            table = [b for b in (rng.choice(tables)[1] if tables else [])]
            outcomes = []
            for fast in twin.fast:
                try:
                    outcomes.append(fast.allocate_and_cache(request, table, n_new,
                                                            len(table), len(table) + n_new,
                                                            HBS, 0))
                except KvPoolError as error:
                    outcomes.append(type(error))
            try:
                expected = batch.allocate_and_cache(twin.spec, request, table, n_new, len(table),
                                                    len(table) + n_new, HBS, 0)
                tables.append((request, list(expected)))
            except KvPoolError as error:
                expected = type(error)
            assert outcomes == [expected, expected]
            for fast in twin.fast:
                assert fast.abstract() == twin.spec.abstract()
        elif op < 0.87 and not tables:
            attempt("reset_prefix_cache")
        else:
            attempt("take_events")
        keys = len(twin.state.cache)
        twin.key_drops += keys < twin.peak_keys
        twin.peak_keys = max(twin.peak_keys, keys)
    return twin


@pytest.mark.parametrize("seed", range(8))
def test_serving_like_workloads_agree(seed):
    twin = run_workload(seed, 150, events=seed % 2 == 0)
    # The workload must exercise the index: many live keys, and keys leaving it.
    assert twin.peak_keys >= 10 and twin.key_drops > 0
