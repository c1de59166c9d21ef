"""Garbage in, typed errors out: no argument can corrupt or escape a fast pool.

Every public method (the batch verbs of :mod:`kvpool.batch` included) is called with random
garbage — huge and negative ids, ids beyond int64, floats, bools, ``None``, strings, numpy
scalars and arrays of every dtype and shape, empty and oversized batches, repeated ids, bad
group ids, wrong mask lengths, short hash lists, bad sizes and counts, malformed cache items.
For each call:

* only :class:`KvPoolError` subclasses escape;
* a rejected call leaves ``abstract()`` exactly as it was;
* the arrays stay structurally sound and the guard rows around every array are untouched
  (an out-of-bounds write by a compiled kernel would land there);
* the spec, given the same call, raises the same error type with the same message, or
  returns the same result.
"""

from __future__ import annotations

import numpy as np
import pytest
from fast_twin import assert_sound, block_hash, fast_pool, request_with_hashes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpool import batch, make_pool
from kvpool.errors import KvPoolError
from kvpool.request import Request

N = 9
EDGE_INTS = [-(2**70), -(2**63), -1, 0, 1, N - 1, N, 2**31, 2**32, 2**63, 2**64, 2**70]

ints = st.sampled_from(EDGE_INTS) | st.integers(-3, N + 3)
scalars = st.one_of(
    ints,
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.text(max_size=2),
    st.sampled_from([np.int8(3), np.uint64(2**64 - 1), np.int64(2), np.float32(1.0),
                     np.bool_(True), np.int32(-1)]),
)
DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64", "float64", "bool"]


@st.composite
def id_batches(draw):
    kind = draw(st.sampled_from(["list", "tuple", "array", "array2d", "huge"]))
    if kind == "huge":  # oversized batch: far more entries than blocks
        return [draw(st.integers(0, N - 1))] * draw(st.integers(N, 70))
    if kind.startswith("array"):
        dtype = draw(st.sampled_from(DTYPES))
        values = draw(st.lists(st.integers(-3, N + 3), max_size=6))
        arr = np.array(values, dtype=np.int64).astype(dtype)
        return arr.reshape(-1, 1) if kind == "array2d" else arr
    values = draw(st.lists(scalars | st.integers(0, N - 1), max_size=6))
    return tuple(values) if kind == "tuple" else values


@st.composite
def requests(draw):
    num = draw(st.integers(0, 6))
    size = draw(st.sampled_from([0, 1, 16, 32, 40]))
    request = Request("fuzz", list(range(num * 4 + 2)))
    request.block_hashes.extend(block_hash(f"f{i % 3}", size) for i in range(num))
    return request


groups = st.sampled_from([0, 1, 2**32 - 1, -1, 2**32, 2**70]) | scalars
counts = st.integers(-2, 8) | scalars
sizes = st.sampled_from([4, 8, 12, 0, -4, 3, 4 * 2**70]) | scalars
masks = st.none() | st.lists(st.booleans(), max_size=7)
items = st.tuples(requests(), id_batches(), counts, counts) | scalars  # malformed: not a 4-tuple
hash_lists = st.one_of(
    st.lists(st.sampled_from([block_hash("f0"), block_hash("f1"), b"", b"x"]), max_size=5),
    st.lists(scalars, min_size=1, max_size=3),
    st.sampled_from([np.zeros((3, 32), np.uint8), np.zeros((2, 2), np.float64),
                     np.zeros(4, np.uint8)]),
)

def _read_only(table: np.ndarray) -> np.ndarray:
    table.flags.writeable = False
    return table


tables = st.sampled_from([np.full(8, -1, np.int64), np.full(3, -1, np.int64),
                          np.zeros(0, np.int64), np.zeros(8, np.int32),
                          np.zeros((2, 8), np.int64), _read_only(np.zeros(8, np.int64))]) \
    | scalars | st.lists(st.integers(0, 3), max_size=8)

CALLS = {
    "get_new_blocks": st.tuples(counts),
    "get_new_blocks_array": st.tuples(counts),
    "free_blocks": st.tuples(id_batches()),
    "touch": st.tuples(id_batches()),
    "unpin_blocks": st.tuples(id_batches(), st.sampled_from([lambda b: None, None, 5])),
    "evict_blocks": st.tuples(id_batches()),
    "get_cached_block": st.tuples(st.sampled_from([block_hash("f0"), "f0", None, 3, b""]),
                                  st.lists(groups, max_size=3)),
    "cache_full_blocks": st.tuples(requests(), id_batches(), counts, counts, sizes, groups,
                                   masks),
    "cache_partial_block": st.tuples(requests(), scalars, counts, groups, sizes,
                                     st.booleans()),
    "move_block_hashes": st.tuples(scalars, scalars),
    "is_block_writable": st.tuples(scalars),
    "emit_cached_block_events": st.tuples(requests(), counts, sizes, groups),
    "find_longest_cache_hit": st.tuples(hash_lists, st.lists(groups, max_size=3),
                                        st.none() | counts),
    "allocate_and_cache": st.tuples(requests(), id_batches(), counts, counts, counts, sizes,
                                    groups, masks),
    "admit": st.tuples(requests(), counts, counts, counts, counts, sizes, groups),
    "admit_into": st.tuples(requests(), tables, counts, counts, counts, counts, sizes, groups),
    "step": st.tuples(st.lists(items, max_size=3), counts, st.lists(id_batches(), max_size=3),
                      sizes, groups),
    "cache_full_blocks_batch": st.tuples(st.lists(items, max_size=3), sizes, groups),
    "free_tables": st.tuples(st.lists(id_batches(), max_size=3)),
}
GENERIC = {name: getattr(batch, name) for name in (
    "find_longest_cache_hit", "allocate_and_cache", "admit", "admit_into", "step",
    "cache_full_blocks_batch", "free_tables")}


def prepared(pool, watch):
    """A pool with held, cached, free-cached (and watched) blocks, so garbage has targets."""
    r = request_with_hashes(4, prefix="f", hbs=4)
    r.block_hashes[:] = [block_hash(f"f{i % 3}") for i in range(4)]
    blocks = pool.get_new_blocks(6)
    pool.cache_full_blocks(r, blocks[:4], 0, 4, 4, 0)
    pool.cache_partial_block(r, blocks[4], 8, 1, 8)
    pool.free_blocks([blocks[1], blocks[0]])
    pool.touch([blocks[2]])
    if watch:
        pool.unpin_blocks([blocks[2]], lambda b: None)
    return pool


def run(pool, name, args):
    """Call ``name`` on ``pool``; the spec runs the generic twins of the fast-only verbs.
    ``admit_into`` writes into a copy of its table, returned beside the result (a refusal
    or an error must leave it as it was)."""
    if name == "admit_into" and isinstance(args[1], np.ndarray):
        table = args[1].copy()
        table.flags.writeable = args[1].flags.writeable
        try:
            result = run(pool, "admit_into_copied", (args[0], table, *args[2:]))
        except KvPoolError:
            assert np.array_equal(table, args[1])
            raise
        if result is None:
            assert np.array_equal(table, args[1])
        return result, table.tolist()
    if name == "admit_into_copied":
        name = "admit_into"
    if pool.backend_name == "spec":
        if name in GENERIC:
            return GENERIC[name](pool, *args)
        if name == "get_new_blocks_array":
            return np.array(pool.get_new_blocks(*args), dtype=np.int64)
    return getattr(pool, name)(*args)


def outcome(pool, name, args):
    try:
        result = run(pool, name, args)
    except KvPoolError as error:
        return ("error", type(error), str(error))
    if isinstance(result, np.ndarray):
        result = ("array", str(result.dtype), result.tolist())
    return ("ok", result)


@pytest.mark.long
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), events=st.booleans(), caching=st.sampled_from([True, True, False]),
       watch=st.booleans())
def test_garbage_arguments_raise_typed_errors_and_change_nothing(data, events, caching, watch):
    options = dict(hash_block_size=4, enable_kv_cache_events=events, enable_caching=caching)
    if not caching:
        prepared_pools = [make_pool(N, backend="spec", **options),
                          fast_pool(N, jit=True, **options), fast_pool(N, jit=False, **options)]
        for pool in prepared_pools:
            pool.get_new_blocks(3)
    else:
        prepared_pools = [prepared(make_pool(N, backend="spec", **options), watch),
                          prepared(fast_pool(N, jit=True, **options), watch),
                          prepared(fast_pool(N, jit=False, **options), watch)]
    spec, *fast = prepared_pools
    for _ in range(4):
        name = data.draw(st.sampled_from(sorted(CALLS)), label="method")
        args = data.draw(CALLS[name], label="args")
        before = [p.abstract() for p in prepared_pools]
        expected = outcome(spec, name, args)
        if expected[0] == "error":  # batch verbs too: their compositions validate up front
            assert spec.abstract() == before[0]
        for pool, was in zip(fast, before[1:], strict=True):
            got = outcome(pool, name, args)  # anything but a KvPoolError propagates: a failure
            assert got == expected, (name, args, pool._jit)
            if got[0] == "error":
                assert pool.abstract() == was, (name, args)
            assert_sound(pool)
        assert fast[0].abstract() == spec.abstract() == fast[1].abstract()
