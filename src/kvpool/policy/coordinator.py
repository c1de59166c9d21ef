"""Coordinators: one pool, one manager per KV cache group (BEHAVIOUR.md §9).

A coordinator owns exactly one block pool shared by all groups and fans every manager call
out in group order. The three kinds differ only in the prefix-cache lookup:

* :class:`KVCacheCoordinatorNoPrefixCache` — caching off: no hits, any number of groups;
* :class:`UnitaryKVCacheCoordinator` — one group: its manager's lookup, aligned to its bs;
* :class:`~kvpool.policy.hybrid.HybridKVCacheCoordinator` — several specs: a fixed-point
  search for one hit length every group can serve.

:func:`get_kv_cache_coordinator` picks one. Every configuration vLLM only asserts (or fails on
later) is rejected here, at construction, with an :class:`InvalidConfig` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from kvpool._compat import moved_names
from kvpool.backends import make_pool
from kvpool.errors import InvalidArgument, InvalidConfig
from kvpool.policy.cross_attention import CrossAttentionManager
from kvpool.policy.manager import SingleTypeKVCacheManager
from kvpool.policy.registry import make_manager
from kvpool.policy.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    SlidingWindowSpec,
)

PoolFactory = Callable[..., Any]
"""``factory(num_blocks, enable_caching=, hash_block_size=, enable_kv_cache_events=,
metrics_collector=)`` → a :class:`kvpool.protocol.BlockPool`."""


def _require_int(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidConfig(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def validate_retention_interval(retention_interval: int | None, scheduler_block_size: int,
                                kv_cache_config: KVCacheConfig) -> None:
    """A retention interval needs a sliding-window or Mamba group and must be a
    non-negative multiple of ``scheduler_block_size`` (the group check comes first)."""
    if retention_interval is None:
        return
    if not any(isinstance(g.kv_cache_spec, (SlidingWindowSpec, MambaSpec))
               for g in kv_cache_config.kv_cache_groups):
        raise InvalidConfig(
            "retention_interval (VLLM_PREFIX_CACHE_RETENTION_INTERVAL) is set but this model "
            "has no sliding-window or Mamba KV cache group, so retention has no effect")
    if not isinstance(retention_interval, int) or isinstance(retention_interval, bool) or \
            retention_interval < 0 or retention_interval % scheduler_block_size:
        raise InvalidConfig(
            f"retention_interval ({retention_interval!r}) must be non-negative and a multiple "
            f"of scheduler_block_size ({scheduler_block_size})")


class KVCacheCoordinator:
    """Fan-out over the managers of one shared pool (subclasses add the lookup)."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        max_num_batched_tokens: int,
        use_eagle: bool,
        enable_caching: bool,
        enable_kv_cache_events: bool,
        dcp_world_size: int,
        pcp_world_size: int,
        scheduler_block_size: int,
        hash_block_size: int,
        metrics_collector: Any = None,
        *,
        backend: str | PoolFactory = "reference",
        retention_interval: int | None = None,
        allow_partial_hash_hits: bool = False,
    ) -> None:
        if not isinstance(kv_cache_config, KVCacheConfig):
            raise InvalidConfig(f"kv_cache_config must be a KVCacheConfig, got {kv_cache_config!r}")
        _require_int("max_model_len", max_model_len, 1)
        _require_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        hbs = _require_int("hash_block_size", hash_block_size, 1)
        sbs = _require_int("scheduler_block_size", scheduler_block_size, 1)
        dcp = _require_int("dcp_world_size", dcp_world_size, 1)
        pcp = _require_int("pcp_world_size", pcp_world_size, 1)
        groups = kv_cache_config.kv_cache_groups
        if sbs % hbs or any(sbs % g.kv_cache_spec.block_size for g in groups):
            raise InvalidConfig(
                f"scheduler_block_size ({sbs}) must be a multiple of hash_block_size ({hbs}) "
                f"and of every group's block_size "
                f"({[g.kv_cache_spec.block_size for g in groups]})")
        self._validate_groups(kv_cache_config, enable_caching, dcp * pcp, use_eagle, sbs)
        validate_retention_interval(retention_interval, sbs, kv_cache_config)
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = bool(enable_caching)
        self.scheduler_block_size = sbs
        self.hash_block_size = hbs
        self.retention_interval = retention_interval
        self.allow_partial_hash_hits = bool(allow_partial_hash_hits)
        #: Whether lookups may end inside a block (§10.4); only the hybrid coordinator
        #: turns it on, for the configurations vLLM 0.33 allows.
        self.partial_hash_hits = False
        factory = (lambda n, **kw: make_pool(n, backend=backend, **kw)) \
            if isinstance(backend, str) else backend
        self.block_pool = factory(
            kv_cache_config.num_blocks, enable_caching=self.enable_caching,
            hash_block_size=hbs, enable_kv_cache_events=bool(enable_kv_cache_events),
            metrics_collector=metrics_collector)
        self.eagle_group_ids = {i for i, g in enumerate(groups) if g.is_eagle_group}
        if use_eagle and not self.eagle_group_ids:
            self.eagle_group_ids = set(range(len(groups)))
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            make_manager(g.kv_cache_spec, max_num_batched_tokens, max_model_len,
                         block_pool=self.block_pool, enable_caching=self.enable_caching,
                         kv_cache_group_id=i, dcp_world_size=dcp, pcp_world_size=pcp,
                         scheduler_block_size=sbs)
            for i, g in enumerate(groups))
        #: Whether any group frees blocks as its request advances (windows, Mamba states):
        #: only then do a request's tokens in flight change a step.
        self.frees_skipped_blocks = any(
            type(m).remove_skipped_blocks is not SingleTypeKVCacheManager.remove_skipped_blocks
            or type(m).get_num_skipped_tokens
            is not SingleTypeKVCacheManager.get_num_skipped_tokens
            for m in self.single_type_managers)

    @staticmethod
    def _validate_groups(config: KVCacheConfig, caching: bool, parallel: int,
                         use_eagle: bool, sbs: int) -> None:
        """What vLLM asserts only when a lookup or a cache call first runs."""
        if not caching:
            return
        eagle_marked = any(g.is_eagle_group for g in config.kv_cache_groups)
        for i, g in enumerate(config.kv_cache_groups):
            spec, field = g.kv_cache_spec, f"kv_cache_groups[{i}].kv_cache_spec"
            if isinstance(spec, CrossAttentionSpec):
                raise InvalidConfig(
                    f"{field}: cross attention cannot be prefix-cached; build with "
                    f"enable_caching=False")
            if parallel > 1 and isinstance(
                    spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec)):
                raise InvalidConfig(
                    f"dcp_world_size/pcp_world_size > 1 is not supported by {field} "
                    f"({type(spec).__name__})")
            if isinstance(spec, ChunkedLocalAttentionSpec):
                if g.is_eagle_group or (use_eagle and not eagle_marked):
                    raise InvalidConfig(
                        f"{field}: chunked local attention does not support EAGLE "
                        f"(kv_cache_groups[{i}].is_eagle_group / use_eagle)")
                if len(config.kv_cache_groups) > 1 and spec.block_size != sbs:
                    raise InvalidConfig(
                        f"{field}: chunked local attention needs block_size "
                        f"({spec.block_size}) == scheduler_block_size ({sbs})")

    # -- fan-out ------------------------------------------------------------------------

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[Sequence[int]],
        num_encoder_tokens: int, total_computed_tokens: int, num_tokens_main_model: int,
        apply_admission_cap: bool = False, num_local_computed_tokens: int | None = None,
    ) -> int:
        """Sum over groups; cross attention is sized by the encoder tokens."""
        total = 0
        for i, manager in enumerate(self.single_type_managers):
            if isinstance(manager, CrossAttentionManager):
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, [], 0, num_encoder_tokens,
                    apply_admission_cap=apply_admission_cap)
            else:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_tokens, new_computed_blocks[i], total_computed_tokens,
                    num_tokens_main_model, apply_admission_cap=apply_admission_cap,
                    num_local_computed_tokens=num_local_computed_tokens)
        return total

    def take_pending_copies(self) -> list[tuple[int, int, int]]:
        """Every group's queued copy-on-write pairs as (source, dst, group id), groups in
        order, each in the order made."""
        return [(src, dst, g) for g, m in enumerate(self.single_type_managers)
                for src, dst in m.take_pending_copies()]

    def is_tracked(self, request_id: str) -> bool:
        """Whether any manager has installed hits for the request (it is running)."""
        return any(request_id in m.num_cached_block for m in self.single_type_managers)

    def allocate_new_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[Sequence[int]],
        num_local_computed_tokens: int, num_external_computed_tokens: int,
        skip_zeroing_group_ids: Collection[int] = (),
    ) -> None:
        """Phase 1: every group touches its hits; phase 2: external blocks. Two phases so
        one group's allocation cannot evict another group's untouched hits (§11.25). The
        external blocks of ``skip_zeroing_group_ids`` are not recorded for zeroing (a
        connector's load writes them)."""
        if self.is_tracked(request_id):
            if any(new_computed_blocks):
                raise InvalidArgument(f"request {request_id!r} is running; it takes no hits")
            return
        for i, manager in enumerate(self.single_type_managers):
            manager.add_local_computed_blocks(request_id, new_computed_blocks[i],
                                              num_local_computed_tokens,
                                              num_external_computed_tokens)
        if num_external_computed_tokens > 0:
            for g, manager in enumerate(self.single_type_managers):
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens,
                    record_for_zeroing=g not in skip_zeroing_group_ids)

    def check_new_blocks(self, request_id: str, num_tokens_main_model: int) -> None:
        """Every group's refusal of the coming allocation, before any group (or the skipped
        blocks' removal) changes anything: a refused step leaves every table as it was."""
        for m in self.single_type_managers:
            m.check_new_blocks(request_id, num_tokens_main_model)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int,
                            num_encoder_tokens: int = 0) -> tuple[list[int], ...]:
        return tuple(
            m.allocate_new_blocks(
                request_id,
                num_encoder_tokens if isinstance(m, CrossAttentionManager) else num_tokens,
                num_tokens_main_model)
            for m in self.single_type_managers)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.cache_blocks(request, num_computed_tokens, self.retention_interval)

    def free(self, request_id: str) -> None:
        """Each group in order, each table tail first."""
        for manager in self.single_type_managers:
            manager.free(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        """Every group's table, concatenated in group order (freed later, reversed)."""
        blocks: list[int] = []
        for manager in self.single_type_managers:
            blocks.extend(manager.pop_blocks_for_free(request_id))
        return blocks

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [m.get_num_common_prefix_blocks(running_request_id)
                for m in self.single_type_managers]

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, total_computed_tokens, num_prompt_tokens)

    def get_blocks(self, request_id: str) -> tuple[list[int], ...]:
        return tuple(list(m.req_to_blocks.get(request_id) or [])
                     for m in self.single_type_managers)

    def new_step_starts(self) -> None:
        for manager in self.single_type_managers:
            manager.new_step_starts()

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes],
                               max_cache_hit_length: int) -> tuple[tuple[list[int], ...], int]:
        raise NotImplementedError


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Caching off: managers built without caching, no lookups, no common prefix."""

    def __init__(self, kv_cache_config: KVCacheConfig, max_model_len: int,
                 max_num_batched_tokens: int, use_eagle: bool, enable_kv_cache_events: bool,
                 dcp_world_size: int, pcp_world_size: int, scheduler_block_size: int,
                 hash_block_size: int, metrics_collector: Any = None, **kwargs: Any) -> None:
        super().__init__(kv_cache_config, max_model_len, max_num_batched_tokens, use_eagle,
                         False, enable_kv_cache_events, dcp_world_size, pcp_world_size,
                         scheduler_block_size, hash_block_size, metrics_collector, **kwargs)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * len(self.single_type_managers)

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes],
                               max_cache_hit_length: int) -> tuple[tuple[list[int], ...], int]:
        return tuple([] for _ in self.single_type_managers), 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One group: the manager's own lookup, aligned to its (DCP/PCP-scaled) block size."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        groups = self.kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise InvalidConfig(f"kv_cache_groups: the unitary coordinator takes exactly one "
                                f"group, got {len(groups)}")
        manager = self.single_type_managers[0]
        self.kv_cache_spec = groups[0].kv_cache_spec
        self.block_size = manager.block_size
        if self.enable_caching and self.hash_block_size != self.block_size:
            raise InvalidConfig(
                f"hash_block_size ({self.hash_block_size}) must equal the group's block size "
                f"({self.block_size}) for a single-group model with caching on")
        manager.use_eagle = 0 in self.eagle_group_ids

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes],
                               max_cache_hit_length: int) -> tuple[tuple[list[int], ...], int]:
        manager = self.single_type_managers[0]
        hits = type(manager).find_longest_cache_hit(
            block_hashes, max_cache_hit_length, [0], self.block_pool, self.kv_cache_spec,
            0 in self.eagle_group_ids, self.block_size, manager.dcp_world_size,
            manager.pcp_world_size)
        return hits, len(hits[0]) * self.block_size


__getattr__ = moved_names(__name__, {
    "get_kv_cache_coordinator": "kvpool.policy.coordinator_factory"})

__all__ = [
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "PoolFactory",
    "UnitaryKVCacheCoordinator",
    "validate_retention_interval",
]
