"""Bounded exhaustive checking: every reachable state of a tiny pool, every call from each.

Sampling (the Hypothesis harness) and symbolic search (CrossHair) can both miss a corner; in
a small enough scope nothing needs to be missed. :func:`explore` walks breadth first from the
fresh pool over *every* operation with *every* argument in the scope — valid and invalid ids
(``-1``, the null block, ``N``), counts, groups, masks, sizes, boundaries — and for each call:

* runs the spec and every other backend (reference and fast by default) on copies of the
  same pool and compares results, error types, fired watchers, abstract states and events;
* checks that a rejected call or a query changed nothing, on every backend;
* checks every invariant on the new state, and the operation's contract (runtime icontract:
  postcondition and invariants) for accepted calls;
* checks the precondition contract (§12's rows) for every call, accepted or not.

States are spec ``PoolState`` values up to the event counter (which only numbers events;
they are compared per call and then taken). A scope bounds ref counts (``max_ref``) so the
state space is finite, and may bound the keys per block (``max_keys``) and explore one state
per class of states equal up to renaming block ids and requests (``symmetry``; see
:func:`renamings`). The first failure stops the walk with the path of calls that led to it
(a pasteable ``lockstep`` session).

Where the time goes: every transition runs three backends, copies them when the call is
accepted (pickling; the fast pool's compiled kernels are shared, not copied) and checks two
runtime contracts. About 3,000 transitions per CPU second; the state count is what decides
whether a scope finishes.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import logging
import pickle
import time
import types
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.errors import KvPoolError
from kvpool.harness.pool.backends import resolve_backends
from kvpool.harness.requests import make_request
from kvpool.harness.values import normalize
from kvpool.keys import pack_key
from kvpool.spec import contracts
from kvpool.spec import precondition_contracts as pc
from kvpool.spec.invariants import violated_invariants
from kvpool.spec.state import PoolState, keys_of_block


@dataclass(frozen=True)
class Scope:
    """The bounds of one exhaustive check (every field small: the space is a product)."""

    name: str
    num_blocks: int = 3
    hash_block_size: int = 1
    block_size: int = 1
    num_groups: int = 2
    enable_events: bool = True
    enable_caching: bool = True
    prompts: tuple[tuple[int, ...], ...] = ((1, 2), (1, 3))
    """Token ids of the scope's requests; equal prefixes give shared hashes (2–3 keys)."""
    max_ref: int = 2
    max_batch: int = 2
    max_depth: int | None = None
    """Explore states reachable within this many calls (``None``: all reachable states)."""
    max_keys: int | None = None
    """Bound on the keys one block carries (primary + secondaries); ``None``: unbounded."""
    symmetry: bool = False
    """Explore one state per class of states equal up to renaming the usable block ids and
    swapping requests of the same shape (see :func:`canonical_key`)."""

    def describe(self) -> str:
        return (f"{self.name}: {self.num_blocks} blocks, hbs {self.hash_block_size}, "
                f"bs {self.block_size}, {self.num_groups} groups, {len(self.prompts)} requests, "
                f"events {'on' if self.enable_events else 'off'}, "
                f"caching {'on' if self.enable_caching else 'off'}, ref ≤ {self.max_ref}"
                + (f", keys ≤ {self.max_keys}" if self.max_keys is not None else "")
                + (f", depth ≤ {self.max_depth}" if self.max_depth is not None else "")
                + (", up to renaming" if self.symmetry else ""))


SMALL_SCOPES: tuple[Scope, ...] = (
    Scope("small", num_blocks=2, num_groups=1, prompts=((1, 2),)),
    Scope("small-three-blocks", num_blocks=3, num_groups=1, enable_events=False,
          prompts=((1, 2),), max_depth=3),
)
"""Run in the default test suite (well under a minute on two shared cores)."""

LARGE_SCOPES: tuple[Scope, ...] = (
    Scope("two-groups-events-off", num_blocks=2, num_groups=2, enable_events=False,
          prompts=((1, 2),)),
    Scope("two-groups", num_blocks=2, num_groups=2, prompts=((1, 2), (1, 3)), max_keys=3,
          symmetry=True),
    Scope("three-blocks", num_blocks=3, num_groups=1, prompts=((1, 2),), symmetry=True),
    Scope("coarse", num_blocks=2, num_groups=1, block_size=2, prompts=((1, 2, 3, 4),)),
    Scope("four-blocks-caching-off", num_blocks=4, enable_caching=False, prompts=((1, 2),),
          symmetry=True),
)
"""The slow tier, each run to completion: two groups, two requests sharing a prefix (three
hashes, six keys) with at most three keys per block; three blocks with every reachable state
(no depth bound); a coarse block size (bs = 2·hbs: partial entries inside a block); four
blocks with caching off. Without the bound on keys per block, two blocks in two groups with
two requests have 7,854 states (the order of up to six keys on one block); three blocks in
two groups, or four blocks with caching on, have tens of thousands even up to renaming
(docs/harness.md has the figures)."""

SCOPES = {s.name: s for s in SMALL_SCOPES + LARGE_SCOPES}


class Recorder:
    """A reuse watcher that logs the blocks it fires for (copied along with its pool)."""

    def __init__(self) -> None:
        self.log: list[int] = []

    def __call__(self, block_id: int) -> None:
        self.log.append(int(block_id))


@dataclass(frozen=True)
class Call:
    """One operation with its arguments (``request`` indexes the scope's requests)."""

    op: str
    args: tuple

    def render(self) -> str:
        return f"pool.{self.op}({', '.join(_render(a) for a in self.args)})"


def _render(value: Any) -> str:
    if isinstance(value, _RequestRef):
        return f"r{value.index}"
    if isinstance(value, _Watcher):
        return "RECORD"
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


@dataclass(frozen=True)
class _RequestRef:
    index: int


@dataclass(frozen=True)
class _Watcher:
    pass


QUERIES = {"get_cached_block", "is_block_writable", "get_num_free_blocks", "get_usage"}


def calls_in_scope(scope: Scope) -> list[Call]:
    """Every call the scope contains (the same list from every state)."""
    n, hbs, bs = scope.num_blocks, scope.hash_block_size, scope.block_size
    ids = (-1, *range(n), n)
    batches = [tuple(b) for k in range(scope.max_batch + 1)
               for b in itertools.product(ids, repeat=k)]
    groups = tuple(range(scope.num_groups))
    requests = [_RequestRef(i) for i in range(len(scope.prompts))]
    out = [Call("get_new_blocks", (k,)) for k in range(-1, n + 1)]
    for op in ("touch", "free_blocks", "evict_blocks"):
        out += [Call(op, (b,)) for b in batches]
    out += [Call("unpin_blocks", (b, _Watcher())) for b in batches]
    hashes = sorted({h for p in scope.prompts for h in _request(scope, p).block_hashes})
    lookups = [(), *((g,) for g in groups), groups, groups[::-1], (-1,), (2**32,)]
    out += [Call("get_cached_block", (h, g)) for h in hashes for g in lookups]
    # Tables: each usable block alone, two distinct blocks both ways, the null block first,
    # one block twice; spans: the usual ones, an empty one, a negative count, one too long.
    tables = _tables(n)
    spans = [(0, 1), (0, 2), (1, 2), (1, 1), (3, 3), (-1, 1)]
    for r, table, (cached, full), g in itertools.product(requests, tables, spans, groups):
        out.append(Call("cache_full_blocks", (r, table, cached, full, bs, g)))
    for r, b in itertools.product(requests, range(1, n)):
        out.append(Call("cache_full_blocks", (r, (b,), 0, 1, bs, -1)))      # bad group
        out.append(Call("cache_full_blocks", (r, (b,), 0, 1, bs + 1 if hbs > 1 else 0, 0)))
    for r in requests:
        masks = ((True,), (False, True), (True, False), (True, True))
        for table, mask in itertools.product([t for t in tables if len(t) == 2], masks):
            out.append(Call("cache_full_blocks", (r, table, 0, 2, bs, 0, mask)))
    boundaries = sorted({0, hbs, 2 * hbs, 3 * hbs, hbs + 1 if hbs > 1 else -1})
    for r, b, t in itertools.product(requests, ids, boundaries):
        for g, replace in [*((g, False) for g in groups), (0, True)]:
            out.append(Call("cache_partial_block", (r, b, t, g, bs, replace)))
    for r, b in itertools.product(requests, range(1, n)):
        out += [Call("cache_partial_block", (r, b, hbs, -1, bs)),   # bad group
                Call("cache_partial_block", (r, b, hbs, 0, 0))]     # bad block size
    out += [Call("move_block_hashes", (s, d)) for s in ids for d in ids]
    for r, k, g in itertools.product(requests, range(-1, 4), (0, -1)):
        out.append(Call("emit_cached_block_events", (r, k, bs, g)))
    out += [Call("emit_cached_block_events", (r, 1, 0, 0)) for r in requests]
    out += [Call("is_block_writable", (b,)) for b in ids]
    out += [Call("reset_prefix_cache", ()), Call("get_num_free_blocks", ()), Call("get_usage", ())]
    return out


def _tables(n: int) -> list[tuple[int, ...]]:
    """Block tables: each usable block alone, every two distinct ones in both orders (two
    out-of-range ids when there is one usable block), the null block first, one block twice.
    Closed under renaming the usable ids."""
    usable = range(1, n)
    pairs: list[tuple[int, ...]] = [(a, b) for a in usable for b in usable if a != b] or [
        (1, 2), (2, 1)]
    return ([(b,) for b in usable] + pairs + [(0, b) for b in usable]
            + [(b, b) for b in usable])


def _request(scope: Scope, prompt: Sequence[int]) -> Any:
    return make_request(prompt, hash_block_size=scope.hash_block_size, request_id="r")


def state_key(state: PoolState) -> tuple:
    """A hashable value equal for states that differ only in dict order or the event counter."""
    return (
        state.ref_cnt, state.free_queue, state.primary_key, state.primary_tokens,
        tuple(sorted(state.secondary_keys.items())), tuple(sorted(state.cache.items())),
        state.watchers,
    )


Renaming = tuple[tuple[int, ...], dict[bytes, bytes] | None]
"""A symmetry of a scope: new id of each block id, and new key of each key (``None``: same)."""


def renamings(scope: Scope, requests: Sequence[Any]) -> list[Renaming]:
    """The symmetries :func:`canonical_key` divides out: every permutation of the usable ids
    (the null block stays 0), times every permutation of the requests that maps their block
    hashes consistently (equal-length requests sharing the same prefix structure).

    Why they are symmetries: no operation reads an id's value except to tell the null block
    and the range, and every argument family of :func:`calls_in_scope` is closed under both
    renamings (ids range over all blocks, tables over all shapes, hashes over all requests).
    So a call from a renamed state is the renamed call from the state, with the renamed
    outcome, and exploring one state per class reaches a renamed copy of every reachable
    state and of every transition. The spec is id-agnostic by construction; that the other
    backends are too is what the small scopes (which explore without renaming) check.
    """
    if not scope.symmetry:
        return [(tuple(range(scope.num_blocks)), None)]
    blocks = [(0, *p) for p in itertools.permutations(range(1, scope.num_blocks))]
    keymaps: list[dict[bytes, bytes] | None] = [None]
    for perm in itertools.permutations(range(len(requests))):
        if perm == tuple(range(len(requests))):
            continue
        mapping: dict[bytes, bytes] = {}
        for i, j in enumerate(perm):
            a, b = list(requests[i].block_hashes), list(requests[j].block_hashes)
            if len(a) != len(b) or any(
                    mapping.setdefault(x, y) != y for x, y in zip(a, b, strict=True)):
                break
        else:
            if len(set(mapping.values())) == len(mapping):
                keymaps.append({pack_key(x, g): pack_key(y, g) for x, y in mapping.items()
                                for g in range(scope.num_groups)})
    return [(m, k) for m in blocks for k in keymaps]


def _renamed(state: PoolState, blocks: tuple[int, ...], keys: dict[bytes, bytes] | None) -> tuple:
    """``state_key`` of the renamed state, with ``None`` written as ``b""``/``-1`` so that
    keys of different states compare."""
    old = [0] * len(blocks)
    for b, new in enumerate(blocks):
        old[new] = b

    def k(key: bytes) -> bytes:
        return key if keys is None else keys.get(key, key)

    pk, pt = state.primary_key, state.primary_tokens
    return (
        tuple(state.ref_cnt[b] for b in old),
        tuple(blocks[b] for b in state.free_queue),
        tuple(b"" if (key := pk[b]) is None else k(key) for b in old),
        tuple(-1 if pt[b] is None else pt[b] for b in old),
        tuple(sorted((blocks[b], tuple(map(k, ks))) for b, ks in state.secondary_keys.items())),
        tuple(sorted((k(key), tuple(blocks[b] for b in ids)) for key, ids in state.cache.items())),
        tuple(blocks[b] for b in state.watchers),
    )


def canonical_key(state: PoolState, symmetries: Sequence[Renaming]) -> tuple:
    """The least renamed ``state_key`` over the scope's symmetries: equal for states that
    differ only by a renaming (and in dict order or the event counter)."""
    return min(_renamed(state, blocks, keys) for blocks, keys in symmetries)


@dataclass
class ExhaustiveReport:
    """What one scope's walk found."""

    scope: str
    states: int = 0
    transitions: int = 0
    accepted: int = 0
    rejected: int = 0
    depth: int = 0
    frontier: int = 0
    """States first reached at ``max_depth``: checked on arrival, their calls not explored."""
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    """Process CPU time: on a loaded machine the wall clock says more about the others."""
    failure: str | None = None
    path: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class _Failure(Exception):
    pass


@dataclass
class _Node:
    pools: list[Any]
    recorders: list[Recorder]
    path: tuple[Call, ...]
    abstracts: list[Any] = field(default_factory=list)
    """Each pool's ``abstract()`` (no pending events): computed once, read by every call."""


def explore(scope: Scope, backends: Sequence[str] = ("spec", "reference", "fast"),
            *, max_states: int | None = None,
            progress: Callable[[ExhaustiveReport], None] | None = None) -> ExhaustiveReport:
    """Walk every reachable state of ``scope`` (spec first: the oracle); see the module doc."""
    report = ExhaustiveReport(scope.describe())
    start, cpu_start = time.perf_counter(), time.process_time()
    requests = [_request(scope, p) for p in scope.prompts]
    calls = calls_in_scope(scope)
    options = dict(enable_caching=scope.enable_caching, hash_block_size=scope.hash_block_size,
                   enable_kv_cache_events=scope.enable_events)
    pools = [b.make(scope.num_blocks, **options) for b in resolve_backends(backends)]
    root = _Node(pools, [Recorder() for _ in backends], (), [p.abstract() for p in pools])
    logger = logging.getLogger("kvpool")
    level = logger.level
    logger.setLevel(logging.ERROR)  # refused resets by the hundred
    symmetries = renamings(scope, requests)

    def key_of(state: PoolState) -> tuple:
        return canonical_key(state, symmetries) if scope.symmetry else state_key(state)

    assert not violated_invariants(root.abstracts[0].state), "a fresh pool breaks invariants"
    seen = {key_of(root.abstracts[0].state)}
    queue: deque[_Node] = deque([root])
    try:
        while queue:
            node = queue.popleft()
            report.states += 1
            report.depth = max(report.depth, len(node.path))
            for call in calls:
                child = _step(node, call, requests, scope, report)
                if child is None:
                    continue
                state = child.abstracts[0].state
                if not _in_bounds(scope, state):
                    continue
                key = key_of(state)
                if key in seen:
                    continue
                seen.add(key)
                deep = scope.max_depth is not None and len(child.path) >= scope.max_depth
                if deep:
                    report.frontier += 1  # reached, checked on arrival, not expanded
                elif max_states is None or len(seen) <= max_states:
                    queue.append(child)
            if progress is not None:
                progress(report)
    except _Failure as failure:
        report.failure = str(failure)
    finally:
        logger.setLevel(level)
    report.seconds = time.perf_counter() - start
    report.cpu_seconds = time.process_time() - cpu_start
    return report


def _in_bounds(scope: Scope, state: PoolState) -> bool:
    """Whether a state is inside the scope's bounds on ref counts and keys per block."""
    if max(state.ref_cnt) > scope.max_ref:
        return False
    return scope.max_keys is None or all(
        len(keys_of_block(state, b)) <= scope.max_keys for b in range(state.num_blocks))


def _concrete(value: Any, requests: list, recorder: Recorder) -> Any:
    if isinstance(value, _RequestRef):
        return requests[value.index]
    if isinstance(value, _Watcher):
        return recorder
    return value


def _spec_args(call: Call, requests: list) -> tuple:
    """The call's arguments as the spec's pure functions take them."""
    args = list(call.args)
    if call.op in ("cache_full_blocks", "cache_partial_block", "emit_cached_block_events"):
        args[0] = tuple(requests[args[0].index].block_hashes)
    if call.op == "unpin_blocks":
        args = args[:1]
    if call.op == "cache_full_blocks" and len(args) == 6:
        args.append(None)
    if call.op == "cache_partial_block" and len(args) == 5:
        args.append(False)
    return tuple(args)


def _fail(node: _Node, call: Call, message: str) -> _Failure:
    lines = [c.render() for c in (*node.path, call)]
    return _Failure(f"{message}\nafter {len(node.path)} calls:\n  " + "\n  ".join(lines))


def _step(node: _Node, call: Call, requests: list, scope: Scope,
          report: ExhaustiveReport) -> _Node | None:
    """Apply ``call`` from ``node`` on every backend; the child node if the state changed."""
    report.transitions += 1
    state = node.abstracts[0].state
    spec_args = _spec_args(call, requests)
    rejection = _check_precondition_contract(node, call, state, spec_args)
    mutating = call.op not in QUERIES and rejection is None
    if mutating:
        pairs = [_copy(pair) for pair in zip(node.pools, node.recorders, strict=True)]
        pools, recorders = [p for p, _ in pairs], [r for _, r in pairs]
        child: _Node | None = _Node(pools, recorders, (*node.path, call))
    else:
        pools, recorders, child = node.pools, node.recorders, None
    before = node.abstracts if not mutating else None
    fired_before = [len(r.log) for r in recorders]
    outcomes = []
    for pool, recorder in zip(pools, recorders, strict=True):
        args = [_concrete(a, requests, recorder) for a in call.args]
        try:
            outcomes.append((True, normalize(getattr(pool, call.op)(*args))))
        except KvPoolError as exc:
            outcomes.append((False, type(exc)))
        except Exception as exc:  # noqa: BLE001 - a crash is a finding
            raise _fail(node, call, f"{type(pool).__name__} crashed: {exc!r}") from exc
    if (outcomes[0][0]) != (rejection is None):
        raise _fail(node, call, f"spec outcome {outcomes[0]} disagrees with its precondition "
                    f"({rejection!r})")
    for label, outcome in zip(_labels(pools), outcomes, strict=True):
        if outcome != outcomes[0]:
            raise _fail(node, call, f"{label}: {outcome} but spec: {outcomes[0]}")
    fired = [r.log[n:] for r, n in zip(recorders, fired_before, strict=True)]
    if any(f != fired[0] for f in fired):
        raise _fail(node, call, f"watchers fired differently: {fired}")
    after = [p.abstract() for p in pools]
    for label, a in zip(_labels(pools), after, strict=True):
        if a != after[0]:
            raise _fail(node, call, f"{label}'s state differs from the spec's: {a} vs {after[0]}")
    if before is not None and after != before:
        changed = next(label for label, a, b in zip(_labels(pools), after, before, strict=True)
                       if a != b)
        raise _fail(node, call, f"a rejected call or a query changed the pool ({changed})")
    # A rejected call or a query left the node's state, checked when the node was reached.
    broken = violated_invariants(after[0].state) if mutating else ()
    if broken:
        raise _fail(node, call, f"invariants broken: {broken}")
    if rejection is None:
        report.accepted += 1
        _check_operation_contract(node, call, state, spec_args)
    else:
        report.rejected += 1
    if child is not None:
        for pool in pools:
            pool.take_events()  # compared above; taking them keeps copies small
        if state_key(after[0].state) == state_key(state):
            return None
        child.abstracts = [dataclasses.replace(a, pending_events=()) for a in after]
    return child


class _SharingPickler(pickle.Pickler):
    """Pickles compiled Numba closures (the fast pool's kernels) by reference: they cannot
    be pickled, are immutable, and a copy may share them."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.BuiltinFunctionType and type(obj.__self__).__name__ == "_Closure":
            _SHARED[id(obj)] = obj
            return _shared, (id(obj),)
        return NotImplemented


_SHARED: dict[int, Any] = {}


def _shared(key: int) -> Any:
    return _SHARED[key]


def _copy(value: Any) -> Any:
    """A deep copy of a pool and its watcher: pickling is several times faster than
    ``deepcopy`` (which stays the fallback for anything else that cannot be pickled)."""
    buffer = io.BytesIO()
    try:
        _SharingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(value)
    except (pickle.PicklingError, TypeError, AttributeError):
        return copy.deepcopy(value)
    return pickle.loads(buffer.getvalue())


def _labels(pools: list) -> Iterator[str]:
    return (getattr(p, "backend_name", type(p).__name__) for p in pools)


def _check_precondition_contract(node: _Node, call: Call, state: PoolState,
                                 args: tuple) -> KvPoolError | None:
    """The precondition's verdict, checked against §12's rows (icontract raises if not)."""
    name = f"{call.op}_rejection"
    if call.op in ("get_num_free_blocks", "get_usage", "reset_prefix_cache"):
        return None
    if call.op == "cache_partial_block":
        args = args[:-1]  # replace_existing_hashes is not validated
    try:
        return getattr(pc, name)(state, *args)
    except Exception as exc:  # noqa: BLE001 - icontract.ViolationError, or a crash
        raise _fail(node, call, f"precondition contract of {call.op}: {exc}") from exc


def _check_operation_contract(node: _Node, call: Call, state: PoolState, args: tuple) -> None:
    op = getattr(contracts, call.op, None)
    if op is None or call.op == "get_num_free_blocks":
        return
    try:
        op(state, *args)
    except Exception as exc:  # noqa: BLE001 - icontract.ViolationError
        raise _fail(node, call, f"contract of {call.op}: {exc}") from exc


__all__ = [
    "LARGE_SCOPES",
    "SCOPES",
    "SMALL_SCOPES",
    "Call",
    "ExhaustiveReport",
    "Scope",
    "calls_in_scope",
    "canonical_key",
    "explore",
    "renamings",
    "state_key",
]
