"""The single-type manager base: one KV cache group's block tables (BEHAVIOUR.md §8).

A manager maps each request to its *block table* (position = logical block index, value =
block id; the null block fills positions a request no longer needs) and remembers how many
leading positions are already keyed in the prefix cache (``num_cached_block``). It speaks to
the pool only through :class:`kvpool.protocol.BlockPool` verbs and the ``observe()`` query,
so the same code runs on the spec, the reference and the fast pool.

Subclasses (one module per attention family) supply the lookup rule
(:meth:`find_longest_cache_hit`), the number of tokens that fall out of attention
(:meth:`get_num_skipped_tokens`) and, where a future hit cannot use every block, a mask of the
blocks worth keying (:meth:`reachable_block_mask`).

Invariants kept here (BEHAVIOUR.md §11): a table only grows at the end except that positions
turn null (23); a manager keys only positions below ``num_tokens // bs`` and never re-keys a
position below ``num_cached_block`` (24); a table is freed tail first, so the least reusable
block is evicted first (§4).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from kvpool.errors import InvalidArgument
from kvpool.policy.pool_access import num_evictable
from kvpool.policy.specs import KVCacheSpec, cdiv


def check_blocks_to_skip(num_blocks: object) -> int:
    """``num_blocks`` for :meth:`SingleTypeKVCacheManager.fewest_tokens_skipping`: an int
    >= 1, else :class:`~kvpool.errors.InvalidArgument`."""
    if num_blocks.__class__ is not int or num_blocks < 1:  # type: ignore[operator]
        raise InvalidArgument(f"num_blocks must be an int >= 1, got {num_blocks!r}")
    return num_blocks  # type: ignore[return-value]


class SingleTypeKVCacheManager:
    """Block tables of one KV cache group; see the module docstring."""

    #: Spec classes (exact types) whose fresh blocks are reported for KV zeroing; the
    #: family's default, which an engine that zeroes nothing turns off per manager.
    zeroed_spec_types: tuple[type, ...] = ()
    #: Whether the family can answer a lookup that ends inside a block (vLLM 0.33's
    #: fine-grained hash lookup; full attention and Mamba).
    supports_partial_hits: ClassVar[bool] = False

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: Any,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        self.scheduler_block_size = scheduler_block_size
        self.dcp_world_size = dcp_world_size
        self.pcp_world_size = pcp_world_size
        self.block_size = kv_cache_spec.block_size * max(1, dcp_world_size * pcp_world_size)
        self._max_admission_blocks_per_request = max_admission_blocks_per_request
        self.null_block: int = block_pool.null_block
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.new_block_ids: list[int] = []
        self.use_eagle = False  # set by the coordinator
        # Partial hits and copy-on-write (BEHAVIOUR.md §10.4), set by the coordinator.
        self.partial_hits = False
        # request → (table position, shared source block) of a hit that ends inside a block.
        self._partial_hit_reqs: dict[str, tuple[int, int]] = {}
        # (source, destination) copies queued for the GPU layer, in the order made.
        self._pending_copies: list[tuple[int, int]] = []

    # -- sizing -------------------------------------------------------------------------

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
        """Blocks an allocation for ``num_tokens`` slots takes from the free count,
        counting the hits it will touch out of the queue (evictable hits), plus the
        copy-on-write block of a hit that ends inside a block (§10.4)."""
        new, touched = self.blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks, total_computed_tokens,
            num_tokens_main_model, apply_admission_cap, num_local_computed_tokens)
        return new + num_evictable(self.block_pool, touched)

    def blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
    ) -> tuple[int, Sequence[int]]:
        """:meth:`get_num_blocks_to_allocate` in its two parts: the blocks the allocation
        takes, and the hits it touches (each one a free cached candidate takes one more
        block from the free count; a fast policy counts them only when that decides)."""
        required = cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self._max_admission_blocks_per_request is not None:
            required = min(required, self._max_admission_blocks_per_request)
        held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            if new_computed_blocks:
                raise InvalidArgument(
                    f"request {request_id!r} is already running; it takes no new hits"
                )
            return max(required - held, 0), ()
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        new = max(required - max(skipped, len(new_computed_blocks) + held), 0)
        # Hits that fall out of the window are never touched, so they take nothing.
        first_kept = max(0, skipped - held)
        if self.has_partial_local_hit(new_computed_blocks, num_local_computed_tokens):
            new += 1  # the private copy that replaces the shared tail block
        return new, new_computed_blocks[first_kept:]

    def has_partial_local_hit(self, new_computed_blocks: Sequence[int],
                              num_local_computed_tokens: int | None) -> bool:
        """Whether the prefix hit ends inside a block: its tail block is shared and the
        request will write past the hit, so it needs a private copy (§10.4)."""
        return (self.partial_hits and bool(new_computed_blocks)
                and num_local_computed_tokens is not None
                and num_local_computed_tokens % self.block_size != 0)

    # -- allocation ---------------------------------------------------------------------

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[int],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Install a new request's prefix hits: touch them (a ref for the table slot),
        null the ones already out of attention, and mark the whole prefix cached."""
        table = self.req_to_blocks.setdefault(request_id, [])
        assert not table, "add_local_computed_blocks on a request that holds blocks"
        total = num_local_computed_tokens + num_external_computed_tokens
        skipped = self.get_num_skipped_tokens(total) // self.block_size
        kept = list(new_computed_blocks[skipped:]) if skipped > 0 else list(new_computed_blocks)
        if self.enable_caching:
            self.block_pool.touch(kept)
        table.extend([self.null_block] * skipped)
        table.extend(kept)
        self.num_cached_block[request_id] = len(table)
        if self.has_partial_local_hit(kept, num_local_computed_tokens):
            # The copy replaces the tail at allocation; it is keyed once it is full.
            position = num_local_computed_tokens // self.block_size
            self._partial_hit_reqs[request_id] = (position, kept[-1])
            self.num_cached_block[request_id] = position

    def allocate_external_computed_blocks(
        self, request_id: str, num_local_computed_tokens: int,
        num_external_computed_tokens: int, record_for_zeroing: bool = True,
    ) -> None:
        """Blocks for tokens a KV connector computed; runs after every group's touches. Not
        recorded for zeroing when the connector's load writes them (``record_for_zeroing``
        false)."""
        total = num_local_computed_tokens + num_external_computed_tokens
        skipped = self.get_num_skipped_tokens(total)
        external = num_external_computed_tokens
        if skipped > 0:
            external = min(total - skipped, external)
        if external <= 0:
            return
        table = self.req_to_blocks.setdefault(request_id, [])
        fresh = self.block_pool.get_new_blocks(cdiv(total, self.block_size) - len(table))
        table.extend(fresh)
        if record_for_zeroing:
            self._note_new_blocks(fresh)


    def check_new_blocks(self, request_id: str, num_tokens_main_model: int) -> None:
        """Raise if :meth:`allocate_new_blocks` for ``num_tokens_main_model`` could not be
        carried out; nothing here changes state. Most managers can always carry it out."""

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[int]:
        """Grow the table to ``cdiv(num_tokens, bs)`` blocks; the new ids (a partial hit's
        private copy first)."""
        copied: list[int] = []
        partial = self._partial_hit_reqs.pop(request_id, None)
        if partial is not None:
            # Sizing reserved this block; replacing in place keeps the count below right.
            dst = self.block_pool.get_new_blocks(1)[0]
            self.apply_copy_on_write(request_id, partial[0], partial[1], dst)
            self.new_block_ids.append(dst)
            copied.append(dst)
        table = self.req_to_blocks.setdefault(request_id, [])
        n = cdiv(num_tokens, self.block_size) - len(table)
        if n <= 0:
            return copied
        fresh = list(self.block_pool.get_new_blocks(n))
        table.extend(fresh)
        self._note_new_blocks(fresh)
        return copied + fresh

    def apply_copy_on_write(self, request_id: str, position: int, source: int,
                            dst: int) -> None:
        """A new request's shared tail ``source`` becomes the private ``dst`` in its table.

        Both stay held until the GPU layer has run the copy: ``source`` keeps the hit's
        ref (now a retention, no longer a table slot) and ``dst`` gets one ref more than its
        table slot. The facade hands both out as retained endpoints (§10.4).
        """
        table = self.req_to_blocks[request_id]
        assert table[position] == source and source != self.null_block
        table[position] = dst
        self._pending_copies.append((source, dst))
        self.block_pool.touch([dst])  # the retention ref (dst is held: no queue change)

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """Drain the (source, destination) copies queued since the last call."""
        copies, self._pending_copies = self._pending_copies, []
        return copies

    def _note_new_blocks(self, fresh: Sequence[int]) -> None:
        if type(self.kv_cache_spec) in self.zeroed_spec_types:
            self.new_block_ids.extend(fresh)

    def take_new_block_ids(self) -> list[int]:
        """Drain the ids allocated since the last call (for KV zeroing)."""
        ids, self.new_block_ids = self.new_block_ids, []
        return ids

    # -- caching ------------------------------------------------------------------------

    def cache_blocks(self, request: Any, num_tokens: int,
                     retention_interval: int | None = None) -> None:
        """Key the full blocks among the first ``num_tokens`` tokens not keyed yet."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        mask = self.write_mask(request, num_cached, num_full, retention_interval)
        self.block_pool.cache_full_blocks(
            request, self.req_to_blocks.get(rid, []), num_cached, num_full, self.block_size,
            self.kv_cache_group_id, mask,
        )
        self.num_cached_block[rid] = num_full

    def write_mask(self, request: Any, num_cached: int, num_full: int,
                   retention_interval: int | None = None) -> list[bool] | None:
        """Which candidates ``[num_cached, num_full)`` of the request's cache write are
        keyed (:meth:`reachable_block_mask` for this group); ``None`` = all of them."""
        return self.reachable_block_mask(
            num_cached, num_full, self.scheduler_block_size, self.kv_cache_spec,
            self.use_eagle, retention_interval, request.num_prompt_tokens,
        )

    def keys_every_block(self, retention_interval: int | None = None) -> bool:
        """Whether :meth:`write_mask` is ``None`` for every write of this group (the hybrid
        fast policy then skips it): the base rule's, which keys every block."""
        rule = type(self).reachable_block_mask.__func__  # type: ignore[attr-defined]
        return rule is SingleTypeKVCacheManager.reachable_block_mask.__func__  # type: ignore[attr-defined]

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
        """Which candidates ``[start_block, end_block)`` to key; ``None`` = all of them."""
        return None

    # -- release ------------------------------------------------------------------------

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        """Null positions ``[first, last)`` and free their blocks, walking back from the end.

        Walking backwards stops at the first position already null: everything before it
        was nulled by an earlier call (positions turn null front to back), so the walk
        costs only the newly skipped blocks. The freed list is tail first (§4).
        """
        table = self.req_to_blocks.get(request_id)
        if table is None or first >= last:
            return
        freed: list[int] = []
        for i in range(min(last, len(table)) - 1, first - 1, -1):
            if table[i] == self.null_block:
                break
            freed.append(table[i])
            table[i] = self.null_block
        if freed:
            self.block_pool.free_blocks(freed)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """Free the blocks no future token attends to (replaced by the null block)."""
        skipped = self.get_num_skipped_tokens(total_computed_tokens)
        if skipped <= 0 or request_id not in self.req_to_blocks:
            return
        self._remove_blocks_in_range(request_id, 0, skipped // self.block_size)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens no longer attended to once ``num_computed_tokens`` are computed."""
        return 0

    def fewest_tokens_skipping(self, num_blocks: int) -> int:
        """The fewest computed tokens whose skipped tokens cover ``num_blocks >= 1`` whole
        blocks: :meth:`get_num_skipped_tokens` inverted, where a family's rule has an
        inverse (the windows': the hybrid fast policy bounds its idle steps with it).
        :class:`~kvpool.errors.InvalidArgument` for a count that is not an int >= 1."""
        raise NotImplementedError(f"{type(self).__name__} does not invert its skip rule")


    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        """Forget the request; its blocks in table order (the caller frees them reversed)."""
        self.num_cached_block.pop(request_id, None)
        self._partial_hit_reqs.pop(request_id, None)
        return self.req_to_blocks.pop(request_id, [])

    def free(self, request_id: str) -> None:
        """Release the request's blocks, tail first."""
        self.block_pool.free_blocks(self.pop_blocks_for_free(request_id)[::-1])

    # -- queries ------------------------------------------------------------------------

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Leading blocks every tracked request shares (0 unless a family says more)."""
        return 0

    def new_step_starts(self) -> None:
        """A scheduler step begins (only Mamba keeps per-step state)."""

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
        """Per group id, the hit blocks of the longest usable prefix of at most
        ``max_length`` tokens (null for positions the family skips); equal lengths,
        ``len × bs`` a multiple of ``alignment_tokens``. Pure."""
        raise NotImplementedError


def trim_to_alignment(lists: tuple[list[int], ...], block_size: int,
                      alignment_tokens: int) -> None:
    """Drop trailing blocks until ``len × block_size`` is a multiple of the alignment."""
    if block_size == alignment_tokens:
        return
    while lists[0] and len(lists[0]) * block_size % alignment_tokens:
        for blocks in lists:
            blocks.pop()


__all__ = ["SingleTypeKVCacheManager", "trim_to_alignment"]
