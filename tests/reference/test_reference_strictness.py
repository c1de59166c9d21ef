"""Where kvpool is stricter than vLLM (BEHAVIOUR.md §12), for the reference pool.

Each row: the typed error, which is also the builtin vLLM raises, and the pool (compared
through ``abstract()``) exactly as before the call. The :class:`Twin` also checks that the
spec raises the same error type. Then the "not errors" that must stay silent.
"""

from __future__ import annotations

import pytest
from reference_twin import Twin, block_hash, request_with_hashes

from kvpool import make_pool
from kvpool.errors import (
    CachingDisabled,
    DoubleFree,
    ForeignBlock,
    HashStateError,
    InvalidArgument,
    InvalidBlockId,
    InvalidConfig,
    InvalidGroupId,
    KvPoolError,
    NoFreeBlocks,
    NotQueued,
    NullBlockMisuse,
    WatcherError,
)


def assert_rejected(twin: Twin, error: type, builtin: type, call) -> KvPoolError:
    before = twin.ref.abstract()
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, builtin) and isinstance(info.value, KvPoolError)
    assert twin.ref.abstract() == before
    return info.value


def held_twin(num_blocks: int = 6, held: int = 2, **options) -> Twin:
    twin = Twin(num_blocks, **options)
    twin.get_new_blocks(held)
    return twin


# -- allocation and release ------------------------------------------------------------------


def test_freeing_a_free_block_raises_double_free():
    twin = held_twin()
    assert_rejected(twin, DoubleFree, ValueError, lambda: twin.free_blocks([1, 3]))


def test_a_batch_releasing_a_block_more_often_than_it_is_held_is_a_double_free():
    twin = held_twin()
    assert_rejected(twin, DoubleFree, ValueError, lambda: twin.free_blocks([2, 1, 2]))
    assert twin.state.ref_cnt[1:3] == (1, 1)  # block 1, before the repeat, was not freed


def test_get_new_blocks_of_a_negative_count_raises_invalid_argument():
    twin = held_twin()
    assert_rejected(twin, InvalidArgument, ValueError, lambda: twin.get_new_blocks(-1))


def test_get_new_blocks_beyond_the_free_count_raises_no_free_blocks_with_vllms_text():
    twin = held_twin(6, 2)
    error = assert_rejected(twin, NoFreeBlocks, ValueError, lambda: twin.get_new_blocks(4))
    assert str(error) == "Cannot get 4 free blocks from the pool"


def test_touching_a_block_of_another_pool_raises_foreign_block_and_touches_nothing():
    twin, other = held_twin(), make_pool(4, backend="reference")
    for pool in (twin.spec, twin.ref):
        before = pool.abstract()
        with pytest.raises(ForeignBlock) as info:
            pool.touch([3, other.ref(1)])
        assert isinstance(info.value, ValueError)
        assert pool.abstract() == before


def test_touching_a_corrupted_free_but_unqueued_block_raises_not_queued_and_touches_nothing():
    pool = make_pool(6, backend="reference")
    pool.get_new_blocks(2)
    pool.blocks[2].ref_cnt = 0  # corrupt: "free" yet not in the queue
    before = pool.abstract()
    with pytest.raises(NotQueued) as info:
        pool.touch([3, 2])
    assert isinstance(info.value, RuntimeError)
    assert pool.abstract() == before


def test_unpinning_the_null_block_raises_null_block_misuse():
    twin = held_twin()
    assert_rejected(twin, NullBlockMisuse, ValueError, lambda: twin.unpin_blocks([1, 0]))


def test_unpinning_a_free_block_raises_double_free():
    twin = held_twin()
    assert_rejected(twin, DoubleFree, ValueError, lambda: twin.unpin_blocks([1, 4]))
    assert twin.state.watchers == ()


def test_unpinning_a_block_of_another_pool_raises_foreign_block():
    twin, other = held_twin(), make_pool(4, backend="reference")
    other.get_new_blocks(1)
    before = twin.ref.abstract()
    with pytest.raises(ForeignBlock):
        twin.ref.unpin_blocks([1, other.ref(1)], lambda b: None)
    assert twin.ref.abstract() == before


@pytest.mark.parametrize("bad_id", [-1, 6, 100])
def test_evicting_an_out_of_range_id_raises_invalid_block_id_and_evicts_nothing(bad_id):
    twin = held_twin()
    twin.cache_full_blocks(request_with_hashes(1), [1], 0, 1, 16, 0)
    assert_rejected(twin, InvalidBlockId, ValueError, lambda: twin.evict_blocks([1, bad_id]))


@pytest.mark.parametrize(
    "operation",
    [
        lambda twin: twin.touch([1, 6]),
        lambda twin: twin.free_blocks([1, -1]),
        lambda twin: twin.is_block_writable(6),
        lambda twin: twin.move_block_hashes(1, 9),
    ],
    ids=["touch", "free_blocks", "is_block_writable", "move_block_hashes"],
)
def test_every_lookup_by_id_rejects_out_of_range_ids(operation):
    twin = held_twin()
    assert_rejected(twin, InvalidBlockId, ValueError, lambda: operation(twin))


# -- the prefix cache ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "operation",
    [
        lambda twin, r: twin.get_cached_block(block_hash("r:0"), [0, 2**32]),
        lambda twin, r: twin.cache_full_blocks(r, [1], 0, 1, 16, -1),
        lambda twin, r: twin.cache_partial_block(r, 1, 16, 2**32, 16),
        lambda twin, r: twin.emit_cached_block_events(r, 1, 16, 2**40),
    ],
    ids=["get_cached_block", "cache_full_blocks", "cache_partial_block", "emit_events"],
)
def test_a_group_id_outside_32_bits_raises_invalid_group_id(operation):
    twin, request = held_twin(), request_with_hashes(2)
    assert_rejected(twin, InvalidGroupId, ValueError, lambda: operation(twin, request))


def test_get_cached_block_without_group_ids_raises_invalid_argument():
    twin = held_twin()
    assert_rejected(
        twin, InvalidArgument, ValueError, lambda: twin.get_cached_block(block_hash("r:0"), [])
    )


@pytest.mark.parametrize(
    "args",
    [
        ([1, 2], 0, 2, 16, 0, [True]),  # mask length != candidates
        ([1, 2], 0, 2, 32, 0, None),  # only 1 hash at block size 32
        ([1], 0, 2, 16, 0, None),  # num_full > len(blocks)
        ([1, 2], -1, 2, 16, 0, None),  # negative count
        ([1, 2], 0, 2, 24, 0, None),  # block size not a multiple of hbs
        ([1, 1], 0, 2, 16, 0, None),  # one block at two positions
    ],
    ids=["mask", "hashes", "num_full", "negative", "block_size", "repeat"],
)
def test_bad_cache_full_blocks_arguments_raise_invalid_argument_with_no_keys_and_no_events(args):
    twin = held_twin(enable_kv_cache_events=True)
    request = request_with_hashes(3)
    assert_rejected(
        twin, InvalidArgument, ValueError, lambda: twin.cache_full_blocks(request, *args)
    )
    assert twin.state.event_count == 0 and twin.ref.take_events() == []


def test_caching_a_block_that_already_has_its_target_key_raises_and_keys_nothing():
    twin = held_twin(6, 3)
    request = request_with_hashes(2)
    twin.cache_full_blocks(request, [1, 2], 1, 2, 16, 0)
    call = lambda: twin.cache_full_blocks(request, [3, 2], 0, 2, 16, 0)  # noqa: E731
    assert_rejected(twin, HashStateError, AssertionError, call)
    assert twin.state.primary_key[3] is None


def test_caching_a_block_whose_primary_covers_more_tokens_raises_hash_state_error():
    twin = held_twin()
    request = request_with_hashes(2)
    twin.cache_partial_block(request, 1, 32, 0, 32)
    call = lambda: twin.cache_full_blocks(request, [1], 0, 1, 16, 0)  # noqa: E731
    assert_rejected(twin, HashStateError, AssertionError, call)


@pytest.mark.parametrize(
    "operation",
    [
        lambda twin, r: twin.cache_full_blocks(r, [1, 3], 0, 2, 16, 0),
        lambda twin, r: twin.cache_partial_block(r, 3, 16, 0, 16),
        lambda twin, r: twin.move_block_hashes(1, 3),
        lambda twin, r: twin.move_block_hashes(3, 1),
    ],
    ids=["cache_full_blocks", "cache_partial_block", "move_to_free", "move_from_free"],
)
def test_cache_writes_on_a_free_block_raise_hash_state_error(operation):
    twin, request = held_twin(), request_with_hashes(2)
    assert_rejected(twin, HashStateError, AssertionError, lambda: operation(twin, request))


@pytest.mark.parametrize(
    "operation",
    [
        lambda pool, other, r: pool.cache_full_blocks(r, [1, other.ref(1)], 0, 2, 16, 0),
        lambda pool, other, r: pool.cache_partial_block(r, other.ref(1), 16, 0, 16),
        lambda pool, other, r: pool.move_block_hashes(1, other.ref(1)),
    ],
    ids=["cache_full_blocks", "cache_partial_block", "move_block_hashes"],
)
def test_cache_writes_on_a_block_of_another_pool_raise_foreign_block(operation):
    pool, other = make_pool(4, backend="reference"), make_pool(4, backend="reference")
    pool.get_new_blocks(1)
    other.get_new_blocks(1)
    before = pool.abstract()
    with pytest.raises(ForeignBlock):
        operation(pool, other, request_with_hashes(2))
    assert pool.abstract() == before


@pytest.mark.parametrize(
    "operation",
    [
        lambda twin, r: twin.cache_full_blocks(r, [1], 0, 1, 16, 0),
        lambda twin, r: twin.cache_partial_block(r, 1, 16, 0, 16),
        lambda twin, r: twin.move_block_hashes(1, 2),
    ],
    ids=["cache_full_blocks", "cache_partial_block", "move_block_hashes"],
)
def test_cache_writes_with_caching_disabled_raise_caching_disabled(operation):
    twin, request = held_twin(enable_caching=False), request_with_hashes(2)
    assert_rejected(twin, CachingDisabled, RuntimeError, lambda: operation(twin, request))


@pytest.mark.parametrize("num_tokens", [8, 0, 48], ids=["not_hbs_multiple", "zero", "beyond"])
def test_a_partial_boundary_off_the_hash_grid_or_beyond_the_hashes_raises_invalid_argument(
    num_tokens,
):
    twin, request = held_twin(), request_with_hashes(2)
    call = lambda: twin.cache_partial_block(request, 1, num_tokens, 0, 32)  # noqa: E731
    assert_rejected(twin, InvalidArgument, ValueError, call)


@pytest.mark.parametrize(
    ("src", "dst", "error"),
    [(0, 1, NullBlockMisuse), (1, 0, NullBlockMisuse), (1, 1, InvalidArgument)],
)
def test_move_block_hashes_rejects_the_null_block_and_moving_onto_itself(src, dst, error):
    twin = held_twin()
    assert_rejected(twin, error, ValueError, lambda: twin.move_block_hashes(src, dst))


def test_move_block_hashes_onto_a_keyed_block_raises_hash_state_error():
    twin = held_twin()
    twin.cache_full_blocks(request_with_hashes(2), [1, 2], 0, 2, 16, 0)
    assert_rejected(twin, HashStateError, AssertionError, lambda: twin.move_block_hashes(1, 2))


# -- check order: the first failing check wins -----------------------------------------------


def test_an_out_of_range_id_is_reported_before_a_double_free_later_in_the_batch():
    twin = held_twin()
    assert_rejected(twin, InvalidBlockId, ValueError, lambda: twin.free_blocks([4, 9]))


def test_unpin_checks_ids_before_the_null_block():
    twin = held_twin()
    assert_rejected(twin, InvalidBlockId, ValueError, lambda: twin.unpin_blocks([0, 9]))


def test_caching_disabled_is_reported_before_a_bad_group_id():
    twin = held_twin(enable_caching=False)
    call = lambda: twin.cache_full_blocks(request_with_hashes(1), [1], 0, 1, 16, -1)  # noqa: E731
    assert_rejected(twin, CachingDisabled, RuntimeError, call)


# -- watchers and construction ---------------------------------------------------------------


def test_a_raising_watcher_lets_the_allocation_complete_then_raises_watcher_error():
    pool = make_pool(4, backend="reference", check_contracts=True)
    pool.get_new_blocks(1)

    def broken(block_id: int) -> None:
        raise KeyError(block_id)

    pool.unpin_blocks([1], broken)
    with pytest.raises(WatcherError) as info:
        pool.get_new_blocks(3)  # the unpinned block went to the tail: 2, 3, 1
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value.__cause__, KeyError)
    assert info.value.result == [2, 3, 1]
    assert pool.abstract().state.ref_cnt == (0, 1, 1, 1)
    assert pool.watched_blocks() == () and pool.check_invariants() == []


@pytest.mark.parametrize("num_blocks", [0, -3, 2.5, True, "8"])
def test_num_gpu_blocks_must_be_a_positive_int(num_blocks):
    with pytest.raises(InvalidConfig) as info:
        make_pool(num_blocks, backend="reference")
    assert isinstance(info.value, ValueError)


# -- not errors (reproduced as-is) -----------------------------------------------------------


def test_reset_prefix_cache_while_blocks_are_held_returns_false_without_raising():
    twin = held_twin()
    assert twin.reset_prefix_cache() is False


def test_cache_full_blocks_with_nothing_new_is_a_silent_no_op_without_an_event():
    twin = held_twin(enable_kv_cache_events=True)
    before = twin.ref.abstract()
    twin.cache_full_blocks(request_with_hashes(1), [], 2, 2, 7, 0)  # nothing else is read
    twin.cache_full_blocks(request_with_hashes(1), [1], 3, 1, 16, 0)
    assert twin.ref.abstract() == before


def test_null_blocks_in_touch_and_free_are_skipped_not_rejected():
    twin = held_twin()
    twin.touch([0, 1])
    twin.free_blocks([1, 0, 0])
    assert twin.state.ref_cnt[:2] == (0, 1)
