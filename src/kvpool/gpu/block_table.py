"""Block tables: the worker's copy of each request's block ids, one int32 array per group.

Each request gets a row (the same row index in every group); a row only grows at the end
(BEHAVIOUR.md §11.23), except that positions may become the null block when a sliding window
or chunk leaves them behind. The arrays are allocated once (``max_num_reqs`` rows of
``max_num_blocks_per_req``) and rows are reused after a request leaves. :meth:`upload` copies
only the rows that changed since the last upload to the device copy.

:meth:`BlockTables.slot_mapping` turns a step's tokens (row, position) into KV slots with the
jitted, bounds-checked :func:`kvpool.gpu.cpu_kernels.slot_mapping`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvpool.errors import InvalidArgument, UnknownRequest
from kvpool.gpu import cpu_kernels
from kvpool.gpu.errors import InvalidSlot

_MESSAGES = {
    cpu_kernels.BAD_ROW: "row {row} is not a block table row",
    cpu_kernels.BAD_POSITION: "position {pos} is negative (only -1, padding, is allowed)",
    cpu_kernels.BEYOND_TABLE: "position {pos} lies beyond the {n} blocks of row {row}",
    cpu_kernels.BAD_BLOCK: "row {row} holds block {block}, outside the cache",
    cpu_kernels.NULL_BLOCK: "position {pos} of row {row} is the null block (out of window)",
}


class BlockTable:
    """One group's table: ``rows × max_num_blocks_per_req`` int32, plus each row's length."""

    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int,
                 device: str | torch.device = "cpu") -> None:
        self.cpu = np.zeros((max_num_reqs, max_num_blocks_per_req), dtype=np.int32)
        self.lengths = np.zeros(max_num_reqs, dtype=np.int32)
        self.device = torch.device(device)
        self.on_device = torch.zeros((max_num_reqs, max_num_blocks_per_req), dtype=torch.int32,
                                     device=self.device)
        self.dirty: set[int] = set()

    def set_row(self, row: int, block_ids: Sequence[int]) -> None:
        """Make ``row`` hold ``block_ids``: the old entries may only stay or turn null."""
        ids = self.check_row(row, block_ids)
        n = len(ids)
        old = int(self.lengths[row])
        if n == old and not (ids != self.cpu[row, :old]).any():
            return
        self.cpu[row, :n] = ids
        self.lengths[row] = n
        self.dirty.add(row)

    def check_row(self, row: int, block_ids: Sequence[int]) -> np.ndarray:
        """Refuse an update :meth:`set_row` must not make (typed error, nothing changed)."""
        n = len(block_ids)
        if n > self.cpu.shape[1]:
            raise InvalidArgument(
                f"{n} blocks exceed max_num_blocks_per_req={self.cpu.shape[1]}")
        old = int(self.lengths[row])
        if n < old:
            raise InvalidArgument(f"row {row} would shrink from {old} to {n} blocks")
        ids = np.asarray(block_ids, dtype=np.int64)
        current = self.cpu[row, :old]
        moved = (ids[:old] != current) & (ids[:old] != 0)
        if moved.any():
            j = int(np.flatnonzero(moved)[0])
            raise InvalidArgument(
                f"row {row} position {j}: block {int(current[j])} became {int(ids[j])}; a "
                "table only grows at the end (or drops positions to the null block)")
        return ids

    def clear_row(self, row: int) -> None:
        self.lengths[row] = 0
        self.cpu[row] = 0
        self.dirty.discard(row)

    def upload(self) -> int:
        """Copy the changed rows to the device table; how many rows were copied."""
        if not self.dirty:
            return 0
        rows = np.array(sorted(self.dirty), dtype=np.int64)
        self.dirty.clear()
        values = torch.from_numpy(self.cpu[rows])
        index = torch.from_numpy(rows)
        if self.device.type == "cuda":
            values, index = values.pin_memory(), index.pin_memory()
        self.on_device.index_copy_(0, index.to(self.device, non_blocking=True),
                                   values.to(self.device, non_blocking=True))
        return len(rows)


class BlockTables:
    """One :class:`BlockTable` per group, rows assigned per request id."""

    def __init__(self, block_sizes: Sequence[int], num_blocks: int, max_num_reqs: int,
                 max_num_blocks_per_req: int, device: str | torch.device = "cpu") -> None:
        self.block_sizes = tuple(block_sizes)
        self.num_blocks = num_blocks
        self.groups = [BlockTable(max_num_reqs, max_num_blocks_per_req, device)
                       for _ in self.block_sizes]
        self.rows: dict[str, int] = {}
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))

    def row(self, request_id: str) -> int:
        try:
            return self.rows[request_id]
        except KeyError:
            raise UnknownRequest(f"request {request_id!r} has no block table row") from None

    def update(self, request_id: str, block_ids: Sequence[Sequence[int]]) -> int:
        """Sync the request's rows with the manager's ``get_block_ids`` (a row for a new
        request); its row index."""
        if len(block_ids) != len(self.groups):
            raise InvalidArgument(f"{len(block_ids)} groups of ids for {len(self.groups)} "
                                  "tables")
        for ids in block_ids:
            for b in ids:
                if not 0 <= int(b) < self.num_blocks:
                    raise InvalidSlot(f"block {b} of request {request_id!r} is outside the "
                                      f"cache's {self.num_blocks} blocks")
        row = self.rows.get(request_id)
        if row is None:
            if not self._free_rows:
                raise InvalidArgument(f"all {len(self.groups[0].lengths)} rows are in use")
            row = self._free_rows[-1]
        for table, ids in zip(self.groups, block_ids, strict=True):
            table.check_row(row, ids)
        if request_id not in self.rows:
            self.rows[request_id] = self._free_rows.pop()
        for table, ids in zip(self.groups, block_ids, strict=True):
            table.set_row(row, ids)
        return row

    def remove(self, request_id: str) -> None:
        row = self.rows.pop(request_id, None)
        if row is None:
            return
        for table in self.groups:
            table.clear_row(row)
        self._free_rows.append(row)

    def upload(self) -> int:
        return sum(t.upload() for t in self.groups)

    def slot_mapping(self, group_id: int, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """KV slot of each token (``-1`` for padding), via the jitted kernel; a bad row,
        position or block raises :class:`InvalidSlot` naming the token."""
        table = self.groups[group_id]
        rows = np.ascontiguousarray(rows, dtype=np.int32)
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        if rows.shape != positions.shape or rows.ndim != 1:
            raise InvalidArgument("rows and positions must be 1-D arrays of one length")
        out = np.empty(len(rows), dtype=np.int64)
        error = np.zeros(1, dtype=np.int64)
        bad = cpu_kernels.slot_mapping(table.cpu, table.lengths, rows, positions,
                                       self.block_sizes[group_id], self.num_blocks, out, error)
        if bad != cpu_kernels.OK:
            row, pos = int(rows[bad]), int(positions[bad])
            inside = 0 <= row < len(table.lengths)
            n = int(table.lengths[row]) if inside else 0
            block = int(table.cpu[row, pos // self.block_sizes[group_id]]) \
                if inside and 0 <= pos and pos // self.block_sizes[group_id] < n else None
            raise InvalidSlot(f"token {bad}: " + _MESSAGES[int(error[0])].format(
                row=row, pos=pos, n=n, block=block))
        return out


def write_kv(layer: torch.Tensor, slots: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor) -> None:
    """Write ``key``/``value`` (``[tokens, num_kv_heads, head_dim]``) into their slots of one
    layer's ``[2, num_blocks, block_size, heads, dim]`` tensor; slot ``-1`` is skipped."""
    _, num_blocks, block_size, heads, dim = layer.shape
    if key.shape != value.shape or key.shape[1:] != (heads, dim) or \
            slots.shape != key.shape[:1]:
        raise InvalidArgument(f"key/value {tuple(key.shape)}/{tuple(value.shape)} and slots "
                              f"{tuple(slots.shape)} do not match [tokens, {heads}, {dim}]")
    keep = slots >= 0
    slots = slots[keep]
    if slots.numel() and int(slots.max()) >= num_blocks * block_size:
        raise InvalidSlot(f"slot {int(slots.max())} is outside the {num_blocks * block_size} "
                          "slots of the layer")
    flat = layer.view(2, num_blocks * block_size, heads, dim)
    flat[0].index_copy_(0, slots, key[keep].to(layer.dtype))
    flat[1].index_copy_(0, slots, value[keep].to(layer.dtype))


__all__ = ["BlockTable", "BlockTables", "write_kv"]
