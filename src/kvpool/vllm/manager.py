"""The drop-in: kvpool's KV cache manager behind vLLM 0.25's ``KVCacheManager`` interface
(:mod:`kvpool.vllm.v033` adds what vLLM 0.33's scheduler calls).

:class:`KvpoolKVCacheManager` is constructed exactly as vLLM's scheduler constructs its own
manager (same keyword arguments, vLLM's ``KVCacheConfig``) and answers every call the
scheduler, its KV connectors and its stats loggers make, in vLLM's types:

* results are :class:`~kvpool.vllm.blocks.IdBlocks` (vLLM ``KVCacheBlocks`` over kvpool's ids);
  ``pop_blocks_for_free`` returns :class:`~kvpool.vllm.blocks.BlockView` objects, which
  ``block_pool.free_blocks`` (a :class:`VllmBlockPool`) takes back;
* ``take_events`` returns vLLM's own ``BlockStored`` / ``BlockRemoved`` /
  ``AllBlocksCleared``, annotated as vLLM annotates them, so vLLM's ZeroMQ publisher sends
  kvpool's events unchanged; ``make_prefix_cache_stats`` returns vLLM's ``PrefixCacheStats``;
* requests are vLLM's own ``Request`` objects, read in place (their ``block_hashes`` hold the
  digests vLLM's block hasher computes; nothing is copied). With the fast backend
  :func:`~kvpool.vllm.install` also has the engine's hasher keep each prompt's digests packed
  (:mod:`kvpool.vllm.hashes`), so that an admission reads them in place.

The decisions are kvpool's policy layer (:class:`kvpool.policy.KVCacheManager`, or the
fast policy where it serves the configuration): the conformance tier
(``tests/dropin/test_scheduler_conformance.py``) runs vLLM's real scheduler with both
managers and compares every step. Differences from vLLM's manager are kvpool's documented
stricter checks (BEHAVIOUR.md §12): a call vLLM would half-execute raises a typed error.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from vllm.distributed import kv_events as vllm_events
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import RequestStatus

from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBuilder, materialize
from kvpool.policy import make_kv_cache_manager
from kvpool.policy.manager import SingleTypeKVCacheManager
from kvpool.vllm.blocks import BlockView, IdBlocks, block_ids_of
from kvpool.vllm.config import convert_kv_cache_config

logger = logging.getLogger("kvpool.vllm")


def _nothing() -> None:
    """``new_step_starts`` where no group keeps per-step state."""


class _MetricsCollector:
    """vLLM's ``KVCacheMetricsCollector`` fed by kvpool's pool (ids → block views)."""

    def __init__(self, collector: Any, views: Sequence[BlockView]) -> None:
        self.collector = collector
        self.views = views

    def on_block_allocated(self, block_id: int) -> None:
        self.collector.on_block_allocated(self.views[block_id])

    def on_block_accessed(self, block_id: int) -> None:
        self.collector.on_block_accessed(self.views[block_id])

    def on_block_evicted(self, block_id: int) -> None:
        self.collector.on_block_evicted(self.views[block_id])

    def reset(self) -> None:
        self.collector.reset()


def _shared_fields(ours: type, theirs: type) -> tuple[str, ...]:
    """The fields of kvpool's event class ``ours`` that vLLM's ``theirs`` (a msgspec struct)
    also has, in kvpool's order: what a conversion copies (computed once, not per event)."""
    names = set(getattr(theirs, "__struct_fields__", ()))
    return tuple(f.name for f in dataclasses.fields(ours) if f.name in names)


_STORED_FIELDS = _shared_fields(BlockStored, vllm_events.BlockStored)
_STORED_DIRECT = frozenset(("block_hashes", "parent_block_hash", "token_ids", "block_size",
                            "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
                            "kv_cache_spec_kind", "kv_cache_spec_sliding_window"))
_OPTIONAL = frozenset(("session_id", "lookahead_token_ids"))
"""What kvpool builds a ``BlockStored`` from and vLLM's has in every version the drop-in
serves, and what only some versions have: while the fields are these, the builder names them
(``stored_direct``) instead of filtering them per event."""
_REMOVED_FIELDS = _shared_fields(BlockRemoved, vllm_events.BlockRemoved)


def to_vllm_event(event: Any) -> Any:
    """vLLM's event object for one of kvpool's (the fields vLLM's version has)."""
    if type(event) is BlockStored:
        return vllm_events.BlockStored(**{k: getattr(event, k) for k in _STORED_FIELDS})
    if type(event) is BlockRemoved:
        return vllm_events.BlockRemoved(**{k: getattr(event, k) for k in _REMOVED_FIELDS})
    assert isinstance(event, AllBlocksCleared), event
    return vllm_events.AllBlocksCleared()


def vllm_event_builder(metadata: Sequence[tuple[Any, Any]]) -> EventBuilder:
    """Builds vLLM's event objects straight from the pool's records (kvpool's
    :func:`~kvpool.events.materialize` with vLLM's classes), annotated as vLLM annotates a
    ``BlockStored``: the spec kind and sliding window of its group (``metadata``)."""
    stored_names, removed_names = frozenset(_STORED_FIELDS), frozenset(_REMOVED_FIELDS)

    def stored(**fields: Any) -> Any:
        event = vllm_events.BlockStored(**{k: v for k, v in fields.items() if k in stored_names})
        g = fields["group_idx"]
        if g is not None:
            if 0 <= g < len(metadata):
                event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = metadata[g]
            else:
                logger.warning("Group index `%s` not in KV cache metadata", g)
        return event

    def removed(**fields: Any) -> Any:
        return vllm_events.BlockRemoved(**{k: v for k, v in fields.items() if k in removed_names})

    def removed_direct(block_hashes: Any, medium: Any, group_idx: Any, seq: int) -> Any:
        # Every vLLM version kvpool serves has these three fields: no filtering per event
        # (an eviction burst removes thousands of keys).
        return vllm_events.BlockRemoved(block_hashes=block_hashes, medium=medium,
                                        group_idx=group_idx)

    if {"block_hashes", "medium", "group_idx"} <= removed_names:
        removed = removed_direct  # type: ignore[assignment]

    def cleared(**fields: Any) -> Any:
        return vllm_events.AllBlocksCleared()

    # vLLM 0.33 also reports the session and the lookahead tokens; 0.25 has neither field.
    keep_optional = _OPTIONAL <= stored_names

    def stored_direct(block_hashes: Any, parent_block_hash: Any, token_ids: Any,
                      block_size: int, lora_id: Any, medium: Any, lora_name: Any,
                      extra_keys: Any, group_idx: Any, seq: int, session_id: Any = None,
                      lookahead_token_ids: Any = None) -> Any:
        # vLLM's fields by name, annotated in the constructor: half the cost of
        # filtering them (a decode step with events on builds one per block it fills).
        if group_idx is None or not 0 <= group_idx < len(metadata):
            return stored(block_hashes=block_hashes, parent_block_hash=parent_block_hash,
                          token_ids=token_ids, block_size=block_size, lora_id=lora_id,
                          medium=medium, lora_name=lora_name, extra_keys=extra_keys,
                          group_idx=group_idx, seq=seq, session_id=session_id,
                          lookahead_token_ids=lookahead_token_ids)
        kind, window = metadata[group_idx]
        optional = {"session_id": session_id, "lookahead_token_ids": lookahead_token_ids} \
            if keep_optional else {}
        return vllm_events.BlockStored(
            block_hashes=block_hashes, parent_block_hash=parent_block_hash, token_ids=token_ids,
            block_size=block_size, lora_id=lora_id, medium=medium, lora_name=lora_name,
            extra_keys=extra_keys, group_idx=group_idx, kv_cache_spec_kind=kind,
            kv_cache_spec_sliding_window=window, **optional)

    direct = _STORED_DIRECT <= stored_names and (keep_optional or not stored_names & _OPTIONAL)
    return partial(materialize, stored=stored_direct if direct else stored, removed=removed,
                   cleared=cleared)


class VllmBlockPool:
    """kvpool's pool as vLLM's ``BlockPool`` looks to a scheduler or a KV connector: blocks
    are :class:`BlockView` objects, everything else is forwarded. The pool's state is only
    ever changed through kvpool's verbs (checked, atomic)."""

    def __init__(self, pool: Any, views: Sequence[BlockView]) -> None:
        self.pool = pool
        self.blocks = views
        self.null_block = views[pool.null_block]
        self.num_gpu_blocks = pool.num_gpu_blocks
        self.enable_caching = pool.enable_caching
        self.hash_block_size = pool.hash_block_size

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        self.pool.free_blocks([b.block_id if isinstance(b, KVCacheBlock) else b
                               for b in ordered_blocks])

    def touch(self, blocks: Iterable[Any]) -> None:
        self.pool.touch([b.block_id if isinstance(b, KVCacheBlock) else b for b in blocks])

    def get_new_blocks(self, num_blocks: int) -> list[BlockView]:
        return [self.blocks[b] for b in self.pool.get_new_blocks(num_blocks)]

    def get_cached_block(self, block_hash: bytes,
                         kv_cache_group_ids: list[int]) -> list[BlockView] | None:
        hit = self.pool.get_cached_block(block_hash, kv_cache_group_ids)
        return None if hit is None else [self.blocks[b] for b in hit]

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.pool.evict_blocks(sorted(block_ids))  # vLLM passes a set: a fixed order

    def get_num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()  # type: ignore[no-any-return]

    def get_usage(self) -> float:
        return self.pool.get_usage()  # type: ignore[no-any-return]

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


class KvpoolKVCacheManager:
    """vLLM's ``KVCacheManager``, answered by kvpool (module docstring)."""

    #: Set by :func:`kvpool.vllm.install`: the pool backend and the policy choice.
    backend = "fast"
    policy = "auto"

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_num_batched_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
    ) -> None:
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        views: list[BlockView] = []
        collector = None if metrics_collector is None else _MetricsCollector(
            metrics_collector, views)
        manager = make_kv_cache_manager(
            convert_kv_cache_config(kv_cache_config), max_model_len, scheduler_block_size,
            hash_block_size, max_num_batched_tokens, enable_caching, use_eagle,
            log_stats=log_stats, enable_kv_cache_events=enable_kv_cache_events,
            dcp_world_size=dcp_world_size, pcp_world_size=pcp_world_size,
            metrics_collector=collector, watermark=watermark, backend=self.backend,
            policy=self.policy, **self._policy_options())
        self.manager = manager
        pool = manager.block_pool
        views.extend(BlockView(b, pool) for b in range(pool.num_gpu_blocks))
        self._views = views
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        # kvpool's facade speaks vLLM's types directly (no wrapper on the hot calls): its
        # results are IdBlocks, it reads vLLM's blocks back as hits, it records into vLLM's
        # PrefixCacheStats and applies the watermark to vLLM's waiting statuses.
        self.empty_kv_cache_blocks = IdBlocks(
            tuple(() for _ in range(self.num_kv_cache_groups)), views)
        manager.empty_kv_cache_blocks = self.empty_kv_cache_blocks
        manager.make_blocks = lambda ids: IdBlocks(ids, views)
        manager.hit_block_ids = block_ids_of
        manager.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        manager.watermark_statuses = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        # vLLM 0.25.1's scheduler takes the blocks to zero only when the model needs zeroing
        # (it has Mamba layers); its managers record them regardless, and the ids of every
        # block ever allocated pile up for a call that never comes (0.33 drains them every
        # step). kvpool records them only when they will be taken (the 0.33 drop-in then
        # sets its own groups).
        if not getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
            manager.record_no_blocks_to_zero()
        self.allocate_slots = manager.allocate_slots
        self.get_computed_blocks = manager.get_computed_blocks
        self.free = manager.free
        self.get_num_common_prefix_blocks = manager.get_num_common_prefix_blocks
        self.get_blocks = manager.get_blocks
        self.cache_blocks = manager.cache_blocks  # async scheduling: every request, every step
        # Called once per step: bound straight to the layer that answers (no frame between),
        # or to nothing where no group keeps per-step state (only Mamba's managers do).
        steps = any(type(m).new_step_starts is not SingleTypeKVCacheManager.new_step_starts
                    for m in manager.coordinator.single_type_managers)
        self.new_step_starts = manager.coordinator.new_step_starts if steps else _nothing
        # Events off: nothing is ever pending, and list() is a fresh empty list.
        self.take_events = pool.take_events if pool.enable_kv_cache_events else list
        self.block_pool = VllmBlockPool(pool, views)
        self.coordinator = manager.coordinator
        self.watermark_blocks = manager.watermark_blocks
        self.kv_cache_event_metadata = tuple(
            (get_kv_cache_spec_kind(g.kv_cache_spec).value,
             get_kv_cache_spec_sliding_window(g.kv_cache_spec))
            for g in kv_cache_config.kv_cache_groups)
        if pool.enable_kv_cache_events:
            pool.use_event_builder(vllm_event_builder(self.kv_cache_event_metadata))

    def _policy_options(self) -> dict[str, Any]:
        """Extra options of kvpool's policy for this vLLM version (none for 0.25)."""
        return {}

    def __repr__(self) -> str:
        return f"KvpoolKVCacheManager({self.manager!r})"

    # -- results ------------------------------------------------------------------------

    def create_kv_cache_blocks(self, blocks: tuple[Sequence[Any], ...]) -> Any:
        """vLLM's blocks (or ids) as a result; the shared empty one when there are none."""
        if not any(blocks):
            return self.empty_kv_cache_blocks
        return IdBlocks(tuple([b.block_id if isinstance(b, KVCacheBlock) else b for b in g]
                              for g in blocks), self._views)

    # -- the scheduler's calls ----------------------------------------------------------
    # allocate_slots, get_computed_blocks, free, get_blocks, cache_blocks and
    # get_num_common_prefix_blocks are the kvpool facade's own methods, bound in __init__
    # (vLLM's types in and out);
    # take_events is the pool's (vLLM's event objects, annotated as vLLM annotates them:
    # vllm_event_builder builds them so when recorded) and new_step_starts the coordinator's.

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        return self.manager.prefix_cache_stats  # type: ignore[no-any-return]

    @property
    def usage(self) -> float:
        return self.manager.usage  # type: ignore[no-any-return]

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        if not self.log_stats:
            return None
        stats, self.manager.prefix_cache_stats = self.manager.prefix_cache_stats, \
            PrefixCacheStats()
        return stats  # type: ignore[no-any-return]

    def pop_blocks_for_free(self, request: Any) -> list[BlockView]:
        views = self._views
        return [views[b] for b in self.manager.pop_blocks_for_free(request)]

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        self.manager.remove_skipped_blocks(request_id, total_computed_tokens,
                                           num_prompt_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.manager.reset_prefix_cache()  # type: ignore[no-any-return]

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.manager.get_block_ids(request_id)

    def get_block_ids_for_computed_tokens(self, request_id: str,
                                          num_computed_tokens: int) -> tuple[list[int], ...]:
        return self.manager.get_block_ids_for_computed_tokens(request_id, num_computed_tokens)

    def take_new_block_ids(self) -> list[int]:
        return self.manager.take_new_block_ids()


__all__ = ["KvpoolKVCacheManager", "VllmBlockPool", "to_vllm_event", "vllm_event_builder"]
