"""Rules for issue 7's hostile classes: callbacks that call back in or raise, and keys,
tokens and requests of the wrong type. Generated, so they meet every state the other rules
build, and checked in lockstep: every backend must raise the same error type (for a
callback failure: the same ``.result`` and cause type) and keep ``abstract()`` unchanged
when it refuses.

The semantics they assert (docs/api.md, "Callbacks"): callbacks run after the operation
completed; a state-changing call from inside one raises ``ReentrantCall`` before anything
changes; the first failing callback is re-raised as ``WatcherError`` /
``MetricsCollectorError`` carrying the operation's result, after every callback ran.

Issue 23's wrong-type classes are generated too: a ``block_mask`` entry that is not a yes/no
(``allocate_and_cache``, composed on spec/reference and one kernel call on fast, must refuse
it as ``cache_full_blocks`` does) or a mask that is not a sequence; lookups whose group ids
are not a collection; event streams ``replay`` must refuse with ``InvalidEvent``; unknown
``make_pool`` options and backends that are not names; block hashers that are not callable
or return something other than bytes digests. Each must be the documented ``KvPoolError``,
never a bare ``TypeError``, and (for pool calls) the same on every backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvpool.backends import BACKENDS, make_pool
from kvpool.errors import (
    BackendUnavailable,
    CallbackError,
    InvalidArgument,
    InvalidConfig,
    InvalidEvent,
    KvPoolError,
    ReentrantCall,
)
from kvpool.events import replay
from kvpool.harness.pool.machine import PICK, PoolMachine
from kvpool.harness.requests import make_request
from kvpool.harness.rules.hostile_values import (
    BAD_BACKEND_NAMES,
    BAD_BLOCK_HASHERS,
    BAD_GROUP_LISTS,
    BAD_HASHES,
    BAD_MASK_ENTRIES,
    BAD_MASKS,
    BAD_POOL_OPTIONS,
    COLLECTORS,
    GARBAGE_EVENT_STREAMS,
    ODD_MASK_ENTRIES,
    REENTRANT_WATCHERS,
    with_hash,
    without_tokens,
)
from kvpool.request import Request
from kvpool.spec.state import NULL_BLOCK_ID

BAD_TOKENS = ("5", 1.5, None, -1, 2**63, True)


def _hostile(self: Any) -> bool:
    return self.config.invalid_calls


def _reentrant(self: Any) -> bool:
    return self.config.invalid_calls and self.config.watchers and self.config.raising_watchers


class HostileRules(PoolMachine):
    """:class:`PoolMachine` plus issue 7's hostile callbacks and argument types."""

    hostile_requests = 0

    def define_hostile(self, value: Any, expression: str) -> Any:
        """Name a hostile request in the reproduction log (``hN = expression``)."""
        name = f"h{self.hostile_requests}"
        self.hostile_requests += 1
        self.pool.log.define(name, value, expression)
        return value

    # -- callbacks -----------------------------------------------------------------------

    @precondition(lambda self: _reentrant(self) and self.tables_with_blocks())
    @rule(t=PICK, kind=st.sampled_from(REENTRANT_WATCHERS))
    def a_watcher_calling_back_into_the_pool_is_refused_and_all_watchers_fire(
        self, t: int, kind: Any
    ) -> None:
        tables = self.tables_with_blocks()
        table = tables[t % len(tables)]
        blocks = [b for b in table.blocks if b != NULL_BLOCK_ID]
        self.step(f"unpin {blocks} with a watcher that calls back in ({kind!r})")
        if self.pool.unpin_blocks(blocks, kind).rejected:
            return
        self.release(table)
        watched = set(self.state.watchers)
        queue = self.state.free_queue
        # Allocate up to the last block that now carries *this* watcher: other watched blocks
        # may be queued while every block unpinned here is still held (a table can list a
        # block that another table holds too).
        positions = [i for i, b in enumerate(queue) if b in blocks]
        if not positions:
            return  # every block unpinned here is still held by another table
        n = positions[-1] + 1
        expected = [b for b in queue[:n] if b in watched]
        fired_before = len(self.pool.fired[0])
        self.step(f"allocate {n} blocks, firing the watchers of {expected}")
        reply = self.pool.get_new_blocks(n)
        fired = [b for _, b in self.pool.fired[0][fired_before:]]
        self.expect(fired == expected, f"every watcher should fire, in order: {expected}")
        self.expect(
            isinstance(reply.error, CallbackError)
            and isinstance(reply.error.__cause__, (ReentrantCall, RuntimeError)),
            f"the re-entrant watcher's call should be refused, got {reply.error!r}",
        )
        self.add_table(self.requests[0], reply, 0)

    @precondition(_hostile)
    @rule(kind=st.sampled_from((*COLLECTORS, None)))
    def metrics_collectors_that_raise_or_call_back_leave_operations_whole(self, kind: Any):
        self.step(f"install metrics collector {kind!r} on every backend")
        self.pool.set_metrics_collector(kind)

    # -- key and token types -------------------------------------------------------------

    @precondition(lambda self: _hostile(self) and self.config.enable_caching
                  and self._cacheable_tables())
    @rule(t=PICK, bad=st.sampled_from(BAD_HASHES), where=PICK)
    def a_hash_that_is_not_bytes_is_rejected_before_any_key(self, t: int, bad: Any,
                                                            where: int) -> None:
        picked = self._pick_cacheable_table(t)
        if picked is None:
            return
        table, num_full = picked
        # The bad hash goes at a later position, so that a half-applied write would
        # already have keyed the earlier blocks.
        k = table.num_cached + where % (num_full - table.num_cached)
        fine = (k + 1) * self.ratio - 1
        name = self.pool.log.render(table.request)
        request = self.define_hostile(with_hash(table.request, fine, bad),
                                      f"with_hash({name}, {fine}, {bad!r})")
        self.step(f"cache {table.request.request_id}'s blocks with hash {fine} = {bad!r}")
        reply = self.pool.cache_full_blocks(request, list(table.blocks), table.num_cached,
                                            num_full, self.bs, table.group)
        self.expect(reply.rejected and isinstance(reply.error, InvalidArgument),
                    f"a {type(bad).__name__} block hash should raise InvalidArgument")

    @precondition(_hostile)
    @rule(bad=st.sampled_from(BAD_HASHES))
    def a_lookup_with_a_hash_that_is_not_bytes_is_rejected(self, bad: Any) -> None:
        self.step(f"look up block hash {bad!r}")
        reply = self.pool.get_cached_block(bad, [0])
        self.expect(reply.rejected and isinstance(reply.error, InvalidArgument),
                    f"get_cached_block({bad!r}) should raise InvalidArgument")

    @precondition(lambda self: _hostile(self) and self.config.enable_caching
                  and self._cacheable_tables())
    @rule(t=PICK)
    def a_request_an_event_cannot_describe_is_refused_with_events_on(self, t: int) -> None:
        picked = self._pick_cacheable_table(t)
        if picked is None:
            return
        table, num_full = picked
        name = self.pool.log.render(table.request)
        request = self.define_hostile(without_tokens(table.request), f"without_tokens({name})")
        self.step(f"cache {table.request.request_id}'s blocks through a request without tokens")
        reply = self.pool.cache_full_blocks(request, list(table.blocks), table.num_cached,
                                            num_full, self.bs, table.group)
        if self.pool.events_enabled:
            self.expect(reply.rejected and isinstance(reply.error, InvalidArgument),
                        "with events on, a request without all_token_ids must be refused")
        elif not reply.rejected:
            table.num_cached = num_full  # events off: nothing reads the tokens

    @precondition(_hostile)
    @rule(tokens=st.lists(st.integers(0, 2**40), min_size=1, max_size=12),
          bad=st.sampled_from(BAD_TOKENS), where=PICK)
    def tokens_are_normalised_or_rejected_naming_the_position(
        self, tokens: list[int], bad: Any, where: int
    ) -> None:
        hbs = self.hbs
        self.step(f"hash {tokens} as numpy ints, then with {bad!r} at some position")
        as_ints = make_request(tokens, hash_block_size=hbs)
        as_numpy = make_request(np.array(tokens, dtype=np.int64), hash_block_size=hbs)
        self.expect(as_numpy.block_hashes == as_ints.block_hashes,
                    "numpy integer tokens must hash exactly like Python ints")
        p = where % (len(tokens) + 1)
        try:
            make_request([*tokens[:p], bad, *tokens[p:]], hash_block_size=hbs)
        except InvalidArgument as error:
            self.expect(f"token {p} " in str(error), f"the error should name token {p}: {error}")
        else:
            self.expect(False, f"token {bad!r} should be rejected")



class WrongTypeRules(PoolMachine):
    """Issue 23's wrong Python types: typed, and identical on every backend.

    A class of its own so that :func:`~kvpool.harness.differential.build_machine` adds it
    only when ``invalid_calls`` is on: rules whose precondition is always false still
    change how Hypothesis draws the others, and a valid-calls-only run (a vLLM pool) has no
    use for them.
    """

    @precondition(lambda self: _hostile(self) and self.config.enable_caching
                  and self._cacheable_tables())
    @rule(t=PICK, entry=st.sampled_from((*BAD_MASK_ENTRIES, *ODD_MASK_ENTRIES)), where=PICK,
          fill=st.booleans(), new=st.integers(0, 1))
    def a_block_mask_entry_that_is_not_a_bool_is_rejected_alike(
        self, t: int, entry: Any, where: int, fill: bool, new: int
    ) -> None:
        picked = self._pick_cacheable_table(t)
        if picked is None:
            return
        table, num_full = picked
        n = num_full - table.num_cached
        mask: list[Any] = [fill] * n
        mask[where % n] = entry
        new = min(new, self.free_count())
        self.step(f"allocate {new} and cache {table.request.request_id}'s blocks with mask "
                  f"{mask!r}")
        reply = self.pool.allocate_and_cache(table.request, list(table.blocks), new,
                                             table.num_cached, num_full, self.bs,
                                             table.group, mask)
        if type(entry) is int and entry in ODD_MASK_ENTRIES:
            # 0 and 1 are a yes/no: every backend accepts them (or refuses the call for
            # another reason) alike; the lockstep compares the outcomes and states.
            if not reply.rejected:
                table.num_cached = num_full
                table.blocks.extend(reply.value or ())
            return
        self.expect(reply.rejected and isinstance(reply.error, InvalidArgument),
                    f"block_mask entry {entry!r} should raise InvalidArgument, got "
                    f"{reply.error!r}")

    @precondition(lambda self: _hostile(self) and self.tables_with_blocks())
    @rule(t=PICK, mask=st.sampled_from(BAD_MASKS))
    def a_block_mask_that_is_not_a_sequence_is_rejected_alike(self, t: int, mask: Any) -> None:
        tables = self.tables_with_blocks()
        table = tables[t % len(tables)]
        self.step(f"cache {table.request.request_id}'s blocks with block_mask={mask!r}")
        for verb in ("allocate_and_cache", "cache_full_blocks"):
            if verb == "allocate_and_cache":
                reply = self.pool.allocate_and_cache(table.request, list(table.blocks), 0, 0,
                                                     len(table.blocks), self.bs, table.group,
                                                     mask)
            else:
                reply = self.pool.cache_full_blocks(table.request, list(table.blocks), 0,
                                                    len(table.blocks), self.bs, table.group,
                                                    mask)
            self.expect(reply.rejected and isinstance(reply.error, KvPoolError),
                        f"{verb} with block_mask={mask!r} should raise a KvPoolError, got "
                        f"{reply.error!r}")

    @precondition(_hostile)
    @rule(groups=st.sampled_from(BAD_GROUP_LISTS), t=PICK)
    def a_lookup_without_a_list_of_group_ids_is_invalid_argument(self, groups: Any,
                                                                 t: int) -> None:
        hashes = self.hashes(self.requests[t % len(self.requests)]) if self.requests else []
        block_hash = hashes[0] if hashes else b"\x00" * 32
        self.step(f"look up {block_hash!r} in groups {groups!r}")
        for reply in (self.pool.get_cached_block(block_hash, groups),
                      self.pool.find_longest_cache_hit(list(hashes), groups)):
            self.expect(reply.rejected and isinstance(reply.error, InvalidArgument),
                        f"group ids {groups!r} should raise InvalidArgument, got "
                        f"{reply.error!r}")

    @precondition(_hostile)
    @rule(events=st.sampled_from(GARBAGE_EVENT_STREAMS), taken=st.booleans())
    def replaying_garbage_is_invalid_event(self, events: Any, taken: bool) -> None:
        if taken and isinstance(events, list):
            # After the events the pools really emitted: the garbage comes mid-stream.
            events = [*self.pool.taken_events, *events]
        self.step(f"replay {events!r}"[:200])
        try:
            replay(events)
        except InvalidEvent:
            pass
        except Exception as error:  # noqa: BLE001 - reported as what it is
            self.expect(False, f"replay of garbage should raise InvalidEvent, got {error!r}")
        else:
            self.expect(False, "replay of garbage should raise InvalidEvent")

    @precondition(_hostile)
    @rule(options=st.sampled_from(BAD_POOL_OPTIONS), name=st.sampled_from(BAD_BACKEND_NAMES))
    def make_pool_with_an_unknown_option_or_backend_is_typed(self, options: dict[str, Any],
                                                             name: Any) -> None:
        named = [b for b in self.pool.labels if b in BACKENDS]
        self.step(f"make_pool with {options!r}, and with backend {name!r} / {named!r}")
        for label in named:
            self._expect_raises(InvalidConfig, make_pool, 2, backend=label, **options)
        for bad in (name, named):
            self._expect_raises(BackendUnavailable, make_pool, 2, backend=bad)

    @precondition(_hostile)
    @rule(hasher=st.sampled_from(BAD_BLOCK_HASHERS), at_decode=st.booleans())
    def a_block_hasher_that_is_not_one_is_invalid_argument(self, hasher: Any,
                                                           at_decode: bool) -> None:
        self.step(f"a request with block_hasher={hasher!r} "
                  f"({'from the first decode step' if at_decode else 'at construction'})")
        if not at_decode:
            self._expect_raises(InvalidArgument, Request, "h", [1, 2, 3, 4],
                                block_hasher=hasher)
            return
        if not callable(hasher):
            return
        calls = iter([lambda r: [], hasher])  # the prompt hashes fine; the decode step not
        request = Request("h", [1, 2], block_hasher=lambda r: next(calls)(r))
        self._expect_raises(InvalidArgument, request.append_output_token_ids, 3)
        self.expect(request.output_token_ids == [],
                    "a refused hasher answer must take the decode step's token back out")

    def _expect_raises(self, error: type[BaseException], call: Any, *args: Any,
                       **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except error:
            return
        except Exception as other:  # noqa: BLE001 - reported as what it is
            self.expect(False, f"{getattr(call, '__name__', call)} should raise "
                               f"{error.__name__}, got {other!r}")
        else:
            self.expect(False, f"{getattr(call, '__name__', call)} should raise "
                               f"{error.__name__}")


__all__ = ["HostileRules", "WrongTypeRules"]
