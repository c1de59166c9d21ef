"""A small object-based pool with vLLM 0.33's layout and behaviour, for the adapter tests.

It takes and returns ``KVCacheBlock`` objects, keeps vLLM's attribute names (``blocks``,
``free_block_queue``, ``cached_block_hash_to_block``, ``cached_block_hashes_by_block``,
``_reuse_watchers``, ``kv_event_queue``) and, like vLLM, validates nothing: a double free
drives ``ref_cnt`` to -1, a negative id indexes from the end, a raising watcher propagates
mid-allocation. On valid calls it behaves as BEHAVIOUR.md §6 says, so the harness must find
it equal to the spec there, and different exactly where §12 says vLLM differs.

Built on kvpool.reference's block, queue and map objects; events are built with kvpool's
event code (this fake is about adapter plumbing, not about event construction). Secondary
keys are kept in insertion order (a dict), i.e. with §12's ordering fix applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvpool.events import EventContext, materialize
from kvpool.hashing import resolve_block_hashes
from kvpool.keys import pack_key
from kvpool.reference.block import KVCacheBlock
from kvpool.reference.free_queue import FreeKVCacheBlockQueue
from kvpool.reference.hash_map import BlockHashToBlockMap
from kvpool.spec.records import ClearedRecord, PartialStoredRecord, RemovedRecord, StoredRecord


class VllmLikeBlockPool:
    """vLLM-shaped ``BlockPool`` (object API, no input validation)."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True,
                 hash_block_size: int = 16, enable_kv_cache_events: bool = False) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        self.blocks = [KVCacheBlock(i, pool=self) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.cached_block_hashes_by_block: dict[int, dict[bytes, None]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.kv_event_queue: list[Any] = []
        self._reuse_watchers: dict[int, Callable[[int], None]] = {}
        self._ctx = EventContext(hash_block_size=hash_block_size)

    # -- keys --------------------------------------------------------------------------------

    def _emit(self, record: Any, request: Any = None) -> None:
        request = getattr(request, "_request", request)  # the adapter's vLLM-shaped view
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(materialize(record, request, self._ctx))

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[bytes]:
        keys = [] if block.block_hash is None else [block.block_hash]
        keys += list(self.cached_block_hashes_by_block.pop(block.block_id, {}))
        removed = [k for k in keys if self.cached_block_hash_to_block.pop(k, block.block_id)]
        block.reset_hash()
        for key in removed:
            self._emit(RemovedRecord(-1, key))
        return removed

    def _insert_block_hash(self, key: bytes, block: KVCacheBlock, num_tokens: int) -> None:
        if block.block_hash == key or self.cached_block_hash_to_block.contain(key, block.block_id):
            return
        if block.block_hash is None:
            block.set_block_hash(key, num_tokens)
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, {})[key] = None
        self.cached_block_hash_to_block.insert(key, block)

    # -- verbs -------------------------------------------------------------------------------

    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list | None:
        out = []
        for g in group_ids:
            block = self.cached_block_hash_to_block.get_one_block(pack_key(block_hash, g))
            if block is None:
                return None
            out.append(block)
        return out

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        for block in ret:
            callback = self._reuse_watchers.pop(block.block_id, None)
            if callback is not None:
                callback(block.block_id)
        for block in ret:
            if self.enable_caching:
                self._remove_cached_block_hashes(block)
            block.ref_cnt += 1
        return ret

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        front, tail, foreign = [], [], {}
        for block in ordered_blocks:
            if block.is_null:
                continue
            if block.pool is not self:
                foreign.setdefault(block.pool, []).append(block)
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                uncached = block.block_hash is None or not self.enable_caching
                (front if uncached else tail).append(block)
        self.free_block_queue.prepend_n(front)
        self.free_block_queue.append_n(tail)
        for pool, blocks in foreign.items():
            pool.free_blocks(blocks)

    def unpin_blocks(self, blocks: Iterable[KVCacheBlock], on_reuse: Callable) -> None:
        released = []
        for block in blocks:
            block.ref_cnt -= 1
            self._reuse_watchers[block.block_id] = on_reuse
            if block.ref_cnt == 0:
                released.append(block)
        self.free_block_queue.append_n(released)

    def cache_full_blocks(self, request: Any, blocks: list, num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: list | None = None) -> None:
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        positions = []
        for i, block in enumerate(blocks[num_cached_blocks:num_full_blocks]):
            if block.is_null or (block_mask is not None and not block_mask[i]):
                continue
            k = num_cached_blocks + i
            if block.block_hash is not None:
                self._remove_cached_block_hashes(block)
            key = pack_key(hashes[k], kv_cache_group_id)
            self._insert_block_hash(key, block, (k + 1) * block_size)
            positions.append(k)
        self._emit(StoredRecord(-1, kv_cache_group_id, block_size, num_cached_blocks,
                                num_full_blocks, tuple(positions),
                                tuple(hashes[k] for k in positions)), request)

    def cache_partial_block(self, request: Any, block: KVCacheBlock, num_tokens: int,
                            kv_cache_group_id: int, block_size: int,
                            replace_existing_hashes: bool = False) -> bytes | None:
        if block.is_null:
            return None
        block_hash = request.block_hashes[num_tokens // self.hash_block_size - 1]
        key = pack_key(block_hash, kv_cache_group_id)
        already = block.block_hash == key or self.cached_block_hash_to_block.contain(
            key, block.block_id)
        tokens = block.block_hash_num_tokens
        if replace_existing_hashes or (not already and tokens is not None and tokens < num_tokens):
            self._remove_cached_block_hashes(block)
            already = False
        self._insert_block_hash(key, block, num_tokens)
        if not already:
            self._emit(PartialStoredRecord(-1, kv_cache_group_id, num_tokens, block_hash), request)
        return key

    def move_block_hashes(self, src: KVCacheBlock, dst: KVCacheBlock) -> None:
        tokens = src.block_hash_num_tokens
        keys = [] if src.block_hash is None else [src.block_hash]
        keys += list(self.cached_block_hashes_by_block.pop(src.block_id, {}))
        moved = [k for k in keys if self.cached_block_hash_to_block.pop(k, src.block_id)]
        src.reset_hash()
        for key in moved:
            self._insert_block_hash(key, dst, tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        for block_id in block_ids:
            assert block_id < len(self.blocks), f"Invalid block_id {block_id}"
            self._remove_cached_block_hashes(self.blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        if self.num_gpu_blocks - self.free_block_queue.num_free_blocks != 1:
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.cached_block_hashes_by_block = {}
        watchers, self._reuse_watchers = self._reuse_watchers, {}
        for block_id, callback in watchers.items():
            callback(block_id)
        for block in self.blocks:
            block.reset_hash()
        self._emit(ClearedRecord(-1))
        return True

    def emit_cached_block_events(self, request: Any, num_cached_blocks: int, block_size: int,
                                 kv_cache_group_id: int) -> None:
        if num_cached_blocks == 0:
            return
        hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        self._emit(StoredRecord(-1, kv_cache_group_id, block_size, 0, num_cached_blocks,
                                tuple(range(num_cached_blocks)),
                                tuple(hashes[:num_cached_blocks])), request)

    def is_block_writable(self, block: KVCacheBlock) -> bool:
        return not block.is_null and block.ref_cnt == 1 and block.block_hash is None

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1
        return 0 if not total else 1.0 - (self.get_num_free_blocks() / total)

    def take_events(self) -> list:
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
