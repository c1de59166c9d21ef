"""Rules that make every invalid call of BEHAVIOUR.md §12 that an id-based pool can receive.

Each rule builds a call the spec must reject, usually with a *valid prefix* (blocks that a
half-applied batch would already have changed), and asserts that the oracle rejected it. The
lockstep then checks that every backend raised the same error type and that no backend's
``abstract()`` moved. Rules are gated on ``config.invalid_calls`` so pools that do not
validate (vLLM's) can be checked on valid calls alone.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvpool.errors import DoubleFree, InvalidArgument, NoFreeBlocks
from kvpool.harness.pool.driver import Reply
from kvpool.harness.pool.machine import PICK, PoolMachine
from kvpool.harness.values import RECORD, Foreign
from kvpool.spec.state import NULL_BLOCK_ID, keys_of_block

BAD_GROUP_IDS = (-1, 2**32, 2**40, True)
ID_OPERATIONS = (
    "touch", "free_blocks", "unpin_blocks", "evict_blocks", "is_block_writable",
    "cache_full_blocks", "cache_partial_block", "move_block_hashes",
)
FOREIGN_OPERATIONS = tuple(op for op in ID_OPERATIONS if op != "free_blocks")
MALFORMED_CACHE_CALLS = (
    "mask_length", "hashes_too_short", "beyond_blocks", "negative_count", "block_size_off_grid",
    "duplicate_block",
)
BAD_MOVES = ("null_source", "null_destination", "same_block", "keyed_destination", "free_block")
BAD_BOUNDARIES = ("off_grid", "zero", "beyond_hashes", "negative")


def _invalid(self: Any) -> bool:
    return self.config.invalid_calls


class InvalidCallRules(PoolMachine):
    """:class:`PoolMachine` plus §12's invalid calls (each must be rejected, changing nothing)."""

    rules_are_valid = False

    def expect_rejected(self, reply: Reply, what: str, error: type | None = None) -> None:
        ok = reply.rejected and (error is None or isinstance(reply.error, error))
        expected = error.__name__ if error else "a typed error"
        self.expect(ok, f"{what} should raise {expected}, got {reply.error or reply.value!r}")

    def some_request(self, k: int) -> Any:
        with_hashes = [r for r in self.requests if self.hashes(r)] or self.requests
        return with_hashes[k % len(with_hashes)]

    def valid_prefix(self) -> list[int]:
        """A held block to put in front of a bad id: what a half-applied batch would change."""
        held = self.held_blocks()
        return held[:1]

    # -- allocation --------------------------------------------------------------------------

    @precondition(_invalid)
    @rule(extra=st.integers(1, 3))
    def over_allocation_raises_no_free_blocks_and_changes_nothing(self, extra: int) -> None:
        n = self.free_count() + extra
        self.step(f"ask for {n} blocks with only {n - extra} free")
        self.expect_rejected(self.pool.get_new_blocks(n), f"get_new_blocks({n})", NoFreeBlocks)

    @precondition(_invalid)
    @rule(n=st.integers(-3, -1))
    def negative_allocation_is_rejected_without_phantom_blocks(self, n: int) -> None:
        self.step(f"ask for {n} blocks")
        self.expect_rejected(self.pool.get_new_blocks(n), f"get_new_blocks({n})", InvalidArgument)

    # -- release -----------------------------------------------------------------------------

    @precondition(lambda self: _invalid(self) and self.tables_with_blocks())
    @rule(t=PICK, k=PICK)
    def double_free_raises_and_changes_nothing(self, t: int, k: int) -> None:
        tables = self.tables_with_blocks()
        table = tables[t % len(tables)]
        blocks = [b for b in table.blocks if b != NULL_BLOCK_ID]
        b = blocks[k % len(blocks)]
        batch = list(reversed(table.blocks)) + [b] * self.state.ref_cnt[b]
        self.step(f"free {table.request.request_id}'s table and block {b} once too often")
        self.expect_rejected(self.pool.free_blocks(batch), f"free_blocks({batch})", DoubleFree)

    @precondition(lambda self: _invalid(self) and self.free_count() > 0)
    @rule(k=PICK, twice=st.booleans())
    def freeing_a_free_block_is_a_double_free(self, k: int, twice: bool) -> None:
        queue = self.state.free_queue
        b = queue[k % len(queue)]
        batch = self.valid_prefix() + [b] * (2 if twice else 1)
        self.step(f"free block {b}, which is already free")
        self.expect_rejected(self.pool.free_blocks(batch), f"free_blocks({batch})", DoubleFree)

    @precondition(lambda self: _invalid(self) and self.config.foreign_blocks and self.tables)
    @rule(t=PICK, b=PICK)
    def double_free_in_another_pool_rejects_the_whole_batch(self, t: int, b: int) -> None:
        table = self.tables[t % len(self.tables)]
        unheld = [x for x in range(1, self.config.num_blocks) if x not in self.sibling_held]
        if unheld:
            foreign = [Foreign(unheld[b % len(unheld)])]
        else:  # the sibling holds everything: release one of its blocks twice
            x = self.sibling_held[b % len(self.sibling_held)]
            foreign = [Foreign(x)] * (self.sibling_held.count(x) + 1)
        batch: list[Any] = list(reversed(table.blocks)) + foreign
        self.step(f"free a table together with {foreign[0]}, one release too many")
        self.expect_rejected(self.pool.free_blocks(batch), f"free_blocks({batch})", DoubleFree)

    @precondition(lambda self: _invalid(self) and self.config.watchers
                  and (self.tables_with_blocks() or self.free_count()))
    @rule(null=st.booleans(), k=PICK)
    def unpinning_the_null_or_a_free_block_is_rejected(self, null: bool, k: int) -> None:
        queue = self.state.free_queue
        bad = NULL_BLOCK_ID if null or not queue else queue[k % len(queue)]
        batch = self.valid_prefix() + [bad]
        self.step(f"unpin {batch}: block {bad} cannot be unpinned")
        self.expect_rejected(self.pool.unpin_blocks(batch, RECORD), f"unpin_blocks({batch})")

    @precondition(lambda self: _invalid(self) and self.config.watchers
                  and self.tables_with_blocks())
    @rule()
    def unpin_without_a_callable_watcher_is_rejected(self) -> None:
        batch = self.valid_prefix()
        self.step(f"unpin {batch} without a watcher")
        self.expect_rejected(self.pool.unpin_blocks(batch, None), "unpin_blocks(on_reuse=None)",
                             InvalidArgument)

    # -- ids, groups and foreign blocks --------------------------------------------------------

    def call_with_block(self, op: str, bad: Any, k: int) -> Reply:
        """``op`` with ``bad`` where a block goes, after a valid prefix for batch operations."""
        prefix: list[Any] = self.valid_prefix()
        request = self.some_request(k)
        group = 0
        if op == "unpin_blocks" and not self.config.watchers:
            op = "touch"  # a pool without unpinning gets the other batch verb instead
        if op in ("is_block_writable", "move_block_hashes") and not getattr(self.api, op):
            op = "evict_blocks"  # outside the pool's version: another id-taking call
        if op == "touch":
            queued = self.queued_keyed()
            return self.pool.touch(queued[:1] + prefix + [bad])
        if op == "free_blocks":
            return self.pool.free_blocks(prefix + [bad])
        if op == "unpin_blocks":
            return self.pool.unpin_blocks(prefix + [bad], RECORD)
        if op == "evict_blocks":
            keyed = [b for b, key in enumerate(self.state.primary_key) if key is not None]
            return self.pool.evict_blocks(keyed[:1] + [bad])
        if op == "is_block_writable":
            return self.pool.is_block_writable(bad)
        if op == "cache_full_blocks":
            return self.pool.cache_full_blocks(request, [bad], 0, 1, self.bs, group)
        if op == "cache_partial_block":
            return self.pool.cache_partial_block(request, bad, self.hbs, group, self.bs)
        held = prefix or [1]
        return self.pool.move_block_hashes(*((held[0], bad) if k % 2 else (bad, held[0])))

    @precondition(_invalid)
    @rule(op=st.sampled_from(ID_OPERATIONS), which=st.integers(0, 3), k=PICK)
    def out_of_range_block_ids_are_rejected_everywhere(self, op: str, which: int, k: int):
        n = self.config.num_blocks
        bad = (n, n + 7, -1, -n)[which]
        self.step(f"{op} with block id {bad} (valid ids are 0..{n - 1})")
        self.expect_rejected(self.call_with_block(op, bad, k), f"{op} with id {bad}")

    @precondition(lambda self: _invalid(self) and self.config.foreign_blocks)
    @rule(op=st.sampled_from(FOREIGN_OPERATIONS), b=PICK, k=PICK)
    def foreign_block_refs_are_rejected_outside_free_blocks(self, op: str, b: int, k: int):
        bad = Foreign(1 + b % (self.config.num_blocks - 1))
        self.step(f"{op} with {bad}, a block of another pool")
        self.expect_rejected(self.call_with_block(op, bad, k), f"{op} with {bad}")

    @precondition(_invalid)
    @rule(op=st.sampled_from(("get_cached_block", "cache_full_blocks", "cache_partial_block",
                              "emit_cached_block_events")),
          g=st.sampled_from(BAD_GROUP_IDS), k=PICK)
    def bad_group_ids_are_rejected(self, op: str, g: Any, k: int) -> None:
        request = self.some_request(k)
        hashes = self.hashes(request)
        self.step(f"{op} with group id {g!r}")
        if op == "get_cached_block" or (op == "emit_cached_block_events"
                                        and not self.api.emit_cached_block_events):
            reply = self.pool.get_cached_block(hashes[0] if hashes else b"\0" * 32, [0, g])
        elif op == "emit_cached_block_events":
            reply = self.pool.emit_cached_block_events(request, len(hashes), self.bs, g)
        else:
            held = self.held_blocks() or [1]
            if op == "cache_full_blocks":
                reply = self.pool.cache_full_blocks(request, held[:1], 0, 1, self.bs, g)
            else:
                reply = self.pool.cache_partial_block(request, held[0], self.hbs, g, self.bs)
        self.expect_rejected(reply, f"{op} with group {g!r}")

    @precondition(_invalid)
    @rule(k=PICK)
    def lookup_with_no_group_ids_is_rejected(self, k: int) -> None:
        hashes = self.hashes(self.some_request(k))
        self.step("look up a hash in no group at all")
        reply = self.pool.get_cached_block(hashes[0] if hashes else b"\0" * 32, [])
        self.expect_rejected(reply, "get_cached_block(h, [])", InvalidArgument)

    # -- caching -----------------------------------------------------------------------------

    @precondition(lambda self: _invalid(self) and self.tables)
    @rule(kind=st.sampled_from(MALFORMED_CACHE_CALLS), t=PICK)
    def malformed_cache_full_blocks_arguments_are_rejected(self, kind: str, t: int) -> None:
        table = self.tables[t % len(self.tables)]
        request, blocks, bs = table.request, list(table.blocks), self.bs
        available = len(self.hashes(request))
        cached, full, mask = table.num_cached, max(table.num_cached + 1, len(blocks)), None
        if kind == "mask_length":
            mask = [True] * (full - cached + 1)
        elif kind == "hashes_too_short":
            full = max(available, cached) + 1  # past num_cached too, or it is a silent no-op
            blocks += blocks[:1] * max(0, full - len(blocks))
        elif kind == "beyond_blocks":
            full = len(blocks) + 1
        elif kind == "negative_count":
            cached = -1
        elif kind == "block_size_off_grid":
            bs = bs + 1 if self.hbs > 1 else 0
        else:
            blocks = ([b for b in blocks if b != NULL_BLOCK_ID][:1] or [1]) * 2
            cached, full = 0, 2
        self.step(f"cache_full_blocks with {kind.replace('_', ' ')}")
        reply = self.pool.cache_full_blocks(request, blocks, cached, full, bs, table.group, mask)
        self.expect_rejected(reply, f"cache_full_blocks ({kind})")

    def recache_candidates(self) -> list[tuple[Any, int]]:
        out = []
        for t in self.tables:
            for p in range(t.num_cached):
                b = t.blocks[p]
                tokens = self.state.primary_tokens[b] if b != NULL_BLOCK_ID else None
                if tokens is not None and tokens >= (p + 1) * self.bs:
                    out.append((t, p))
        return out

    @precondition(lambda self: _invalid(self) and self.recache_candidates())
    @rule(k=PICK)
    def caching_a_keyed_block_again_is_rejected(self, k: int) -> None:
        candidates = self.recache_candidates()
        table, p = candidates[k % len(candidates)]
        self.step(f"cache block {table.blocks[p]} again at position {p}")
        reply = self.pool.cache_full_blocks(table.request, list(table.blocks), p, p + 1, self.bs,
                                            table.group)
        self.expect_rejected(reply, f"re-caching block {table.blocks[p]}")

    @precondition(lambda self: _invalid(self) and self.free_count() > 0)
    @rule(k=PICK, partial=st.booleans())
    def caching_a_free_block_is_rejected(self, k: int, partial: bool) -> None:
        queue = self.state.free_queue
        b = queue[k % len(queue)]
        request = self.some_request(k)
        self.step(f"cache free block {b}")
        if partial:
            reply = self.pool.cache_partial_block(request, b, self.hbs, 0, self.bs)
        else:
            reply = self.pool.cache_full_blocks(request, [b], 0, 1, self.bs, 0)
        self.expect_rejected(reply, f"caching free block {b}")

    @precondition(lambda self: _invalid(self) and self.api.move_block_hashes)
    @rule(kind=st.sampled_from(BAD_MOVES), k=PICK)
    def move_with_null_same_or_keyed_destination_is_rejected(self, kind: str, k: int) -> None:
        held = self.held_blocks() or [1]
        src = held[k % len(held)]
        keyed = [b for b in range(1, self.config.num_blocks) if keys_of_block(self.state, b)]
        if kind == "null_source":
            src, dst = NULL_BLOCK_ID, src
        elif kind == "null_destination":
            dst = NULL_BLOCK_ID
        elif kind == "same_block":
            dst = src
        elif kind == "keyed_destination" and keyed:
            dst = keyed[k % len(keyed)]
            src = src if src != dst else NULL_BLOCK_ID
        else:
            queue = self.state.free_queue
            dst = queue[k % len(queue)] if queue else NULL_BLOCK_ID
        self.step(f"move the keys of block {src} to block {dst} ({kind.replace('_', ' ')})")
        self.expect_rejected(self.pool.move_block_hashes(src, dst), f"move({src}, {dst})")

    @precondition(lambda self: _invalid(self) and self.tables_with_blocks())
    @rule(kind=st.sampled_from(BAD_BOUNDARIES), t=PICK)
    def partial_boundary_off_the_hash_grid_is_rejected(self, kind: str, t: int) -> None:
        tables = self.tables_with_blocks()
        table = tables[t % len(tables)]
        block = next(b for b in table.blocks if b != NULL_BLOCK_ID)
        fine = len(table.request.block_hashes)
        tokens = {
            "off_grid": self.hbs + 1 if self.hbs > 1 else -self.hbs,
            "zero": 0,
            "beyond_hashes": (fine + 1) * self.hbs,
            "negative": -self.hbs,
        }[kind]
        self.step(f"partial entry for block {block} ending at token {tokens}")
        reply = self.pool.cache_partial_block(table.request, block, tokens, table.group, self.bs)
        self.expect_rejected(reply, f"cache_partial_block(num_tokens={tokens})")


__all__ = ["InvalidCallRules"]
