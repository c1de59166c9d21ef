"""The fast policy: the generic policy's decisions, with the hot calls collapsed.

The generic policy (facade → coordinator → manager → pool, :mod:`kvpool.policy.facade`) is
the readable reference of this layer; each call crosses four layers of Python and re-checks
at each. An engine calls ``allocate_slots`` for every running request every step, and for
a decoding request almost every call changes nothing: the last block still has room and no
block filled. :class:`FastKVCacheManager` serves the configuration engines run most — one
full-attention (or MLA) group over the fast (Numba) pool — with:

* a **running request's step** in one function: the shrink checks, the block count, the
  budget, at most one ``get_new_blocks`` and one ``cache_full_blocks`` straight on the pool,
  and ``O(1)`` Python when nothing is needed (the common decode step);
* a **lookup** straight into the pool's one-kernel longest-hit scan;
* a **free** that pops the table and frees it tail first in one pool call.

State is the generic policy's own (the manager's ``req_to_blocks`` and ``num_cached_block``,
the facade's ``_live``), so every call not collapsed here — admissions with hits, external
tokens, the admission gate, copy-on-write, stats — runs the generic code on the same state,
and the two can never drift apart. What is collapsed is checked against the generic policy
by the stack differential machine (``kvpool check --layer stack``, tests/policy), step by
step, on every observable: tables, ref counts, queue order, keys, events.

Served (:func:`fast_policy_refusal` says why not otherwise): exactly one KV cache group whose
spec is :class:`~kvpool.policy.specs.FullAttentionSpec` or :class:`~kvpool.policy.specs.
MLAAttentionSpec` (EAGLE and DCP/PCP included), the ``"fast"`` backend, no partial hits.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from kvpool.policy.blocks import KVCacheBlocks
from kvpool.policy.facade import KVCacheManager
from kvpool.policy.specs import FullAttentionSpec, KVCacheConfig, MLAAttentionSpec

_SERVED_SPECS = (FullAttentionSpec, MLAAttentionSpec)
_INT = {int}
_SIGNATURE = inspect.signature(KVCacheManager.__init__)


def fast_policy_refusal(*args: Any, **kwargs: Any) -> str | None:
    """Why the fast policy does not serve :class:`KVCacheManager` built with these
    arguments, or ``None`` when it does (bad arguments are left to the constructor)."""
    try:
        bound = _SIGNATURE.bind(None, *args, **kwargs)
    except TypeError:
        return "the arguments do not bind (the constructor will say why)"
    bound.apply_defaults()
    a = bound.arguments
    config = a["kv_cache_config"]
    if not isinstance(config, KVCacheConfig):
        return "kv_cache_config is not a KVCacheConfig"
    if a["backend"] != "fast":
        return f"backend {a['backend']!r} (the fast policy drives the fast pool)"
    if len(config.kv_cache_groups) != 1:
        return f"{len(config.kv_cache_groups)} KV cache groups (it serves one)"
    spec = config.kv_cache_groups[0].kv_cache_spec
    if type(spec) not in _SERVED_SPECS:
        return f"{type(spec).__name__} (it serves FullAttentionSpec and MLAAttentionSpec)"
    if a["allow_partial_hash_hits"]:
        return "partial hash hits"
    return None


class FastKVCacheManager(KVCacheManager):
    """:class:`KVCacheManager` with the hot calls collapsed (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        refusal = fast_policy_refusal(*args, **kwargs)
        super().__init__(*args, **kwargs)
        if refusal is not None:
            from kvpool.errors import InvalidConfig

            raise InvalidConfig(f"the fast policy does not serve this configuration: {refusal}")
        manager = self.coordinator.single_type_managers[0]
        self._manager = manager
        self._tables: dict[str, list[int]] = manager.req_to_blocks
        self._num_cached: dict[str, int] = manager.num_cached_block
        self._block_size: int = manager.block_size
        self._zeroed = type(manager.kv_cache_spec) in manager.zeroed_spec_types
        self._eagle = 0 in self.coordinator.eagle_group_ids

    def __repr__(self) -> str:
        spec = type(self._manager.kv_cache_spec).__name__
        return (f"FastKVCacheManager(policy=fast, group={spec}, block_size={self._block_size}, "
                f"blocks={self.block_pool.num_gpu_blocks})")

    # -- lookup -------------------------------------------------------------------------

    def get_computed_blocks(self, request: Any) -> tuple[KVCacheBlocks, int]:
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        bs = self._block_size
        limit = (request.num_tokens - 1) // bs
        hits: list[int] = []
        if limit > 0:
            hits = self.block_pool.find_longest_cache_hit(request.block_hashes[:limit], [0])[0]
            if self._eagle and hits:
                hits.pop()
        num_tokens = len(hits) * bs
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.record(request.num_tokens, num_tokens,
                                           request.num_preemptions > 0)
        if not hits:
            return self.empty_kv_cache_blocks, 0
        return self.make_blocks((hits,)), num_tokens

    # -- allocation ---------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> Any:
        """A running request's step or a plain admission here; anything else (connector
        loads, the admission gate, every call that must be refused) in the generic policy."""
        rid = request.request_id
        seen = self._live.get(rid)
        computed = request.num_computed_tokens
        num_tokens = request.num_tokens
        if (num_external_computed_tokens or num_encoder_tokens or full_sequence_must_fit
                or type(num_new_tokens) is not int or num_new_tokens <= 0
                or type(num_lookahead_tokens) is not int or num_lookahead_tokens < 0
                or type(reserved_blocks) is not int or reserved_blocks < 0
                or type(num_new_computed_tokens) is not int
                or type(num_external_computed_tokens) is not int
                or type(num_encoder_tokens) is not int or type(computed) is not int):
            return self._generic_allocate_slots(
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                has_scheduled_reqs)
        hits: Sequence[int] | None = None
        if new_computed_blocks is not None and \
                new_computed_blocks is not self.empty_kv_cache_blocks:
            hits = self._admissible_hits(rid, seen, new_computed_blocks,
                                         num_new_computed_tokens)
            if hits is None:  # not an admission this path takes: the generic one decides
                return self._generic_allocate_slots(
                    request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                    num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                    num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                    has_scheduled_reqs)
        elif num_new_computed_tokens or computed < 0 or seen is not None and (
                computed < seen[1] or num_tokens < seen[0]):
            return self._generic_allocate_slots(  # refused there, with the generic message
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                has_scheduled_reqs)
        max_len = self.max_model_len
        local = computed + num_new_computed_tokens
        total = local if local < max_len else max_len
        main = total + num_new_tokens
        need = main + num_lookahead_tokens
        if need > max_len:
            need = max_len
        bs = self._block_size
        table = self._tables.get(rid)
        held = len(table) if table is not None else 0
        num_new = -(-need // bs) - held - (len(hits) if hits else 0)
        if num_new < 0:
            num_new = 0
        watermark = 0
        if has_scheduled_reqs and request.status in self.watermark_statuses:
            watermark = self.watermark_blocks
        pool = self.block_pool
        # The budget; hits that are free cached candidates leave the free count when
        # touched. The free count is only read when something could exceed it.
        evictable = self._num_evictable(hits) if hits else 0
        if (num_new or watermark or reserved_blocks or evictable) and \
                num_new + evictable + watermark > pool.get_num_free_blocks() - reserved_blocks:
            return None
        if hits is not None:  # install the hits: a ref each, counted as cached
            if hits and self.enable_caching:
                pool.touch(hits)
            table = self._tables[rid] = list(hits)
            self._num_cached[rid] = len(table)
        elif table is None:
            table = self._tables[rid] = []
        num_full = 0
        num_cached = 0
        if self.enable_caching and not delay_cache_blocks:
            num_full = (main if main < num_tokens else num_tokens) // bs
            num_cached = self._num_cached.get(rid, 0)
        new: list[int] = []
        if num_full > num_cached:
            if num_new:
                new = pool.allocate_and_cache(request, table, num_new, num_cached, num_full,
                                              bs, 0)
                table.extend(new)
            else:
                pool.cache_full_blocks(request, table, num_cached, num_full, bs, 0)
            self._num_cached[rid] = num_full
        elif num_new:
            new = pool.get_new_blocks(num_new)
            table.extend(new)
        if new and self._zeroed:
            self._manager.new_block_ids.extend(new)
        self._live[rid] = (num_tokens, computed)
        if not new:
            return self.empty_kv_cache_blocks
        return self.make_blocks((new,))

    def _admissible_hits(self, rid: str, seen: Any, hit_object: Any,
                         num_new_computed_tokens: int) -> Sequence[int] | None:
        """The hit ids of a new request's admission when they are plainly valid (ints of
        this pool, none null, covering exactly the computed tokens) and the request holds
        nothing; ``None`` for anything else (the generic policy then decides or refuses)."""
        if seen is not None or rid in self._tables or rid in self._num_cached:
            return None
        ids = self.hit_block_ids(hit_object)
        if ids is None or len(ids) != 1:
            return None
        hits = ids[0]
        if len(hits) * self._block_size != num_new_computed_tokens:
            return None
        if hits:
            if type(hits) is not list or set(map(type, hits)) != _INT or \
                    min(hits) <= 0 or max(hits) >= self.block_pool.num_gpu_blocks:
                return None
            if not self.enable_caching:
                return None
        return hits

    def _num_evictable(self, hits: Sequence[int]) -> int:
        """How many hits are free cached candidates (ref 0): a touch takes each out of the
        free count (``pool_access.num_evictable``, without the null block: hits have none)."""
        return self.block_pool.observe().ref_cnts(hits).count(0)  # type: ignore[no-any-return]

    def _generic_allocate_slots(self, *args: Any) -> Any:
        return super().allocate_slots(*args)

    # -- release ------------------------------------------------------------------------

    def free(self, request: Any) -> None:
        rid = request.request_id
        if self._live.pop(rid, None) is None:
            return
        self._num_cached.pop(rid, None)
        table = self._tables.pop(rid, None)
        if table:
            table.reverse()
            self.block_pool.free_blocks(table)

    def get_blocks(self, request_id: str) -> Any:
        table = self._tables.get(request_id)
        if not table:
            return self.empty_kv_cache_blocks
        return self.make_blocks((list(table),))

    # -- queries ------------------------------------------------------------------------

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Leading blocks every tracked request holds (ref count = tracked requests); the
        first block usually settles it, so only it is read unless it is shared by all."""
        table = self._tables.get(running_request_id)
        if not table:
            return [0]
        tracked = len(self._tables)
        observer = self.block_pool.observe()
        if observer.ref_cnts(table[:1])[0] != tracked:
            return [0]
        common = 0
        for count in observer.ref_cnts(table):
            if count != tracked:
                break
            common += 1
        return [common]


__all__ = ["FastKVCacheManager", "fast_policy_refusal"]
