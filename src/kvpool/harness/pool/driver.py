"""``Lockstep``: one call applied to every backend, then everything compared.

This is the checking core of the harness. The state machine drives it, and a pasted
reproduction drives it too, so both check exactly the same things after every call:

1. **outcome** — equal results (normalised: ids as lists of ints) or, when the oracle (the
   first backend) rejects the call, the same error *type* from every backend. A
   ``WatcherError`` is an outcome too: its ``.result`` and its cause's type must agree;
2. **watchers** — every backend fired the same watchers (``(watcher number, block id)``) in
   the same order, and its metrics collector (``set_metrics_collector``) saw the same calls;
3. **state** — ``abstract()`` values equal after the call; a rejected call or a query left
   each backend's ``abstract()`` exactly as it was;
4. **invariants** — every spec invariant holds (names and witnesses are reported);
5. **events** — after ``take_events``, replaying every event taken so far rebuilds the
   cache index of the current hash table.

The first failed check raises :class:`Divergence` carrying the call log as a pasteable test.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from kvpool import batch
from kvpool.errors import CallbackError, InvalidEvent, KvPoolError
from kvpool.events import EventContext, EventGap, cache_index_of, replay
from kvpool.harness.api import FULL_API, Backend, PoolFactory
from kvpool.harness.pool import set_order
from kvpool.harness.pool.backends import resolve_backends
from kvpool.harness.reproduction import Reproduction
from kvpool.harness.requests import make_request
from kvpool.harness.values import Foreign, WatcherKind, WatcherRefused, normalize
from kvpool.spec.invariants import violated_invariants


class Divergence(AssertionError):
    """A check failed at one call: backends disagreed, an invariant broke, or events lied.

    ``kind`` is one of ``"outcome"``, ``"watchers"``, ``"metrics"``, ``"state"``,
    ``"rejected-mutated"``, ``"query-mutated"``, ``"invariant"``, ``"events"``,
    ``"oracle-crash"``, or ``"harness"`` (a rule meant to be valid made a call the oracle
    rejects: a bug in the harness's model, not in a pool); ``reproduction``
    is a pytest function replaying the calls up to and including the failing one.
    """

    def __init__(self, kind: str, call: str, detail: str, reproduction: str,
                 rule: str | None = None) -> None:
        self.kind = kind
        self.call = call
        self.detail = detail
        self.reproduction = reproduction
        self.rule = rule
        """The state-machine rule that made the call (``None`` outside a machine)."""
        super().__init__(f"[{kind}] at {call}\n{detail}\n\nReproduction:\n{reproduction}")

    @property
    def is_invariant_violation(self) -> bool:
        return self.kind == "invariant"


class Reply(NamedTuple):
    """The oracle's answer to one call: its normalised value and the error it raised."""

    value: Any
    error: BaseException | None

    @property
    def rejected(self) -> bool:
        """The call was refused (a typed error other than a completed call's CallbackError)."""
        return self.error is not None and not isinstance(self.error, CallbackError)


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_outcome(ok: bool, value: Any) -> str:
    return f"returned {_short(normalize(value))}" if ok else f"raised {_short(value)}"


def describe_difference(expected: Any, actual: Any) -> str:
    """Which fields of two ``PoolAbstract`` values differ, block by block where possible."""
    lines = []
    x, y = expected.pending_events, actual.pending_events
    if x != y:
        pairs = enumerate(zip(x, y, strict=False))
        i = next((i for i, (a, b) in pairs if a != b), min(len(x), len(y)))
        lines.append(
            f"pending_events ({len(x)} expected, {len(y)} got) first differ at #{i}:\n"
            f"  expected {_short(x[i] if i < len(x) else None, 600)}\n"
            f"  got      {_short(y[i] if i < len(y) else None, 600)}"
        )
    a, b = expected.state, actual.state
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x == y:
            continue
        if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y) and f.name in (
            "ref_cnt",
            "primary_key",
            "primary_tokens",
        ):
            diffs = [f"block {i}: {x[i]!r} != {y[i]!r}" for i in range(len(x)) if x[i] != y[i]]
            lines.append(f"{f.name}: " + "; ".join(diffs[:8]))
        else:
            lines.append(f"{f.name}: expected {_short(x)}, got {_short(y)}")
    return "\n".join(lines) or "(abstract values differ but no field does: check __eq__)"


def _describe_violations(label: str, violations: list[tuple[str, tuple]]) -> str:
    return "\n".join(f"{label}: invariant {name} broken by {_short(w)}" for name, w in violations)


BATCH_VERBS = frozenset({"allocate_and_cache", "find_longest_cache_hit"})
"""Verbs of :mod:`kvpool.batch` the lockstep calls: a pool's own method, else the function."""


def _verb(pool: Any, method: str) -> Callable[..., Any]:
    """``pool.method``, or for a batch verb the pool lacks, :mod:`kvpool.batch`'s."""
    if method in BATCH_VERBS and not hasattr(pool, method):
        return functools.partial(getattr(batch, method), pool)
    return getattr(pool, method)  # type: ignore[no-any-return]


class Lockstep:
    """Several pools driven with identical calls and checked after each one (module doc).

    ``backends[0]`` is the oracle. ``options`` are ``make_pool``'s keyword arguments. A
    *sibling* pool per backend (same options) is created on first use of :class:`Foreign`.
    """

    def __init__(
        self,
        backends: Sequence[str | PoolFactory | Backend],
        *,
        num_blocks: int,
        on_divergence: Callable[[Divergence], None] | None = None,
        **options: Any,
    ) -> None:
        self.backends = resolve_backends(backends)
        self.labels = [b.label for b in self.backends]
        self.num_blocks = num_blocks
        self.options = options
        self.on_divergence = on_divergence
        self.events_enabled = bool(options.get("enable_kv_cache_events", False))
        self.hash_block_size = int(options.get("hash_block_size", 16))
        self.lookahead = int(options.get("num_hash_lookahead_tokens", 0))
        self.event_context = EventContext(
            medium=options.get("medium", "GPU"),
            hash_block_size=self.hash_block_size,
            num_lookahead_tokens=self.lookahead,
            use_int_block_hashes=options.get("use_int_block_hashes", True),
        )
        self.log = Reproduction(setup=self._setup_source())
        self.pools = [b.make(num_blocks, **options) for b in self.backends]
        self.set_ordered = [
            getattr(p, "pool_api", FULL_API).secondary_key_order == "set" for p in self.pools
        ]
        self.deviations: dict[str, int] = {}
        """Documented deviations tolerated so far (description → calls), e.g. set order."""
        self.siblings: list[Any] | None = None
        self.sibling_abstracts: list[Any] = []
        self.fired: list[list[tuple[int, int]]] = [[] for _ in self.pools]
        self._fired_seen = 0
        self.watchers_registered = 0
        self.taken_events: list[Any] = []
        self._rereported: set[int] = set()
        self.requests_made = 0
        self.rule: str | None = None
        self.must_accept = False
        """Set by the state machine per rule: the oracle must accept every call it makes."""
        self.abstracts = [p.abstract() for p in self.pools]
        self._check_states("construction", self.pools, self.abstracts)

    # -- setup -------------------------------------------------------------------------------

    def _setup_source(self) -> str:
        imports = sorted(
            {b.source.rsplit(".", 1)[0] for b in self.backends if b.source[0] not in "'\""}
        )
        names = ", ".join(b.source for b in self.backends)
        opts = "".join(f", {k}={v!r}" for k, v in self.options.items())
        lines = [f"import {m}" for m in imports]
        lines.append(f"pool = lockstep([{names}], num_blocks={self.num_blocks!r}{opts})")
        return "\n".join(lines)

    @property
    def state(self) -> Any:
        """The oracle's current ``PoolState`` (after the last checked call)."""
        return self.abstracts[0].state

    @property
    def sibling_state(self) -> Any:
        return self.sibling_abstracts[0].state if self.siblings else None

    def make_request(self, token_ids: Sequence[int], extras: int = 0) -> Any:
        """A request hashed like the pools' (logged as ``rN = pool.make_request([...])``),
        with the extra-key inputs ``REQUEST_EXTRAS[extras]`` (LoRA, multimodal, salt)."""
        name = f"r{self.requests_made}"
        self.requests_made += 1
        request = make_request(
            token_ids,
            hash_block_size=self.hash_block_size,
            request_id=name,
            num_hash_lookahead_tokens=self.lookahead,
            extras=extras,
        )
        aliases = {h: f"{name}.block_hashes[{i}]" for i, h in enumerate(request.block_hashes)}
        extra = f", extras={extras}" if extras else ""
        self.log.define(name, request, f"pool.make_request({list(token_ids)!r}{extra})", aliases)
        return request

    def _ensure_siblings(self) -> None:
        if self.siblings is None:
            self.siblings = [b.make(self.num_blocks, **self.options) for b in self.backends]
            self.sibling_abstracts = [p.abstract() for p in self.siblings]

    # -- the pool API ------------------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> Reply:
        return self._call("get_new_blocks", (num_blocks,))

    def touch(self, blocks: list) -> Reply:
        return self._call("touch", (blocks,))

    def free_blocks(self, ordered_blocks: list) -> Reply:
        return self._call("free_blocks", (ordered_blocks,))

    def unpin_blocks(self, blocks: list, on_reuse: Any) -> Reply:
        return self._call("unpin_blocks", (blocks, on_reuse))

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: list) -> Reply:
        return self._call("get_cached_block", (block_hash, kv_cache_group_ids), query=True)

    def cache_full_blocks(self, request: Any, blocks: list, num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: list | None = None) -> Reply:
        args: tuple[Any, ...] = (request, blocks, num_cached_blocks, num_full_blocks, block_size,
                kv_cache_group_id)
        if block_mask is not None:
            args += (block_mask,)
        return self._call("cache_full_blocks", args)

    def cache_partial_block(self, request: Any, block: Any, num_tokens: int,
                            kv_cache_group_id: int, block_size: int,
                            replace_existing_hashes: bool = False) -> Reply:
        args: tuple[Any, ...] = (request, block, num_tokens, kv_cache_group_id, block_size)
        if replace_existing_hashes:
            args += (True,)
        return self._call("cache_partial_block", args)

    def move_block_hashes(self, src_block: Any, dst_block: Any) -> Reply:
        return self._call("move_block_hashes", (src_block, dst_block))

    def evict_blocks(self, block_ids: list) -> Reply:
        return self._call("evict_blocks", (block_ids,))

    def reset_prefix_cache(self) -> Reply:
        return self._call("reset_prefix_cache", ())

    def emit_cached_block_events(self, request: Any, num_cached_blocks: int, block_size: int,
                                 kv_cache_group_id: int) -> Reply:
        args = (request, num_cached_blocks, block_size, kv_cache_group_id)
        return self._call("emit_cached_block_events", args, rereport=True)

    def is_block_writable(self, block: Any) -> Reply:
        return self._call("is_block_writable", (block,), query=True)

    def get_num_free_blocks(self) -> Reply:
        return self._call("get_num_free_blocks", (), query=True)

    def get_usage(self) -> Reply:
        return self._call("get_usage", (), query=True)

    def take_events(self) -> Reply:
        return self._call("take_events", (), take=True)

    # Batch verbs: a pool's own method where it has one (fast), else the composition of
    # kvpool.batch over its protocol verbs; both must answer alike.

    def allocate_and_cache(self, request: Any, blocks: list, num_new_blocks: int,
                           num_cached_blocks: int, num_full_blocks: int, block_size: int,
                           kv_cache_group_id: int, block_mask: Any = None) -> Reply:
        args: tuple[Any, ...] = (request, blocks, num_new_blocks, num_cached_blocks,
                                 num_full_blocks, block_size, kv_cache_group_id)
        if block_mask is not None:
            args += (block_mask,)
        return self._call("allocate_and_cache", args)

    def find_longest_cache_hit(self, block_hashes: Any, kv_cache_group_ids: Any,
                               max_num_blocks: int | None = None) -> Reply:
        args: tuple[Any, ...] = (block_hashes, kv_cache_group_ids)
        if max_num_blocks is not None:
            args += (max_num_blocks,)
        return self._call("find_longest_cache_hit", args, query=True)

    def sibling_get_new_blocks(self, num_blocks: int) -> Reply:
        """Allocate on every backend's sibling pool (so ``Foreign`` blocks can be freed)."""
        self._ensure_siblings()
        return self._call("get_new_blocks", (num_blocks,), on_siblings=True)

    # -- the checks --------------------------------------------------------------------------

    def _translate(self, i: int, value: Any, tag: int) -> Any:
        if isinstance(value, Foreign):
            assert self.siblings is not None
            return self.siblings[i].ref(value.block_id)
        if isinstance(value, WatcherKind):
            return self._watcher(i, tag, value.raises, value.reenter)
        if isinstance(value, list):
            return [self._translate(i, v, tag) for v in value]
        return value

    def _watcher(self, i: int, tag: int, raises: bool,
                 reenter: Any = None) -> Callable[[int], None]:
        log = self.fired[i]

        def on_reuse(block_id: int) -> None:
            log.append((tag, int(block_id)))
            if reenter is not None:
                reenter(self.pools[i], int(block_id))
            if raises:
                raise WatcherRefused(f"watcher {tag} refuses block {block_id}")

        return on_reuse

    def fail(self, kind: str, detail: str) -> Divergence:
        """A :class:`Divergence` at the last logged call (for the caller to raise)."""
        call = self.log.lines[-1] if self.log.lines else "construction"
        error = Divergence(kind, call, detail, self.log.render_test(), self.rule)
        if self.on_divergence is not None:
            self.on_divergence(error)
        return error

    def _call(self, method: str, args: tuple, *, query: bool = False, take: bool = False,
              rereport: bool = False, on_siblings: bool = False) -> Reply:
        target = "pool"
        self.log.call(target, "sibling_get_new_blocks" if on_siblings else method, args, {})
        uses_foreign = _contains_foreign(args)
        if uses_foreign:
            self._ensure_siblings()
        tag = self.watchers_registered
        if any(isinstance(a, WatcherKind) for a in args):
            self.watchers_registered += 1
        pools = self.siblings if on_siblings else self.pools
        assert pools is not None
        outcomes: list[tuple[bool, Any]] = []
        for i, pool in enumerate(pools):
            call_args = [self._translate(i, a, tag) for a in args]
            try:
                outcomes.append((True, _verb(pool, method)(*call_args)))
            except Exception as exc:  # noqa: BLE001 - every outcome is compared below
                outcomes.append((False, exc))
        reply = self._check_outcomes(outcomes)
        if self.must_accept and reply.rejected:
            raise self.fail(
                "harness",
                f"rule {self.rule} meant this call to be valid, but the oracle "
                f"({self.labels[0]}) rejects it with {reply.error!r}: the machine's model is "
                "wrong, not the pools",
            )
        self._check_fired()
        self._check_metrics()
        if on_siblings or uses_foreign:
            assert self.siblings is not None
            new = [p.abstract() for p in self.siblings]
            self._check_unchanged(reply, query, self.sibling_abstracts, new, "sibling ")
            self._check_states("sibling", self.siblings, new)
            self.sibling_abstracts = new
        if not on_siblings:
            old_pending = len(self.abstracts[0].pending_events)
            new = [p.abstract() for p in self.pools]
            self._check_unchanged(reply, query, self.abstracts, new, "")
            self._check_states("pool", self.pools, new)
            if rereport:
                self._rereported.update(e.seq for e in new[0].pending_events[old_pending:])
            self.abstracts = new
            if take and self.events_enabled:
                self.taken_events.extend(normalize(reply.value))
                self._check_replay()
        return reply

    def _check_outcomes(self, outcomes: list[tuple[bool, Any]]) -> Reply:
        ok0, v0 = outcomes[0]
        oracle = self.labels[0]
        if not ok0 and not isinstance(v0, KvPoolError):
            raise self.fail("oracle-crash", f"{oracle} raised {v0!r}") from v0
        for i, (label, (ok, v)) in enumerate(
            zip(self.labels[1:], outcomes[1:], strict=True), start=1
        ):
            if ok and ok0 and self.set_ordered[i] and isinstance(v, list) and isinstance(v0, list):
                v, moved = set_order.align_events(v0, v)  # take_events: removals in set order
                if moved:
                    self._deviation(set_order.DEVIATION)
            mismatch = ok != ok0 or (not ok and type(v) is not type(v0))
            if not mismatch and ok and normalize(v) != normalize(v0):
                mismatch = True
            if not mismatch and not ok and isinstance(v0, CallbackError):
                mismatch = normalize(getattr(v, "result", None)) != normalize(v0.result) or (
                    type(v.__cause__) is not type(v0.__cause__)
                )
            if mismatch:
                raise self.fail(
                    "outcome",
                    f"{oracle} {_describe_outcome(ok0, v0)}\n{label} {_describe_outcome(ok, v)}",
                )
        if ok0:
            return Reply(normalize(v0), None)
        return Reply(normalize(getattr(v0, "result", None)), v0)

    def _check_fired(self) -> None:
        start = self._fired_seen
        expected = self.fired[0][start:]
        for label, log in zip(self.labels[1:], self.fired[1:], strict=True):
            if log[start:] != expected:
                raise self.fail(
                    "watchers",
                    f"{self.labels[0]} fired {expected}\n{label} fired {log[start:]} "
                    "(watcher number, block id)",
                )
        self._fired_seen = len(self.fired[0])

    def set_metrics_collector(self, kind: Any) -> Reply:
        """Give every backend its own collector of ``kind`` (a
        :class:`~kvpool.harness.rules.hostile_values.CollectorKind`, or ``None`` to remove it);
        their call logs are compared after every later call."""
        self.log.call("pool", "set_metrics_collector", (kind,), {})
        self.metric_logs = [[] for _ in self.pools]
        self._metrics_seen = 0
        for pool, log in zip(self.pools, self.metric_logs, strict=True):
            pool.metrics_collector = None if kind is None else kind.make(pool, log)
        return Reply(None, None)

    metric_logs: list[list[Any]] = []
    _metrics_seen = 0

    def _check_metrics(self) -> None:
        if not self.metric_logs:
            return
        start = self._metrics_seen
        expected = self.metric_logs[0][start:]
        for label, log in zip(self.labels[1:], self.metric_logs[1:], strict=True):
            if log[start:] != expected:
                raise self.fail(
                    "metrics",
                    f"{self.labels[0]}'s collector saw {expected}\n{label}'s saw {log[start:]}",
                )
        self._metrics_seen = len(self.metric_logs[0])

    def _check_unchanged(self, reply: Reply, query: bool, old: list, new: list,
                         which: str) -> None:
        if not (query or reply.rejected):
            return
        for i, (label, before, after) in enumerate(zip(self.labels, old, new, strict=True)):
            if self.set_ordered[i] and before != after:
                after, _ = set_order.align_abstract(before, after)  # the stored value may be
                # aligned to the oracle's order already; the pool's own is still set order
            if before != after:
                kind = "query-mutated" if query else "rejected-mutated"
                why = "a query" if query else f"a rejected call ({reply.error!r})"
                raise self.fail(
                    kind,
                    f"{label}: {which}abstract() changed by {why}\n"
                    + describe_difference(before, after),
                )

    def _deviation(self, what: str) -> None:
        self.deviations[what] = self.deviations.get(what, 0) + 1

    def _check_states(self, which: str, pools: list, new: list) -> None:
        expected = new[0]
        for i in range(1, len(new)):
            if self.set_ordered[i] and new[i] != expected:
                new[i], moved = set_order.align_abstract(expected, new[i])
                if moved:
                    self._deviation(set_order.DEVIATION)
        for label, actual in zip(self.labels[1:], new[1:], strict=True):
            if actual != expected:
                detail = f"{which} state of {label} differs from {self.labels[0]}:\n"
                detail += describe_difference(expected, actual)
                broken = violated_invariants(actual.state)
                if broken:
                    detail += "\n" + _describe_violations(label, broken)
                    raise self.fail("invariant", detail)
                raise self.fail("state", detail)
        # Equal states have equal invariant verdicts, so checking the oracle's covers all.
        broken = violated_invariants(expected.state)
        if broken:
            labels = ", ".join(self.labels)
            where = f"{which} state of {labels}"
            raise self.fail("invariant", _describe_violations(where, broken))

    def _check_replay(self) -> None:
        # emit_cached_block_events re-reports blocks that are already cached (full reporting);
        # a consumer counting blocks per key must not count them twice.
        stream = [
            dataclasses.replace(e, block_hashes=[]) if e.seq in self._rereported else e
            for e in self.taken_events
        ]
        try:
            index = replay(stream)
        except EventGap as exc:
            raise self.fail("events", f"event stream has a gap: {exc}") from exc
        except InvalidEvent as exc:
            raise self.fail("events", f"event stream is malformed: {exc}") from exc
        expected = cache_index_of(self.state.cache, self.event_context)
        if index != expected:
            raise self.fail(
                "events",
                f"replaying {len(stream)} events gives {dict(index)}\n"
                f"but the hash table holds {dict(expected)}",
            )


def _contains_foreign(value: Any) -> bool:
    if isinstance(value, Foreign):
        return True
    if isinstance(value, (list, tuple)):
        return any(_contains_foreign(v) for v in value)
    return False


def lockstep(backends: Sequence[str | PoolFactory | Backend], *, num_blocks: int,
             **options: Any) -> Lockstep:
    """A :class:`Lockstep` over ``backends`` (first = oracle): what reproductions call."""
    return Lockstep(backends, num_blocks=num_blocks, **options)


__all__ = ["Divergence", "Lockstep", "Reply", "describe_difference", "lockstep"]
