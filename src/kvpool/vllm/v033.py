"""vLLM 0.33's manager contract over kvpool's policy (the 0.25 one is :mod:`kvpool.vllm.manager`).

vLLM 0.33's scheduler builds its ``KVCacheManager`` with other arguments and calls more of
it than 0.25's. :class:`Kvpool033KVCacheManager` is the 0.25 drop-in with what changed:

* constructed with 0.33's keywords (``max_in_flight_tokens`` is the batch budget kvpool's
  windowed groups size their admission for; lookahead hashing, multi-module MTP and Mamba
  shared-prefix checkpoints are refused, :func:`kvpool.vllm.v033_checks.refusal`);
* ``get_computed_blocks(request, max_cache_hit_length=None)`` returns three values: the
  hits, their token count and the shared-prefix boundary (the longest single-group hit
  when it is longer than the common one: vLLM's scheduler stops a Mamba chunk there);
  prefix-cache stats are recorded by ``record_prefix_cache_stats`` at admission, not by
  the lookup; ``kv_cache_report_mode="full"`` requests get ``BlockStored`` for their hits;
* ``allocate_slots`` is kvpool's facade's, bound as in the 0.25 drop-in: it takes
  ``skip_zeroing_group_ids`` (a connector's async load writes those groups' external
  blocks) and frees out-of-window blocks behind the processed tokens (vLLM 0.33's
  ``request.num_in_flight_tokens``: async scheduling schedules a step before the previous
  one is back); partial hash hits are on where vLLM 0.33 turns them on (kvpool's opt-in
  ``allow_partial_hash_hits``), checked against vLLM's own predicate at engine start;
* Mamba groups free old states by 0.33's rules
  (:func:`kvpool.policy.mamba.follow_vllm_033_rules`: the count not lowered by the
  speculative blocks, a walk past the align table's null gaps);
* ``truncate_computed_blocks``, ``estimate_cached_tokens``, ``record_blocks_for_zeroing``,
  ``take_kv_cache_block_copies`` (vLLM's copy objects, endpoints as block views that
  ``block_pool.free_blocks`` takes back), ``take_boundary_state_offloads`` and
  ``finalize_partial_tail_offloads`` (Mamba states for a connector: refused with one),
  ``get_num_common_prefix_blocks`` (0.33: always zeros);
* ``coordinator`` is a view whose ``single_type_managers`` carry vLLM's specs (the
  scheduler tests them with ``isinstance``) and whose ``get_num_blocks_to_allocate``
  takes 0.33's keywords (``prefill_end`` only matters for sparse retention and Mamba
  prefill checkpoints, both refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.v1.core.kv_cache_utils import KVCacheBlock, KVCacheBlockCopy
from vllm.v1.kv_cache_interface import AttentionSpec as VllmAttentionSpec
from vllm.v1.kv_cache_interface import CircularBufferSpec as VllmCircularBufferSpec
from vllm.v1.kv_cache_interface import CrossAttentionSpec as VllmCrossAttentionSpec
from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec as VllmEncoderOnlyAttentionSpec
from vllm.v1.metrics.stats import PrefixCacheStats

from kvpool.policy.mamba import MambaManager, follow_vllm_033_rules
from kvpool.vllm.blocks import BlockView, block_ids_of
from kvpool.vllm.config import UnsupportedConfig
from kvpool.vllm.manager import KvpoolKVCacheManager
from kvpool.vllm.v033_checks import refusal, zeroed_group_ids


def _no_copies() -> tuple[list[Any], list[BlockView]]:
    """``take_kv_cache_block_copies`` of a manager that never queues a copy."""
    return [], []

class _GroupView:
    """One group as 0.33's scheduler reads it: block size, vLLM's spec, group id."""

    def __init__(self, manager: Any, spec: Any, group_id: int) -> None:
        self.block_size = manager.block_size
        self.kv_cache_spec = spec
        self.kv_cache_group_id = group_id
        self._manager = manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


class CoordinatorView:
    """kvpool's coordinator with the attributes and keywords vLLM 0.33's scheduler uses."""

    num_reprefillable_tokens = 0

    def __init__(self, coordinator: Any, vllm_groups: Sequence[Any]) -> None:
        self._coordinator = coordinator
        self.single_type_managers = tuple(
            _GroupView(m, g.kv_cache_spec, i)
            for i, (m, g) in enumerate(zip(coordinator.single_type_managers, vllm_groups,
                                           strict=True)))
        self.enable_partial_hash_hits = bool(getattr(coordinator, "partial_hash_hits", False))

    def get_num_blocks_to_allocate(
            self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[Any],
            num_encoder_tokens: int, total_computed_tokens: int,
            num_local_computed_tokens: int, num_tokens_main_model: int,
            apply_admission_cap: bool = False, prefill_end: int = 0) -> int:
        """The blocks a request still needs (``prefill_end``: see the module docstring)."""
        del prefill_end
        ids = tuple([b.block_id if isinstance(b, KVCacheBlock) else b for b in group]
                    for group in new_computed_blocks)
        return self._coordinator.get_num_blocks_to_allocate(  # type: ignore[no-any-return]
            request_id, num_tokens, ids, num_encoder_tokens, total_computed_tokens,
            num_tokens_main_model, apply_admission_cap=apply_admission_cap,
            num_local_computed_tokens=num_local_computed_tokens)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._coordinator, name)


def _vllm_partial_hits(kv_cache_config: Any, hash_block_size: int, dcp_world_size: int,
                       enable_caching: bool) -> bool:
    """Whether vLLM 0.33's manager would allow hits inside a block for this model (its
    hybrid coordinator's own predicate, over the manager classes it would build)."""
    from vllm.v1.core.kv_cache_utils import partial_hash_hits_enabled
    from vllm.v1.core.single_type_kv_cache_manager import KVCacheSpecRegistry

    groups = list(kv_cache_config.kv_cache_groups)
    if len(groups) < 2 or not enable_caching:
        return False
    classes = [KVCacheSpecRegistry.get_manager_class(g.kv_cache_spec, g.role) for g in groups]
    return bool(partial_hash_hits_enabled(groups, hash_block_size, dcp_world_size, classes))


class Kvpool033KVCacheManager(KvpoolKVCacheManager):
    """vLLM 0.33's ``KVCacheManager``, answered by kvpool (module docstring)."""

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
    ) -> None:
        why = refusal(kv_cache_config, num_hash_lookahead_tokens=num_hash_lookahead_tokens,
                      num_prefill_lookahead=num_prefill_lookahead)
        if why is not None:
            raise UnsupportedConfig(f"kvpool's drop-in for vLLM 0.33: {why}")
        self._vllm_partial = _vllm_partial_hits(kv_cache_config, hash_block_size,
                                                dcp_world_size, enable_caching)
        super().__init__(
            kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
            max_in_flight_tokens, enable_caching, use_eagle, log_stats, enable_kv_cache_events,
            dcp_world_size, pcp_world_size, metrics_collector, watermark)
        manager = self.manager
        if bool(manager.partial_hash_hits_enabled) != self._vllm_partial:
            raise UnsupportedConfig(
                f"vLLM 0.33 turns partial prefix hits {'on' if self._vllm_partial else 'off'} "
                f"for this model, kvpool does not: they would answer differently")
        # 0.33's scheduler records the lookup stats itself, at admission: the facade's
        # lookup must not (it records when it has a stats object).
        self._stats = manager.prefix_cache_stats
        manager.prefix_cache_stats = None
        # The 0.25 drop-in binds these facade methods on the instance; 0.33's differ. Its
        # allocate_slots is kvpool's as it stands: the facade takes skip_zeroing_group_ids,
        # and frees out-of-window blocks behind the processed tokens (vLLM 0.33's request
        # says how many are in flight).
        for name in ("get_computed_blocks", "get_num_common_prefix_blocks"):
            del self.__dict__[name]
        self._facade_lookup = manager.get_computed_blocks
        self.enable_kv_cache_events = enable_kv_cache_events
        self.mamba_shared_prefix_checkpoint = False  # refused when it would be on
        self.retained_hit_group_ids: tuple[int, ...] = ()
        groups = list(kv_cache_config.kv_cache_groups)
        self.coordinator = CoordinatorView(manager.coordinator, groups)
        self._zeroed = zeroed_group_ids(groups, VllmAttentionSpec, VllmCircularBufferSpec) \
            if getattr(kv_cache_config, "needs_kv_cache_zeroing", False) else frozenset()
        for g, single in enumerate(manager.coordinator.single_type_managers):
            # kvpool records fresh blocks of full attention only; 0.33 of every group above.
            single.zeroed_spec_types = (type(single.kv_cache_spec),) if g in self._zeroed \
                else ()
        # What take_new_block_ids drains each step: every group, and whether it is zeroed.
        singles = manager.coordinator.single_type_managers
        self._drains = tuple((single, g in self._zeroed) for g, single in enumerate(singles))
        # Two per-step calls that have nothing to say in most engines, answered at once
        # there: no block is recorded for zeroing when no group is zeroed and no partial
        # hit makes a private copy (which records its copy); no copy is queued without
        # partial hits (copy-on-write) or a Mamba group (its running state's copy).
        partial = manager.partial_hash_hits_enabled
        if not self._zeroed and not partial:
            self.take_new_block_ids = list  # type: ignore[method-assign]
        if not partial and not any(isinstance(m, MambaManager) for m in singles):
            self.take_kv_cache_block_copies = _no_copies  # type: ignore[method-assign]

        self._block_sizes = tuple(m.block_size for m in manager.coordinator.single_type_managers)
        # The tables estimate_cached_tokens reads (read, never copied): the prefix-cached
        # groups', cross-attention and encoder-only groups aside (as 0.33 picks them).
        self._estimated_tables = tuple(
            single.req_to_blocks for single, group in
            zip(manager.coordinator.single_type_managers, groups, strict=True)
            if group.kv_cache_spec.prefix_cacheable
            and not isinstance(group.kv_cache_spec, (VllmCrossAttentionSpec,
                                                     VllmEncoderOnlyAttentionSpec)))
        follow_vllm_033_rules(manager)  # Mamba states freed as 0.33 frees them

    def _policy_options(self) -> dict[str, Any]:
        return {"allow_partial_hash_hits": True} if self._vllm_partial else {}

    # -- lookup -------------------------------------------------------------------------

    def get_computed_blocks(self, request: Any,
                            max_cache_hit_length: int | None = None) -> tuple[Any, int, int]:
        """The hits, their tokens, and the shared-prefix boundary (module docstring)."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0, 0
        coordinator = self.manager.coordinator
        if max_cache_hit_length is None:
            blocks, num_tokens = self._facade_lookup(request)
        else:
            hits, num_tokens = coordinator.find_longest_cache_hit(request.block_hashes,
                                                                  max_cache_hit_length)
            blocks = self.create_kv_cache_blocks(hits)
        uncached = getattr(coordinator, "num_uncached_common_prefix_tokens", 0)
        if num_tokens and self.enable_kv_cache_events and \
                getattr(request, "kv_cache_report_mode", "incremental") == "full":
            pool = self.manager.block_pool
            for g, ids in enumerate(block_ids_of(blocks)):
                if ids:
                    pool.emit_cached_block_events(request, len(ids), self._block_sizes[g], g)
        return blocks, num_tokens, (num_tokens + uncached if uncached else 0)

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        if self._stats is None or not self.enable_caching or \
                request.skip_reading_prefix_cache:
            return
        self._stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                           preempted=request.num_preemptions > 0)

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        """The hits cut at an aligned token count (Mamba keeps what it has); pure."""
        out: list[Sequence[int]] = []
        for g, (ids, group) in enumerate(zip(block_ids_of(blocks),
                                             self.kv_cache_config.kv_cache_groups,
                                             strict=True)):
            spec = group.kv_cache_spec
            bs = self._block_sizes[g]
            if not getattr(spec, "prefix_cacheable", True) or num_computed_tokens % bs:
                if ids or num_computed_tokens % bs:
                    raise UnsupportedConfig(
                        f"truncate_computed_blocks: group {g} cannot be cut at "
                        f"{num_computed_tokens} tokens")
                out.append([])
                continue
            keep = num_computed_tokens // bs
            if type(spec).__name__ != "MambaSpec" and keep > len(ids):
                raise UnsupportedConfig(f"truncate_computed_blocks: group {g} holds "
                                        f"{len(ids)} blocks, fewer than {keep}")
            out.append(ids[:keep])
        return self.create_kv_cache_blocks(tuple(out))

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups  # 0.33: cascade attention is gone

    # -- zeroing, copies, connector hand-offs -------------------------------------------

    def take_new_block_ids(self) -> list[int]:
        """New blocks of the groups 0.33 zeroes (attention, not circular buffers), only when
        the model needs zeroing; drained every step either way."""
        out: list[int] = []
        for manager, zeroed in self._drains:
            ids = manager.take_new_block_ids()
            if zeroed:
                out.extend(ids)
        return out

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Blocks a failed connector load left unwritten, from ``start_token`` on, zeroed
        again (only where the model needs zeroing: then a connector is refused)."""
        if self._zeroed:
            raise UnsupportedConfig("record_blocks_for_zeroing: kvpool's drop-in for vLLM "
                                    "0.33 serves no KV connector on a model that needs zeroing")

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[BlockView]]:
        """Pending copy-on-write copies as vLLM's objects, and their endpoints (held until
        the scheduler gives them back with ``block_pool.free_blocks``)."""
        pairs = self.manager.coordinator.take_pending_copies()
        if not pairs:
            return [], []
        views = self._views
        copies = [KVCacheBlockCopy(src_block_id=src, dst_block_id=dst)
                  for src, dst, _ in pairs]
        return copies, [views[b] for src, dst, _ in pairs for b in (src, dst)]

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        return {}  # Mamba "align" states for a connector: connectors with Mamba are refused

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        return []  # Mamba partial tails for a connector: connectors with Mamba are refused

    def get_computed_blocks_for_connector(self, request: Any,
                                          max_cache_hit_length: int | None = None) -> Any:
        """The lookup a connector asking for divergent hybrid hits gets (refused at start;
        without a Mamba group 0.33 answers with the plain lookup)."""
        return (*self.get_computed_blocks(request, max_cache_hit_length), False)

    def estimate_cached_tokens(self, request: Any) -> int:
        """The fewest keyed tokens any prefix-cached attention group holds for the
        request (0.33's estimate: per group the longest keyed prefix its blocks cover;
        the scheduler asks once per request, at its first output)."""
        if not self._estimated_tables:
            return 0
        rid = request.request_id
        observe = self.manager.block_pool.observe()
        return min(observe.max_key_tokens(tables.get(rid, ()))
                   for tables in self._estimated_tables)

    # -- stats and release --------------------------------------------------------------

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        return self._stats

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        if not self.log_stats:
            return None
        stats, self._stats = self._stats, PrefixCacheStats()
        return stats

    def reset_prefix_cache(self) -> bool:
        if not self.manager.reset_prefix_cache():
            return False
        if self._stats is not None:
            self._stats.reset = True
        return True

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """0.33's keyword: the tokens processed (computed and no longer in flight)."""
        self.manager.remove_skipped_blocks(request_id, processed_computed_tokens,
                                           num_prompt_tokens)

    def pop_blocks_for_free(self, request: Any) -> list[BlockView]:
        """0.33 hands the tables over without null blocks (its pool skips them)."""
        views = self._views
        null = self.manager.block_pool.null_block
        return [views[b] for b in self.manager.pop_blocks_for_free(request) if b != null]


__all__ = ["CoordinatorView", "Kvpool033KVCacheManager"]
