"""KVCacheBlock: one block's metadata (BEHAVIOUR.md §3)."""

from __future__ import annotations

import pytest

from kvpool.errors import HashStateError, KvPoolError
from kvpool.reference import KVCacheBlock


def test_a_new_block_is_free_unkeyed_unlinked_and_not_null():
    block = KVCacheBlock(5)
    assert (block.block_id, block.ref_cnt, block.block_hash) == (5, 0, None)
    assert block.block_hash_num_tokens is None
    assert block.prev_free_block is None and block.next_free_block is None
    assert not block.is_null


def test_set_block_hash_stores_the_key_with_its_token_count():
    block = KVCacheBlock(1)
    block.set_block_hash(b"key", 32)
    assert (block.block_hash, block.block_hash_num_tokens) == (b"key", 32)


def test_setting_a_second_hash_raises_hash_state_error_with_vllms_text():
    block = KVCacheBlock(1)
    block.set_block_hash(b"first", 16)
    with pytest.raises(
        HashStateError, match="The block already has a hash. This should not happen."
    ):
        block.set_block_hash(b"second", 32)
    assert (block.block_hash, block.block_hash_num_tokens) == (b"first", 16)


def test_hash_state_error_is_also_the_assertion_error_vllm_raises():
    block = KVCacheBlock(1)
    block.set_block_hash(b"first", 16)
    with pytest.raises(AssertionError) as info:
        block.set_block_hash(b"first", 16)
    assert isinstance(info.value, KvPoolError)


def test_reset_hash_clears_key_and_token_count_together():
    block = KVCacheBlock(1)
    block.set_block_hash(b"key", 16)
    block.reset_hash()
    assert (block.block_hash, block.block_hash_num_tokens) == (None, None)
    block.set_block_hash(b"other", 48)  # a reset block can be keyed again
    assert block.block_hash == b"other"


def test_blocks_compare_by_identity_not_by_fields():
    a, b = KVCacheBlock(3), KVCacheBlock(3)
    assert a != b
    assert a == a
    assert len({a, b}) == 2


def test_the_owning_pool_is_recorded_but_not_part_of_equality_or_repr():
    owner = object()
    block = KVCacheBlock(2, pool=owner)
    assert block.pool is owner
    assert "pool" not in repr(block)


def test_repr_names_neighbours_by_id_instead_of_printing_them():
    a, b, c = KVCacheBlock(1), KVCacheBlock(2), KVCacheBlock(3)
    a.next_free_block, b.prev_free_block, b.next_free_block, c.prev_free_block = b, a, c, b
    text = repr(b)
    assert "prev_free_block=1" in text and "next_free_block=3" in text
    assert text.count("KVCacheBlock(") == 1
