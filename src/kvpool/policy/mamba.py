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

from kvpool.hashing.coarse import resolve_block_hashes
from kvpool.keys import pack_key
from kvpool.policy.manager import SingleTypeKVCacheManager
from kvpool.policy.pool_access import has_key, num_evictable
from kvpool.policy.specs import KVCacheSpec, MambaSpec, cdiv


class MambaManager(SingleTypeKVCacheManager):
    """Mamba state blocks, plain or in align mode; see the module docstring."""

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

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """Base removal on the count lowered by the speculative blocks (vLLM 0.25.1's rule);
        align mode also frees the previous state block once it is behind the current one."""
        lowered = max(0, total_computed_tokens - self.num_speculative_blocks)
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
    ) -> int:
        if new_computed_blocks and \
                self._last_key.get(new_computed_blocks[-1]) in self.cached_blocks_this_step:
            # The state was keyed this step and may not be computed yet: retry next step.
            return self.block_pool.num_gpu_blocks + 1
        if not self.align:
            num_tokens += self.kv_cache_spec.block_size * self.num_speculative_blocks
            return super().get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                num_tokens_main_model, apply_admission_cap)
        required = cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks
        held = len(self.req_to_blocks.get(request_id, ()))
        hit_tokens = len(new_computed_blocks) * self.block_size
        if not held and request_id not in self.num_cached_block and \
                total_computed_tokens > hit_tokens:
            return self._blocks_with_external_tokens(
                required, new_computed_blocks, total_computed_tokens)
        new = required - len(new_computed_blocks) - held
        if new > 0:
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
        if required <= len(table):
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
        n = required - len(table)
        assert n <= (1 if allocated_before else 1 + spec), "Mamba align sizing broke"
        table.extend(self.block_pool.get_new_blocks(n))
        self._allocated_block_reqs.add(request_id)
        return table[previous:]

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        """Also forgets align state, so a resumed request starts over."""
        self._allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        return super().pop_blocks_for_free(request_id)

    def cache_blocks(self, request: Any, num_tokens: int,
                     retention_interval: int | None = None) -> None:
        """Base caching, then remember the keys of the states keyed now (this step)."""
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(request, num_tokens, retention_interval)
        after = self.num_cached_block.get(rid, 0)
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

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()


__all__ = ["MambaManager"]
