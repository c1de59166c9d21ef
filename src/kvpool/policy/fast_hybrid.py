"""The hybrid attention models' fast policy, :class:`FastHybridKVCacheManager`: full
attention with sliding-window or chunked-local groups. What it collapses, why, and how it
is checked against the generic policy: :mod:`kvpool.policy.fast`, which describes both fast
policies and chooses between them (:func:`~kvpool.policy.fast.fast_policy_class`); what
both share: :mod:`kvpool.policy.fast_base`."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, NamedTuple

from kvpool.policy.facade import processed_tokens, tokens_in_flight
from kvpool.policy.fast_base import _NEVER, _NO_GROUPS, _ZERO, HYBRID, FastPolicy, _never_skips

_INT = {int}
_DECLINED = object()  # _one_call_step: not a step it takes (nothing changed)


class _Group(NamedTuple):
    """One KV cache group as the fast steps read it: its manager's own objects (the fast
    policy keeps no state of its own), gathered once. Hot loops unpack it positionally."""

    tables: dict[str, list[int]]  # the manager's req_to_blocks
    num_cached: dict[str, int]  # its num_cached_block: blocks keyed per request
    block_size: int
    #: The window's rule (tokens -> tokens skipped); ``None`` for a group that never skips
    #: a token (full attention, MLA): no call, no table read, in every idle step.
    skipped_tokens: Callable[[int], int] | None
    null: int  # the null block's id (a window's tables hold it as a prefix)
    #: The rule inverted (the fewest tokens that skip ``n`` blocks), ``None`` beside it.
    fewest_skipping: Callable[[int], int] | None
    group_id: int
    #: The window's write mask, ``None`` when it keys every block (no call needed).
    write_mask: Callable[..., Any] | None
    note_new_blocks: Callable[[list[int]], None]  # the blocks-to-zero record
    partial_hits: Collection[str]  # requests whose partial hit's copy is pending


class FastHybridKVCacheManager(FastPolicy):
    """A hybrid attention model's facade with its idle step collapsed and a running
    request's other steps straight on the managers (:mod:`kvpool.policy.fast`)."""

    serves = HYBRID

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        managers = self._managers = self.coordinator.single_type_managers
        retention = self.coordinator.retention_interval
        self._groups = [_Group(
            m.req_to_blocks, m.num_cached_block, m.block_size,
            None if _never_skips(m) else m.get_num_skipped_tokens, m.null_block,
            None if _never_skips(m) else m.fewest_tokens_skipping, m.kv_cache_group_id,
            None if m.keys_every_block(retention) else m.write_mask, m._note_new_blocks,
            m._partial_hit_reqs) for m in managers]
        self._frees = self.coordinator.frees_skipped_blocks
        # The step as one pool call (_one_call_step), where the pool serves it: a prefix
        # cache, no events, no metrics collector, every group keyed at the hash block size.
        pool = self.block_pool
        self._group_step = getattr(pool, "group_step", None) if (
            pool.enable_caching and not pool.enable_kv_cache_events
            and getattr(pool, "metrics_collector", None) is None
            and all(m.block_size == pool.hash_block_size for m in managers)) else None
        self._no_hits: tuple[Any, ...] = tuple(() for _ in managers)
        # get_computed_blocks' one probe: the first spec group's ids when it is full
        # attention keyed at the hash block size (the hybrid coordinator, caching on).
        first = getattr(self.coordinator, "attention_groups", None)
        self._first_block_probe = list(first[0].group_ids) if (
            self.enable_caching and first and first[0].is_full_attention
            and first[0].spec.block_size == self.block_pool.hash_block_size) else None
        # The hybrid coordinator keys only lengths aligned to the scheduler block size.
        self._cache_alignment = self.coordinator.scheduler_block_size if len(managers) > 1 \
            else 1

    def __repr__(self) -> str:
        specs = "+".join(type(m.kv_cache_spec).__name__
                         for m in self.coordinator.single_type_managers)
        return (f"FastHybridKVCacheManager(policy=fast, running steps collapsed, groups={specs}, "
                f"blocks={self.block_pool.num_gpu_blocks})")

    def get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        """The generic lookup, but a prompt whose first block misses in the first spec
        group — full attention, which holds every hit from position 0 — is answered with
        one probe: the coordinator's fixed point starts at that group's hit, 0, so every
        group hits nothing (and no lookup ran longer: nothing uncached in common)."""
        probe = self._first_block_probe
        if probe is not None and not request.skip_reading_prefix_cache:
            hashes = request.block_hashes
            if (hashes and hashes[0].__class__ is bytes
                    and self.block_pool.get_cached_block(hashes[0], probe) is None):
                self.coordinator.num_uncached_common_prefix_tokens = 0  # type: ignore[attr-defined]
                if self.prefix_cache_stats is not None:
                    self.prefix_cache_stats.record(request.num_tokens, 0,
                                                   request.num_preemptions > 0)
                return self.empty_kv_cache_blocks, 0
        return super().get_computed_blocks(request)

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
        skip_zeroing_group_ids: Collection[int] = _NO_GROUPS,
    ) -> Any:
        """A running request's step with the scheduler's usual arguments here: an idle one
        (nothing to allocate, free or key in any group) in ``O(groups)``, any other one
        straight on the managers (:meth:`_step`); everything else in the generic policy."""
        rid = request.request_id
        seen = self._live.get(rid)
        if (seen is not None and new_computed_blocks is None
                and num_new_computed_tokens is _ZERO
                and num_external_computed_tokens is _ZERO
                and num_encoder_tokens is _ZERO and reserved_blocks is _ZERO
                and full_sequence_must_fit is False
                and num_new_tokens.__class__ is int and num_new_tokens > 0
                and num_lookahead_tokens.__class__ is int and num_lookahead_tokens >= 0
                and skip_zeroing_group_ids is _NO_GROUPS):
            computed = request.num_computed_tokens
            num_tokens = request.num_tokens
            # Tokens in flight only shift what the windows free (read where the generic
            # policy reads them; anything but a plain count is refused there).
            in_flight = tokens_in_flight(request) if self._frees else 0
            if computed.__class__ is int and computed >= seen[1] and num_tokens >= seen[0] \
                    and in_flight.__class__ is int and in_flight >= 0:
                # Most decode steps: under the three bounds the last allocation recorded
                # (_record; uncapped counts, which only overstate what the step needs).
                # Windows free behind the processed tokens: the computed ones less those
                # in flight (async scheduling's window free comes a step after the
                # computed count crosses the bound).
                main = computed + num_new_tokens
                if (main + num_lookahead_tokens <= seen[2] and computed - in_flight < seen[4]
                        and ((main if main < num_tokens else num_tokens) < seen[3]
                             or delay_cache_blocks)):
                    if self.watermark_blocks and self._under_watermark(request,
                                                                       has_scheduled_reqs):
                        return None
                    self._live[rid] = (num_tokens, computed, seen[2], seen[3], seen[4])
                    return self.empty_kv_cache_blocks
                # The step's token counts, as the generic step has them: computed tokens
                # (capped), the main model's end, the slots needed (capped).
                max_len = self.max_model_len
                total = computed if computed < max_len else max_len
                main = total + num_new_tokens
                need = main + num_lookahead_tokens
                if need > max_len:
                    need = max_len
                if self._group_step is not None:
                    done = self._one_call_step(request, rid, computed, total, main, need,
                                               num_tokens, in_flight, delay_cache_blocks,
                                               has_scheduled_reqs)
                    if done is not _DECLINED:
                        return done
                # Idle behind the computed tokens is idle behind the processed ones: fewer
                # tokens can only free less.
                if self._idle(rid, total, main, need, num_tokens, delay_cache_blocks):
                    if self._under_watermark(request, has_scheduled_reqs):
                        return None
                    self._record(rid, num_tokens, computed)
                    return self.empty_kv_cache_blocks
                if all(rid in m.num_cached_block for m in self._managers):
                    return self._step(request, computed, total, main, need, num_tokens,
                                      in_flight, delay_cache_blocks, has_scheduled_reqs)
        elif (seen is None and num_external_computed_tokens is _ZERO
              and num_encoder_tokens is _ZERO and skip_zeroing_group_ids is _NO_GROUPS
              and num_new_tokens.__class__ is int and num_new_tokens > 0
              and num_lookahead_tokens.__class__ is int and num_lookahead_tokens >= 0
              and reserved_blocks.__class__ is int and reserved_blocks >= 0
              and num_new_computed_tokens.__class__ is int and num_new_computed_tokens >= 0):
            hits = self._plain_hits(request, num_new_computed_tokens, new_computed_blocks)
            if hits is not None:
                return self._admit(request, num_new_tokens, num_new_computed_tokens,
                                   new_computed_blocks, hits, num_lookahead_tokens,
                                   delay_cache_blocks, full_sequence_must_fit,
                                   reserved_blocks, has_scheduled_reqs)
        return super().allocate_slots(
            request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
            num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
            num_encoder_tokens, full_sequence_must_fit, reserved_blocks, has_scheduled_reqs,
            skip_zeroing_group_ids)

    # -- admission ----------------------------------------------------------------------

    def _plain_hits(self, request: Any, num_new_computed_tokens: int,
                    new_computed_blocks: Any) -> tuple[Any, ...] | None:
        """The hits of a new request's admission, per group, when every check of the
        generic one plainly passes: the request holds nothing, its counts are plain ints,
        every group's hits are ints of this pool covering exactly the computed tokens.
        ``None`` for anything else (the generic policy then decides or refuses)."""
        rid = request.request_id
        computed = request.num_computed_tokens
        if computed.__class__ is not int or computed < 0 or any(
                rid in tables or rid in num_cached
                for tables, num_cached, _, _, _, _, _, _, _, _ in self._groups):
            return None
        if self._frees:
            in_flight = tokens_in_flight(request)
            if in_flight.__class__ is not int or in_flight < 0:
                return None
        if new_computed_blocks is None or new_computed_blocks is self.empty_kv_cache_blocks:
            return None if num_new_computed_tokens else self._no_hits
        ids = self.hit_block_ids(new_computed_blocks)
        if ids is None or len(ids) != len(self._groups) or not self.enable_caching:
            return None
        n = self.block_pool.num_gpu_blocks
        for blocks, group in zip(ids, self._groups, strict=True):
            if (blocks.__class__ is not list
                    or len(blocks) * group.block_size != num_new_computed_tokens):
                return None
            if blocks and (set(map(type, blocks)) != _INT or min(blocks) < 0
                           or max(blocks) >= n):
                return None
        return tuple(ids)

    def _admit(self, request: Any, num_new_tokens: int, num_new_computed_tokens: int,
               new_computed_blocks: Any, hits: tuple[Any, ...], num_lookahead_tokens: int,
               delay_cache_blocks: bool, full_sequence_must_fit: bool, reserved_blocks: int,
               has_scheduled_reqs: bool) -> Any:
        """A new request's admission with plainly valid arguments (:meth:`_plain_hits`):
        the generic steps on the managers — the gate, the budget, the hits installed,
        every group's new blocks, the cache write — without the facade's checks and the
        coordinator's fan-out, and with a free cached hit counted only when the budget's
        answer depends on it (:meth:`_fits`). A new request holds no table, so no window
        has a block to free and no group a block to check."""
        rid = request.request_id
        managers = self._managers
        local = request.num_computed_tokens + num_new_computed_tokens
        max_len = self.max_model_len
        total = local if local < max_len else max_len
        watermark = 0
        if has_scheduled_reqs and request.status in self.watermark_statuses:
            watermark = self.watermark_blocks
        pool = self.block_pool
        if full_sequence_must_fit:
            full = request.num_tokens if request.num_tokens < max_len else max_len
            needed, touched = self._blocks_to_allocate(rid, full, hits, total, full, True,
                                                       local)
            if not self._fits(needed + watermark, touched, pool.get_num_free_blocks()):
                return None
        main = total + num_new_tokens
        need = main + num_lookahead_tokens
        if need > max_len:
            need = max_len
        needed, touched = self._blocks_to_allocate(rid, need, hits, local, main, False, local)
        if not self._fits(needed + watermark, touched,
                          pool.get_num_free_blocks() - reserved_blocks):
            return None
        if hits is not self._no_hits:  # as the generic step: hits given, even if empty
            for manager, blocks in zip(managers, hits, strict=True):
                manager.add_local_computed_blocks(rid, blocks, local, 0)
        cached = main if main < request.num_tokens else request.num_tokens
        if self._group_step is not None and not delay_cache_blocks:
            return self._take_and_key_groups(request, rid, need, main, cached)
        new = tuple([m.allocate_new_blocks(rid, need, main) for m in managers])
        self._note_allocation(request)
        if self.enable_caching and not delay_cache_blocks:
            self.coordinator.cache_blocks(request, cached)
        return self._blocks(new)

    def _take_and_key_groups(self, request: Any, rid: str, need: int, main: int,
                             cached: int) -> Any:
        """Every group's new blocks and cache write, group by group, each one pool call
        (``take_and_key``) where the pool takes it, else the manager's two calls. On a
        quiet pool (no events, no metrics collector) this order leaves what the generic
        order (every group takes, then every group keys) leaves: a pop never takes a held
        block, and a key it evicts loses the same entry before or after the write that
        joins it (its other entries keep their order)."""
        aligned = cached - cached % self._cache_alignment
        pool = self.block_pool
        retention = self.coordinator.retention_interval
        parts = []
        for manager, (tables, num_cached, bs, _, _, _, group, write_mask, note, _) in zip(
                self._managers, self._groups, strict=True):
            table = tables.setdefault(rid, [])
            n = -(-need // bs) - len(table)
            full = aligned // bs
            keyed = num_cached.get(rid, 0)
            taken = None
            if n > 0 and full > keyed and write_mask is None:
                taken = pool.take_and_key(request, table, n, keyed, full, bs, group)
            if taken is not None:
                table.extend(taken)
                note(taken)  # recorded for zeroing, as the manager records them
                num_cached[rid] = full
                parts.append(taken)
            else:
                parts.append(manager.allocate_new_blocks(rid, need, main))
                manager.cache_blocks(request, aligned, retention)
        self._note_allocation(request)
        return self._blocks(parts)

    def _blocks_to_allocate(self, rid: str, num_tokens: int, hits: tuple[Any, ...],
                            total_computed: int, main: int, admission_cap: bool,
                            local: int) -> tuple[int, list[int]]:
        """Every group's :meth:`~kvpool.policy.manager.SingleTypeKVCacheManager.
        blocks_to_allocate`, summed: the blocks taken and the hits touched."""
        needed = 0
        touched: list[int] = []
        for manager, blocks in zip(self._managers, hits, strict=True):
            new, kept = manager.blocks_to_allocate(rid, num_tokens, blocks, total_computed,
                                                   main, admission_cap, local)
            needed += new
            touched += kept
        return needed, touched

    def _step(self, request: Any, computed: int, total: int, main: int, need: int,
              num_tokens: int, in_flight: int, delay_cache_blocks: bool,
              has_scheduled_reqs: bool) -> Any:
        """A running request's step that changes something, checked by the caller (plain
        arguments, nothing shrank, tracked in every group): the generic step's calls on the
        managers in the generic order — every window's skipped blocks freed, the budget,
        every group's new blocks, the coordinator's aligned cache write — without the
        facade's and the coordinator's checks and fan-out around them."""
        rid = request.request_id
        managers = self._managers
        # Freed even if the budget then refuses (as in the generic step), behind the
        # processed tokens: the blocks behind tokens still in flight are still read.
        if self._frees:
            self.coordinator.remove_skipped_blocks(
                rid, processed_tokens(total, in_flight), request.num_prompt_tokens)
        needed = 0
        for m in managers:
            needed += m.get_num_blocks_to_allocate(rid, need, (), total, main)
        watermark = 0
        if has_scheduled_reqs and request.status in self.watermark_statuses:
            watermark = self.watermark_blocks
        if needed + watermark > self.block_pool.get_num_free_blocks():
            return None
        new = tuple([m.allocate_new_blocks(rid, need, main) for m in managers])
        self._live[rid] = (num_tokens, computed, 0, 0, 0)  # as the generic records it
        if self.enable_caching and not delay_cache_blocks:
            self.coordinator.cache_blocks(request, main if main < num_tokens else num_tokens)
        self._record(rid, num_tokens, computed)
        return self._blocks(new)

    def _one_call_step(self, request: Any, rid: str, computed: int, total: int, main: int,
                       need: int, num_tokens: int, in_flight: int, delay_cache_blocks: bool,
                       has_scheduled_reqs: bool) -> Any:
        """A running request's step past its bounds, as one pool call (``group_step``: the
        windows' frees, every group's new blocks, every group's one-block write, in the
        generic order), the tables and counts then updated as the managers update them;
        an idle step (nothing to free, take or key) without a pool call. ``_DECLINED``
        with nothing changed when the step is not one it takes — a write of more than one
        block or of a block taken now (chunked prefill, speculative tokens), a partial
        hit's copy pending, a request some group does not track — or the pool declines it
        (too few free blocks: the budget then refuses, which :meth:`_step` says after its
        frees, as the generic step does)."""
        processed = processed_tokens(total, in_flight)
        caching = self.enable_caching and not delay_cache_blocks
        cached_tokens = 0
        if caching:
            cached_tokens = main if main < num_tokens else num_tokens
            cached_tokens -= cached_tokens % self._cache_alignment
        hashes = request.block_hashes
        releases: list[list[int]] = []
        nulled: list[tuple[list[int], int, int, Any]] = []  # (table, first, stop, null)
        counts: list[int] = []
        writes: list[tuple[int, bytes, int, int]] = []
        keyed: list[tuple[dict[str, int], int]] = []
        num_new = 0
        for tables, num_cached, bs, skipped_tokens, null, _, group_id, write_mask, _, partial \
                in self._groups:
            table = tables.get(rid)
            if table is None or partial and rid in partial or rid not in num_cached:
                return _DECLINED
            held = len(table)
            first = stop = 0
            if skipped_tokens is not None:  # positions turn null front to back
                stop = skipped_tokens(processed) // bs
                if stop > held:
                    stop = held
                first = stop
                while first > 0 and table[first - 1] != null:
                    first -= 1
                if first < stop:
                    releases.append(table[first:stop][::-1])  # tail first
                    nulled.append((table, first, stop, null))
            n = -(-need // bs) - held
            n = n if n > 0 else 0
            counts.append(n)
            num_new += n
            full = cached_tokens // bs
            cached = num_cached.get(rid, 0)
            if full > cached:
                if full != cached + 1 or full > held or full > len(hashes):
                    return _DECLINED
                keyed.append((num_cached, full))
                b = table[cached]  # null if the window skipped it, now or before
                mask = None if write_mask is None else write_mask(
                    request, cached, full, self.coordinator.retention_interval)
                if b != null and not first <= cached < stop and (mask is None or mask[0]):
                    writes.append((b, hashes[cached], cached, group_id))
        if not (releases or num_new or keyed):  # idle: the generic step changes nothing
            if self._under_watermark(request, has_scheduled_reqs):
                return None
            self._record(rid, num_tokens, computed)
            return self.empty_kv_cache_blocks
        reserve = 0
        if has_scheduled_reqs and request.status in self.watermark_statuses:
            reserve = self.watermark_blocks
        group_step = self._group_step
        new = None if group_step is None else group_step(releases, num_new, reserve, writes)
        if new is None:
            return _DECLINED
        for table, first, stop, null in nulled:
            table[first:stop] = [null] * (stop - first)
        parts = []
        start = 0
        for group, n in zip(self._groups, counts, strict=True):
            part = new[start:start + n]
            if part:
                group.tables[rid].extend(part)
                group.note_new_blocks(part)  # recorded for zeroing, as the manager records them
            parts.append(part)
            start += n
        for num_cached, full in keyed:
            num_cached[rid] = full
        self._record(rid, num_tokens, computed)
        return self._blocks(parts)

    def _under_watermark(self, request: Any, has_scheduled_reqs: bool) -> bool:
        """Whether the watermark refuses this step (checked at every step, idle or not)."""
        watermark = self.watermark_blocks
        return bool(watermark and has_scheduled_reqs
                    and request.status in self.watermark_statuses
                    and watermark > self.block_pool.get_num_free_blocks())

    def _note_allocation(self, request: Any) -> None:
        """The generic record, and the bounds of a step that changes nothing
        (:meth:`_record`) as the tables stand: before the generic step's cache write, so
        the keyed counts may lag (a bound too low only sends the next step to the check)."""
        self._record(request.request_id, request.num_tokens, request.num_computed_tokens)

    def _record(self, rid: str, num_tokens: int, computed: int) -> None:
        """``_live[rid]``: the generic record (``num_tokens``, ``num_computed_tokens``), then
        three bounds under which a step changes no group, as of now — tables only grow,
        keyed counts only rise and windows only null more while a request holds blocks, so
        a bound read later is only too low: the tokens every group's table takes; the
        (aligned) token count that fills a group's next unkeyed block (never, without a
        prefix cache); the processed tokens at which a window would free its first block
        still held (never, with no window). A window's tables hold null blocks as a prefix
        (positions turn null front to back): the first one held is where the window's rule
        puts it for the computed tokens, else (tokens in flight, hits) found by bisection."""
        room = key_at = skip_at = _NEVER
        caching = self.enable_caching
        for tables, num_cached, bs, skipped_tokens, null, fewest_skipping, _, _, _, _ \
                in self._groups:
            table = tables.get(rid)
            if table is None:  # not tracked here: every step takes the check
                self._live[rid] = (num_tokens, computed, 0, 0, 0)
                return
            held = len(table)
            if held * bs < room:
                room = held * bs
            if caching:
                keys = (num_cached.get(rid, 0) + 1) * bs
                if keys < key_at:
                    key_at = keys
            if skipped_tokens is not None and fewest_skipping is not None:
                lo = skipped_tokens(computed) // bs
                if lo > held:
                    lo = held
                if not ((lo == 0 or table[lo - 1] == null) and (lo == held or table[lo] != null)):
                    lo, hi = 0, held
                    while lo < hi:
                        mid = (lo + hi) // 2
                        if table[mid] == null:
                            lo = mid + 1
                        else:
                            hi = mid
                if lo < held:
                    skips = fewest_skipping(lo + 1)
                    if skips < skip_at:
                        skip_at = skips
        align = self._cache_alignment
        if key_at != _NEVER:  # the coordinator keys aligned lengths only
            key_at = -(-key_at // align) * align
        self._live[rid] = (num_tokens, computed, room, key_at, skip_at)

    def free(self, request: Any) -> None:
        """The generic release — group by group, each table tail first (a window's null
        blocks included: the pool skips them) — each table handed over as one array."""
        rid = request.request_id
        if self._live.pop(rid, None) is None:
            return
        for manager in self._managers:
            self._free_table(manager.pop_blocks_for_free(rid))

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Key the request's full blocks, every group up to the aligned length (async
        scheduling calls it for every request after every step's output): nothing to do,
        checked in ``O(groups)``, when no group has a full block left to key."""
        if num_computed_tokens.__class__ is int and num_computed_tokens >= 0 and \
                self.enable_caching:
            rid = request.request_id
            seen = self._live.get(rid)
            if seen is not None and num_computed_tokens < seen[3]:
                return  # under the keying bound (_record)
            aligned = num_computed_tokens - num_computed_tokens % self._cache_alignment
            if all(aligned // bs <= num_cached.get(rid, 0)
                   for _, num_cached, bs, _, _, _, _, _, _, _ in self._groups):
                return
        super().cache_blocks(request, num_computed_tokens)

    def _idle(self, rid: str, total: int, main: int, need: int, num_tokens: int,
              delay_cache_blocks: bool) -> bool:
        """Whether the generic step would change no group: every table long enough, no
        window with a block left to null (the generic walk stops at the first null), no
        aligned full block left to key."""
        caching = self.enable_caching and not delay_cache_blocks
        cached_tokens = (main if main < num_tokens else num_tokens)
        cached_tokens -= cached_tokens % self._cache_alignment
        for tables, num_cached, bs, skipped_tokens, null, _, _, _, _, _ in self._groups:
            table = tables.get(rid)
            if table is None or -(-need // bs) > len(table):
                return False
            if skipped_tokens is not None:
                skipped = skipped_tokens(total) // bs
                if skipped > 0 and table[(skipped if skipped < len(table) else len(table)) - 1] \
                        != null:
                    return False
            if caching and cached_tokens // bs > num_cached.get(rid, 0):
                return False
        return True


__all__ = ["FastHybridKVCacheManager"]
