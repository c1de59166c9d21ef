"""``ReferenceBlockPool``: the block pool as objects, readable and shaped like vLLM's ``BlockPool``.

Every operation does exactly what :mod:`kvpool.spec.ops` does, rejects exactly the inputs
:mod:`kvpool.spec.preconditions` rejects (it runs those very checks, reading the object graph
through :class:`~kvpool.reference.preconditions.StateView`) and numbers its event records the
same way. Where the spec rebuilds tuples, this pool moves pointers in an object graph, and the
names are vLLM's so that the two can be read side by side:

* ``blocks`` — one :class:`KVCacheBlock` per id; block 0 is the null block;
* ``free_block_queue`` — the free blocks, front first (:class:`FreeKVCacheBlockQueue`);
* ``cached_block_hash_to_block`` — key → block(s) (:class:`BlockHashToBlockMap`);
* ``cached_block_hashes_by_block`` — block id → its *secondary* keys, in insertion order;
* ``reuse_watcher_ids`` — blocks with a pending reuse watcher, in table order (the callbacks
  themselves live in :class:`~kvpool.shell.PoolShell`).

Each operation validates its whole input before changing anything, so a raised error leaves
the pool as it was (BEHAVIOUR.md §12). ``check_contracts=True`` runs the spec in lockstep and
compares after every call (:mod:`kvpool.reference.contracts`); it costs nothing when off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvpool.errors import KvPoolError
from kvpool.keys import pack_key
from kvpool.reference.block import KVCacheBlock
from kvpool.reference.free_queue import FreeKVCacheBlockQueue
from kvpool.reference.hash_map import BlockHashToBlockMap
from kvpool.reference.observer import ReferenceObserver
from kvpool.reference.preconditions import StateView, unqueued_free_block
from kvpool.shell import PoolConfig, PoolShell
from kvpool.spec import preconditions as pre
from kvpool.spec.records import (
    ClearedRecord,
    EventRecord,
    PartialStoredRecord,
    RemovedRecord,
    StoredRecord,
)
from kvpool.spec.state import PoolState

if TYPE_CHECKING:
    from kvpool.reference.contracts import ContractChecker


def _raise_if(error: KvPoolError | None) -> None:
    if error is not None:
        raise error


class ReferenceBlockPool(PoolShell):
    """The reference backend: vLLM's ``BlockPool`` data structures behind the id-based API.

    Takes the :class:`~kvpool.shell.PoolShell` settings plus ``check_contracts`` (default
    ``False``): when true, every core call is replayed on a shadow spec state and any
    difference in state, result, records or error type raises ``AssertionError``.
    """

    backend_name = "reference"
    bytes_per_block = 160  # a KVCacheBlock with its links (136 bytes measured), rounded up
    contract_checker: ContractChecker | None = None
    """The lockstep spec checker, when built with ``check_contracts=True``."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int = 16,
        enable_kv_cache_events: bool = False,
        metrics_collector: Any = None,
        num_hash_lookahead_tokens: int = 0,
        medium: str = "GPU",
        *,
        use_int_block_hashes: bool = True,
        check_contracts: bool = False,
    ) -> None:
        super().__init__(
            num_gpu_blocks,
            enable_caching,
            hash_block_size,
            enable_kv_cache_events,
            metrics_collector,
            num_hash_lookahead_tokens,
            medium,
            use_int_block_hashes=use_int_block_hashes,
        )
        if check_contracts:
            from kvpool.reference.contracts import install_contract_checks

            install_contract_checks(self)

    def _core_init(self, config: PoolConfig) -> None:
        n = config.num_gpu_blocks
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i, pool=self) for i in range(n)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        # A dict used as an ordered set: removal order of secondary keys is observable (in
        # events and move_block_hashes), and a set's order differs between processes.
        self.cached_block_hashes_by_block: dict[int, dict[bytes, None]] = {}
        self.reuse_watcher_ids: dict[int, None] = {}
        self._event_count = 0
        # Block 0 never enters the free queue again; it only fills skipped table positions.
        self._null_block = self.free_block_queue.popleft()
        self._null_block.is_null = True
        # The spec's preconditions, reading this object graph (one source of truth, §12).
        self.state_view = StateView(self)

    def observe(self) -> ReferenceObserver:
        """Per-block facts off the block objects (:class:`kvpool.protocol.BlockObserver`)."""
        return ReferenceObserver(self)

    # -- keys and events (vLLM's private helpers) ---------------------------------------------

    def _next_seq(self) -> int:
        """Take the pool's next event sequence number (records exist only with events on)."""
        seq = self._event_count
        self._event_count += 1
        return seq

    def _insert_block_hash(self, key: bytes, block: KVCacheBlock, num_tokens: int) -> None:
        """Give ``block`` one more key (spec: ``hash_map.insert_key_on_block``). O(1).

        The key becomes the primary (with ``num_tokens``) if the block has none, else a
        secondary. No-op if the block carries the key already.
        """
        if block.block_hash == key or self.cached_block_hash_to_block.contain(key, block.block_id):
            return
        if block.block_hash is None:
            block.set_block_hash(key, num_tokens)
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, {})[key] = None
        self.cached_block_hash_to_block.insert(key, block)

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[bytes]:
        """Strip every key from ``block``; return those that were in the map, primary first.

        Spec: ``hash_map.remove_all_keys``. Secondaries go in insertion order (vLLM: set order).
        """
        primary = block.block_hash
        if primary is None:
            return []
        candidates = [primary, *self.cached_block_hashes_by_block.pop(block.block_id, ())]
        removed = [
            key
            for key in candidates
            if self.cached_block_hash_to_block.pop(key, block.block_id) is not None
        ]
        block.reset_hash()
        return removed

    def _maybe_evict_cached_block(self, block: KVCacheBlock, records: list[EventRecord]) -> bool:
        """Drop ``block``'s cache identity, one ``BlockRemoved`` per key; whether it had one."""
        removed = self._remove_cached_block_hashes(block)
        if self.enable_kv_cache_events:
            records.extend(RemovedRecord(seq=self._next_seq(), key=key) for key in removed)
        return bool(removed)

    # -- allocation and release ---------------------------------------------------------------

    def _core_get_new_blocks(
        self, n: int
    ) -> tuple[list[int], tuple[EventRecord, ...], tuple[int, ...]]:
        """Spec: ``ops.get_new_blocks``. Pop ``n`` blocks off the front, evicting keys. O(n)."""
        _raise_if(pre.get_new_blocks_rejection(self.state_view, n))
        blocks = self.free_block_queue.popleft_n(n)
        fired: tuple[int, ...] = ()
        if self.reuse_watcher_ids:
            # Each watcher is popped here and called by the shell, in pop order, afterwards.
            fired = tuple(b.block_id for b in blocks if b.block_id in self.reuse_watcher_ids)
            for b in fired:
                del self.reuse_watcher_ids[b]
        records: list[EventRecord] = []
        for block in blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block, records)
            block.ref_cnt = 1
        return [b.block_id for b in blocks], tuple(records), fired

    def _core_touch(self, ids: tuple[int, ...]) -> None:
        """Spec: ``ops.touch``. One more reference per block; free ones leave the queue. O(len)."""
        _raise_if(pre.touch_rejection(self.state_view, ids) or unqueued_free_block(self, ids))
        for b in ids:
            block = self.blocks[b]
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def _core_check_free(self, ids: tuple[int, ...]) -> KvPoolError | None:
        """Spec: ``preconditions.free_blocks_rejection`` (multi-pool frees check every pool)."""
        return pre.free_blocks_rejection(self.state_view, ids)

    def _core_free(self, ids: tuple[int, ...]) -> None:
        """Spec: ``ops.free_blocks``. Drop one reference per block; zeros rejoin the queue. O(len).

        Uncached blocks (or any, with caching off) go to the front: nothing can hit them, so
        reuse them first while their memory is warm. Keyed blocks go to the tail, in batch
        order, which is eviction priority: the hashed zone stays an LRU list.
        """
        _raise_if(pre.free_blocks_rejection(self.state_view, ids))
        to_front: list[KVCacheBlock] = []
        to_tail: list[KVCacheBlock] = []
        for b in ids:
            block = self.blocks[b]
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    to_front.append(block)
                else:
                    to_tail.append(block)
        self.free_block_queue.prepend_n(to_front)
        self.free_block_queue.append_n(to_tail)

    def _core_unpin(self, ids: tuple[int, ...]) -> None:
        """Spec: ``ops.unpin_blocks``. Release, register watchers, zeros to the tail. O(len)."""
        _raise_if(pre.unpin_blocks_rejection(self.state_view, ids))
        released: list[KVCacheBlock] = []
        for b in ids:
            block = self.blocks[b]
            block.ref_cnt -= 1
            # setdefault: a block that already has a watcher keeps its place in the table.
            self.reuse_watcher_ids.setdefault(b, None)
            if block.ref_cnt == 0:
                released.append(block)
        self.free_block_queue.append_n(released)

    # -- the prefix cache ---------------------------------------------------------------------

    def _core_get_cached_block(
        self, block_hash: bytes, group_ids: tuple[int, ...]
    ) -> list[int] | None:
        """Spec: ``ops.get_cached_block``. One block per group, all or nothing. Pure, O(groups)."""
        _raise_if(pre.get_cached_block_rejection(self.state_view, block_hash, group_ids))
        cached_blocks: list[int] = []
        for g in group_ids:
            block = self.cached_block_hash_to_block.get_one_block(pack_key(block_hash, g))
            if block is None:
                return None
            cached_blocks.append(block.block_id)
        return cached_blocks

    def _core_cache_full_blocks(
        self,
        hashes: Sequence[bytes],
        ids: tuple[int, ...],
        num_cached: int,
        num_full: int,
        block_size: int,
        group_id: int,
        mask: tuple[bool, ...] | None,
    ) -> tuple[EventRecord, ...]:
        """Spec: ``ops.cache_full_blocks``. Key positions ``[num_cached, num_full)``. O(positions).

        A block keyed already (partial entry) is promoted: its old keys go first.
        """
        _raise_if(
            pre.cache_full_blocks_rejection(
                self.state_view, hashes, ids, num_cached, num_full, block_size, group_id, mask
            )
        )
        if num_cached >= num_full:
            return ()
        # Position k's hash at block_size granularity is the last fine hash inside it.
        ratio = block_size // self.hash_block_size
        records: list[EventRecord] = []
        positions: list[int] = []
        for i, b in enumerate(ids[num_cached:num_full]):
            block = self.blocks[b]
            if block.is_null or (mask is not None and not mask[i]):
                continue
            k = num_cached + i
            if block.block_hash is not None:
                self._maybe_evict_cached_block(block, records)
            key = pack_key(hashes[(k + 1) * ratio - 1], group_id)
            self._insert_block_hash(key, block, (k + 1) * block_size)
            positions.append(k)
        if self.enable_kv_cache_events:
            # One record for the call, even when every candidate was skipped.
            stored = StoredRecord(
                seq=self._next_seq(),
                group_id=group_id,
                block_size=block_size,
                num_cached=num_cached,
                num_full=num_full,
                positions=tuple(positions),
                hashes=tuple(hashes[(k + 1) * ratio - 1] for k in positions),
            )
            records.append(stored)
        return tuple(records)

    def _core_cache_partial_block(
        self,
        hashes: Sequence[bytes],
        block_id: int,
        num_tokens: int,
        group_id: int,
        block_size: int,
        replace_existing: bool,
    ) -> tuple[bytes | None, tuple[EventRecord, ...]]:
        """Spec: ``ops.cache_partial_block``. A prefix entry ending inside the block. O(keys)."""
        _raise_if(
            pre.cache_partial_block_rejection(
                self.state_view, hashes, block_id, num_tokens, group_id, block_size
            )
        )
        block = self.blocks[block_id]
        if block.is_null:
            return None, ()
        block_hash = hashes[num_tokens // self.hash_block_size - 1]
        key = pack_key(block_hash, group_id)
        already = block.block_hash == key or self.cached_block_hash_to_block.contain(key, block_id)
        records: list[EventRecord] = []
        tokens = block.block_hash_num_tokens
        # The entry "grows": a shorter primary is dropped so the new key becomes the primary.
        if replace_existing or (not already and tokens is not None and tokens < num_tokens):
            self._maybe_evict_cached_block(block, records)
            already = False
        self._insert_block_hash(key, block, num_tokens)
        if not already and self.enable_kv_cache_events:
            partial = PartialStoredRecord(
                seq=self._next_seq(),
                group_id=group_id,
                num_tokens=num_tokens,
                block_hash=block_hash,
            )
            records.append(partial)
        return key, tuple(records)

    def _core_move_block_hashes(self, src: int, dst: int) -> None:
        """Spec: ``ops.move_block_hashes``. ``dst`` takes over every key of ``src``; no events."""
        _raise_if(pre.move_block_hashes_rejection(self.state_view, src, dst))
        src_block, dst_block = self.blocks[src], self.blocks[dst]
        tokens = src_block.block_hash_num_tokens
        for key in self._remove_cached_block_hashes(src_block):
            # Only the first key becomes dst's primary, so only it uses the token count.
            self._insert_block_hash(key, dst_block, tokens)  # type: ignore[arg-type]

    def _core_evict_blocks(self, ids: tuple[int, ...]) -> tuple[EventRecord, ...]:
        """Spec: ``ops.evict_blocks``. Drop each block's keys; ref and queue kept. O(len)."""
        _raise_if(pre.evict_blocks_rejection(self.state_view, ids))
        records: list[EventRecord] = []
        for b in ids:
            self._maybe_evict_cached_block(self.blocks[b], records)
        return tuple(records)

    def _core_reset_prefix_cache(self) -> tuple[bool, tuple[EventRecord, ...], tuple[int, ...]]:
        """Spec: ``ops.reset_prefix_cache``. Forget all keys if only the null block is held.

        O(N). Watchers fire in table order; queue order and pending events are kept.
        """
        num_used_blocks = len(self.blocks) - self.free_block_queue.num_free_blocks
        if num_used_blocks != 1:
            return False, (), ()
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.cached_block_hashes_by_block = {}
        fired = tuple(self.reuse_watcher_ids)
        self.reuse_watcher_ids = {}
        for block in self.blocks:
            block.reset_hash()
        records: tuple[EventRecord, ...] = ()
        if self.enable_kv_cache_events:
            records = (ClearedRecord(seq=self._next_seq()),)
        return True, records, fired

    def _core_emit_cached_block_events(
        self, hashes: Sequence[bytes], num_cached: int, block_size: int, group_id: int
    ) -> tuple[EventRecord, ...]:
        """Spec: ``ops.emit_cached_block_events``. Report positions ``0…n-1`` as stored. O(n)."""
        _raise_if(
            pre.emit_cached_block_events_rejection(
                self.state_view, hashes, num_cached, block_size, group_id
            )
        )
        if num_cached == 0 or not self.enable_kv_cache_events:
            return ()
        ratio = block_size // self.hash_block_size
        stored = StoredRecord(
            seq=self._next_seq(),
            group_id=group_id,
            block_size=block_size,
            num_cached=0,
            num_full=num_cached,
            positions=tuple(range(num_cached)),
            hashes=tuple(hashes[(k + 1) * ratio - 1] for k in range(num_cached)),
        )
        return (stored,)

    # -- queries --------------------------------------------------------------------------

    def _core_is_block_writable(self, block_id: int) -> bool:
        """Spec: ``ops.is_block_writable``. Not null, one holder, no key. O(1)."""
        _raise_if(pre.is_block_writable_rejection(self.state_view, block_id))
        block = self.blocks[block_id]
        return not block.is_null and block.ref_cnt == 1 and block.block_hash is None

    def _core_num_free_blocks(self) -> int:
        """Spec: ``ops.get_num_free_blocks``. The queue's counter. O(1)."""
        return self.free_block_queue.num_free_blocks

    def _core_state(self) -> PoolState:
        """The object graph as the spec's state value. O(N + keys)."""
        queue = tuple(b.block_id for b in self.free_block_queue.get_all_free_blocks())
        return self.state_with_queue(queue)

    def state_with_queue(self, free_queue: tuple[int, ...]) -> PoolState:
        """The spec state of this pool with ``free_queue`` as the queue order (for checks that
        walk the links themselves, bounded, in case they are corrupted). O(N + keys)."""
        blocks = self.blocks
        return PoolState(
            num_blocks=len(blocks),
            enable_caching=self.enable_caching,
            hash_block_size=self.hash_block_size,
            enable_events=self.enable_kv_cache_events,
            # vLLM does not maintain the null block's count; the spec reports it as 0.
            ref_cnt=tuple(0 if b.is_null else b.ref_cnt for b in blocks),
            free_queue=free_queue,
            primary_key=tuple(b.block_hash for b in blocks),
            primary_tokens=tuple(b.block_hash_num_tokens for b in blocks),
            secondary_keys={
                b: tuple(keys) for b, keys in self.cached_block_hashes_by_block.items() if keys
            },
            cache={
                key: tuple(block.block_id for block in cached)
                for key, cached in self.cached_block_hash_to_block.items()
            },
            watchers=tuple(self.reuse_watcher_ids),
            event_count=self._event_count,
        )

    def check_invariants(self) -> list[tuple[str, tuple]]:
        """``[(invariant name, witnesses)]`` for every broken invariant; ``[]`` when sound.

        The spec's predicates run on the converted state, followed by the checks only an
        object graph needs (queue links, ids in place, null flag). See
        :mod:`kvpool.reference.invariants`. O(N + keys).
        """
        from kvpool.reference.invariants import check_invariants

        return check_invariants(self)
