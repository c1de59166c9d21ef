"""Mamba (state-space) layers (BEHAVIOUR.md §8): only the newest state matters.

A hit is the *rightmost* cached state whose end is aligned — ``[null] × i + [state]``. In
``"align"`` mode a state is checkpointed at every block boundary (so it can be cached), the
table keeps the previous state block until the next step has read it, and speculative blocks
(``num_speculative_blocks``) sit at the table's end, relocated as the request grows. A state
cached during the current step may not be computed yet, so a hit on it is deferred: sizing
answers "does not fit" (``num_gpu_blocks + 1``) until :meth:`new_step_starts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.errors import HashStateError, InvalidConfig
from kvpool.hashing.coarse import resolve_block_hashes
from kvpool.keys import pack_key
from kvpool.policy.manager import SingleTypeKVCacheManager
from kvpool.policy.pool_access import has_key, num_evictable
from kvpool.policy.specs import KVCacheSpec, MambaSpec, cdiv


class MambaManager(SingleTypeKVCacheManager):
    """Mamba state blocks, plain or in align mode; see the module docstring."""

    supports_partial_hits = True
    #: vLLM 0.25.1 lowers the skipped-token count by the speculative blocks before freeing
    #: states; 0.33 does not (:func:`follow_vllm_033_rules`).
    lowers_skipped_by_speculative_blocks = True
    #: vLLM 0.33's align-mode walk (:func:`follow_vllm_033_rules`): over the whole newly
    #: skipped range, past the table's null gaps. 0.25.1's stops at the first null, which
    #: holds until the request ends a state block no index points at any more: one that
    #: ``last_state_block_idx`` moved past before a removal reached it (removals lag when
    #: tokens are in flight), or a connector's external-token block with speculative blocks.
    walks_past_null_gaps = False

    def __init__(self, kv_cache_spec: KVCacheSpec, block_pool: Any, **kwargs: Any) -> None:
        super().__init__(kv_cache_spec, block_pool, **kwargs)
        assert isinstance(kv_cache_spec, MambaSpec)
        self.mamba_cache_mode = kv_cache_spec.mamba_cache_mode
        self.num_speculative_blocks = kv_cache_spec.num_speculative_blocks
        self.cached_blocks_this_step: set[bytes] = set()
        # The key this manager last gave each block. A block that a lookup returns for this
        # group carries exactly that key (only this manager keys blocks of its group).
        self._last_key: dict[int, bytes] = {}
        self.last_state_block_idx: dict[str, int] = {}
        self._allocated_block_reqs: set[str] = set()
        #: Per request, where the last removal walk ended (the next one starts there).
        self._num_retired_blocks: dict[str, int] = {}

    @property
    def align(self) -> bool:
        return self.mamba_cache_mode == "align"

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: Any,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[int], ...]:
        """The rightmost aligned cached state within ``max_length``; EAGLE drop ignored."""
        bs = kv_cache_spec.block_size
        groups = list(kv_cache_group_ids)
        hits: tuple[list[int], ...] = tuple([] for _ in groups)
        for i in range(max_length // bs - 1, -1, -1):
            cached = block_pool.get_cached_block(block_hashes[i], groups)
            if cached is None:
                continue
            if bs != alignment_tokens and (i + 1) * bs % alignment_tokens:
                continue
            for blocks, b in zip(hits, cached, strict=True):
                blocks.extend([block_pool.null_block] * i)
                blocks.append(b)
            break  # only the newest state matters
        return hits

    @classmethod
    def find_longest_partial_cache_hit(
        cls,
        fine_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: Any,
        kv_cache_spec: KVCacheSpec,
    ) -> tuple[tuple[list[int], ...], int]:
        """The rightmost cached state at hash-block granularity (§10.4): a state may end
        inside a block. Returns ``[null] × i + [state]`` per group and the hit tokens."""
        hbs = block_pool.hash_block_size
        ratio = kv_cache_spec.block_size // hbs
        groups = list(kv_cache_group_ids)
        hits: tuple[list[int], ...] = tuple([] for _ in groups)
        for fine in range(min(max_length // hbs, len(fine_hashes)) - 1, -1, -1):
            cached = block_pool.get_cached_block(fine_hashes[fine], groups)
            if cached is None:
                continue
            for blocks, b in zip(hits, cached, strict=True):
                blocks.extend([block_pool.null_block] * (fine // ratio))
                blocks.append(b)
            return hits, (fine + 1) * hbs
        return hits, 0

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: KVCacheSpec,
        use_eagle: bool,
        retention_interval: int | None = None,
        num_prompt_tokens: int | None = None,
    ) -> list[bool] | None:
        """Sparse state checkpoints: with a retention interval, key the states ending at a
        multiple of it, plus the state at the prompt's replay boundary."""
        if retention_interval is None or alignment_tokens is None:
            return None
        bs = kv_cache_spec.block_size
        mask = [False] * (end_block - start_block)
        if retention_interval:
            per_segment = retention_interval // bs
            if per_segment <= 1:
                return None
            for i in range(start_block, end_block):
                if (i + 1) % per_segment == 0:
                    mask[i - start_block] = True
        if num_prompt_tokens is not None:
            boundary = (num_prompt_tokens - 1) // alignment_tokens * alignment_tokens
            block = boundary // bs - 1
            if start_block <= block < end_block:
                mask[block - start_block] = True
        return mask

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Everything but the last computed token's state: ``n − 1``."""
        return num_computed_tokens - 1

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        """The base walk, or (``walks_past_null_gaps``, align mode) every non-null position
        of ``[max(first, retired), last)`` freed tail first, then ``retired = last``."""
        if not (self.align and self.walks_past_null_gaps):
            super()._remove_blocks_in_range(request_id, first, last)
            return
        table = self.req_to_blocks.get(request_id)
        if table is None:
            return
        first = max(first, self._num_retired_blocks.get(request_id, 0))
        last = min(last, len(table))
        if first >= last:
            return
        null = self.null_block
        freed: list[int] = []
        for i in range(last - 1, first - 1, -1):
            if table[i] != null:  # prefill leaves null gaps between states
                freed.append(table[i])
                table[i] = null
        if freed:
            self.block_pool.free_blocks(freed)
        self._num_retired_blocks[request_id] = last

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """Base removal on the count lowered by the speculative blocks (vLLM 0.25.1's rule;
        0.33's is not lowered); align mode also frees the previous state block once it is
        behind the current one."""
        lowered = max(0, total_computed_tokens - self.num_speculative_blocks) \
            if self.lowers_skipped_by_speculative_blocks else total_computed_tokens
        super().remove_skipped_blocks(request_id, lowered)
        if not self.align:
            return
        idx = self.last_state_block_idx.get(request_id)
        if idx is None or idx >= cdiv(lowered, self.block_size) - 1:
            return
        table = self.req_to_blocks[request_id]
        if table[idx] != self.null_block:
            self.block_pool.free_blocks([table[idx]])
            table[idx] = self.null_block

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
    ) -> int:
        if new_computed_blocks and \
                self._last_key.get(new_computed_blocks[-1]) in self.cached_blocks_this_step:
            # The state was keyed this step and may not be computed yet: retry next step.
            return self.block_pool.num_gpu_blocks + 1
        if not self.align:
            num_tokens += self.kv_cache_spec.block_size * self.num_speculative_blocks
            return super().get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                num_tokens_main_model, apply_admission_cap, num_local_computed_tokens)
        required = cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks
        held = len(self.req_to_blocks.get(request_id, ()))
        hit_tokens = len(new_computed_blocks) * self.block_size
        if not held and request_id not in self.num_cached_block and \
                total_computed_tokens > hit_tokens:
            return self._blocks_with_external_tokens(
                required, new_computed_blocks, total_computed_tokens)
        new = required - len(new_computed_blocks) - held
        partial = self.has_partial_local_hit(new_computed_blocks, num_local_computed_tokens) \
            or request_id in self._partial_hit_reqs
        if partial:
            # vLLM 0.33: one block more for the copy, capped at what one step can take.
            new = max(new, 0) + 1
            first = request_id not in self._allocated_block_reqs
            new = min(new, 2 + (self.num_speculative_blocks if first else 0))
        elif new > 0:
            new = 1 if request_id in self._allocated_block_reqs \
                else 1 + self.num_speculative_blocks
        # A non-positive ``new`` is not clamped (vLLM 0.25.1 and 0.33 alike): it can lower
        # the coordinator's sum. Reproduced for parity.
        return new + num_evictable(self.block_pool, new_computed_blocks)

    def _blocks_with_external_tokens(self, required: int, hits: Sequence[int],
                                     total_computed: int) -> int:
        """Align-mode sizing of a new request with KV-connector tokens: what
        ``allocate_external_computed_blocks`` and then ``allocate_new_blocks`` will take.

        vLLM 0.25.1 counts only ``1 + num_speculative_blocks`` here and misses the external
        block, so its allocation can fail half-way (``ValueError`` after blocks were taken).
        kvpool sizes both phases, so a short pool answers "does not fit" instead (§12)."""
        bs = self.block_size
        skipped = max(0, self.get_num_skipped_tokens(total_computed)) // bs
        table = max(skipped, len(hits))  # after add_local_computed_blocks
        external = max(0, cdiv(total_computed, bs) - table)
        table += external
        new = 0
        if required > table:
            new = required - max(table, required - self.num_speculative_blocks - 1)
        return external + new + num_evictable(self.block_pool, hits[skipped:])

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_tokens_main_model: int) -> list[int]:
        if not self.align:
            num_tokens += self.block_size * self.num_speculative_blocks
            return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        spec = self.num_speculative_blocks
        required = cdiv(num_tokens_main_model, self.block_size) + spec
        table = self.req_to_blocks.setdefault(request_id, [])
        partial = self._partial_hit_reqs.pop(request_id, None)
        if required <= len(table) and partial is None:
            if self.partial_hits:
                # vLLM 0.33 marks the request allocated here too (0.25.1 does not), so a
                # state it checkpoints next is copied out on the running-request path.
                self._allocated_block_reqs.add(request_id)
            return []
        previous = len(table)
        allocated_before = request_id in self._allocated_block_reqs
        if allocated_before:
            self.last_state_block_idx[request_id] = previous - 1 - spec
        elif previous > 0:
            self.last_state_block_idx[request_id] = previous - 1  # the hit state
        boundary = required - spec - 1  # the new state block's position
        if previous < boundary:
            table.extend([self.null_block] * (boundary - previous))
        if allocated_before:
            # Speculative slots that now lie before the boundary move to the end.
            for idx in range(previous - spec, previous):
                if idx >= boundary:
                    break
                table.append(table[idx])
                table[idx] = self.null_block
        n = max(required - len(table), 0) + (partial is not None)
        assert n <= (1 if allocated_before else 1 + spec) + (partial is not None), \
            "Mamba align sizing broke"
        fresh = list(self.block_pool.get_new_blocks(n))
        returned = table[previous:]
        if partial is not None:
            dst, fresh = fresh[0], fresh[1:]
            if allocated_before:
                self._copy_running_state(partial[1], dst)
            else:
                self.apply_copy_on_write(request_id, partial[0], partial[1], dst)
                returned.insert(0, dst)
        table.extend(fresh)
        self._allocated_block_reqs.add(request_id)
        return returned + fresh

    def check_new_blocks(self, request_id: str, num_tokens_main_model: int) -> None:
        """A speculative block moves to the table's end only while the request alone holds
        it and it has no cache identity (the pool's ``is_block_writable``; vLLM 0.33 asserts
        the same): a moved block that another holder reads, or that a hit could return,
        would be written under it. Checked before any group allocates."""
        spec = self.num_speculative_blocks
        table = self.req_to_blocks.get(request_id, [])
        if not self.align or not spec or request_id not in self._allocated_block_reqs:
            return
        required = cdiv(num_tokens_main_model, self.block_size) + spec
        if required <= len(table) and request_id not in self._partial_hit_reqs:
            return  # nothing is allocated, nothing moves
        boundary = required - spec - 1
        for b in table[len(table) - spec:min(len(table), boundary)]:
            if b != self.null_block and not self.block_pool.is_block_writable(b):
                raise HashStateError(f"speculative Mamba block {b} is shared or keyed: "
                                     "it cannot be relocated (BEHAVIOUR.md §10.4)")

    def _copy_running_state(self, source: int, dst: int) -> None:
        """The running request's boundary state in ``source`` is about to be overwritten;
        its worker table is append-only, so the request keeps ``source`` and the cache
        entry moves to the fresh ``dst``, which the queued copy fills this step (§10.4).
        ``source`` gets a retention ref; ``dst``'s only ref is its retention."""
        key = self._last_key.pop(source, None)
        self.block_pool.move_block_hashes(source, dst)
        self._pending_copies.append((source, dst))
        self.block_pool.touch([source])
        if key is not None and self.block_pool.observe().key_tokens(dst) is not None:
            # (No key moved if a KV connector evicted the entry meanwhile.)
            self._last_key[dst] = key
            self.cached_blocks_this_step.add(key)  # filled only by this step's copy

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        """Also forgets align state, so a resumed request starts over."""
        self._allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self._num_retired_blocks.pop(request_id, None)
        return super().pop_blocks_for_free(request_id)

    def cache_blocks(self, request: Any, num_tokens: int,
                     retention_interval: int | None = None) -> None:
        """Base caching, then remember the keys of the states keyed now (this step)."""
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(request, num_tokens, retention_interval)
        after = self.num_cached_block.get(rid, 0)
        if self.align and self.partial_hits:
            self._cache_partial_tail_block(request, num_tokens)
        if after <= before:
            return
        hashes = resolve_block_hashes(request.block_hashes, self.block_pool.hash_block_size,
                                      self.block_size)
        table = self.req_to_blocks[rid]
        for position in range(before, after):
            block = table[position]
            if not has_key(self.block_pool, block):
                continue
            key = pack_key(hashes[position], self.kv_cache_group_id)
            self._last_key[block] = key
            self.cached_blocks_this_step.add(key)

    def _cache_partial_tail_block(self, request: Any, num_tokens: int) -> None:
        """Key the state at the prompt's last hash boundary (``prompt − 1`` rounded down to
        hbs) when this step computed exactly up to it (§10.4). A state inside a block is
        overwritten by the next step, so the request's next allocation copies it out
        (:meth:`_copy_running_state`) and it is keyed again once its block is full."""
        hbs = self.block_pool.hash_block_size
        boundary = max(0, (request.num_prompt_tokens - 1) // hbs * hbs)
        if num_tokens <= 0 or num_tokens != boundary:
            return
        rid = request.request_id
        table = self.req_to_blocks.get(rid, [])
        position = cdiv(num_tokens, self.block_size) - 1
        if position >= len(table) or table[position] == self.null_block:
            return
        source = table[position]
        if self.block_pool.observe().key_tokens(source) == num_tokens:
            return  # already keyed here (a hit, or an earlier step)
        key = self.block_pool.cache_partial_block(request, source, num_tokens,
                                                  self.kv_cache_group_id, self.block_size)
        if key is None:
            return
        if self.block_pool.observe().key_tokens(source) == num_tokens:
            self._last_key[source] = key  # the partial entry is the block's primary
        self.cached_blocks_this_step.add(key)
        if num_tokens % self.block_size:
            self._partial_hit_reqs[rid] = (position, source)
            self.num_cached_block[rid] = position

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()



def follow_vllm_033_rules(manager: Any) -> None:
    """Free Mamba states by vLLM 0.33's rules in ``manager`` (a facade): the skipped count is
    not lowered by the speculative blocks, and align mode walks past null gaps. The facade's
    default is 0.25.1's (BEHAVIOUR.md §8); the vLLM 0.33 drop-in applies this."""
    managers = getattr(getattr(manager, "coordinator", None), "single_type_managers", None)
    if managers is None:
        raise InvalidConfig(f"follow_vllm_033_rules takes a KVCacheManager, got {manager!r}")
    for single in managers:
        if isinstance(single, MambaManager):
            single.lowers_skipped_by_speculative_blocks = False
            single.walks_past_null_gaps = True


__all__ = ["MambaManager", "follow_vllm_033_rules"]
