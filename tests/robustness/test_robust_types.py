"""Issue 23, item 4: a wrong Python type gets the typed error the docs name, the same on every
backend, and the pool does not move.

Before the fix each class below escaped as a plain ``TypeError`` somewhere, or was accepted
by one backend and refused by another (a mask of strings: spec and reference keyed the
blocks the strings' truthiness chose, fast refused it, and the pools diverged).
"""

from __future__ import annotations

import numpy as np
import pytest
from hostile import BACKENDS, pool_of, request

from kvpool import batch, make_pool
from kvpool.errors import (
    BackendUnavailable,
    InvalidArgument,
    InvalidConfig,
    InvalidEvent,
    KvPoolError,
)
from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored, replay
from kvpool.request import Request


def rejected(pool, error, call, *args, match=None):
    """``call(*args)`` raises ``error`` (a ``KvPoolError``) and leaves ``pool`` as it was."""
    before = pool.abstract()
    with pytest.raises(error, match=match) as raised:
        call(*args)
    assert isinstance(raised.value, KvPoolError)
    assert pool.abstract() == before
    return raised.value


def allocate_and_cache(pool):
    """The pool's own verb (fast) or the composition of :mod:`kvpool.batch`."""
    return getattr(pool, "allocate_and_cache", None) or (
        lambda *a: batch.allocate_and_cache(pool, *a)
    )


# -- block_mask: the mask cache_full_blocks takes, checked the same way by every path -----------

BAD_MASKS = [
    (["a", "b"], "block_mask\\[0\\]"),   # truthy strings: were keyed by spec/reference
    (["", "x"], "block_mask\\[0\\]"),     # a falsy then a truthy string
    ([2, 0], "block_mask\\[0\\]"),        # an int that is not 0/1
    ([1.0, 0.0], "block_mask\\[0\\]"),
    ([None, None], "block_mask\\[0\\]"),
    ([True, "x"], "block_mask\\[1\\]"),
    (5, "sequence of bools"),             # an int, not a mask: was TypeError (spec, reference)
    ("ab", "sequence of bools"),
    (np.array([[1, 0]]), "1-D"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask,match", BAD_MASKS, ids=lambda v: repr(v)[:20])
def test_allocate_and_cache_refuses_a_mask_that_is_not_bools(backend, mask, match):
    pool = pool_of(backend, 16, enable_kv_cache_events=True)
    r = request((1, 2, 3, 4, 5, 6))
    rejected(pool, InvalidArgument, allocate_and_cache(pool), r, [], 2, 0, 2, 2, 0, mask,
             match=match)
    # cache_full_blocks has always refused them: the two verbs agree.
    blocks = pool.get_new_blocks(2)
    rejected(pool, InvalidArgument, pool.cache_full_blocks, r, blocks, 0, 2, 2, 0, mask,
             match=match)


@pytest.mark.parametrize("mask", [[1, 0], [np.int64(0), np.int64(1)], [np.True_, False],
                                  np.array([True, False]), np.array([0, 1])],
                         ids=repr)
def test_allocate_and_cache_reads_a_valid_mask_alike_on_every_backend(mask):
    outcomes = []
    for backend in BACKENDS:
        pool = pool_of(backend, 16, enable_kv_cache_events=True)
        new = allocate_and_cache(pool)(request((1, 2, 3, 4, 5, 6)), [], 2, 0, 2, 2, 0, mask)
        outcomes.append((new, pool.abstract()))
    assert all(o == outcomes[0] for o in outcomes[1:])


# -- group ids: a lookup needs a collection of them ----------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("groups", [None, 0, 1.5, "0", b"\x00"], ids=repr)
def test_a_lookup_without_a_list_of_group_ids_is_invalid_argument(backend, groups):
    pool = pool_of(backend)
    h = request().block_hashes[0]
    rejected(pool, InvalidArgument, pool.get_cached_block, h, groups,
             match="kv_cache_group_ids")
    find = getattr(pool, "find_longest_cache_hit", None) or (
        lambda *a: batch.find_longest_cache_hit(pool, *a)
    )
    rejected(pool, InvalidArgument, find, [h], groups, match="kv_cache_group_ids")
    rejected(pool, InvalidArgument, batch.find_longest_cache_hit, pool, [h], groups,
             match="kv_cache_group_ids")


# -- make_pool: options and backends ---------------------------------------------------------


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_make_pool_refuses_an_unknown_option_with_invalid_config(backend):
    with pytest.raises(InvalidConfig, match="unknown option foo"):
        make_pool(8, backend=backend, foo=1)
    with pytest.raises(InvalidConfig, match="num_gpu_blocks"):  # num_blocks says it already
        make_pool(8, backend=backend, num_gpu_blocks=8)


def test_make_pool_still_takes_each_backends_own_options():
    assert make_pool(4, backend="reference", check_contracts=True).get_num_free_blocks() == 3
    assert make_pool(4, backend="fast", jit=False).get_num_free_blocks() == 3


@pytest.mark.parametrize("name", [["spec"], {"spec": 1}, None, 3, b"spec", "nope"], ids=repr)
def test_make_pool_refuses_a_backend_that_is_not_a_name_with_backend_unavailable(name):
    with pytest.raises(BackendUnavailable, match="unknown backend"):
        make_pool(8, backend=name)


# -- events.replay: a stream of events, each field of its type -------------------------------

GARBAGE_STREAMS = [
    None,
    5,
    "events",
    [None],
    [[1, 2]],
    [BlockStored(None, None, [1, 2], 2, None, "GPU", seq=0)],           # hashes None
    [BlockStored(7, None, [1, 2], 2, None, "GPU", seq=0)],              # hashes an int
    [BlockStored([[1]], None, [1, 2], 2, None, "GPU", seq=0)],          # unhashable hash
    [BlockStored([1.5], None, [1, 2], 2, None, "GPU", seq=0)],
    [BlockStored([1], None, [1, 2], 2, None, "GPU", group_idx=[0], seq=0)],
    [BlockStored([1], None, [1, 2], 2, None, "GPU", seq="0")],
    [BlockStored([1], None, [1, 2], 2, None, "GPU", seq=None)],
    [BlockRemoved(None, "GPU", 0, seq=0)],
    [BlockRemoved(5, "GPU", 0, seq=0)],
    [BlockRemoved([{}], "GPU", 0, seq=0)],
    [AllBlocksCleared(seq=1.0)],
]


@pytest.mark.parametrize("events", GARBAGE_STREAMS, ids=lambda v: repr(v)[:40])
def test_replay_of_garbage_is_invalid_event(events):
    with pytest.raises(InvalidEvent):
        replay(events)


def test_replay_start_seq_must_be_an_int():
    with pytest.raises(InvalidArgument, match="start_seq"):
        replay([], start_seq=None)
    # Still fine: tuples of hashes, bytes hashes, a generator of events.
    stored = BlockStored((b"\x01", 2), None, [1, 2], 2, None, "GPU", group_idx=0, seq=0)
    assert replay(e for e in [stored]) == {(b"\x01", 0): 1, (2, 0): 1}


# -- Request: a block_hasher is a callable returning bytes digests --------------------------


@pytest.mark.parametrize("hasher,match", [
    (5, "callable"),
    ("sha256", "callable"),
    (lambda r: None, "list of bytes"),
    (lambda r: 7, "list of bytes"),
    (lambda r: [1, 2], "returned 1 at position 0"),
    (lambda r: [b"\x01", None], "returned None at position 1"),
    (lambda r: ["ab"], "not a bytes digest"),
])
def test_a_request_refuses_a_hasher_that_is_not_a_block_hasher(hasher, match):
    with pytest.raises(InvalidArgument, match=match):
        Request("r", [1, 2, 3, 4], block_hasher=hasher)


@pytest.mark.parametrize("bad", [[3], None, [b"\x01", 4], (b"\x01", 2)], ids=repr)
def test_a_hasher_turning_bad_at_a_decode_step_leaves_the_request_as_it_was(bad):
    answers = iter([[b"\x00" * 32], bad])
    r = Request("r", [1, 2], block_hasher=lambda req: next(answers))
    with pytest.raises(InvalidArgument):
        r.append_output_token_ids(3)
    assert r.output_token_ids == [] and r.block_hashes == [b"\x00" * 32]


def test_a_hasher_may_return_a_tuple_of_bytes():
    answers = iter([(b"\x01",), (), (b"\x02", b"\x03")])
    r = Request("r", [1, 2], block_hasher=lambda req: next(answers))
    r.append_output_token_ids(3)
    r.append_output_token_ids([4, 5])
    assert r.block_hashes == [b"\x01", b"\x02", b"\x03"]
