"""Deliberately broken pools: copies of the reference, each with one bug in one method.

They exist to test the harness: a differential check of ``["spec", "planted:<name>"]`` must
fail, within the default budget, with a reproduction that points at the bug. ``kvpool check
--planted NAME`` demonstrates one; ``python -m kvpool.harness.detection`` reports how many
steps each one took to be found.

Each pool subclasses :class:`~kvpool.reference.pool.ReferenceBlockPool` and overrides one
method (named in the class docstring) with a mistake a real implementation can make; several
are things vLLM does (BEHAVIOUR.md §12). Every other operation is the reference's, so the
planted method is the only difference.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import ClassVar

from kvpool.errors import DoubleFree
from kvpool.keys import pack_key
from kvpool.reference.block import KVCacheBlock
from kvpool.reference.pool import ReferenceBlockPool
from kvpool.spec import preconditions as pre
from kvpool.spec.records import EventRecord


class PlantedPool(ReferenceBlockPool):
    """The base of the planted pools: the reference, and the bug planted, in words."""

    bug: ClassVar[str] = ""


PLANTED: dict[str, type[PlantedPool]] = {}


def _planted(name: str, bug: str) -> Callable[[type[PlantedPool]], type[PlantedPool]]:
    def register(cls: type[PlantedPool]) -> type[PlantedPool]:
        cls.backend_name = f"planted:{name}"
        cls.bug = bug
        PLANTED[name] = cls
        return cls

    return register


def planted_class(name: str) -> type[PlantedPool]:
    """The planted pool called ``name`` (see :data:`PLANTED`)."""
    try:
        return PLANTED[name]
    except KeyError:
        raise ValueError(f"unknown planted bug {name!r}; known: {', '.join(PLANTED)}") from None


@_planted("free_zones_swapped", "freed keyed blocks go to the front, unkeyed ones to the tail")
class FreeZonesSwapped(PlantedPool):
    """``_core_free`` with the two zones of the queue exchanged."""

    def _core_free(self, ids):
        error = pre.free_blocks_rejection(self.state_view, ids)
        if error:
            raise error
        to_front, to_tail = [], []
        for b in ids:
            block = self.blocks[b]
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                (to_tail if block.block_hash is None else to_front).append(block)
        self.free_block_queue.prepend_n(to_front)
        self.free_block_queue.append_n(to_tail)


@_planted("free_batch_reversed", "free_blocks processes the batch last block first")
class FreeBatchReversed(PlantedPool):
    """``_core_free`` walking the batch backwards (eviction priority inverted)."""

    def _core_free(self, ids):
        super()._core_free(tuple(reversed(ids)))


@_planted("reuse_keeps_old_key", "get_new_blocks does not evict a reused block's keys")
class ReuseKeepsOldKey(PlantedPool):
    """``_core_get_new_blocks`` without the lazy eviction of the popped blocks' keys."""

    def _core_get_new_blocks(self, n):
        error = pre.get_new_blocks_rejection(self.state_view, n)
        if error:
            raise error
        blocks = self.free_block_queue.popleft_n(n)
        fired = tuple(b.block_id for b in blocks if b.block_id in self.reuse_watcher_ids)
        for b in fired:
            del self.reuse_watcher_ids[b]
        for block in blocks:
            block.ref_cnt = 1
        return [b.block_id for b in blocks], (), fired


@_planted("touch_stays_queued", "touch takes a reference but leaves a free block in the queue")
class TouchStaysQueued(PlantedPool):
    """``_core_touch`` that forgets to unlink a free block from the queue."""

    def _core_touch(self, ids):
        error = pre.touch_rejection(self.state_view, ids)
        if error:
            raise error
        for b in ids:
            if not self.blocks[b].is_null:
                self.blocks[b].ref_cnt += 1


@_planted("usage_off_by_one", "get_usage divides by num_gpu_blocks, counting the null block")
class UsageOffByOne(PlantedPool):
    """``get_usage`` over all blocks instead of the usable ``N - 1``."""

    def get_usage(self) -> float:
        return 1.0 - self.get_num_free_blocks() / self.num_gpu_blocks


@_planted("duplicate_newest_first", "a key with several blocks answers its newest block")
class DuplicateNewestFirst(PlantedPool):
    """``_core_get_cached_block`` answering the newest duplicate, not the earliest."""

    def _core_get_cached_block(self, block_hash, group_ids):
        if super()._core_get_cached_block(block_hash, group_ids) is None:
            return None
        out = []
        for g in group_ids:
            entry = self.cached_block_hash_to_block._cache[pack_key(block_hash, g)]
            out.append(entry.block_id if isinstance(entry, KVCacheBlock) else list(entry)[-1])
        return out


@_planted("eviction_event_missing", "dropping a block's keys emits no BlockRemoved")
class EvictionEventMissing(PlantedPool):
    """``_maybe_evict_cached_block`` that removes the keys but records no event."""

    def _maybe_evict_cached_block(self, block: KVCacheBlock, records: list[EventRecord]) -> bool:
        return bool(self._remove_cached_block_hashes(block))


@_planted("rejected_free_half_applied", "a double free releases the blocks before it, then raises")
class RejectedFreeHalfApplied(PlantedPool):
    """``_core_free`` that, like vLLM, walks the batch and fails at the over-released block."""

    def _core_free(self, ids):
        error = pre.free_blocks_rejection(self.state_view, ids)
        if isinstance(error, DoubleFree):
            released: Counter = Counter()
            prefix = []
            for b in ids:
                if not self.blocks[b].is_null and released[b] + 1 > self.blocks[b].ref_cnt:
                    break
                released[b] += 1
                prefix.append(b)
            super()._core_free(tuple(prefix))
            raise error
        super()._core_free(ids)


@_planted("sequence_number_skips", "cache_full_blocks numbers its events one too high")
class SequenceNumberSkips(PlantedPool):
    """``_core_cache_full_blocks`` that skips a sequence number before its events."""

    def _core_cache_full_blocks(self, hashes, ids, num_cached, num_full, block_size, group_id,
                                mask):
        records = super()._core_cache_full_blocks(
            hashes, ids, num_cached, num_full, block_size, group_id, mask
        )
        if not records:
            return records
        self._event_count += 1
        return tuple(dataclasses.replace(r, seq=r.seq + 1) for r in records)


@_planted("watchers_fire_reversed", "reuse watchers fire last popped block first")
class WatchersFireReversed(PlantedPool):
    """``_core_get_new_blocks`` reporting the fired watchers in reverse pop order."""

    def _core_get_new_blocks(self, n):
        ids, records, fired = super()._core_get_new_blocks(n)
        return ids, records, tuple(reversed(fired))


@_planted("secondary_keys_reversed", "a block's secondary keys are removed newest first")
class SecondaryKeysReversed(PlantedPool):
    """``_remove_cached_block_hashes`` walking the secondary keys newest first."""

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[bytes]:
        secondary = self.cached_block_hashes_by_block.get(block.block_id)
        if secondary:
            self.cached_block_hashes_by_block[block.block_id] = dict.fromkeys(
                reversed(list(secondary))
            )
        return super()._remove_cached_block_hashes(block)


@_planted("touch_repeat_counted_once", "touch of a block listed twice takes one reference")
class TouchRepeatCountedOnce(PlantedPool):
    """``_core_touch`` that de-duplicates the batch (a set where a list was meant)."""

    def _core_touch(self, ids):
        super()._core_touch(tuple(dict.fromkeys(ids)))


@_planted("free_repeat_counted_once", "free_blocks releases a block listed twice only once")
class FreeRepeatCountedOnce(PlantedPool):
    """``_core_free`` that de-duplicates the batch after validating it."""

    def _core_free(self, ids):
        error = pre.free_blocks_rejection(self.state_view, ids)
        if error:
            raise error
        super()._core_free(tuple(dict.fromkeys(ids)))


@_planted("writable_ignores_holders", "is_block_writable asks for a holder, not the only one")
class WritableIgnoresHolders(PlantedPool):
    """``_core_is_block_writable`` testing ``ref_cnt >= 1`` instead of ``== 1``."""

    def _core_is_block_writable(self, block_id):
        error = pre.is_block_writable_rejection(self.state_view, block_id)
        if error:
            raise error
        block = self.blocks[block_id]
        return not block.is_null and block.ref_cnt >= 1 and block.block_hash is None


__all__ = ["PLANTED", "PlantedPool", "planted_class"]
