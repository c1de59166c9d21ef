"""Classes 3–9 of issue 7: inputs that used to corrupt a pool, lose an event or crash.

Each test runs on every backend and checks the typed error *and* that ``abstract()`` (state
and pending events) did not move.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from hostile import BACKENDS, plant_ref_cnt, pool_of, request

from kvpool import batch
from kvpool.errors import (
    EventGap,
    ForeignBlock,
    InvalidArgument,
    InvalidConfig,
    InvalidEvent,
    KvPoolError,
    RefCountOverflow,
)
from kvpool.events import BlockRemoved, BlockStored, replay
from kvpool.fast import kernels
from kvpool.request import LoRARequest, MultiModalFeature, Request
from kvpool.shell import BlockRef
from kvpool.spec.state import MAX_REF_CNT


def rejected(pool, error, call, *args, match=None):
    """``call(*args)`` raises ``error`` and leaves ``pool.abstract()`` as it was."""
    before = pool.abstract()
    with pytest.raises(error, match=match):
        call(*args)
    assert pool.abstract() == before


def verb(pool, name):
    return getattr(pool, name, None) or (lambda *a: getattr(batch, name)(pool, *a))


# -- class 3: everything an event needs is checked before the pool moves ----------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_request_events_cannot_describe_is_rejected_before_any_key_is_stored(backend):
    pool = pool_of(backend, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(2)
    pool.take_events()
    bare = types.SimpleNamespace(block_hashes=request().block_hashes)  # no all_token_ids
    rejected(pool, InvalidArgument, pool.cache_full_blocks, bare, blocks, 0, 2, 2, 0)
    rejected(pool, InvalidArgument, pool.cache_partial_block, bare, blocks[0], 2, 0, 4)
    rejected(pool, InvalidArgument, pool.emit_cached_block_events, bare, 1, 2, 0)
    rejected(pool, InvalidArgument, verb(pool, "step"), [(bare, blocks, 0, 2)], 0, [], 2, 0)
    rejected(pool, InvalidArgument, verb(pool, "allocate_and_cache"), bare, blocks, 1, 0, 2,
             2, 0)
    rejected(pool, InvalidArgument, verb(pool, "admit"), bare, 0, 2, 2, 0, 2, 0)
    table = np.full(2, -1, np.int64)
    rejected(pool, InvalidArgument, verb(pool, "admit_into"), bare, table, 0, 2, 2, 0, 2, 0)
    assert table.tolist() == [-1, -1]
    good = request()
    pool.cache_full_blocks(good, blocks, 0, 2, 2, 0)
    assert [e.seq for e in pool.take_events()] == [0]  # no sequence number was consumed


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_int_parent_hash_with_events_on_is_rejected_before_the_write(backend):
    pool = pool_of(backend, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(2)
    r = request()
    r.block_hashes[0] = 12345  # the parent of position 1
    rejected(pool, InvalidArgument, pool.cache_full_blocks, r, blocks, 1, 2, 2, 0,
             match="parent")


# -- classes 4 and 6: hash keys are bytes, checked before the first key ----------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [7, np.int64(7), "ab", None, {}, bytearray(b"x" * 32),
                                 memoryview(b"y" * 32)])
def test_a_non_bytes_hash_at_any_position_is_rejected_identically(backend, bad):
    pool = pool_of(backend)
    blocks = pool.get_new_blocks(3)
    r = request()
    r.block_hashes[1] = bad
    match = r"block_hashes\[1\]"
    rejected(pool, InvalidArgument, pool.cache_full_blocks, r, blocks, 0, 3, 2, 0, match=match)
    rejected(pool, InvalidArgument, pool.cache_partial_block, r, blocks[1], 4, 0, 4,
             match=match)
    rejected(pool, InvalidArgument, verb(pool, "step"), [(r, blocks, 0, 3)], 0, [], 2, 0,
             match=match)
    rejected(pool, InvalidArgument, verb(pool, "allocate_and_cache"), r, blocks, 1, 0, 3, 2,
             0, match=match)
    rejected(pool, InvalidArgument, pool.get_cached_block, bad, [0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_hashes_that_are_a_generator_are_rejected(backend):
    pool = pool_of(backend)
    blocks = pool.get_new_blocks(2)
    r = types.SimpleNamespace(block_hashes=(h for h in request().block_hashes),
                              all_token_ids=[1, 2, 3, 4])
    rejected(pool, InvalidArgument, pool.cache_full_blocks, r, blocks, 0, 2, 2, 0,
             match="block_hashes")


# -- class 5: the fast step reads its items more than once ------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("events", [False, True])
def test_step_with_generators_caches_like_the_spec(backend, events):
    pools = [pool_of("spec", enable_kv_cache_events=events),
             pool_of(backend, enable_kv_cache_events=events)]
    results = []
    for pool in pools:
        r = request()
        table = pool.get_new_blocks(2)
        items = ((req, blocks, c, f) for req, blocks, c, f in [(r, table, 0, 2)])
        tables = (t for t in [table[::-1]])
        new = verb(pool, "step")(items, 1, tables, 2, 0)
        results.append((new, pool.abstract()))
    assert results[0] == results[1]
    assert len(results[1][1].state.cache) == 2


# -- class 7: tokens and extra-key inputs -------------------------------------------------------


def test_numpy_tokens_hash_exactly_like_python_ints():
    assert request(np.arange(8)).block_hashes == request(list(range(8))).block_hashes
    grown = request([0, 1])
    grown.append_output_token_ids(np.int32(2))
    grown.append_output_token_ids(np.array([3, 4, 5, 6, 7]))
    assert grown.block_hashes == request(range(8)).block_hashes


@pytest.mark.parametrize("bad", ["5", 1.0, None, -1, 2**63, True, np.float32(1)])
def test_a_token_that_is_not_an_id_is_rejected_naming_its_position(bad):
    with pytest.raises(InvalidArgument, match="token 3 "):
        request([1, 2, 3, bad])
    r = request([1, 2])
    with pytest.raises(InvalidArgument, match="token 3 "):
        r.append_output_token_ids([4, bad])
    assert r.all_token_ids == [1, 2]  # nothing appended


@pytest.mark.parametrize("field, value", [
    ("lora_request", "adapter"),
    ("lora_request", types.SimpleNamespace(lora_name=1, lora_int_id=1)),
    ("mm_features", [("img", 0, 2)]),
    ("mm_features", [MultiModalFeature("img", "0", 2)]),
    ("prompt_embeds", np.zeros(3)),
    ("prompt_embeds", 5),
    ("cache_salt", 7),
])
def test_extra_key_inputs_of_the_wrong_shape_are_rejected(field, value):
    with pytest.raises(InvalidArgument, match=field.split("_")[0].replace("mm", "multimodal")):
        Request("r", [1, 2, 3, 4], **{field: value})


def test_well_formed_extra_key_inputs_are_accepted():
    Request("r", [1, 2, 3, 4], lora_request=LoRARequest("a", 1),
            mm_features=[MultiModalFeature("img", 0, 2)], prompt_embeds=np.zeros((4, 2)))


# -- class 8: reference counts stop at MAX_REF_CNT on every backend ----------------------------


def test_the_kernels_limit_is_the_specs():
    assert kernels.MAX_REF_CNT == MAX_REF_CNT == 2**31 - 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_touching_past_the_ref_count_limit_is_refused(backend):
    pool = pool_of(backend)
    b, c = pool.get_new_blocks(2)
    plant_ref_cnt(pool, b, MAX_REF_CNT - 1)
    pool.touch([b])
    for batch_ in ([b], [c, b], [0, c, b]):
        rejected(pool, RefCountOverflow, pool.touch, batch_, match=f"block {b} ")
    plant_ref_cnt(pool, c, MAX_REF_CNT - 1)
    rejected(pool, RefCountOverflow, pool.touch, [c, c], match=f"block {c} ")


@pytest.mark.parametrize("backend", BACKENDS)
def test_admitting_a_hit_past_the_ref_count_limit_is_refused(backend):
    pool = pool_of(backend)
    r = request()
    hits, new = verb(pool, "admit")(r, 4, 4, 4, 0, 2, 0)
    plant_ref_cnt(pool, new[0], MAX_REF_CNT)
    rejected(pool, RefCountOverflow, verb(pool, "admit"), r, 4, 4, 4, 0, 2, 0)


# -- class 9: every error is a KvPoolError; options are what they say ---------------------------


def test_replay_errors_are_typed():
    assert issubclass(EventGap, KvPoolError)
    with pytest.raises(EventGap):
        replay([BlockRemoved([1], "GPU", 0, seq=3)])
    with pytest.raises(InvalidEvent):
        replay([BlockRemoved([], "GPU", 0, seq=0)])
    with pytest.raises(InvalidEvent, match="never stored"):
        replay([BlockRemoved([1], "GPU", 0, seq=0)])
    with pytest.raises(InvalidEvent):
        replay(["not an event"])
    # A stream joined mid-way may remove what it never saw stored.
    stored = BlockStored([2], None, [1, 2], 2, None, "GPU", group_idx=0, seq=6)
    assert replay([BlockRemoved([1], "GPU", 0, seq=5), stored], start_seq=5) == {(2, 0): 1}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_block_ref_to_something_that_is_not_a_pool_is_a_foreign_block(backend):
    pool = pool_of(backend)
    b = pool.get_new_blocks(1)[0]
    rejected(pool, ForeignBlock, pool.free_blocks, [b, BlockRef(object(), 1)])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", [np.ones((2, 1), bool), ["yes", True], [2, 1], "ab"])
def test_a_block_mask_that_is_not_bools_is_rejected(backend, mask):
    pool = pool_of(backend)
    blocks = pool.get_new_blocks(2)
    rejected(pool, InvalidArgument, pool.cache_full_blocks, request(), blocks, 0, 2, 2, 0,
             mask, match="block_mask")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option, value", [
    ("enable_caching", "False"), ("enable_caching", np.array([1, 2])),
    ("enable_kv_cache_events", 1), ("use_int_block_hashes", None),
    ("num_hash_lookahead_tokens", True), ("num_hash_lookahead_tokens", np.array([1])),
    ("hash_block_size", 2.0), ("medium", 5),
])
def test_options_of_the_wrong_type_are_rejected(backend, option, value):
    with pytest.raises(InvalidConfig, match=option):
        pool_of(backend, **{option: value})
