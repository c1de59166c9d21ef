"""The differential state machine: valid operations that steer pools into interesting states.

:class:`PoolMachine` is a Hypothesis ``RuleBasedStateMachine`` over a :class:`Lockstep` of
backends (the first is the oracle, normally the spec). It keeps a small model of *who holds
what*: request block tables, like vLLM's managers keep them. Rules pick their arguments from
that model and from the oracle's state (held blocks, queued cached blocks, present keys,
watched blocks), never as blind random ids, so that pool exhaustion, eviction, shared blocks,
duplicate keys, partial entries, moved keys, watchers and resets all happen within a few
dozen steps. This module holds the model, the scheduler's common path, allocation and
prefix hits; :mod:`~kvpool.harness.rules.cache`, :mod:`~kvpool.harness.rules.release` and
:mod:`~kvpool.harness.rules.invalid` add the other rules, and
:func:`kvpool.harness.differential.build_machine` combines them.

Every rule applies its operation(s) through the lockstep, which checks results, error types,
abstract states, invariants and events after each call. The machine adds checks of its own,
about the oracle: the model's holder counts equal the ref counts (BEHAVIOUR.md §11.22), and
each rule's name is a claim it asserts (``self.expect``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvpool.harness.pool.config import HarnessConfig
from kvpool.harness.pool.driver import Divergence, Lockstep, Reply
from kvpool.harness.requests import (
    REQUEST_EXTRAS,
    SHARED_PREFIXES,
    TOKEN_ALPHABET,
    coarse_hashes,
)
from kvpool.keys import key_group, key_hash, pack_key
from kvpool.spec.state import NULL_BLOCK_ID, keys_of_block

PICK = st.integers(min_value=0, max_value=63)
"""Chooses among the candidates a rule computed (``candidates[pick % len]``); shrinks to 0."""
PICKS = st.lists(PICK, min_size=1, max_size=4)


@dataclass
class Table:
    """One holder of blocks: a request's block table for one group (vLLM's ``req_to_blocks``).

    Position ``k`` of ``blocks`` holds the request's ``k``-th ``block_size`` tokens; the null
    block fills skipped positions. ``num_cached`` leading positions are already cached.
    """

    request: Any
    blocks: list[int]
    num_cached: int
    group: int


class StepCounter:
    """Rule applications across examples, and the step at which the first check failed."""

    def __init__(self) -> None:
        self.steps = 0
        self.examples = 0
        self.first_divergence_at: int | None = None
        self.first_divergence: Divergence | None = None
        self.deviations: dict[str, int] = {}
        """Documented deviations the lockstep tolerated (description → calls), all examples."""

    def add_deviations(self, seen: dict[str, int]) -> None:
        for what, n in seen.items():
            self.deviations[what] = self.deviations.get(what, 0) + n

    def divergence_seen(self, error: Divergence) -> None:
        if self.first_divergence_at is None:
            self.first_divergence_at = self.steps
            self.first_divergence = error


class PoolMachine(RuleBasedStateMachine):
    """Valid operations (see module docstring); subclassed per configuration.

    ``rules_are_valid``: every call made by a rule defined in this class (or a subclass that
    keeps the flag in its own body) must be accepted by the oracle. A rejection there is a
    harness bug (a rule that believes its arguments valid when the spec says otherwise), so
    the lockstep fails loudly with kind ``"harness"`` instead of hiding it behind equal
    errors. Rule classes that make invalid calls on purpose set it to ``False``.
    """

    config: ClassVar[HarnessConfig] = HarnessConfig()
    counter: ClassVar[StepCounter] = StepCounter()
    rules_are_valid: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        cfg = self.config
        self.counter.examples += 1
        self.pool = Lockstep(
            cfg.backends,
            num_blocks=cfg.num_blocks,
            on_divergence=self._divergence_seen,
            **cfg.pool_options(),
        )
        self.failed = False
        self.bs = cfg.block_size
        self.hbs = cfg.hash_block_size
        self.ratio = cfg.block_size // cfg.hash_block_size
        self.groups = range(cfg.num_groups)
        self.requests: list[Any] = []
        self.coarse: dict[int, list[bytes]] = {}
        self.tables: list[Table] = []
        self.sibling_held: list[int] = []
        self.scheduled = 0

    # -- helpers -----------------------------------------------------------------------------

    def _divergence_seen(self, error: Divergence) -> None:
        self.failed = True
        self.counter.divergence_seen(error)

    def step(self, text: str) -> None:
        """Count one rule application and describe it in domain words.

        Also tells the lockstep whether the running rule's calls must all be accepted: the
        rule is the caller, and the class that defines it says (``rules_are_valid``).
        """
        self.counter.steps += 1
        self.pool.rule = sys._getframe(1).f_code.co_name
        self.pool.must_accept = self._rule_is_valid(self.pool.rule)
        note(text)

    @classmethod
    def _rule_is_valid(cls, name: str) -> bool:
        for klass in cls.__mro__:
            if name in vars(klass):
                return bool(vars(klass).get("rules_are_valid", False))
        return False

    def expect(self, claim: bool, message: str) -> None:
        """A rule's own claim about the oracle's answer (the spec checked against §6)."""
        if not claim:
            raise self.pool.fail("property", message)

    @property
    def state(self) -> Any:
        return self.pool.state

    def free_count(self) -> int:
        return len(self.state.free_queue)

    def hashes(self, request: Any) -> list[bytes]:
        key = id(request)
        if key not in self.coarse:
            self.coarse[key] = coarse_hashes(request, self.hbs, self.bs)
        return self.coarse[key]

    def held_blocks(self) -> list[int]:
        seen: dict[int, None] = {}
        for table in self.tables:
            for b in table.blocks:
                if b != NULL_BLOCK_ID:
                    seen[b] = None
        return list(seen)

    @property
    def api(self) -> Any:
        """The calls the pools under test offer (:class:`~kvpool.harness.api.PoolApi`)."""
        return self.config.api

    def release_batch(self, blocks: list[int]) -> list[int]:
        """A ``free_blocks`` batch for ``blocks``: without the null block for pools that
        count its references (vLLM < 0.33), where passing it would change its ref count."""
        if self.api.null_block_skipped:
            return list(blocks)
        return [b for b in blocks if b != NULL_BLOCK_ID]

    def _cacheable_tables(self) -> list[Table]:
        """Tables with a position past their cached prefix that a hash covers."""
        return [x for x in self.tables if len(self.hashes(x.request)) > x.num_cached]

    def _pick_cacheable_table(self, t: int) -> tuple[Table, int] | None:
        """Table ``t`` of :meth:`_cacheable_tables` and its ``num_full``, or ``None`` when no
        position can be cached (the precondition saw tables a shrunk run no longer has)."""
        tables = self._cacheable_tables()
        if not tables:
            return None
        table = tables[t % len(tables)]
        num_full = min(len(table.blocks), len(self.hashes(table.request)))
        return None if num_full <= table.num_cached else (table, num_full)

    def tables_with_blocks(self) -> list[Table]:
        return [t for t in self.tables if any(b != NULL_BLOCK_ID for b in t.blocks)]

    def queued_keyed(self) -> list[int]:
        keys = self.state.primary_key
        return [b for b in self.state.free_queue if keys[b] is not None]

    def cacheable_range(self, table: Table) -> tuple[int, int]:
        """``(first, limit)``: positions ``[first, n)`` of ``table`` may be cached, n ≤ limit.

        Leading positions whose block already carries a key covering the whole position (a
        partial entry that completed the block, keys moved onto it by ``move_block_hashes``)
        count as cached: ``table.num_cached`` advances over them, as a manager that saw the
        key would. The range then stops before the next position the spec would refuse:
        a block already keyed that far, or one listed twice.
        """
        hashes = len(self.hashes(table.request))
        tokens = self.state.primary_tokens
        end = min(len(table.blocks), hashes)

        def covered(p: int) -> bool:
            b = table.blocks[p]
            return b != NULL_BLOCK_ID and tokens[b] is not None and tokens[b] >= (p + 1) * self.bs

        while table.num_cached < end and covered(table.num_cached):
            table.num_cached += 1
        seen: set[int] = set()
        limit = table.num_cached
        while limit < end and not covered(limit) and table.blocks[limit] not in seen:
            if table.blocks[limit] != NULL_BLOCK_ID:
                seen.add(table.blocks[limit])
            limit += 1
        return table.num_cached, limit

    def add_table(self, request: Any, reply: Reply, group: int,
                  prefix: Sequence[int] = ()) -> None:
        """Record the blocks an allocation handed out (also when a watcher raised after it)."""
        if not reply.rejected and reply.value is not None:
            self.tables.append(Table(request, [*prefix, *reply.value], len(prefix), group))

    def release(self, table: Table) -> None:
        self.tables.remove(table)

    # -- requests ----------------------------------------------------------------------------

    @initialize(prefix=st.integers(0, len(SHARED_PREFIXES) - 1),
                suffix=st.lists(st.sampled_from(TOKEN_ALPHABET), max_size=12))
    def first_request(self, prefix: int, suffix: list[int]) -> None:
        self.a_new_request_may_share_a_prefix(prefix, suffix)

    @precondition(lambda self: len(self.requests) < self.config.max_requests)
    @rule(prefix=st.integers(0, len(SHARED_PREFIXES) - 1),
          suffix=st.lists(st.sampled_from(TOKEN_ALPHABET), max_size=12))
    def a_new_request_may_share_a_prefix(self, prefix: int, suffix: list[int]) -> None:
        tokens = [*SHARED_PREFIXES[prefix], *suffix]
        self.step(f"a request arrives with {len(tokens)} tokens (shared prefix {prefix})")
        self.requests.append(self.pool.make_request(tokens))

    @precondition(lambda self: self.config.request_extras
                  and len(self.requests) < self.config.max_requests)
    @rule(prefix=st.integers(0, len(SHARED_PREFIXES) - 1),
          suffix=st.lists(st.sampled_from(TOKEN_ALPHABET), max_size=12),
          extras=st.integers(1, len(REQUEST_EXTRAS) - 1))
    def a_request_with_lora_multimodal_or_salt_arrives(self, prefix: int, suffix: list[int],
                                                       extras: int) -> None:
        allowed = [i for i, e in enumerate(REQUEST_EXTRAS)
                   if i and (self.api.mm_window_index or "mm_features" not in e)]
        extras = allowed[extras % len(allowed)]
        tokens = [*SHARED_PREFIXES[prefix], *suffix]
        self.step(f"a request with extra keys {sorted(REQUEST_EXTRAS[extras])} arrives "
                  f"with {len(tokens)} tokens")
        self.requests.append(self.pool.make_request(tokens, extras))

    # -- the scheduler's common path -----------------------------------------------------------

    @rule()
    def a_request_is_scheduled_reusing_its_cached_prefix(self) -> None:
        """vLLM's ``allocate_slots`` then ``cache_blocks``: hits, touch, allocate, cache.

        Takes no arguments on purpose: Hypothesis prefers the first rule of its (argument
        count, name) order, so the most common step is the one that builds realistic state.
        The request and group rotate with the step count instead.
        """
        turn = self.scheduled
        self.scheduled += 1
        request = self.requests[turn % len(self.requests)]
        group = (turn // len(self.requests)) % len(self.groups)
        hashes = self.hashes(request)
        self.step(f"schedule {request.request_id} in group {group} ({len(hashes)} full blocks)")
        hits: list[int] = []
        if self.config.enable_caching:
            for h in hashes[: self.config.max_table_blocks]:
                found = self.pool.get_cached_block(h, [group]).value
                if found is None:
                    break
                hits.append(found[0])
            if hits and self.pool.touch(hits).rejected:
                return
        wanted = min(len(hashes) + 1, self.config.max_table_blocks) - len(hits)
        while self.free_count() < wanted and len(self.tables) > 1:
            # Out of room: finish the oldest request, as a scheduler would, so its cached
            # blocks become eviction candidates at the tail of the queue.
            oldest = self.tables[0]
            if self.pool.free_blocks(self.release_batch(oldest.blocks[::-1])).rejected:
                break
            self.release(oldest)
        reply = self.pool.get_new_blocks(max(0, min(wanted, self.free_count())))
        if reply.rejected:
            return
        self.add_table(request, reply, group, hits)
        table = self.tables[-1]
        _, num_full = self.cacheable_range(table)
        if self.config.enable_caching and num_full > table.num_cached:
            reply = self.pool.cache_full_blocks(request, list(table.blocks), table.num_cached,
                                                num_full, self.bs, group)
            if not reply.rejected:
                table.num_cached = num_full

    # -- allocation --------------------------------------------------------------------------

    @rule(req=PICK, n=st.integers(0, 4), group=PICK)
    def allocation_hands_out_the_front_of_the_free_queue(self, req: int, n: int, group: int):
        n = min(n, self.free_count(), self.config.max_table_blocks)
        request = self.requests[req % len(self.requests)]
        expected = list(self.state.free_queue[:n])
        self.step(f"allocate {n} blocks for a new table of {request.request_id}")
        reply = self.pool.get_new_blocks(n)
        self.expect(reply.value == expected, f"get_new_blocks({n}) should return {expected}")
        self.add_table(request, reply, group % len(self.groups))

    @precondition(lambda self: self.config.enable_caching and self.queued_keyed())
    @rule(req=PICK, group=PICK)
    def allocation_evicts_least_recent_cached_block(self, req: int, group: int) -> None:
        queue, keys = self.state.free_queue, self.state.primary_key
        first = next(i for i, b in enumerate(queue) if keys[b] is not None)
        victim = queue[first]
        self.step(f"allocate {first + 1} blocks, evicting least recent cached block {victim}")
        reply = self.pool.get_new_blocks(first + 1)
        self.expect(
            not keys_of_block(self.state, victim),
            f"block {victim} was reallocated but kept its keys",
        )
        self.add_table(self.requests[req % len(self.requests)], reply, group % len(self.groups))

    @precondition(lambda self: self.free_count() > 0)
    @rule(req=PICK, group=PICK)
    def exhausting_the_pool_hands_out_every_free_block(self, req: int, group: int) -> None:
        n = self.free_count()
        self.step(f"allocate all {n} free blocks")
        reply = self.pool.get_new_blocks(n)
        self.expect(self.free_count() == 0, "the pool should be exhausted")
        self.add_table(self.requests[req % len(self.requests)], reply, group % len(self.groups))

    @precondition(lambda self: self.tables and self.free_count() > 0)
    @rule(t=PICK, n=st.integers(1, 3))
    def growing_a_table_appends_fresh_blocks(self, t: int, n: int) -> None:
        table = self.tables[t % len(self.tables)]
        n = min(n, self.free_count())
        self.step(f"table of {table.request.request_id} grows by {n} blocks")
        reply = self.pool.get_new_blocks(n)
        if not reply.rejected:
            table.blocks.extend(reply.value)

    # -- prefix hits -------------------------------------------------------------------------

    def hit_candidates(self) -> list[tuple[Any, int]]:
        cache = self.state.cache
        return [
            (r, g)
            for r in self.requests
            for g in self.groups
            if self.hashes(r) and pack_key(self.hashes(r)[0], g) in cache
        ]

    @precondition(lambda self: self.config.enable_caching and self.hit_candidates())
    @rule(k=PICK, extra=st.integers(0, 2))
    def prefix_hit_touches_and_shares_cached_blocks(self, k: int, extra: int) -> None:
        candidates = self.hit_candidates()
        request, group = candidates[k % len(candidates)]
        self.step(f"{request.request_id} looks up its prefix in group {group}")
        hits: list[int] = []
        for h in self.hashes(request)[: self.config.max_table_blocks]:
            found = self.pool.get_cached_block(h, [group]).value
            if found is None:
                break
            hits.append(found[0])
        self.expect(bool(hits), f"{request.request_id}'s first block should hit")
        if self.pool.touch(hits).rejected:
            return
        n = min(extra, self.free_count())
        self.add_table(request, self.pool.get_new_blocks(n), group, hits)

    @precondition(lambda self: self.state.cache)
    @rule(k=PICK, others=st.lists(st.integers(0, 3), max_size=2), where=PICK)
    def lookup_answers_every_group_or_none(self, k: int, others: list[int], where: int):
        keys = list(self.state.cache)
        key = keys[k % len(keys)]
        group_ids = [g % (len(self.groups) + 1) for g in others]
        group_ids.insert(where % (len(group_ids) + 1), key_group(key))
        self.step(f"look up one cached hash in groups {group_ids}")
        reply = self.pool.get_cached_block(key_hash(key), group_ids)
        cache = self.state.cache
        all_hit = all(pack_key(key_hash(key), g) in cache for g in group_ids)
        answered = reply.value is not None
        self.expect(
            answered == all_hit and (not all_hit or len(reply.value) == len(group_ids)),
            "get_cached_block is all-or-nothing, one block per requested group",
        )

    # -- model checks ------------------------------------------------------------------------

    @invariant()
    def ref_counts_equal_the_holders_in_the_tables(self) -> None:
        """§11.22: every reference is a table slot (or a sibling block handed out)."""
        expected = [0] * self.config.num_blocks
        for table in self.tables:
            for b in table.blocks:
                if b != NULL_BLOCK_ID:
                    expected[b] += 1
        if tuple(expected) != self.state.ref_cnt:
            raise self.pool.fail(
                "invariant",
                f"ref_counts_equal_the_holders_in_the_tables: tables hold {expected}, "
                f"pool says {list(self.state.ref_cnt)}",
            )
        if self.pool.siblings is not None:
            sib = [0] * self.config.num_blocks
            for b in self.sibling_held:
                sib[b] += 1
            if tuple(sib) != self.pool.sibling_state.ref_cnt:
                raise self.pool.fail("invariant", f"sibling holds {sib}, pool says "
                                      f"{list(self.pool.sibling_state.ref_cnt)}")

    def teardown(self) -> None:
        self.counter.add_deviations(self.pool.deviations)
        # A last replay check per example; skipped after a failure, whose report must stand.
        if not self.failed and self.pool.events_enabled:
            self.pool.take_events()


__all__ = ["PICK", "PICKS", "PoolMachine", "StepCounter", "Table"]
