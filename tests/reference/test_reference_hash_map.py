"""BlockHashToBlockMap: key → block(s), duplicates kept in insertion order (BEHAVIOUR.md §5)."""

from __future__ import annotations

import pytest

from kvpool.reference import BlockHashToBlockMap, KVCacheBlock

KEY, OTHER = b"key\x00\x00\x00\x00", b"other\x00\x00\x00\x00"


def filed(table: BlockHashToBlockMap) -> dict[bytes, list[int]]:
    return {key: [b.block_id for b in blocks] for key, blocks in table.items()}


def test_an_empty_map_misses_and_has_no_keys():
    table = BlockHashToBlockMap()
    assert table.get_one_block(KEY) is None
    assert not table.contain(KEY, 1)
    assert len(table) == 0


def test_a_single_entry_is_stored_as_the_block_itself():
    table, block = BlockHashToBlockMap(), KVCacheBlock(1)
    table.insert(KEY, block)
    assert table.get_one_block(KEY) is block
    assert table.contain(KEY, 1) and not table.contain(KEY, 2)
    assert table._cache[KEY] is block


def test_a_second_block_under_a_key_promotes_it_to_an_ordered_dict():
    table, a, b = BlockHashToBlockMap(), KVCacheBlock(4), KVCacheBlock(2)
    table.insert(KEY, a)
    table.insert(KEY, b)
    assert table._cache[KEY] == {4: a, 2: b}
    assert filed(table) == {KEY: [4, 2]}


def test_lookups_answer_with_the_earliest_inserted_duplicate_not_the_lowest_id():
    table, a, b, c = BlockHashToBlockMap(), KVCacheBlock(9), KVCacheBlock(1), KVCacheBlock(5)
    for block in (a, b, c):
        table.insert(KEY, block)
    assert table.get_one_block(KEY) is a
    table.pop(KEY, 9)
    assert table.get_one_block(KEY) is b


def test_reinserting_a_stored_block_keeps_its_place_among_duplicates():
    table, a, b = BlockHashToBlockMap(), KVCacheBlock(1), KVCacheBlock(2)
    table.insert(KEY, a)
    table.insert(KEY, b)
    table.insert(KEY, a)
    assert filed(table) == {KEY: [1, 2]}


def test_reinserting_a_single_block_keeps_it_single():
    table, a = BlockHashToBlockMap(), KVCacheBlock(1)
    table.insert(KEY, a)
    table.insert(KEY, a)
    assert table._cache[KEY] is a


def test_pop_returns_the_removed_block_and_drops_a_single_entry():
    table, a = BlockHashToBlockMap(), KVCacheBlock(1)
    table.insert(KEY, a)
    assert table.pop(KEY, 1) is a
    assert len(table) == 0 and table.get_one_block(KEY) is None


def test_pop_of_another_id_leaves_a_single_entry_untouched():
    table, a = BlockHashToBlockMap(), KVCacheBlock(1)
    table.insert(KEY, a)
    assert table.pop(KEY, 2) is None
    assert table.get_one_block(KEY) is a


def test_pop_of_an_absent_key_returns_none():
    assert BlockHashToBlockMap().pop(KEY, 1) is None


def test_an_inner_dict_of_size_one_is_not_collapsed_back_to_a_block():
    table, a, b = BlockHashToBlockMap(), KVCacheBlock(1), KVCacheBlock(2)
    table.insert(KEY, a)
    table.insert(KEY, b)
    assert table.pop(KEY, 1) is a
    assert table._cache[KEY] == {2: b}
    assert table.get_one_block(KEY) is b


def test_an_inner_dict_that_becomes_empty_is_dropped():
    table, a, b = BlockHashToBlockMap(), KVCacheBlock(1), KVCacheBlock(2)
    table.insert(KEY, a)
    table.insert(KEY, b)
    table.pop(KEY, 1)
    table.pop(KEY, 2)
    assert KEY not in table._cache and len(table) == 0


def test_pop_of_an_absent_id_leaves_an_inner_dict_untouched():
    table, a, b = BlockHashToBlockMap(), KVCacheBlock(1), KVCacheBlock(2)
    table.insert(KEY, a)
    table.insert(KEY, b)
    assert table.pop(KEY, 3) is None
    assert filed(table) == {KEY: [1, 2]}


def test_len_counts_keys_not_blocks():
    table = BlockHashToBlockMap()
    table.insert(KEY, KVCacheBlock(1))
    table.insert(KEY, KVCacheBlock(2))
    table.insert(OTHER, KVCacheBlock(1))
    assert len(table) == 2


def test_entries_list_every_pair_with_the_id_it_is_filed_under():
    table, a, b = BlockHashToBlockMap(), KVCacheBlock(1), KVCacheBlock(2)
    table.insert(KEY, a)
    table.insert(KEY, b)
    table.insert(OTHER, b)
    assert list(table.entries()) == [(KEY, 1, a), (KEY, 2, b), (OTHER, 2, b)]


def test_a_stored_value_of_another_type_is_an_internal_assertion_error():
    table = BlockHashToBlockMap()
    table._cache[KEY] = [KVCacheBlock(1)]  # type: ignore[assignment]
    with pytest.raises(AssertionError, match="Invalid KV cache block type"):
        table.get_one_block(KEY)
