"""Rules that give blocks back: freeing tables, skipped positions, unpinning, resets, routing.

Freeing in reverse table order and in arbitrary caller order (both zones of the queue),
positions falling out of a window (replaced by the null block, then freed with it),
unpinning with recording or raising watchers and the allocations that fire them, resets
refused and accepted, a sibling pool whose blocks travel in the same ``free_blocks`` batch,
and the read-only queries.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvpool.harness.pool.machine import PICK, PICKS, PoolMachine, Table
from kvpool.harness.values import RAISE, RECORD, Foreign
from kvpool.spec.state import NULL_BLOCK_ID, keys_of_block


class ReleaseRules(PoolMachine):
    """Releases, watchers, resets, routing and queries (see the module docstring)."""

    rules_are_valid = True

    @precondition(lambda self: self.tables)
    @rule(t=PICK)
    def freeing_a_table_in_reverse_order_evicts_its_tail_first(self, t: int) -> None:
        table = self.tables[t % len(self.tables)]
        self.step(f"{table.request.request_id} finishes: free its table tail first")
        if not self.pool.free_blocks(self.release_batch(table.blocks[::-1])).rejected:
            self.release(table)

    @precondition(lambda self: self.tables)
    @rule(t=PICK, keys=st.lists(PICK, min_size=1, max_size=6))
    def freeing_keeps_the_callers_order_within_each_zone(self, t: int, keys: list[int]) -> None:
        table = self.tables[t % len(self.tables)]
        order = sorted(range(len(table.blocks)), key=lambda i: (keys[i % len(keys)], i))
        batch = self.release_batch([table.blocks[i] for i in order])
        self.step(f"free {table.request.request_id}'s blocks in caller order {batch}")
        if not self.pool.free_blocks(batch).rejected:
            self.release(table)

    def skippable_tables(self) -> list[Table]:
        return [t for t in self.tables if len(t.blocks) >= 2 and t.blocks[0] != NULL_BLOCK_ID]

    @precondition(lambda self: self.skippable_tables())
    @rule(t=PICK, k=PICK)
    def skipped_positions_become_null_and_are_freed(self, t: int, k: int) -> None:
        tables = self.skippable_tables()
        table = tables[t % len(tables)]
        end = 1 + k % (len(table.blocks) - 1)
        positions = []
        for p in range(end - 1, -1, -1):  # walk back from the window edge, stop at a null
            if table.blocks[p] == NULL_BLOCK_ID:
                break
            positions.append(p)
        batch = [table.blocks[p] for p in positions]
        self.step(f"positions {sorted(positions)} fall out of the window: free {batch}")
        if not self.pool.free_blocks(batch).rejected:
            for p in positions:
                table.blocks[p] = NULL_BLOCK_ID

    @precondition(lambda self: self.config.watchers and self.tables_with_blocks())
    @rule(t=PICK, raising=st.booleans())
    def unpinned_blocks_wait_at_the_tail_for_reuse(self, t: int, raising: bool) -> None:
        tables = self.tables_with_blocks()
        table = tables[t % len(tables)]
        blocks = [b for b in table.blocks if b != NULL_BLOCK_ID]
        raising = raising and self.config.raising_watchers
        watcher = RAISE if raising else RECORD
        self.step(f"unpin {blocks} with a {'raising' if raising else 'recording'} watcher")
        if not self.pool.unpin_blocks(blocks, watcher).rejected:
            self.release(table)

    def watched_positions(self) -> list[int]:
        watched = set(self.state.watchers)
        return [i for i, b in enumerate(self.state.free_queue) if b in watched]

    @precondition(lambda self: self.watched_positions())
    @rule(req=PICK, k=PICK, group=PICK)
    def allocation_fires_reuse_watchers_in_queue_order(self, req: int, k: int, group: int):
        positions = self.watched_positions()
        n = positions[k % len(positions)] + 1
        popped = self.state.free_queue[:n]
        watched = [b for b in popped if b in self.state.watchers]
        fired_before = len(self.pool.fired[0])
        self.step(f"allocate {n} blocks, reusing unpinned blocks {watched}")
        reply = self.pool.get_new_blocks(n)
        fired = [b for _, b in self.pool.fired[0][fired_before:]]
        self.expect(fired == watched, f"watchers should fire for {watched} in queue order")
        self.add_table(self.requests[req % len(self.requests)], reply, group % len(self.groups))

    @precondition(lambda self: self.free_count() < self.config.num_blocks - 1)
    @rule()
    def reset_is_refused_while_blocks_are_held(self) -> None:
        self.step("reset the prefix cache while blocks are held")
        self.expect(self.pool.reset_prefix_cache().value is False, "reset must be refused")

    @rule(oldest_first=st.booleans())
    def releasing_every_table_then_resetting_clears_the_cache(self, oldest_first: bool) -> None:
        self.step(f"free all {len(self.tables)} tables, then reset the prefix cache")
        for table in list(self.tables if oldest_first else reversed(self.tables)):
            if not self.pool.free_blocks(self.release_batch(table.blocks[::-1])).rejected:
                self.release(table)
        reply = self.pool.reset_prefix_cache()
        self.expect(reply.value is True and not self.state.cache, "reset must clear the cache")

    # -- repeated ids within one batch ---------------------------------------------------------

    def touchable_blocks(self) -> list[int]:
        held = self.held_blocks()
        return held + [b for b in self.state.free_queue if b not in held]

    @precondition(lambda self: self.requests and self.touchable_blocks())
    @rule(k=PICK, req=PICK, times=st.integers(2, 3))
    def touching_a_block_twice_in_one_batch_takes_a_reference_each_time(self, k: int, req: int,
                                                                       times: int) -> None:
        candidates = self.touchable_blocks()
        b = candidates[k % len(candidates)]
        before = self.state.ref_cnt[b]
        self.step(f"touch block {b} {times} times in one batch")
        reply = self.pool.touch([b] * times)
        self.expect(self.state.ref_cnt[b] == before + times,
                    f"touch([{b}] * {times}) should add {times} references")
        if not reply.rejected:  # one holder per touch: a table that lists the block `times` times
            request = self.requests[req % len(self.requests)]
            self.tables.append(Table(request, [b] * times, times, 0))

    def tables_sharing_a_block(self) -> list[tuple[Table, Table | None]]:
        """Tables whose release batch repeats a block: one listing it twice, or two sharing it."""
        out: list[tuple[Table, Table | None]] = []
        for i, t in enumerate(self.tables):
            real = [b for b in t.blocks if b != NULL_BLOCK_ID]
            if len(set(real)) < len(real):
                out.append((t, None))
            for u in self.tables[i + 1:]:
                if set(real) & set(u.blocks) - {NULL_BLOCK_ID}:
                    out.append((t, u))
        return out

    @precondition(lambda self: self.tables_sharing_a_block())
    @rule(k=PICK)
    def freeing_a_shared_block_twice_in_one_batch_releases_both_references(self, k: int) -> None:
        pairs = self.tables_sharing_a_block()
        first, second = pairs[k % len(pairs)]
        batch = first.blocks[::-1] + (second.blocks[::-1] if second else [])
        batch = self.release_batch(batch)
        self.step(f"free {batch} in one batch (a block appears twice, once per holder)")
        if not self.pool.free_blocks(batch).rejected:
            self.release(first)
            if second is not None:
                self.release(second)

    def sole_unkeyed_owners(self) -> list[int]:
        state = self.state
        return [b for b in self.held_blocks()
                if state.ref_cnt[b] == 1 and not keys_of_block(state, b)]

    @precondition(lambda self: self.api.is_block_writable and self.requests
                  and self.sole_unkeyed_owners())
    @rule(k=PICK, req=PICK)
    def a_second_holder_makes_an_unkeyed_block_read_only(self, k: int, req: int) -> None:
        candidates = self.sole_unkeyed_owners()
        b = candidates[k % len(candidates)]
        self.step(f"block {b} gets a second holder: no longer writable in place")
        self.expect(self.pool.is_block_writable(b).value is True,
                    f"block {b} (ref 1, no key) should be writable")
        if self.pool.touch([b]).rejected:
            return
        self.tables.append(Table(self.requests[req % len(self.requests)], [b], 1, 0))
        self.expect(self.pool.is_block_writable(b).value is False,
                    f"block {b} has two holders and should not be writable")

    # -- siblings (multi-pool routing) ---------------------------------------------------------

    @precondition(lambda self: self.config.foreign_blocks
                  and len(self.sibling_held) < self.config.num_blocks - 1)
    @rule(n=st.integers(1, 3))
    def sibling_pool_allocates_independently(self, n: int) -> None:
        n = min(n, self.config.num_blocks - 1 - len(self.sibling_held))
        self.step(f"the sibling pool allocates {n} blocks")
        reply = self.pool.sibling_get_new_blocks(n)
        if not reply.rejected:
            self.sibling_held.extend(reply.value)

    @precondition(lambda self: self.sibling_held and self.tables)
    @rule(t=PICK, picks=PICKS, where=PICK)
    def freeing_blocks_of_two_pools_routes_each_to_its_owner(self, t: int, picks: list[int],
                                                             where: int) -> None:
        table = self.tables[t % len(self.tables)]
        foreign = list(dict.fromkeys(self.sibling_held[p % len(self.sibling_held)] for p in picks))
        batch: list[Any] = self.release_batch(table.blocks[::-1])
        for i, b in enumerate(foreign):
            batch.insert((where + i) % (len(batch) + 1), Foreign(b))
        self.step(f"free {table.request.request_id}'s table together with sibling blocks {foreign}")
        if not self.pool.free_blocks(batch).rejected:
            self.release(table)
            for b in foreign:
                self.sibling_held.remove(b)

    # -- queries -----------------------------------------------------------------------------

    @precondition(lambda self: self.api.is_block_writable)
    @rule(b=PICK)
    def writability_means_sole_unkeyed_owner(self, b: int) -> None:
        b %= self.config.num_blocks
        self.step(f"is block {b} writable in place?")
        state = self.state
        expected = b != NULL_BLOCK_ID and state.ref_cnt[b] == 1 and not keys_of_block(state, b)
        self.expect(self.pool.is_block_writable(b).value == expected,
                    f"is_block_writable({b}) should be {expected}")

    @rule()
    def usage_counts_cached_candidates_as_free(self) -> None:
        self.step("read the free count and usage")
        free = self.pool.get_num_free_blocks().value
        self.pool.get_usage()
        self.expect(free == self.free_count(), "free count = queue length")


__all__ = ["ReleaseRules"]
