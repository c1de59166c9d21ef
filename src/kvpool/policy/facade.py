"""``KVCacheManager``: what a scheduler calls (BEHAVIOUR.md §10, vLLM 0.25.1's facade).

A scheduler step, for each request it schedules::

    hits, num_hit_tokens = manager.get_computed_blocks(request)      # new requests only
    new = manager.allocate_slots(request, num_new_tokens, num_hit_tokens, hits,
                                 num_lookahead_tokens=...)
    if new is None: ...                                              # does not fit: retry

and ``free(request)`` when a request finishes or is preempted. ``allocate_slots`` runs
vLLM's order (§10.2): free out-of-window blocks, check the budget (counting the hits a touch
will take out of the free queue, and the watermark), touch *every* group's hits, allocate,
then key the blocks that are full. A ``None`` means nothing was touched or allocated.

Stricter than vLLM (§12): every bad call — a shrinking token count, hits for a running
request, hits that do not cover ``num_new_computed_tokens``, ``num_new_tokens == 0`` without
external tokens, ids outside the pool — raises a typed :class:`~kvpool.errors.KvPoolError`
before anything changes. Freeing a request that holds nothing is vLLM's no-op: a scheduler
frees requests aborted while still waiting.
"""

from __future__ import annotations

import logging
import numbers
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, NamedTuple

from kvpool.errors import InvalidArgument, InvalidConfig, NotRetained
from kvpool.events import BlockStored, KVCacheEvent
from kvpool.policy.blocks import KVCacheBlocks
from kvpool.policy.circular_buffer import CircularBufferManager
from kvpool.policy.coordinator import KVCacheCoordinator, PoolFactory
from kvpool.policy.coordinator_factory import get_kv_cache_coordinator
from kvpool.policy.cross_attention import CrossAttentionManager
from kvpool.policy.request import RequestStatus
from kvpool.policy.specs import (
    AttentionSpec,
    CrossAttentionSpec,
    KVCacheConfig,
    cdiv,
    spec_kind,
    spec_sliding_window,
)
from kvpool.policy.stats import PrefixCacheStats

logger = logging.getLogger("kvpool")


class BlockCopy(NamedTuple):
    """One pending copy-on-write: the GPU layer copies block ``src_block_id``'s contents
    into ``dst_block_id`` for group ``group_id`` before the step's forward pass (§10.4)."""

    src_block_id: int
    dst_block_id: int
    group_id: int


def processed_tokens(computed_tokens: int, in_flight: int) -> int:
    """The computed tokens already processed: ``computed_tokens`` less the request's tokens
    in flight (vLLM 0.33's ``num_in_flight_tokens``: scheduled, their step not back yet).
    Windows free blocks behind these only, since a step in flight still reads the blocks
    behind its own tokens."""
    return computed_tokens - in_flight if computed_tokens > in_flight else 0


def tokens_in_flight(request: Any) -> Any:
    """The request's tokens in flight; 0 for a request without the field (vLLM 0.25.1's)."""
    return getattr(request, "num_in_flight_tokens", 0)


def _count(name: str, value: object) -> int:
    if type(value) is int and value >= 0:  # the common case; the ABC check costs ~1 µs
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InvalidArgument(f"{name} must be a non-negative int, got {value!r}")
    return int(value)


class KVCacheManager:
    """The KV cache manager facade over one pool; see the module docstring.

    ``backend`` names the pool backend (``"spec"``, ``"reference"``, ``"fast"``) or is a
    pool factory; ``retention_interval`` is vLLM's ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``
    passed explicitly (policy reads no environment); ``allow_partial_hash_hits`` turns on
    vLLM 0.33's partial hits and copy-on-write where the configuration supports them
    (§10.4; :attr:`partial_hash_hits_enabled`, :meth:`take_kv_cache_block_copies`).
    """

    #: Which policy this is (``repr``, ``kvpool simulate``): the generic one, the reference
    #: of this layer; :class:`~kvpool.policy.fast.FastKVCacheManager` says ``"fast"``.
    policy_name = "generic"

    #: The request statuses the watermark applies to (vLLM: waiting and preempted). A
    #: scheduler with its own status enum (``kvpool.vllm``) names its members here.
    watermark_statuses: tuple[Any, ...] = (RequestStatus.WAITING, RequestStatus.PREEMPTED)

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
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
        *,
        backend: str | PoolFactory = "reference",
        retention_interval: int | None = None,
        allow_partial_hash_hits: bool = False,
    ) -> None:
        if not isinstance(watermark, numbers.Real) or isinstance(watermark, bool) or \
                not watermark >= 0.0:
            raise InvalidConfig(f"watermark must be non-negative, got {watermark!r}")
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max_model_len
        self.max_model_len: int = max_model_len
        self.enable_caching: bool = bool(enable_caching)
        self.use_eagle: bool = bool(use_eagle)
        self.log_stats: bool = bool(log_stats)
        self.coordinator: KVCacheCoordinator = get_kv_cache_coordinator(
            kv_cache_config, max_model_len, max_num_batched_tokens, self.use_eagle,
            self.enable_caching, enable_kv_cache_events, dcp_world_size, pcp_world_size,
            scheduler_block_size, hash_block_size, metrics_collector,
            backend=backend, retention_interval=retention_interval,
            allow_partial_hash_hits=allow_partial_hash_hits)
        self.kv_cache_config: KVCacheConfig = kv_cache_config
        self.block_pool: Any = self.coordinator.block_pool
        self.num_kv_cache_groups: int = len(kv_cache_config.kv_cache_groups)
        self.watermark_blocks: int = int(watermark * kv_cache_config.num_blocks)
        self.prefix_cache_stats: PrefixCacheStats | None = \
            PrefixCacheStats() if self.log_stats else None
        self.kv_cache_event_metadata: tuple[tuple[str, int | None], ...] = tuple(
            (spec_kind(g.kv_cache_spec), spec_sliding_window(g.kv_cache_spec))
            for g in kv_cache_config.kv_cache_groups)
        self.empty_kv_cache_blocks: Any = KVCacheBlocks(tuple(() for _ in range(
            self.num_kv_cache_groups)))
        #: How results are made from per-group id lists, and how a caller's hit object is
        #: read back as id lists (``None``: not a hit object). A scheduler with its own
        #: block types (``kvpool.vllm``) replaces both, and ``empty_kv_cache_blocks``, so
        #: its objects go in and come out with no wrapper around this facade.
        self.make_blocks: Callable[[tuple[Sequence[int], ...]], Any] = KVCacheBlocks
        self.hit_block_ids: Callable[[Any], tuple[Sequence[int], ...] | None] = \
            _kvpool_hit_ids
        # Requests holding an allocation, with the (num_tokens, num_computed_tokens) of
        # their last successful allocate_slots: the shrink check reads them (a fast policy
        # keeps more after those two: _note_allocation).
        self._live: dict[str, tuple[int, ...]] = {}
        # Copy endpoints handed out by take_kv_cache_block_copies and not yet released,
        # with multiplicity (two copies may share a source).
        self._retained: Counter[int] = Counter()

    # -- queries ------------------------------------------------------------------------

    @property
    def partial_hash_hits_enabled(self) -> bool:
        """Whether hits may end inside a block (copy-on-write, §10.4): asked for with
        ``allow_partial_hash_hits=True`` and supported by the configuration."""
        return self.coordinator.partial_hash_hits

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held (cached candidates count as free)."""
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The stats since the last call (and start fresh); ``None`` without log_stats."""
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self._blocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table per group (empty lists for an unknown request)."""
        return tuple(list(t) for t in self.coordinator.get_blocks(request_id))

    def get_block_ids_for_computed_tokens(self, request_id: str,
                                          num_computed_tokens: int) -> tuple[list[int], ...]:
        """Per group the ids covering the first ``num_computed_tokens`` tokens (Mamba and
        cross-attention tables whole)."""
        out = []
        for group, ids in zip(self.kv_cache_config.kv_cache_groups,
                              self.get_block_ids(request_id), strict=True):
            spec = group.kv_cache_spec
            if not isinstance(spec, AttentionSpec) or isinstance(spec, CrossAttentionSpec):
                out.append(ids)
            else:
                out.append(ids[:cdiv(num_computed_tokens, spec.block_size)])
        return tuple(out)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return self.coordinator.get_num_common_prefix_blocks(running_request_id)

    def take_new_block_ids(self) -> list[int]:
        """Ids allocated for full-attention/MLA groups since the last call (KV zeroing)."""
        ids: list[int] = []
        for manager in self.coordinator.single_type_managers:
            ids.extend(manager.take_new_block_ids())
        return ids

    def record_no_blocks_to_zero(self) -> None:
        """Stop recording new blocks for zeroing, in every group: for an engine that never
        calls :meth:`take_new_block_ids`, where the id of every block it allocates would
        otherwise pile up. Both policies read the setting at each allocation."""
        for manager in self.coordinator.single_type_managers:
            manager.zeroed_spec_types = ()

    def new_step_starts(self) -> None:
        """A scheduler step begins (Mamba forgets which states were cached this step)."""
        self.coordinator.new_step_starts()

    def is_running(self, request_id: str) -> bool:
        """Whether the manager holds an allocation for the request."""
        return request_id in self._live

    # -- lookup -------------------------------------------------------------------------

    def get_computed_blocks(self, request: Any) -> tuple[KVCacheBlocks, int]:
        """The request's prefix hits and their token count; touches nothing.

        The hit stops before the last token (its logits must be computed), so a fully
        cached, block-aligned prompt loses its whole last block.
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        hits, num_tokens = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1)
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.record(request.num_tokens, num_tokens,
                                           request.num_preemptions > 0)
        return self._blocks(hits), num_tokens

    # -- allocation ---------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: Collection[int] = (),
    ) -> KVCacheBlocks | None:
        """Slots for ``num_new_tokens`` more tokens (plus lookahead); the newly allocated
        blocks per group, or ``None`` if they do not fit (then only out-of-window blocks
        were freed). See the module docstring for the order of the steps.

        ``skip_zeroing_group_ids``: groups whose blocks for external tokens a connector's
        load writes, so they are not recorded for zeroing (vLLM 0.33). A request with a
        ``num_in_flight_tokens`` field (vLLM 0.33's: tokens scheduled but not processed
        yet, async scheduling) keeps the out-of-window blocks those tokens still read:
        the windows free behind the processed tokens."""
        hits = self._check_allocate(request, num_new_tokens, num_new_computed_tokens,
                                    new_computed_blocks, num_lookahead_tokens,
                                    num_external_computed_tokens, num_encoder_tokens,
                                    reserved_blocks, skip_zeroing_group_ids)
        coordinator, pool, rid = self.coordinator, self.block_pool, request.request_id
        local = request.num_computed_tokens + num_new_computed_tokens
        total = min(local + num_external_computed_tokens, self.max_model_len)
        watermark = 0
        if has_scheduled_reqs and request.status in self.watermark_statuses:
            watermark = self.watermark_blocks
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            needed = coordinator.get_num_blocks_to_allocate(
                rid, full, hits.blocks, num_encoder_tokens, total, full,
                apply_admission_cap=True, num_local_computed_tokens=local)
            if needed + watermark > pool.get_num_free_blocks():
                return None
        main = total + num_new_tokens
        need_slots = min(main + num_lookahead_tokens, self.max_model_len)
        coordinator.check_new_blocks(rid, main)  # a refusal here changes nothing
        # Freed even if the allocation then fails: those tokens are out of attention anyway.
        if coordinator.frees_skipped_blocks:
            coordinator.remove_skipped_blocks(
                rid, processed_tokens(total, tokens_in_flight(request)),
                request.num_prompt_tokens)
        needed = coordinator.get_num_blocks_to_allocate(
            rid, need_slots, hits.blocks, num_encoder_tokens,
            local + num_external_computed_tokens, main, num_local_computed_tokens=local)
        if needed + watermark > pool.get_num_free_blocks() - reserved_blocks:
            return None
        if hits is not self.empty_kv_cache_blocks or num_external_computed_tokens > 0:
            coordinator.allocate_new_computed_blocks(rid, hits.blocks, local,
                                                     num_external_computed_tokens,
                                                     skip_zeroing_group_ids)
        new = coordinator.allocate_new_blocks(rid, need_slots, main, num_encoder_tokens)
        self._note_allocation(request)
        if self.enable_caching and not delay_cache_blocks:
            # Unverified draft tokens are never cached: cap at the request's tokens.
            coordinator.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
        return self._blocks(new)

    def _note_allocation(self, request: Any) -> None:
        """Record a successful allocation of ``request`` (its counts, for the shrink check).
        A fast policy records more here: what its next step may skip."""
        self._live[request.request_id] = (request.num_tokens, request.num_computed_tokens)

    def _check_group_ids(self, name: str, ids: object) -> None:
        n = self.num_kv_cache_groups
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Collection) or any(
                type(g) is not int or not 0 <= g < n for g in ids):
            raise InvalidArgument(f"{name} must be a collection of group ids in [0, {n}), "
                                  f"got {ids!r}")

    def _check_allocate(self, request: Any, num_new_tokens: object,
                        num_new_computed_tokens: object,
                        new_computed_blocks: KVCacheBlocks | None,
                        num_lookahead_tokens: object, num_external_computed_tokens: object,
                        num_encoder_tokens: object, reserved_blocks: object,
                        skip_zeroing_group_ids: object = ()) -> KVCacheBlocks:
        """Every rejection of ``allocate_slots``, before anything changes; the hits."""
        if skip_zeroing_group_ids != ():
            self._check_group_ids("skip_zeroing_group_ids", skip_zeroing_group_ids)
        if self.coordinator.frees_skipped_blocks:  # (read nowhere else)
            _count("request.num_in_flight_tokens", tokens_in_flight(request))
        new_tokens = _count("num_new_tokens", num_new_tokens)
        new_computed = _count("num_new_computed_tokens", num_new_computed_tokens)
        _count("num_lookahead_tokens", num_lookahead_tokens)
        external = _count("num_external_computed_tokens", num_external_computed_tokens)
        _count("num_encoder_tokens", num_encoder_tokens)
        _count("reserved_blocks", reserved_blocks)
        if new_tokens == 0 and external == 0:
            raise InvalidArgument("num_new_tokens must be greater than 0 when there are no "
                                  "external computed tokens")
        rid = request.request_id
        computed = _count("request.num_computed_tokens", request.num_computed_tokens)
        seen = self._live.get(rid)
        if seen is not None:
            if request.num_tokens < seen[0] or computed < seen[1]:
                raise InvalidArgument(
                    f"request {rid!r} shrank: {request.num_tokens} tokens / {computed} "
                    f"computed after {seen[0]} / {seen[1]} at its last allocation")
        if new_computed_blocks is None or new_computed_blocks is self.empty_kv_cache_blocks:
            if new_computed:
                raise InvalidArgument(
                    f"num_new_computed_tokens={new_computed} but no hit blocks were given")
            return self.empty_kv_cache_blocks  # the common case: nothing more to check
        ids = self.hit_block_ids(new_computed_blocks)
        if ids is None or len(ids) != self.num_kv_cache_groups:
            raise InvalidArgument(
                f"new_computed_blocks must be a KVCacheBlocks with {self.num_kv_cache_groups} "
                f"groups, got {new_computed_blocks!r}")
        hits = KVCacheBlocks(tuple(ids))
        running = seen is not None or self.coordinator.is_tracked(rid)
        if running and (new_computed or any(hits.blocks)):
            raise InvalidArgument(f"request {rid!r} is running; it takes no new prefix hits")
        if not running and any(rid in m.req_to_blocks
                               for m in self.coordinator.single_type_managers):
            raise InvalidArgument(f"request {rid!r} holds blocks; it takes no prefix hits")
        n = self.block_pool.num_gpu_blocks
        managers = self.coordinator.single_type_managers
        for g, (blocks, manager) in enumerate(zip(hits.blocks, managers, strict=True)):
            hitless = isinstance(manager, (CrossAttentionManager, CircularBufferManager))
            if not blocks and (hitless or not new_computed):
                continue  # nothing to check; an empty list that must cover tokens is not
            if hitless:
                kind = "cross-attention" if isinstance(manager, CrossAttentionManager) \
                    else "circular-buffer"
                raise InvalidArgument(f"{kind} groups take no prefix hits")
            if blocks and not self.enable_caching:
                raise InvalidArgument("prefix hits given while caching is disabled")
            if self.coordinator.partial_hash_hits:
                covers = new_computed % self.coordinator.hash_block_size == 0 and \
                    len(blocks) == cdiv(new_computed, manager.block_size)
            else:
                covers = len(blocks) * manager.block_size == new_computed
            if not covers:
                raise InvalidArgument(
                    f"group {g}: {len(blocks)} hit blocks of {manager.block_size} tokens do "
                    f"not cover num_new_computed_tokens={new_computed}")
            for b in blocks:
                if type(b) is not int and (isinstance(b, bool) or
                                           not isinstance(b, numbers.Integral)) or \
                        not 0 <= b < n:
                    raise InvalidArgument(f"group {g}: hit block {b!r} is not a block id")
        if new_computed and not any(hits.blocks):
            raise InvalidArgument(
                f"num_new_computed_tokens={new_computed} but no hit blocks were given")
        return hits

    # -- copy-on-write (§10.4) ------------------------------------------------------------

    def take_kv_cache_block_copies(self) -> tuple[list[BlockCopy], list[int]]:
        """Drain the pending copies and hand over their retained endpoints.

        Returns the copies the GPU layer must run before this step's forward pass, and
        the ids held for them (each pair's source and destination, in that order). Once a
        copy has run, the caller releases its endpoints with :meth:`release_copy_endpoints`
        (a pipelined engine waits until the step that runs the copy has finished)."""
        pairs = self.coordinator.take_pending_copies()
        copies = [BlockCopy(src, dst, g) for src, dst, g in pairs]
        retained = [b for src, dst, _ in pairs for b in (src, dst)]
        self._retained.update(retained)
        return copies, retained

    def release_copy_endpoints(self, block_ids: Iterable[int]) -> None:
        """Free each retained endpoint once (one pool ``free_blocks`` call, in the given
        order). Every id must be a retained endpoint not yet released, counted with
        multiplicity; otherwise :class:`~kvpool.errors.NotRetained` and nothing changes."""
        ids = list(block_ids)
        wanted = Counter(ids)
        for b, n in wanted.items():
            if self._retained.get(b, 0) < n:
                raise NotRetained(
                    f"block {b!r} is not a retained copy endpoint {n} time(s) (held "
                    f"{self._retained.get(b, 0)}): never handed out by "
                    f"take_kv_cache_block_copies, or already released")
        if ids:
            self.block_pool.free_blocks(ids)
        self._retained.subtract(wanted)
        self._retained += Counter()  # drop zero counts

    @property
    def pending_kv_cache_block_copies(self) -> list[BlockCopy]:
        """The copies queued and not yet taken (a peek: nothing is drained)."""
        return [BlockCopy(src, dst, g)
                for g, m in enumerate(self.coordinator.single_type_managers)
                for src, dst in m._pending_copies]

    @property
    def retained_copy_endpoints(self) -> dict[int, int]:
        """Block id → retentions handed out and not yet released."""
        return dict(self._retained)

    # -- release ------------------------------------------------------------------------

    def free(self, request: Any) -> None:
        """Release the request's blocks: group by group, each table tail first. A request
        that holds nothing (never allocated, aborted while waiting, already freed) is left
        alone, as vLLM does."""
        rid = request.request_id
        if self._live.pop(rid, None) is not None:
            self.coordinator.free(rid)

    def pop_blocks_for_free(self, request: Any) -> list[int]:
        """Forget the request and hand its blocks over, in table order, group after group;
        the caller later calls ``block_pool.free_blocks(reversed(blocks))``. ``[]`` for a
        request that holds nothing."""
        rid = request.request_id
        if self._live.pop(rid, None) is None:
            return []
        return self.coordinator.pop_blocks_for_free(rid)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        self.coordinator.remove_skipped_blocks(request_id, total_computed_tokens,
                                               num_prompt_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the cache identity of these blocks (a KV connector lost their data)."""
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix if no request holds blocks; whether it did."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Key the request's full blocks up to ``num_computed_tokens`` (caching on only); a
        count that is not a non-negative int is refused, changing nothing."""
        _count("num_computed_tokens", num_computed_tokens)
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def take_events(self) -> list[KVCacheEvent]:
        """The pool's pending events, each ``BlockStored`` annotated with its group's kind
        and window."""
        out: list[KVCacheEvent] = []
        metadata = self.kv_cache_event_metadata
        for event in self.block_pool.take_events():
            if isinstance(event, BlockStored) and event.group_idx is not None:
                g = event.group_idx
                if 0 <= g < len(metadata):
                    event = event.with_spec(*metadata[g])
                else:
                    logger.warning("Group index `%s` not in KV cache metadata", g)
            out.append(event)
        return out

    def _blocks(self, blocks: Sequence[Sequence[int]]) -> Any:
        if not any(blocks):
            return self.empty_kv_cache_blocks
        return self.make_blocks(tuple(blocks))


def _kvpool_hit_ids(hits: Any) -> tuple[Sequence[int], ...] | None:
    return hits.blocks if isinstance(hits, KVCacheBlocks) else None


__all__ = ["BlockCopy", "KVCacheManager"]
