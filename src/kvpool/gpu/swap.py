"""Swap: blocks between the device cache and a (pinned) host mirror, for offload.

Offloading a preempted request copies its blocks out and gives them back to the pool with
``unpin_blocks`` rather than ``free_blocks`` (BEHAVIOUR.md §6.4): they go to the free
queue's tail, stay readable while the copy-out is in flight, and a *reuse watcher* fires if
the pool hands one out again first. The watcher then either **finishes** the copy-out before
the new owner can write (``on_reuse="finish"``: on the CPU the pending copy runs at once; on
CUDA the compute stream waits for the copy's event) or **invalidates** that block's host copy
(``on_reuse="invalidate"``), so a reload stops before it and those tokens are recomputed.

One watcher (:meth:`Offloader._reused`) serves every block: a pool keeps one watcher per
block, and two offloads may unpin the same shared block, so the offloader itself remembers
which transfers hold which block.

A swap-out is *in flight* from :meth:`Offloader.swap_out` until :meth:`Offloader.flush`
(or a watcher) completes it: on CUDA it runs on a side stream; on the CPU it is deferred —
which is what lets tests exercise the in-flight window deterministically. Each transfer and
each reload is one launch over all layers and blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kvpool.errors import InvalidArgument, UnknownRequest
from kvpool.gpu import copy_plan
from kvpool.gpu.copier import launch_segments
from kvpool.gpu.kv_cache import PagedKVCache

NO_COPY = -1


class SwapOut:
    """One request's blocks on their way to the host (or there).

    ``host_ids[g][j]`` is the host block holding table position ``j`` of group ``g``
    (``NO_COPY`` for a null position). ``valid_blocks(g)`` counts the leading positions
    whose host copy is good; nulls count (they hold nothing the request needs).
    """

    def __init__(self, tables: Sequence[Sequence[int]], host_ids: list[list[int]],
                 pairs: np.ndarray, segments: np.ndarray) -> None:
        self.tables = [list(t) for t in tables]
        self.host_ids = host_ids
        self.pairs = pairs
        self.segments = segments  # the planned copy-out (device words -> host words)
        self.done = False
        self.released = False
        self.invalid: set[int] = set()  # device block ids whose host copy is not good
        self.event: Any = None

    def blocks(self) -> set[int]:
        return {int(b) for b in self.pairs[:, 0].tolist()}

    def covers(self, group_id: int, first: int, last: int) -> bool:
        """Whether positions ``[first, last)`` of the group all have a good host copy."""
        hosts, table = self.host_ids[group_id], self.tables[group_id]
        return last <= len(hosts) and all(
            hosts[j] != NO_COPY and table[j] not in self.invalid for j in range(first, last))

    def valid_blocks(self, group_id: int) -> int:
        n = 0
        for block, host in zip(self.tables[group_id], self.host_ids[group_id], strict=True):
            if host != NO_COPY and block in self.invalid:
                break
            n += 1
        return n


class Offloader:
    """Moves blocks between ``device`` and ``host`` caches of the same groups."""

    def __init__(self, device: PagedKVCache, host: PagedKVCache, *,
                 on_reuse: str = "finish",
                 ref_cnts: copy_plan.RefCounts | None = None) -> None:
        if on_reuse not in ("finish", "invalidate"):
            raise InvalidArgument(f"on_reuse must be 'finish' or 'invalidate', got {on_reuse!r}")
        shapes = [[(g.block_numel, len(g.layers)) for g in c.layout.groups] for c in (device, host)]
        if shapes[0] != shapes[1] or device.dtype != host.dtype:
            raise InvalidArgument("the host cache must have the device cache's groups, layers, "
                                  "block shapes and dtype")
        self.device, self.host = device, host
        self.policy = on_reuse
        self.ref_cnts = ref_cnts
        # A swap's two sides are separate id spaces; the host side has no null block.
        self._out = copy_plan.CopyPlanner(device, host, same_space=False, null_dst=False)
        self._in = copy_plan.CopyPlanner(host, device, same_space=False)
        self._free_host = list(range(host.num_blocks - 1, -1, -1))
        self._in_flight: dict[int, list[SwapOut]] = {}  # device block -> transfers reading it
        self._pending: list[SwapOut] = []
        self.reused_in_flight = 0  # watcher calls that met a transfer still in flight
        self._stream = torch.cuda.Stream(device.device) if device.device.type == "cuda" \
            else None

    @property
    def free_host_blocks(self) -> int:
        return len(self._free_host)

    # -- out ------------------------------------------------------------------------------

    def swap_out(self, tables: Sequence[Sequence[int]]) -> SwapOut:
        """Start copying every non-null block of ``tables`` (per group, in table order) to
        fresh host blocks. Checked first (ids, host room); then one launch (CUDA) or deferred
        to :meth:`flush` (CPU)."""
        if len(tables) != self.device.num_groups:
            raise InvalidArgument(f"{len(tables)} tables for {self.device.num_groups} groups")
        wanted = sum(1 for t in tables for b in t if int(b) != 0)
        if wanted > len(self._free_host):
            raise InvalidArgument(f"offloading {wanted} blocks needs host room; "
                                  f"{len(self._free_host)} host blocks are free")
        # Host blocks are taken from the free list's end (checked first, popped after).
        take = iter(reversed(self._free_host[len(self._free_host) - wanted:]))
        host_ids = [[NO_COPY if int(b) == 0 else next(take) for b in t] for t in tables]
        rows = [(int(b), h, g) for g, (t, hs) in enumerate(zip(tables, host_ids, strict=True))
                for b, h in zip(t, hs, strict=True) if h != NO_COPY]
        plan = self._out.plan(rows)
        del self._free_host[len(self._free_host) - wanted:]
        transfer = SwapOut(tables, host_ids, plan.pairs, plan.segments)
        for b in transfer.blocks():
            self._in_flight.setdefault(b, []).append(transfer)
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self.device.device))
            with torch.cuda.stream(self._stream):
                launch_segments(self.device, self.host, plan.segments)
                transfer.event = torch.cuda.Event()
                transfer.event.record(self._stream)
        self._pending.append(transfer)
        return transfer

    def _complete(self, transfer: SwapOut, host_wait: bool = False) -> None:
        if transfer.done:
            if host_wait and transfer.event is not None:
                transfer.event.synchronize()
            return
        if transfer.event is None:
            launch_segments(self.device, self.host, transfer.segments)
        elif host_wait:  # the host will read the copy
            transfer.event.synchronize()
        else:  # the compute stream (which will write reused blocks) waits for the copy
            torch.cuda.current_stream(self.device.device).wait_event(transfer.event)
        transfer.done = True
        for b in transfer.blocks():
            holders = self._in_flight.get(b, [])
            if transfer in holders:
                holders.remove(transfer)
            if not holders:
                self._in_flight.pop(b, None)
        self._pending.remove(transfer)

    def flush(self) -> int:
        """Complete every swap-out in flight (the host copies are readable afterwards);
        how many there were."""
        pending = list(self._pending)
        for transfer in pending:
            self._complete(transfer, host_wait=True)
        if self._stream is not None:  # also those a watcher completed on the device only
            self._stream.synchronize()
        return len(pending)

    def can_hold(self, tables: Sequence[Sequence[int]]) -> bool:
        """Whether the host has room for the non-null blocks of ``tables``."""
        return sum(1 for t in tables for b in t if int(b) != 0) <= len(self._free_host)

    def on_reuse(self, block_id: int) -> None:
        """The watcher to register with ``unpin_blocks``: a block of a transfer in flight
        is being handed out again."""
        for transfer in list(self._in_flight.get(int(block_id), [])):
            self.reused_in_flight += 1
            if self.policy == "finish":
                self._complete(transfer)
            else:
                transfer.invalid.add(int(block_id))

    def offload(self, manager: Any, request: Any) -> SwapOut:
        """Offload a request the manager holds: swap its blocks out, forget the request
        (``pop_blocks_for_free``) and unpin its blocks with :meth:`on_reuse` as watcher."""
        if not manager.is_running(request.request_id):
            raise UnknownRequest(f"request {request.request_id!r} holds no blocks to offload")
        tables = manager.get_block_ids(request.request_id)
        transfer = self.swap_out(tables)  # checked: nothing moved or held if it raises
        blocks = manager.pop_blocks_for_free(request)
        manager.block_pool.unpin_blocks([b for b in reversed(blocks) if b != 0],
                                        self.on_reuse)
        return transfer

    # -- in -------------------------------------------------------------------------------

    def swap_in(self, transfer: SwapOut, tables: Sequence[Sequence[int]],
                positions: Sequence[range]) -> int:
        """Copy the host copies of ``positions[g]`` into the blocks ``tables[g]`` now holds
        there (one launch); how many blocks moved. Positions must be valid host copies."""
        if transfer.released:
            raise InvalidArgument("this transfer was released; its host blocks are reused")
        self._complete(transfer)
        rows = []
        for g, (table, span) in enumerate(zip(tables, positions, strict=True)):
            for j in span:
                if j >= len(table) or not transfer.covers(g, j, j + 1):
                    raise InvalidArgument(f"group {g} position {j}: no valid host copy")
                rows.append((transfer.host_ids[g][j], int(table[j]), g))
        plan = self._in.plan(rows, ref_cnts=self.ref_cnts)
        launch_segments(self.host, self.device, plan.segments)
        return len(plan.pairs)

    def release(self, transfer: SwapOut) -> None:
        """Give the transfer's host blocks back (after its reload, or to drop it)."""
        if transfer.released:
            return
        if not transfer.done:
            self._complete(transfer)
        transfer.released = True
        for ids in transfer.host_ids:
            self._free_host.extend(h for h in ids if h != NO_COPY)


__all__ = ["NO_COPY", "Offloader", "SwapOut"]
