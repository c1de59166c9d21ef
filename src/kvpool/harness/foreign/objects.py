"""``ObjectPoolAdapter``: an object-based pool presented through kvpool's id-based protocol.

vLLM-shaped pools take and return *block objects* (``KVCacheBlock``); kvpool's protocol and
the harness speak *block ids*. An adapter translates at the boundary and nothing more: it
adds no validation, so the harness sees the wrapped pool's own behaviour, including its
failures (an ``AssertionError`` where kvpool raises ``DoubleFree``, say).

To plug in a pool, subclass and implement :meth:`snapshot` (read the pool's internals into a
spec :class:`~kvpool.spec.state.PoolState`); override :meth:`block`, :meth:`block_id`,
:meth:`to_request`, :meth:`raw_pending_events` or :meth:`convert_event` when the pool's
layout differs from vLLM's (``pool.blocks``, ``block.block_id``, ``pool.kv_event_queue``).

Translation rules: an int ``i`` becomes ``pool.blocks[i]`` — Python indexing, so a negative
id names a block counted from the end, exactly what a vLLM caller holding ``blocks[-1]``
would pass; a :class:`~kvpool.shell.BlockRef` to another adapter becomes *that* pool's block
object (vLLM routes such blocks by ``block.pool``). ``evict_blocks`` takes ids in vLLM too,
so ids pass through unchanged (in the caller's order, not as a set).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvpool import events as kv_events
from kvpool.shell import BlockRef, PoolAbstract, as_block_id
from kvpool.spec.state import PoolState

_EVENT_CLASSES: dict[str, type[kv_events.BlockStored] | type[kv_events.BlockRemoved]
                     | type[kv_events.AllBlocksCleared]] = {
    "BlockStored": kv_events.BlockStored,
    "BlockRemoved": kv_events.BlockRemoved,
    "AllBlocksCleared": kv_events.AllBlocksCleared,
}


class ObjectPoolAdapter:
    """Id-based facade over an object-based block pool (see the module docstring)."""

    backend_name = "adapter"

    def __init__(self, pool: Any, *, num_gpu_blocks: int | None = None,
                 hash_block_size: int | None = None) -> None:
        self.pool = pool
        self.num_gpu_blocks = int(num_gpu_blocks or pool.num_gpu_blocks)
        self.enable_caching = bool(pool.enable_caching)
        self.hash_block_size = int(hash_block_size or pool.hash_block_size)
        self.enable_kv_cache_events = bool(getattr(pool, "enable_kv_cache_events", False))
        self.null_block = 0
        self._events_taken = 0

    # -- hooks -------------------------------------------------------------------------------

    def block(self, block_id: int) -> Any:
        """The pool's block object for ``block_id`` (Python indexing; see module docstring)."""
        return self.pool.blocks[block_id]

    def block_id(self, block: Any) -> int:
        return int(block.block_id)

    def to_request(self, request: Any) -> Any:
        """The pool's request object for a kvpool request (identity: the fields match vLLM's)."""
        return request

    def raw_pending_events(self) -> list[Any]:
        """The pool's events not yet taken, oldest first."""
        return list(getattr(self.pool, "kv_event_queue", ()))

    def convert_event(self, event: Any, seq: int) -> kv_events.KVCacheEvent:
        """A pool event as kvpool's event class, numbered ``seq`` (fields matched by name)."""
        if isinstance(event, (kv_events.BlockStored, kv_events.BlockRemoved,
                              kv_events.AllBlocksCleared)):
            return dataclasses.replace(event, seq=seq)
        cls = _EVENT_CLASSES[type(event).__name__]
        values = {
            f.name: getattr(event, f.name)
            for f in dataclasses.fields(cls)
            if f.name != "seq" and hasattr(event, f.name)
        }
        return cls(**values, seq=seq)

    def snapshot(self) -> PoolState:
        """The pool's bookkeeping as a spec state (ref counts, queue, keys, table, watchers).

        ``event_count`` should be :meth:`events_emitted`.
        """
        raise NotImplementedError

    # -- translation -------------------------------------------------------------------------

    def to_block(self, value: Any) -> Any:
        if isinstance(value, BlockRef):
            owner = value.pool
            if isinstance(owner, ObjectPoolAdapter):
                return owner.block(as_block_id(value.block_id))
            return self.block(as_block_id(value.block_id))
        return self.block(as_block_id(value))

    def to_blocks(self, values: Iterable[Any]) -> list[Any]:
        return [self.to_block(v) for v in values]

    def ids(self, blocks: Iterable[Any] | None) -> list[int] | None:
        return None if blocks is None else [self.block_id(b) for b in blocks]

    def ref(self, block_id: int) -> BlockRef:
        return BlockRef(self, as_block_id(block_id))

    def events_emitted(self) -> int:
        return self._events_taken + len(self.raw_pending_events())

    # -- the protocol ------------------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        return self.ids(self.pool.get_new_blocks(num_blocks))  # type: ignore[return-value]

    def touch(self, blocks: Iterable[Any]) -> None:
        self.pool.touch(self.to_blocks(blocks))

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        self.pool.free_blocks(self.to_blocks(ordered_blocks))

    def unpin_blocks(self, blocks: Iterable[Any], on_reuse: Callable[[int], None]) -> None:
        callback: Any = on_reuse
        if callable(on_reuse):
            def callback(block: Any) -> None:
                on_reuse(block if isinstance(block, int) else self.block_id(block))

        self.pool.unpin_blocks(self.to_blocks(blocks), callback)

    def get_cached_block(self, block_hash: bytes,
                         kv_cache_group_ids: Sequence[int]) -> list[int] | None:
        return self.ids(self.pool.get_cached_block(block_hash, list(kv_cache_group_ids)))

    def cache_full_blocks(self, request: Any, blocks: Iterable[Any], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: Sequence[bool] | None = None) -> None:
        args = [self.to_request(request), self.to_blocks(blocks), num_cached_blocks,
                num_full_blocks, block_size, kv_cache_group_id]
        if block_mask is not None:
            args.append(list(block_mask))
        self.pool.cache_full_blocks(*args)

    def cache_partial_block(self, request: Any, block: Any, num_tokens: int,
                            kv_cache_group_id: int, block_size: int,
                            replace_existing_hashes: bool = False) -> bytes | None:
        args = [self.to_request(request), self.to_block(block), num_tokens, kv_cache_group_id,
                block_size]
        if replace_existing_hashes:
            args.append(True)
        key = self.pool.cache_partial_block(*args)
        return None if key is None else bytes(key)

    def move_block_hashes(self, src_block: Any, dst_block: Any) -> None:
        self.pool.move_block_hashes(self.to_block(src_block), self.to_block(dst_block))

    def evict_blocks(self, block_ids: Iterable[Any]) -> None:
        ids = [v.block_id if isinstance(v, BlockRef) else as_block_id(v) for v in block_ids]
        self.pool.evict_blocks(ids)

    def reset_prefix_cache(self) -> bool:
        return bool(self.pool.reset_prefix_cache())

    def emit_cached_block_events(self, request: Any, num_cached_blocks: int, block_size: int,
                                 kv_cache_group_id: int) -> None:
        self.pool.emit_cached_block_events(self.to_request(request), num_cached_blocks,
                                           block_size, kv_cache_group_id)

    def is_block_writable(self, block: Any) -> bool:
        return bool(self.pool.is_block_writable(self.to_block(block)))

    def get_num_free_blocks(self) -> int:
        return int(self.pool.get_num_free_blocks())

    def get_usage(self) -> float:
        return self.pool.get_usage()

    def take_events(self) -> list[kv_events.KVCacheEvent]:
        raw = self.pool.take_events()
        out = [self.convert_event(e, self._events_taken + i) for i, e in enumerate(raw)]
        self._events_taken += len(out)
        return out

    def abstract(self) -> PoolAbstract:
        pending = tuple(
            self.convert_event(e, self._events_taken + i)
            for i, e in enumerate(self.raw_pending_events())
        )
        return PoolAbstract(self.snapshot(), pending)

    def watched_blocks(self) -> tuple[int, ...]:
        return self.snapshot().watchers


__all__ = ["ObjectPoolAdapter"]
