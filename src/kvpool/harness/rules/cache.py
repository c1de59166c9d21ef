"""Rules that give blocks their cache identity, move it, drop it and report it.

Caching full blocks (with masks and promotion of partial entries), equal prefixes cached on
fresh blocks (several blocks under one key), partial entries inside a block (``bs > hbs``)
and shorter entries kept as secondary keys in several groups, ``move_block_hashes``,
``evict_blocks``, ``emit_cached_block_events`` and ``take_events`` (whose replay the lockstep
checks against the hash table).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvpool.harness.pool.machine import PICK, PICKS, PoolMachine, Table
from kvpool.keys import pack_key
from kvpool.spec.state import NULL_BLOCK_ID, keys_of_block


class CacheRules(PoolMachine):
    """The prefix-cache writes and reports (see the module docstring)."""

    rules_are_valid = True

    def cacheable_tables(self) -> list[Table]:
        return [t for t in self.tables if (r := self.cacheable_range(t))[0] < r[1]]

    @precondition(lambda self: self.config.enable_caching and self.cacheable_tables())
    @rule(t=PICK, k=PICK, masked=st.booleans(),
          bits=st.lists(st.booleans(), min_size=1, max_size=4))
    def caching_full_blocks_keys_each_new_position(self, t: int, k: int, masked: bool,
                                                    bits: list[bool]) -> None:
        tables = self.cacheable_tables()
        table = tables[t % len(tables)]
        _, limit = self.cacheable_range(table)
        num_full = table.num_cached + 1 + k % (limit - table.num_cached)
        mask = [bits[i % len(bits)] for i in range(num_full - table.num_cached)] if masked else None
        self.step(
            f"cache positions {table.num_cached}..{num_full - 1} of {table.request.request_id}'s "
            f"table in group {table.group}" + (f" with mask {mask}" if mask else "")
        )
        reply = self.pool.cache_full_blocks(table.request, list(table.blocks), table.num_cached,
                                            num_full, self.bs, table.group, mask)
        if not reply.rejected:
            table.num_cached = num_full

    def duplicate_candidates(self) -> list[tuple[Any, int]]:
        return self.hit_candidates() if self.free_count() > 0 else []

    @precondition(lambda self: self.config.enable_caching and self.duplicate_candidates())
    @rule(k=PICK, n=st.integers(1, 3))
    def caching_an_equal_prefix_on_fresh_blocks_duplicates_the_key(self, k: int, n: int):
        candidates = self.duplicate_candidates()
        request, group = candidates[k % len(candidates)]
        n = min(n, self.free_count(), len(self.hashes(request)))
        self.step(f"{request.request_id} ignores its hit and caches {n} fresh blocks again")
        reply = self.pool.get_new_blocks(n)
        if reply.rejected:
            return
        self.add_table(request, reply, group)
        table = self.tables[-1]
        reply = self.pool.cache_full_blocks(request, list(table.blocks), 0, n, self.bs, group)
        if not reply.rejected:
            table.num_cached = n
            key = pack_key(self.hashes(request)[0], group)
            self.expect(table.blocks[0] in self.state.cache.get(key, ()),
                        f"block {table.blocks[0]} should be listed under its key")

    def partial_candidates(self, shorter_only: bool = False) -> list[tuple[Table, int, int]]:
        """(table, position, highest fine index usable) for non-null blocks with hashes."""
        out = []
        # Pools before vLLM 0.33 take only boundaries strictly inside a block (bs > hbs).
        widest = self.ratio if self.api.partial_any_boundary else self.ratio - 1
        for t in self.tables:
            fine = len(t.request.block_hashes)
            for p, b in enumerate(t.blocks):
                top = min(widest, fine - p * self.ratio)
                if b == NULL_BLOCK_ID or top < 1:
                    continue
                if shorter_only:
                    tokens = self.state.primary_tokens[b]
                    if tokens is None or tokens - p * self.bs < 2 * self.hbs:
                        continue
                    top = min(top, (tokens - p * self.bs) // self.hbs - 1)
                out.append((t, p, top))
        return out

    @precondition(lambda self: self.config.enable_caching and self.partial_candidates())
    @rule(k=PICK, j=PICK, group=PICK, replace=st.booleans())
    def partial_block_entry_grows_toward_a_full_key(self, k: int, j: int, group: int,
                                                    replace: bool) -> None:
        candidates = self.partial_candidates()
        table, p, top = candidates[k % len(candidates)]
        num_tokens = p * self.bs + (1 + j % top) * self.hbs
        block, g = table.blocks[p], group % len(self.groups)
        replace = replace and self.api.replace_existing_hashes
        self.step(f"block {block} gets a prefix entry ending at token {num_tokens} (group {g})")
        self.pool.cache_partial_block(table.request, block, num_tokens, g, self.bs, replace)

    @precondition(lambda self: self.config.enable_caching and self.partial_candidates(True))
    @rule(k=PICK, j=PICK, first_group=PICK)
    def a_block_keeps_shorter_entries_as_secondary_keys(self, k: int, j: int, first_group: int):
        candidates = self.partial_candidates(shorter_only=True)
        table, p, top = candidates[k % len(candidates)]
        num_tokens = p * self.bs + (1 + j % top) * self.hbs
        block = table.blocks[p]
        groups = [(first_group + i) % len(self.groups) for i in range(len(self.groups))]
        self.step(f"block {block} also answers the prefix ending at {num_tokens}, groups {groups}")
        for g in groups:
            self.pool.cache_partial_block(table.request, block, num_tokens, g, self.bs)
            key = pack_key(table.request.block_hashes[num_tokens // self.hbs - 1], g)
            self.expect(block in self.state.cache.get(key, ()),
                        f"block {block} should answer {key!r}")

    def move_candidates(self) -> tuple[list[int], list[int]]:
        held = self.held_blocks()
        keys = self.state.primary_key
        return [b for b in held if keys[b] is not None], [b for b in held if keys[b] is None]

    @precondition(lambda self: self.config.enable_caching and self.api.move_block_hashes
                  and all(self.move_candidates()))
    @rule(a=PICK, b=PICK)
    def move_hands_the_cache_identity_to_a_private_copy(self, a: int, b: int) -> None:
        sources, targets = self.move_candidates()
        src, dst = sources[a % len(sources)], targets[b % len(targets)]
        moved = keys_of_block(self.state, src)
        self.step(f"block {dst} takes over the {len(moved)} keys of block {src}")
        reply = self.pool.move_block_hashes(src, dst)
        if not reply.rejected:
            moved_in_order = keys_of_block(self.state, dst) == moved
            self.expect(moved_in_order and not keys_of_block(self.state, src),
                        f"keys {moved!r} should move from {src} to {dst} in order")

    @rule(picks=PICKS)
    def evicting_blocks_drops_their_keys_and_nothing_else(self, picks: list[int]) -> None:
        keyed = [b for b, key in enumerate(self.state.primary_key) if key is not None]
        candidates = keyed + list(range(self.config.num_blocks))
        ids = [candidates[p % len(candidates)] for p in picks]
        before = self.state
        self.step(f"a connector reports blocks {ids} lost")
        self.pool.evict_blocks(ids)
        after = self.state
        self.expect(
            after.ref_cnt == before.ref_cnt and after.free_queue == before.free_queue
            and not any(keys_of_block(after, b) for b in ids),
            "evict_blocks drops keys only",
        )

    @precondition(lambda self: self.api.emit_cached_block_events and self.tables)
    @rule(t=PICK, n=PICK)
    def emitting_cached_block_events_reports_the_whole_prefix(self, t: int, n: int) -> None:
        table = self.tables[t % len(self.tables)]
        n %= len(self.hashes(table.request)) + 1
        self.step(f"report the first {n} blocks of {table.request.request_id} as stored")
        self.pool.emit_cached_block_events(table.request, n, self.bs, table.group)

    @rule()
    def taken_events_replay_to_the_cache_index(self) -> None:
        self.step("take the pending events (replay must rebuild the cache index)")
        self.pool.take_events()


__all__ = ["CacheRules"]
