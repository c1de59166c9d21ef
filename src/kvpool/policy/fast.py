"""The fast policy: the generic policy's decisions, with the hot calls collapsed.

The generic policy (facade → coordinator → manager → pool, :mod:`kvpool.policy.facade`) is
the readable reference of this layer; each call crosses four layers of Python and re-checks
at each. An engine calls ``allocate_slots`` for every running request every step, and for
a decoding request almost every call changes nothing: the last block still has room and no
block filled. :class:`FastKVCacheManager` serves the configuration engines run most — one
full-attention (or MLA) group over the fast (Numba) pool — with:

* a **running request's step** in one function: the shrink checks, the block count, the
  budget, at most one ``get_new_blocks`` and one ``cache_full_blocks`` straight on the pool
  (one ``take_and_key`` for a block boundary on a pool without events), and ``O(1)``
  Python when nothing is needed (the common decode step: two bounds the last allocation
  recorded beside the request's counts, :meth:`FastKVCacheManager._record`);
* a **lookup** straight into the pool's one-kernel longest-hit scan;
* a **free** that pops the table and frees it tail first in one pool call;
* an **admission** (hits installed, new blocks, the full ones keyed) as one ``touch`` and
  one ``take_and_key`` (one ``get_new_blocks`` and one ``cache_full_blocks`` where the pool
  declines it), after the generic policy's checks.

State is the generic policy's own (the manager's ``req_to_blocks`` and ``num_cached_block``,
the facade's ``_live``), so every call not collapsed here — admissions with hits, external
tokens, the admission gate, copy-on-write, stats — runs the generic code on the same state,
and the two can never drift apart. What is collapsed is checked against the generic policy
by the stack differential machine (``kvpool check --layer stack``, tests/policy), step by
step, on every observable: tables, ref counts, queue order, keys, events.

Served (:func:`fast_policy_refusal` says why not otherwise): exactly one KV cache group whose
spec is :class:`~kvpool.policy.specs.FullAttentionSpec` or :class:`~kvpool.policy.specs.
MLAAttentionSpec` (EAGLE and DCP/PCP included), the ``"fast"`` backend, no partial hits.

Hybrid attention models — full attention with sliding-window or chunked-local groups, the
hybrid engines run most — get
:class:`~kvpool.policy.fast_hybrid.FastHybridKVCacheManager`: there a step touches every
group's table, the windows free blocks as they slide and the coordinator keys only aligned
lengths, so the step that changes nothing in any group is collapsed (checked in
``O(groups)``: no group needs a block, no window passes a block boundary, no group keys a
block); a running request's other steps are one pool call on a quiet pool
(``group_step``: the windows' frees, every group's new blocks and one-block writes) and the
managers' own methods in the generic order elsewhere; a plainly valid admission runs on the
managers without the facade's and coordinator's layers; a lookup whose first full-attention
block misses is one probe; a free hands each table over as one array. Every other call runs
the generic policy. Most decode steps are idle steps (``docs/policy.md`` has the table).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from kvpool.hash_list import BlockHashList
from kvpool.policy.blocks import KVCacheBlocks
from kvpool.policy.facade import KVCacheManager
from kvpool.policy.fast_base import (
    _NEVER,
    _NO_GROUPS,
    _ZERO,
    HYBRID,
    SINGLE,
    FastPolicy,
    served_kind,
)
from kvpool.policy.fast_hybrid import FastHybridKVCacheManager

_INT = {int}
_BYTES = {bytes}


def fast_policy_class(*args: Any, **kwargs: Any) -> type[KVCacheManager] | str:
    """The fast policy that serves :class:`KVCacheManager` built with these arguments, or
    why none does (bad arguments are left to the constructor to refuse)."""
    kind = served_kind(*args, **kwargs)
    return FastKVCacheManager if kind == SINGLE else FastHybridKVCacheManager \
        if kind == HYBRID else kind


def fast_policy_refusal(*args: Any, **kwargs: Any) -> str | None:
    """Why no fast policy serves these arguments, or ``None`` when one does."""
    served = fast_policy_class(*args, **kwargs)
    return served if isinstance(served, str) else None


class FastKVCacheManager(FastPolicy):
    """:class:`KVCacheManager` with the hot calls collapsed (module docstring)."""

    serves = SINGLE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        manager = self.coordinator.single_type_managers[0]
        self._manager = manager
        self._tables: dict[str, list[int]] = manager.req_to_blocks
        self._num_cached: dict[str, int] = manager.num_cached_block
        self._block_size: int = manager.block_size
        # The generic rule that records new blocks for zeroing (take_new_block_ids), read at
        # each call: a drop-in sets which groups are zeroed after the policy is built.
        self._note_new_blocks = manager._note_new_blocks
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
        hashes = request.block_hashes
        if limit > 0 and hashes:
            # Half of all prompts share nothing: one probe of the first block answers them
            # without packing a few hundred hashes (the scan's type check still runs; a
            # packed companion has done it). The scan reads the first `limit` hashes in
            # place (a slice would lose the companion).
            if self.block_pool.get_cached_block(hashes[0], [0]) is not None or not (
                    type(hashes) is BlockHashList and hashes.packed(limit) is not None
                    or set(map(type, hashes[:limit])) == _BYTES):
                hits = self.block_pool.find_longest_cache_hit(hashes, [0], limit)[0]
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
        skip_zeroing_group_ids: Collection[int] = _NO_GROUPS,
    ) -> Any:
        """A running request's step (inline, below) or a plain admission
        (:meth:`_allocate`); anything else — connector loads, the admission gate, every
        call that must be refused — in the generic policy."""
        rid = request.request_id
        seen = self._live.get(rid)
        # The step of a running request with the scheduler's usual arguments: the defaults
        # are tested by identity (the int 0 is one object), so anything else — a float, a
        # numpy int, hits — takes the checked path.
        if (seen is None or new_computed_blocks is not None
                or num_new_computed_tokens is not _ZERO
                or num_external_computed_tokens is not _ZERO
                or num_encoder_tokens is not _ZERO or reserved_blocks is not _ZERO
                or full_sequence_must_fit is not False
                or num_new_tokens.__class__ is not int
                or num_lookahead_tokens.__class__ is not int
                or skip_zeroing_group_ids is not _NO_GROUPS):
            return self._allocate(
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                has_scheduled_reqs, skip_zeroing_group_ids)
        computed = request.num_computed_tokens
        num_tokens = request.num_tokens
        main = computed + num_new_tokens
        # Most decode steps: the new and lookahead tokens fit the blocks held and no block
        # fills. seen[2] and seen[3] (_record) say up to where, as of the last
        # allocation; tables and keyed counts only grow while a request holds blocks, so a
        # bound read late is only too low, and then the step below decides.
        if (computed.__class__ is int and seen[1] <= computed and seen[0] <= num_tokens
                and 0 < num_new_tokens and 0 <= num_lookahead_tokens
                and main + num_lookahead_tokens <= seen[2]
                and ((main if main < num_tokens else num_tokens) < seen[3]
                     or delay_cache_blocks)):
            self._live[rid] = (num_tokens, computed, seen[2], seen[3])
            return self.empty_kv_cache_blocks
        if (computed.__class__ is not int or computed < seen[1] or num_tokens < seen[0]
                or num_new_tokens <= 0 or num_lookahead_tokens < 0):
            return self._generic_allocate_slots(  # refused there, with its message
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                has_scheduled_reqs, skip_zeroing_group_ids)
        bs = self._block_size
        table = self._tables[rid]
        max_len = self.max_model_len
        main = (computed if computed < max_len else max_len) + num_new_tokens
        need = main + num_lookahead_tokens
        if need > max_len:
            need = max_len
        num_new = -(-need // bs) - len(table)
        watermark = self.watermark_blocks
        if watermark and not (has_scheduled_reqs
                              and request.status in self.watermark_statuses):
            watermark = 0
        if num_new <= 0:  # (the step that fills a block: no count of free blocks needed)
            num_new = 0
            if watermark and watermark > self.block_pool.get_num_free_blocks():
                return None
        elif num_new + watermark > self.block_pool.get_num_free_blocks():
            return None
        num_full = num_cached = 0
        if self.enable_caching and not delay_cache_blocks:
            num_full = (main if main < num_tokens else num_tokens) // bs
            num_cached = self._num_cached.get(rid, 0)
        return self._grow(request, table, num_new, num_cached, num_full, num_tokens, computed)

    def _grow(self, request: Any, table: list[int], num_new: int, num_cached: int,
              num_full: int, num_tokens: int, computed: int) -> Any:
        """Take ``num_new`` blocks onto ``table``, key its blocks ``[num_cached, num_full)``
        and record the allocation; the new blocks as a result. One pool call where the pool
        takes it (``take_and_key``: a block boundary, an admission); where it declines,
        having changed nothing (a pool with events, say), ``get_new_blocks`` and
        ``cache_full_blocks`` in the generic order, the record made before the write as the
        generic policy makes it (``num_cached`` is 0 when nothing is written: a bound too
        low only sends the next step to the full path)."""
        rid = request.request_id
        pool = self.block_pool
        if num_new and num_full > num_cached:
            taken = pool.take_and_key(request, table, num_new, num_cached, num_full,
                                      self._block_size, 0)
            if taken is not None:
                table.extend(taken)
                self._note_new_blocks(taken)
                self._num_cached[rid] = num_full
                self._record(rid, num_tokens, computed, len(table), num_full)
                return self.make_blocks((taken,))
        new: list[int] = []
        if num_new:
            new = pool.get_new_blocks(num_new)
            table.extend(new)
            self._note_new_blocks(new)
        self._record(rid, num_tokens, computed, len(table), num_cached)
        if num_full > num_cached:
            pool.cache_full_blocks(request, table, num_cached, num_full, self._block_size, 0)
            self._num_cached[rid] = num_full
            self._record(rid, num_tokens, computed, len(table), num_full)
        if not new:
            return self.empty_kv_cache_blocks
        return self.make_blocks((new,))

    def _note_allocation(self, request: Any) -> None:
        """The generic record (``num_tokens``, ``num_computed_tokens``), then the two bounds
        of a step that needs nothing: the tokens the held blocks take (``0`` under a
        watermark, whose check every step must make) and the token count that fills the
        next unkeyed block (never, without a prefix cache). Past ``max_model_len`` the
        generic step caps its counts, which only lowers them: a step under both bounds
        needs nothing there either."""
        rid = request.request_id
        self._record(rid, request.num_tokens, request.num_computed_tokens,
                     len(self._tables.get(rid, ())), self._num_cached.get(rid, 0))

    def _record(self, rid: str, num_tokens: int, computed: int, held: int,
                keyed: int) -> None:
        """:meth:`_note_allocation` from counts the caller has at hand: ``held`` blocks in
        the table, the first ``keyed`` keyed (at most as many as are)."""
        bs = self._block_size
        self._live[rid] = (num_tokens, computed, 0 if self.watermark_blocks else held * bs,
                           (keyed + 1) * bs if self.enable_caching else _NEVER)

    def _allocate(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: Any,
        num_lookahead_tokens: int,
        num_external_computed_tokens: int,
        delay_cache_blocks: bool,
        num_encoder_tokens: int,
        full_sequence_must_fit: bool,
        reserved_blocks: int,
        has_scheduled_reqs: bool,
        skip_zeroing_group_ids: Collection[int],
    ) -> Any:
        """A step that allocates, or a plain admission; the rest in the generic policy."""
        rid = request.request_id
        seen = self._live.get(rid)
        computed = request.num_computed_tokens
        num_tokens = request.num_tokens
        if (num_external_computed_tokens or num_encoder_tokens
                or skip_zeroing_group_ids is not _NO_GROUPS
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
                has_scheduled_reqs, skip_zeroing_group_ids)
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
                    has_scheduled_reqs, skip_zeroing_group_ids)
        elif num_new_computed_tokens or computed < 0 or seen is not None and (
                computed < seen[1] or num_tokens < seen[0]):
            return self._generic_allocate_slots(  # refused there, with the generic message
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                has_scheduled_reqs, skip_zeroing_group_ids)
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
        if full_sequence_must_fit:
            # The admission gate: the whole sequence must fit beside the watermark (the
            # reserved blocks are not subtracted here, as in the generic policy).
            full = num_tokens if num_tokens < max_len else max_len
            gate = -(-full // bs) - held - (len(hits) if hits else 0)
            wanted = (gate if gate > 0 else 0) + watermark
            if not self._fits(wanted, hits, pool.get_num_free_blocks()):
                return None
        # The budget of this step.
        if num_new or watermark or reserved_blocks or hits:
            available = pool.get_num_free_blocks() - reserved_blocks
            if not self._fits(num_new + watermark, hits, available):
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
        return self._grow(request, table, num_new, num_cached, num_full, num_tokens, computed)

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

    def _generic_allocate_slots(self, *args: Any) -> Any:
        return super().allocate_slots(*args)

    # -- release ------------------------------------------------------------------------

    def free(self, request: Any) -> None:
        rid = request.request_id
        if self._live.pop(rid, None) is None:
            return
        self._num_cached.pop(rid, None)
        self._free_table(self._tables.pop(rid, ()))

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Key the request's full blocks up to ``num_computed_tokens``. Async scheduling
        calls it for every request after every step's output: when no block filled since
        the last key, that is a dict read here (the generic rule's own early return)."""
        if num_computed_tokens.__class__ is int and num_computed_tokens >= 0 and \
                self.enable_caching and num_computed_tokens // self._block_size \
                <= self._num_cached.get(request.request_id, 0):
            return
        super().cache_blocks(request, num_computed_tokens)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        if not self.enable_caching:  # the coordinator without a prefix cache says none
            return self.coordinator.get_num_common_prefix_blocks(running_request_id)
        # The one group's own rule, without the facade's and coordinator's frames (the
        # scheduler asks every step), and its usual answer (the first block is not held by
        # every tracked request) read off that block's ref count directly.
        table = self._tables.get(running_request_id)
        if not table or table[0] == self.block_pool.null_block or \
                self.block_pool.ref_cnt(table[0]) != len(self._tables):
            return [0]
        return [self._manager.get_num_common_prefix_blocks(running_request_id)]

    def get_blocks(self, request_id: str) -> Any:
        table = self._tables.get(request_id)
        if not table:
            return self.empty_kv_cache_blocks
        return self.make_blocks((list(table),))


__all__ = ["FastKVCacheManager", "fast_policy_class",
           "fast_policy_refusal"]
