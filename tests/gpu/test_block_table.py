"""Block tables (append-only rows, row-wise upload), the jitted slot mapping, write_kv."""

import numpy as np
import pytest
import torch

from kvpool.errors import InvalidArgument, KvPoolError, UnknownRequest
from kvpool.gpu import BlockTables, InvalidSlot, write_kv


def tables(device="cpu", num_blocks=32):
    return BlockTables([4, 2], num_blocks, max_num_reqs=4, max_num_blocks_per_req=8,
                       device=device)


def test_rows_grow_at_the_end_and_may_drop_positions_to_null() -> None:
    t = tables()
    row = t.update("a", ([5, 6], [7]))
    t.update("a", ([5, 6, 9], [7, 8]))
    t.update("a", ([5, 6, 9], [0, 8, 10]))  # a window left position 0 behind
    assert t.groups[0].cpu[row, :3].tolist() == [5, 6, 9]
    assert t.groups[1].cpu[row, :3].tolist() == [0, 8, 10]
    assert t.groups[1].lengths[row] == 3
    for bad in (([5, 11, 9], [0, 8, 10]), ([5, 6], [0, 8, 10])):  # moved / shrunk
        with pytest.raises(InvalidArgument):
            t.update("a", bad)
    assert t.groups[0].cpu[row, :3].tolist() == [5, 6, 9]
    with pytest.raises(InvalidSlot):
        t.update("b", ([32], []))  # not a block of this cache
    assert "b" not in t.rows  # a refused update takes no row
    with pytest.raises(InvalidArgument):
        t.update("c", (list(range(1, 10)), []))  # wider than max_num_blocks_per_req


def test_upload_copies_only_the_rows_that_changed(device) -> None:
    t = tables(device)
    ra = t.update("a", ([1, 2], [3]))
    rb = t.update("b", ([4], [5]))
    assert t.upload() == 4  # two rows in each of two groups
    t.groups[0].on_device[rb] = -7  # a marker: an upload of row b would overwrite it
    t.update("a", ([1, 2, 6], [3]))
    t.update("b", ([4], [5]))  # unchanged: not dirty
    assert t.upload() == 1
    assert t.groups[0].on_device[ra, :3].tolist() == [1, 2, 6]
    assert bool((t.groups[0].on_device[rb] == -7).all())
    assert t.upload() == 0


def test_rows_are_reused_after_a_request_leaves() -> None:
    t = tables()
    rows = [t.update(r, ([1], [2])) for r in "abcd"]
    with pytest.raises(InvalidArgument, match="rows"):
        t.update("e", ([1], [2]))
    t.remove("b")
    assert t.update("e", ([3], [4])) == rows[1]
    assert t.groups[0].lengths[rows[1]] == 1
    with pytest.raises(UnknownRequest):
        t.row("b")


def test_slot_mapping_follows_the_table() -> None:
    t = tables()
    ra = t.update("a", ([5, 6, 9], [0, 8, 10]))
    rb = t.update("b", ([3], [4]))
    rows = np.array([ra, ra, ra, rb, ra], dtype=np.int32)
    positions = np.array([0, 5, 11, 2, -1])
    assert t.slot_mapping(0, rows, positions).tolist() == [20, 25, 39, 14, -1]
    assert t.slot_mapping(1, rows[1:4], np.array([3, 4, 1])).tolist() == [17, 20, 9]


@pytest.mark.parametrize(("group", "row", "position", "message"), [
    (0, 4, 0, "not a block table row"),
    (0, -1, 0, "not a block table row"),
    (0, 0, 12, "beyond the 3 blocks"),
    (0, 0, -2, "negative"),
    (1, 0, 1, "null block"),
    (0, 1, 4, "beyond the 1 blocks"),  # a row's length, not the array's width
])
def test_slot_mapping_refuses_what_the_tables_do_not_hold(group, row, position,
                                                          message) -> None:
    t = tables()
    t.update("a", ([5, 6, 9], [0, 8, 10]))
    t.update("b", ([3], [4]))
    with pytest.raises(InvalidSlot, match=message) as info:
        t.slot_mapping(group, np.array([0, row], dtype=np.int32), np.array([2, position]))
    assert "token 1" in str(info.value) and isinstance(info.value, KvPoolError)


def test_a_corrupted_table_entry_is_caught_not_followed() -> None:
    t = tables(num_blocks=8)
    t.update("a", ([5], [6]))
    t.groups[0].cpu[0, 0] = 1 << 20  # what a bug elsewhere could leave behind
    with pytest.raises(InvalidSlot, match="outside the cache"):
        t.slot_mapping(0, np.array([0], dtype=np.int32), np.array([1]))


def test_write_kv_fills_exactly_the_slots(device) -> None:
    layer = torch.zeros(2, 6, 4, 2, 3, device=device)
    key = torch.arange(3 * 2 * 3, dtype=torch.float32).reshape(3, 2, 3) + 1
    value = -key
    slots = torch.tensor([5, -1, 23], device=device)
    write_kv(layer, slots, key.to(device), value.to(device))
    flat = layer.view(2, 24, 2, 3).cpu()
    assert torch.equal(flat[0, 5], key[0]) and torch.equal(flat[0, 23], key[2])
    assert torch.equal(flat[1, 23], value[2])
    assert int((flat != 0).sum()) == 2 * 2 * 2 * 3  # two tokens, K and V, nothing else
    with pytest.raises(InvalidSlot):
        write_kv(layer, torch.tensor([24], device=device), key[:1].to(device),
                 value[:1].to(device))
    with pytest.raises(InvalidArgument):
        write_kv(layer, slots, key[:, :1].to(device), value[:, :1].to(device))
