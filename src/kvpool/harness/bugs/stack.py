"""Planted policy-layer bugs: each must be caught by the whole-stack machine.

A planted stack is kvpool's facade on the reference pool with one method of one layer
replaced by a broken twin, run beside the clean stacks; the machine must report a divergence
or a broken invariant within the default budget. ``kvpool check --layer stack --planted
NAME`` runs one; ``tests/policy/test_stack_planted.py`` runs them all.

Each entry: the configuration that exercises the code path, a one-line description, and the
patch (applied to one manager instance only, never to a class).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpool.harness.stack.configs import CONFIGURATIONS, StackConfiguration
from kvpool.policy.facade import KVCacheManager
from kvpool.policy.pool_access import num_evictable


def _managers(m: KVCacheManager) -> tuple[Any, ...]:
    return m.coordinator.single_type_managers


def _independent_lookups(m: KVCacheManager) -> None:
    coordinator: Any = m.coordinator  # a hybrid coordinator, patched

    def broken(block_hashes: Any, max_len: int) -> Any:
        # Wrong fixed point: every spec group looked up on its own at the cap, then the
        # minimum taken — a later group never sees (or re-checks) the shrunk length.
        hits: list[list[int]] = [[] for _ in _managers(m)]
        lengths = []
        for sg in coordinator.attention_groups:
            result = coordinator._lookup(sg, block_hashes, max_len, sg.use_eagle)
            lengths.append(len(result[0]) * sg.spec.block_size)
            for gid, blocks in zip(sg.group_ids, result, strict=True):
                hits[gid] = blocks
        hit = min(lengths)
        for sg in coordinator.attention_groups:
            if sg.is_full_attention:
                for gid in sg.group_ids:
                    del hits[gid][hit // sg.spec.block_size:]
        return tuple(hits), hit

    coordinator.find_longest_cache_hit = broken


def _lookup_aligned_to_own_block_size(m: KVCacheManager) -> None:
    coordinator: Any = m.coordinator  # a hybrid coordinator, patched

    def broken(self: Any, sg: Any, block_hashes: Any, max_length: int, drop: bool) -> Any:
        return sg.manager_cls.find_longest_cache_hit(
            self._hashes(sg.spec, block_hashes), max_length, sg.group_ids, self.block_pool,
            sg.spec, drop, sg.spec.block_size)  # should be scheduler_block_size

    coordinator._lookup = types.MethodType(broken, coordinator)


def _touch_after_allocating(m: KVCacheManager) -> None:
    for mgr in _managers(m):
        pending: list[list[int]] = []
        pool = mgr.block_pool
        add_local, allocate = mgr.add_local_computed_blocks, mgr.allocate_new_blocks

        def add(rid: str, hits: Any, local: int, external: int, add_local: Any = add_local,
                pending: list = pending, pool: Any = pool) -> None:
            touch = pool.touch
            pool.touch = lambda blocks: pending.append(list(blocks))
            try:
                add_local(rid, hits, local, external)
            finally:
                pool.touch = touch

        def alloc(rid: str, n: int, main: int, allocate: Any = allocate,
                  pending: list = pending, pool: Any = pool) -> list[int]:
            new = allocate(rid, n, main)
            while pending:
                pool.touch(pending.pop(0))
            return new

        mgr.add_local_computed_blocks, mgr.allocate_new_blocks = add, alloc


def _free_in_forward_order(m: KVCacheManager) -> None:
    for mgr in _managers(m):
        mgr.free = lambda rid, mgr=mgr: mgr.block_pool.free_blocks(mgr.pop_blocks_for_free(rid))


def _skipped_block_not_nulled(m: KVCacheManager) -> None:
    for mgr in _managers(m):
        def broken(rid: str, first: int, last: int, mgr: Any = mgr) -> None:
            table = mgr.req_to_blocks.get(rid)
            if table is None or first >= last:
                return
            freed = [b for b in table[first:min(last, len(table))][::-1]
                     if b != mgr.null_block]
            if freed:
                mgr.block_pool.free_blocks(freed)  # freed, but the table still names them

        mgr._remove_blocks_in_range = broken


def _evictable_hits_not_counted(m: KVCacheManager) -> None:
    for mgr in _managers(m):
        original = mgr.get_num_blocks_to_allocate

        def broken(rid: str, n: int, hits: Any, *args: Any, original: Any = original,
                   mgr: Any = mgr, **kw: Any) -> int:
            return original(rid, n, hits, *args, **kw) - num_evictable(mgr.block_pool, hits)

        mgr.get_num_blocks_to_allocate = broken


def _eagle_block_kept(m: KVCacheManager) -> None:
    m.coordinator.eagle_group_ids = set()


def _mamba_same_step_hit_allowed(m: KVCacheManager) -> None:
    for mgr in _managers(m):
        if hasattr(mgr, "cached_blocks_this_step"):
            original = mgr.cache_blocks

            def broken(request: Any, n: int, interval: Any = None, original: Any = original,
                       mgr: Any = mgr) -> None:
                original(request, n, interval)
                mgr.cached_blocks_this_step.clear()

            mgr.cache_blocks = broken


def _hit_reaches_last_token(m: KVCacheManager) -> None:
    coordinator: Any = m.coordinator  # patched
    original = coordinator.find_longest_cache_hit
    coordinator.find_longest_cache_hit = lambda hashes, max_len: original(hashes, max_len + 1)


def _copy_source_released_early(m: KVCacheManager) -> None:
    for mgr in _managers(m):
        original = mgr.apply_copy_on_write

        def broken(rid: str, position: int, source: int, dst: int,
                   original: Any = original, mgr: Any = mgr) -> None:
            original(rid, position, source, dst)
            mgr.block_pool.free_blocks([source])  # before the GPU layer has copied it

        mgr.apply_copy_on_write = broken


def _copy_dst_without_retention(m: KVCacheManager) -> None:
    for mgr in _managers(m):
        def broken(rid: str, position: int, source: int, dst: int, mgr: Any = mgr) -> None:
            mgr.req_to_blocks[rid][position] = dst
            mgr._pending_copies.append((source, dst))  # no extra ref: table only

        mgr.apply_copy_on_write = broken


def _running_copy_keeps_key_on_source(m: KVCacheManager) -> None:
    for mgr in _managers(m):
        if hasattr(mgr, "_copy_running_state"):
            def broken(source: int, dst: int, mgr: Any = mgr) -> None:
                # The entry stays on the block the owner overwrites next.
                mgr._pending_copies.append((source, dst))
                mgr.block_pool.touch([source])

            mgr._copy_running_state = broken


def _running_copy_rewrites_table(m: KVCacheManager) -> None:
    for mgr in _managers(m):
        if hasattr(mgr, "_allocated_block_reqs"):
            original = mgr.allocate_new_blocks

            def broken(rid: str, *args: Any, original: Any = original, mgr: Any = mgr) -> Any:
                if rid in mgr._partial_hit_reqs:  # take the new-request path
                    mgr._allocated_block_reqs.discard(rid)
                return original(rid, *args)

            mgr.allocate_new_blocks = broken


# -- the same rules, broken in the fast policy's own code (kvpool.policy.fast) -------------

def _fast_free_in_forward_order(m: Any) -> None:
    def broken(request: Any) -> None:
        rid = request.request_id
        if m._live.pop(rid, None) is None:
            return
        m._num_cached.pop(rid, None)
        table = m._tables.pop(rid, None)
        if table:
            m.block_pool.free_blocks(table)  # head first: the prefix is evicted first

    m.free = broken


def _fast_hit_reaches_last_token(m: Any) -> None:
    def broken(request: Any) -> Any:
        if not m.enable_caching or request.skip_reading_prefix_cache:
            return m.empty_kv_cache_blocks, 0
        bs = m._block_size
        limit = request.num_tokens // bs  # should be (num_tokens - 1) // bs
        hits = m.block_pool.find_longest_cache_hit(request.block_hashes[:limit], [0])[0] \
            if limit else []
        if m._eagle and hits:
            hits.pop()
        if not hits:
            return m.empty_kv_cache_blocks, 0
        return m.make_blocks((hits,)), len(hits) * bs

    m.get_computed_blocks = broken


def _fast_touch_after_allocating(m: Any) -> None:
    class Deferred:
        """The pool, with each touch held back until the next allocation has run."""

        pending: list[list[Any]]

        def __init__(self, pool: Any) -> None:
            self.pool, self.pending = pool, []

        def touch(self, blocks: Any) -> None:
            self.pending.append(list(blocks))

        def _then_touch(self, result: Any) -> Any:
            while self.pending:
                self.pool.touch(self.pending.pop(0))
            return result

        def get_new_blocks(self, n: int) -> Any:
            return self._then_touch(self.pool.get_new_blocks(n))

        def allocate_and_cache(self, *args: Any) -> Any:
            return self._then_touch(self.pool.allocate_and_cache(*args))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.pool, name)

    pool = Deferred(m.block_pool)
    original = m.allocate_slots

    def broken(*args: Any, **kwargs: Any) -> Any:
        real, m.block_pool = m.block_pool, pool
        try:
            return original(*args, **kwargs)
        finally:
            m.block_pool = real
            pool._then_touch(None)

    m.allocate_slots = broken


def _fast_evictable_hits_not_counted(m: Any) -> None:
    m._num_evictable = lambda hits: 0


def _fast_zeroing_ids_not_recorded(m: Any) -> None:
    # The blocks it allocates itself never reach take_new_block_ids.
    m._note_new_blocks = lambda fresh: None


def _fast_idle_step_ignores_the_window(m: Any) -> None:
    # The idle test (and its bound) forgets that a sliding window may have a block to null.
    m._groups = [g._replace(skipped_tokens=lambda tokens: 0, fewest_skipping=None)
                 for g in m._groups]


def _fast_hybrid_window_bound_one_block_late(m: Any) -> None:
    # The bound of the window's next free (FastHybridKVCacheManager._record) is computed
    # for one block more than the window holds null.
    m._groups = [g._replace(fewest_skipping=None if g.fewest_skipping is None else
                            lambda n, fewest=g.fewest_skipping: fewest(n + 1))
                 for g in m._groups]


def _fast_hybrid_room_one_block_more(m: Any) -> None:
    # The hybrid idle step's room bound counts a block more than the shortest table holds.
    record = m._record

    def broken(rid: str, num_tokens: int, computed: int) -> None:
        record(rid, num_tokens, computed)
        seen = m._live[rid]
        m._live[rid] = (*seen[:2], seen[2] + m._groups[0].block_size, *seen[3:])

    m._record = broken


def _fast_free_hands_tables_over_head_first(m: Any) -> None:
    # A finished request's tables reach the pool head first, not tail first.
    free_table = m._free_table
    m._free_table = lambda table: free_table(table[::-1])


def _fast_hybrid_one_call_frees_head_first(m: Any) -> None:
    # The one-call step hands each window's skipped blocks over head first, not tail first.
    group_step = m._group_step
    m._group_step = lambda releases, n, reserve, writes: group_step(
        [ids[::-1] for ids in releases], n, reserve, writes)


def _fast_hybrid_one_call_new_blocks_reversed(m: Any) -> None:
    # The one-call step deals the new blocks out to the groups from the wrong end.
    group_step = m._group_step

    def broken(*args: Any) -> Any:
        new = group_step(*args)
        return None if new is None else new[::-1]

    m._group_step = broken


def _fast_hybrid_admission_keys_a_block_short(m: Any) -> None:
    # The collapsed admission's one-call take-and-key leaves each group's last full block
    # unkeyed while the keyed count says it is keyed.
    pool = m.block_pool
    take_and_key = pool.take_and_key

    def broken(request: Any, table: Any, n: int, num_cached: int, num_full: int,
               block_size: int, group: int) -> Any:
        return take_and_key(request, table, n, num_cached, max(num_cached + 1, num_full - 1),
                            block_size, group)

    pool.take_and_key = broken


def _fast_step_frees_the_window_after_allocating(m: Any) -> None:
    # The collapsed step sizes and allocates before the windows' skipped blocks are freed:
    # its budget misses the blocks the generic step frees first.
    step = m._step

    def broken(request: Any, computed: int, *args: Any) -> Any:
        managers = m._managers
        for manager in managers:
            manager.remove_skipped_blocks = lambda *a, **k: None  # shadows the method
        try:
            result = step(request, computed, *args)
        finally:
            for manager in managers:
                del manager.remove_skipped_blocks
        total = min(computed, m.max_model_len)
        for manager in managers:
            manager.remove_skipped_blocks(request.request_id, total, request.num_prompt_tokens)
        return result

    m._step = broken


def _windows_free_behind_computed_tokens(m: Any) -> None:
    # Tokens in flight ignored: windows free behind every computed token, including those
    # whose step is still running (vLLM 0.25.1's rule; 0.33 frees behind processed ones).
    allocate = m.allocate_slots

    def broken(request: Any, *args: Any, **kwargs: Any) -> Any:
        saved, request.num_in_flight_tokens = request.num_in_flight_tokens, 0
        try:
            return allocate(request, *args, **kwargs)
        finally:
            request.num_in_flight_tokens = saved

    m.allocate_slots = broken


def _fast_step_frees_behind_computed_tokens(m: Any) -> None:
    # The collapsed step's own copy of the rule, broken: it frees behind the computed
    # tokens (session 15's bug, found inside vLLM 0.33 with async scheduling).
    step = m._step

    def broken(request: Any, computed: int, total: int, main: int, need: int,
               num_tokens: int, in_flight: int, *rest: Any) -> Any:
        return step(request, computed, total, main, need, num_tokens, 0, *rest)

    m._step = broken


class _Everything(dict):  # type: ignore[type-arg]
    """A keyed-count table that says every block is keyed already."""

    def get(self, key: Any, default: Any = None) -> int:
        return 1 << 62


def _fast_idle_step_ignores_unaligned_keys(m: Any) -> None:
    m._groups = [g._replace(num_cached=_Everything()) for g in m._groups]


def _fast_admission_gate_skipped(m: Any) -> None:
    original = m._allocate

    def broken(request: Any, *args: Any) -> Any:
        changed = list(args)
        changed[7] = False  # full_sequence_must_fit: the gate is never checked
        return original(request, *changed)

    m._allocate = broken


def _fast_eagle_block_kept(m: Any) -> None:
    m._eagle = False


def _fast_step_ignores_watermark(m: Any) -> None:
    m.watermark_statuses = ()


def _shifted_idle_bounds(m: Any, room_blocks: int, key_blocks: int) -> None:
    # The bounds the idle step reads (FastKVCacheManager._record), recorded too high by
    # whole blocks.
    record = m._record

    def broken(rid: str, num_tokens: int, computed: int, held: int, keyed: int) -> None:
        record(rid, num_tokens, computed, held + room_blocks, keyed + key_blocks)

    m._record = broken


def _fast_idle_room_one_block_more(m: Any) -> None:
    _shifted_idle_bounds(m, 1, 0)


def _fast_idle_key_bound_one_block_late(m: Any) -> None:
    _shifted_idle_bounds(m, 0, 1)


def _fast_fused_step_skips_the_key(m: Any) -> None:
    # The step across a block boundary takes its block but never keys the one that filled
    # (the policy still counts it keyed).
    class KeyLess:
        def __init__(self, pool: Any) -> None:
            self.pool = pool

        def take_and_key(self, request: Any, blocks: Any, num_blocks: int, *rest: Any) -> Any:
            return self.pool.get_new_blocks(num_blocks)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.pool, name)

    m.block_pool = KeyLess(m.block_pool)


def _fast_step_caches_drafts(m: Any) -> None:
    original = m.allocate_slots

    def broken(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        result = original(request, num_new_tokens, *args, **kwargs)
        rid = request.request_id
        lookahead = kwargs.get("num_lookahead_tokens", args[2] if len(args) > 2 else 0)
        if result is not None and lookahead and rid in m._live:
            # Keys the blocks the drafts fill, as if they were verified tokens.
            full = min(request.num_computed_tokens + num_new_tokens + lookahead,
                       len(request.block_hashes) * m._block_size) // m._block_size
            cached = m._num_cached.get(rid, 0)
            table = m._tables.get(rid, [])
            if full > cached and full <= len(table):
                m.block_pool.cache_full_blocks(request, table, cached, full, m._block_size, 0)
                m._num_cached[rid] = full
        return result

    m.allocate_slots = broken


@dataclass(frozen=True)
class PlantedPolicyBug:
    """A broken twin of one policy method, and the configuration that reaches it.

    ``policy`` is the policy planted into: ``"generic"`` (the facade on the reference pool)
    or ``"fast"`` (:class:`kvpool.policy.fast.FastKVCacheManager` on the fast pool)."""

    name: str
    configuration: str
    bug: str
    install: Callable[[Any], None]
    policy: str = "generic"

    def stack(self) -> Callable[[StackConfiguration], tuple[str, Any]]:
        """A builder for the machine's ``extra`` stacks."""
        def build(config: StackConfiguration) -> tuple[str, Any]:
            manager: Any
            if self.policy == "fast":
                from kvpool.policy import make_kv_cache_manager

                manager = make_kv_cache_manager(**config.manager_kwargs(), backend="fast",
                                                policy="fast")
            else:
                manager = KVCacheManager(**config.manager_kwargs(), backend="reference")
            self.install(manager)
            return f"planted:{self.name}", manager

        return build


PLANTED_POLICY: dict[str, PlantedPolicyBug] = {p.name: p for p in (
    PlantedPolicyBug("independent-lookups-no-fixed-point", "2full+swa",
                     "hybrid groups looked up independently at the cap, then the minimum",
                     _independent_lookups),
    PlantedPolicyBug("lookup-aligned-to-own-block-size", "full+swa",
                     "hybrid lookups aligned to each group's block size, not the LCM",
                     _lookup_aligned_to_own_block_size),
    PlantedPolicyBug("touch-after-allocating", "full",
                     "hits touched after the allocation (which may evict them)",
                     _touch_after_allocating),
    PlantedPolicyBug("free-in-forward-order", "full",
                     "tables freed head first (prefix evicted before its tail)",
                     _free_in_forward_order),
    PlantedPolicyBug("windows-free-behind-computed-tokens", "full+swa",
                     "tokens in flight ignored: a window frees blocks their step still "
                     "reads", _windows_free_behind_computed_tokens),
    PlantedPolicyBug("skipped-block-not-nulled", "full+swa",
                     "out-of-window blocks freed but left in the table",
                     _skipped_block_not_nulled),
    PlantedPolicyBug("evictable-hits-not-counted", "full",
                     "budget ignores hits a touch takes out of the free queue",
                     _evictable_hits_not_counted),
    PlantedPolicyBug("eagle-block-kept", "full-eagle",
                     "EAGLE lookups keep the last hit block",
                     _eagle_block_kept),
    PlantedPolicyBug("mamba-same-step-hit-allowed", "full+mamba",
                     "a Mamba state cached this step is hit before it is computed",
                     _mamba_same_step_hit_allowed),
    PlantedPolicyBug("hit-reaches-last-token", "full",
                     "lookup not capped at num_tokens - 1 (last token's logits skipped)",
                     _hit_reaches_last_token),
    PlantedPolicyBug("copy-source-released-early", "full+mamba-cow",
                     "a copy-on-write source freed at allocation, before the copy ran",
                     _copy_source_released_early),
    PlantedPolicyBug("copy-dst-without-retention", "full+mamba-cow",
                     "a copy-on-write destination held by its table slot only",
                     _copy_dst_without_retention),
    PlantedPolicyBug("running-copy-keeps-key-on-source", "full+mamba-cow",
                     "a running request's boundary state copied but its entry not moved",
                     _running_copy_keeps_key_on_source),
    PlantedPolicyBug("running-copy-rewrites-table", "full+mamba-cow",
                     "a running request's copy replaces its table entry",
                     _running_copy_rewrites_table),
    # The rules the fast policy carries out itself, broken there; the rules it leaves to
    # the generic code (admissions with hits, the admission gate) are planted into that
    # code on a fast-policy stack.
    PlantedPolicyBug("fast-free-in-forward-order", "full",
                     "fast policy: tables freed head first", _fast_free_in_forward_order,
                     policy="fast"),
    PlantedPolicyBug("fast-hit-reaches-last-token", "full",
                     "fast policy: lookup capped at num_tokens, not num_tokens - 1",
                     _fast_hit_reaches_last_token, policy="fast"),
    PlantedPolicyBug("fast-eagle-block-kept", "full-eagle",
                     "fast policy: EAGLE lookups keep the last hit block",
                     _fast_eagle_block_kept, policy="fast"),
    PlantedPolicyBug("fast-step-ignores-watermark", "full-watermark",
                     "fast policy: a waiting request's step skips the watermark",
                     _fast_step_ignores_watermark, policy="fast"),
    PlantedPolicyBug("fast-step-caches-drafts", "full-eagle",
                     "fast policy: blocks filled by unverified drafts are keyed",
                     _fast_step_caches_drafts, policy="fast"),
    PlantedPolicyBug("fast-idle-room-one-block-more", "full",
                     "fast policy: the idle step's room bound counts a block it does not "
                     "hold", _fast_idle_room_one_block_more, policy="fast"),
    PlantedPolicyBug("fast-idle-key-bound-one-block-late", "full",
                     "fast policy: the idle step's key bound is a block late, so a step "
                     "that fills a block keys nothing", _fast_idle_key_bound_one_block_late,
                     policy="fast"),
    PlantedPolicyBug("fast-fused-step-skips-the-key", "full-quiet",
                     "fast policy: the step that takes a block leaves the filled one unkeyed",
                     _fast_fused_step_skips_the_key, policy="fast"),
    PlantedPolicyBug("fast-idle-step-ignores-the-window", "full+swa",
                     "hybrid fast policy: a step whose window passes a block is called idle",
                     _fast_idle_step_ignores_the_window, policy="fast"),
    PlantedPolicyBug("fast-hybrid-window-bound-one-block-late", "full+swa",
                     "hybrid fast policy: the idle step's window bound is a block late, so "
                     "a step whose window passes a block frees nothing",
                     _fast_hybrid_window_bound_one_block_late, policy="fast"),
    PlantedPolicyBug("fast-hybrid-idle-room-one-block-more", "full+swa",
                     "hybrid fast policy: the idle step's room bound counts a block no "
                     "table holds", _fast_hybrid_room_one_block_more, policy="fast"),
    PlantedPolicyBug("fast-idle-step-forgets-keyed-counts", "full+swa",
                     "hybrid fast policy: the idle test reads no keyed count, so a step "
                     "that must key a block is called idle",
                     _fast_idle_step_ignores_unaligned_keys, policy="fast"),
    PlantedPolicyBug("fast-hybrid-free-hands-tables-over-head-first", "full+swa",
                     "hybrid fast policy: a finished request's tables are freed head first",
                     _fast_free_hands_tables_over_head_first, policy="fast"),
    PlantedPolicyBug("fast-hybrid-one-call-frees-head-first", "full+swa-quiet",
                     "hybrid fast policy: the one-call step frees a window's skipped blocks "
                     "head first", _fast_hybrid_one_call_frees_head_first, policy="fast"),
    PlantedPolicyBug("fast-hybrid-one-call-new-blocks-reversed", "full+swa-quiet",
                     "hybrid fast policy: the one-call step deals the new blocks to the "
                     "groups from the wrong end", _fast_hybrid_one_call_new_blocks_reversed,
                     policy="fast"),
    PlantedPolicyBug("fast-hybrid-admission-ignores-free-cached-hits", "full+swa-quiet",
                     "hybrid fast policy: an admission's budget leaves out the free cached "
                     "hits it touches", _fast_evictable_hits_not_counted,
                     policy="fast"),
    PlantedPolicyBug("fast-hybrid-admission-keys-a-block-short", "full+swa-quiet",
                     "hybrid fast policy: an admission's one-call take-and-key leaves a "
                     "group's last full block unkeyed", _fast_hybrid_admission_keys_a_block_short,
                     policy="fast"),
    PlantedPolicyBug("fast-step-frees-the-window-after-allocating", "full+swa",
                     "hybrid fast policy: a step allocates before its window's skipped "
                     "blocks are freed", _fast_step_frees_the_window_after_allocating,
                     policy="fast"),
    PlantedPolicyBug("fast-step-frees-behind-computed-tokens", "full+swa",
                     "hybrid fast policy: a step frees window blocks that tokens still in "
                     "flight read", _fast_step_frees_behind_computed_tokens, policy="fast"),
    PlantedPolicyBug("fast-admission-gate-skipped", "full",
                     "fast policy: an admission that must fit whole is not checked whole",
                     _fast_admission_gate_skipped, policy="fast"),
    PlantedPolicyBug("fast-touch-after-allocating", "full",
                     "fast policy: hits touched after the allocation (which may evict them)",
                     _fast_touch_after_allocating, policy="fast"),
    PlantedPolicyBug("fast-evictable-hits-not-counted", "full",
                     "fast policy: budget ignores hits a touch takes out of the free queue",
                     _fast_evictable_hits_not_counted, policy="fast"),
    PlantedPolicyBug("fast-zeroing-ids-not-recorded", "full",
                     "fast policy: the blocks it allocates itself are not listed for zeroing",
                     _fast_zeroing_ids_not_recorded, policy="fast"),
    PlantedPolicyBug("fast-stack-evictable-hits-not-counted", "full",
                     "fast policy stack, generic code it falls back to: budget ignores hits "
                     "a touch takes out of the queue", _evictable_hits_not_counted,
                     policy="fast"),
)}
assert all(p.configuration in CONFIGURATIONS for p in PLANTED_POLICY.values())


__all__ = ["PLANTED_POLICY", "PlantedPolicyBug"]
