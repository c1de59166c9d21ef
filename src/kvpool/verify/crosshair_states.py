"""How CrossHair builds a symbolic :class:`~kvpool.spec.state.PoolState`: every bounded valid one.

Left to itself, CrossHair builds a ``PoolState`` field by field (tuples of any length, dicts
of any bytes) and almost never satisfies all twelve invariants: measured, one valid state in
20 s of search. This creator instead builds states that are valid by construction, making
only the choices a valid state leaves open, each one a CrossHair branch or SMT variable:

* ``num_blocks`` in ``1…MAX_BLOCKS`` and ``hash_block_size`` in ``HASH_BLOCK_SIZES``
  (concrete, one subtree each);
* caching / events on or off; for each block, free or held, and its ref count (symbolic);
* the free queue: the free blocks in any order (each inserted at a chosen position);
* each block's primary key (from ``KEY_ALPHABET``, symbolic token count ``hbs·t``) and up to
  ``MAX_SECONDARY`` secondary keys; the ids under each key in any insertion order;
* watchers: any subset of the non-null blocks, in any order; the event counter (symbolic).

A second creator builds the *batches* the contracted wrappers take (``BlockIds``, ``GroupIds``
of :mod:`kvpool.spec.state`): 0…``MAX_BATCH`` ids, each one a concrete choice among the pool's
ids and the two ids just out of range (-1 and ``num_blocks``), often repeating an earlier one.
Left symbolic, a batch of two ids that name two suitable blocks, or the same block twice, was
a rarity (a reversed free-queue batch took ~480 paths to find, a refusal of a repeated block
none in the CI budget); here it is one choice among a few.

A third set of creators draws the arguments of the focused contracts
(:mod:`kvpool.spec.focused_contracts`) from small concrete domains: batches a release empties,
keyed batches, pop counts, hashes of the key alphabet, whole ``cache_full_blocks`` calls and
one-row probes of them, single ids. They choose with balanced trees of coins
(:meth:`_Chooser.pick_balanced`), so that no option sits behind a long chain of coins.

Within these bounds every state that satisfies the invariants can be produced (the alphabet
is a bound on how many *distinct* keys a state holds; operations only compare keys). The
contracts still *require* every invariant, so a creator bug can only hide states, never let an
invalid one through. Arguments other than the state (ids, hashes, counts) stay fully symbolic.

Registered by :mod:`kvpool.verify.crosshair_plugin` (``crosshair check --extra_plugin``).
"""

from __future__ import annotations

import atexit
import sys

from crosshair import IgnoreAttempt, SymbolicFactory, register_type
from crosshair.statespace import StateSpace, context_statespace
from crosshair.tracers import NoTracing, ResumedTracing

from kvpool.keys import MAX_GROUP_ID, key_group, pack_key
from kvpool.spec.state import (
    NULL_BLOCK_ID,
    BlockId,
    BlockIds,
    CachedHash,
    CacheFullCall,
    CacheFullProbe,
    GroupIds,
    HitGroups,
    KeyedBatch,
    PoolState,
    PopCount,
    ReleasedBatch,
)

MAX_BLOCKS = 5
"""Largest pool built: the null block and four real blocks."""

HASH_BLOCK_SIZES = (1, 2)
"""hbs values tried: 1 makes every token count legal, 2 exercises the multiple-of-hbs rules."""

KEY_ALPHABET: tuple[bytes, ...] = tuple(
    pack_key(bytes([h]), g) for g in (0, 1) for h in (1, 2, 3)
)
"""Keys a built state may hold: three one-byte block hashes in groups 0 and 1."""

MAX_SECONDARY = 2
"""Most secondary keys one block carries."""

STATES_BUILT = 0
"""How many states this process built: one per CrossHair iteration that reached the call."""


class _Chooser:
    """Makes the creator's choices as CrossHair branches with explicit probabilities.

    CrossHair's default explores the *true* side of an untried branch only a quarter of the
    time, which would make a state with four free cached blocks a rarity; a fair (or chosen)
    coin keeps the interesting states common (CrossHair's coverage heuristic may still
    re-weight a coin towards code it has rarely reached). Counts that the SMT solver should
    pick (ref counts, token counts, the event counter) are symbolic ints with constraints,
    not branches.
    """

    def __init__(self, factory: SymbolicFactory) -> None:
        self.factory = factory
        self.space = factory.space

    def coin(self, probability_true: float = 0.5) -> bool:
        return self.space.smt_fork(desc="kvpool_choice", probability_true=probability_true)

    def pick(self, options: tuple, weights: tuple[float, ...] | None = None):
        """One of ``options`` (uniform unless ``weights``), as a chain of coins."""
        weights = weights or (1.0,) * len(options)
        left = sum(weights)
        for option, weight in zip(options[:-1], weights[:-1], strict=True):
            if self.coin(weight / left):
                return option
            left -= weight
        return options[-1]

    def pick_balanced(self, options: tuple, weights: tuple[float, ...] | None = None):
        """One of ``options`` as a balanced tree of coins (depth log2 of their number).

        :meth:`pick` is a chain: its last option sits behind ``len - 1`` coins, and once the
        search re-weights the coins of a well-explored chain towards even odds, that option is
        reached a few times in a thousand paths. Here every option sits behind about
        ``log2(len)`` coins. (The state creator keeps :meth:`pick`: changing its choices would
        move every existing search, measured and tested as they are.)
        """
        weights = weights or (1.0,) * len(options)
        while len(options) > 1:
            half = len(options) // 2
            left = sum(weights[:half])
            if self.coin(left / (left + sum(weights[half:]))):
                options, weights = options[:half], weights[:half]
            else:
                options, weights = options[half:], weights[half:]
        return options[0]

    def shuffled(self, items: list[int]) -> tuple[int, ...]:
        """``items`` in any order: each one inserted at a uniformly chosen position."""
        out: list[int] = []
        for item in items:
            out.insert(self.pick(tuple(range(len(out) + 1))), item)
        return tuple(out)

    def symbolic_count(self, suffix: str, at_least: int, multiple_of: int = 1):
        """A symbolic int ``≥ at_least`` and a multiple of ``multiple_of`` (no branch)."""
        value = self.factory(int, suffix)
        with ResumedTracing():
            conditions = [value >= at_least]
            if multiple_of > 1:
                conditions.append(value % multiple_of == 0)
        for condition in conditions:  # checked untraced: traced, type() would lie
            if type(condition) is bool:  # CrossHair handed out a concrete int this time
                if not condition:
                    raise IgnoreAttempt
            else:
                self.space.add(condition)
        return value

    def key(self) -> bytes:
        return self.pick(KEY_ALPHABET, _KEY_WEIGHTS)


_KEY_WEIGHTS = tuple(3.0 if key_group(k) == 0 else 1.0 for k in KEY_ALPHABET)
"""Group 0 three times as likely as group 1: duplicates under one key stay common."""

_NUM_BLOCKS_WEIGHTS = (0.05, 0.1, 0.2, 0.3, 0.35)
"""Weights of ``num_blocks`` 1…5: small pools are cheap to exhaust, bugs need a few blocks."""


def _build(choose: _Chooser) -> PoolState:
    n = choose.pick(tuple(range(1, MAX_BLOCKS + 1)), _NUM_BLOCKS_WEIGHTS)
    hbs = choose.pick(HASH_BLOCK_SIZES)
    caching = choose.coin(0.75)
    events = choose.coin()
    ref_cnt: list = [0] * n
    free: list[int] = []
    for b in range(1, n):
        if choose.coin():
            ref_cnt[b] = choose.symbolic_count(f"_ref{b}", at_least=1)
        else:
            free.append(b)
    queue = choose.shuffled(free)
    primary: list[bytes | None] = [None] * n
    tokens: list = [None] * n
    secondary: dict[int, tuple[bytes, ...]] = {}
    if caching:
        for b in range(1, n):
            if not choose.coin():
                continue
            primary[b] = choose.key()
            tokens[b] = choose.symbolic_count(f"_tokens{b}", at_least=hbs, multiple_of=hbs)
            extra: list[bytes] = []
            while len(extra) < MAX_SECONDARY and choose.coin(0.3):
                key = choose.key()
                if key != primary[b] and key not in extra:
                    extra.append(key)
            if extra:
                secondary[b] = tuple(extra)
    cache: dict[bytes, tuple[int, ...]] = {}
    for key in KEY_ALPHABET:
        holders = [b for b in range(1, n) if primary[b] == key or key in secondary.get(b, ())]
        if holders:
            cache[key] = choose.shuffled(holders)
    watchers = choose.shuffled([b for b in range(1, n) if choose.coin(0.3)])
    return PoolState(
        num_blocks=n,
        enable_caching=caching,
        hash_block_size=hbs,
        enable_events=events,
        ref_cnt=tuple(ref_cnt),
        free_queue=queue,
        primary_key=tuple(primary),
        primary_tokens=tuple(tokens),
        secondary_keys=secondary,
        cache=cache,
        watchers=watchers,
        event_count=choose.symbolic_count("_event_count", at_least=0) if events else 0,
    )


def make_pool_state(factory: SymbolicFactory) -> PoolState:
    """CrossHair's creator for ``PoolState`` (CrossHair calls it with tracing off)."""
    global STATES_BUILT, _LAST_STATE
    STATES_BUILT += 1
    _LAST_STATE = _build(_Chooser(factory))
    return _LAST_STATE


MAX_BATCH = 4
"""Longest batch built: enough for two pairs, or one block three times."""

_BATCH_LENGTH_WEIGHTS = (0.1, 0.25, 0.3, 0.2, 0.15)
"""Weights of batch lengths 0…4: order and repeats need two ids or more."""

REPEAT_PROBABILITY = 0.3
"""How often a batch's next id repeats an earlier one (§12: a batch is checked as a whole)."""

OUT_OF_RANGE_PROBABILITY = 0.1
"""How often an id is one of the two just outside ``[0, num_blocks)``: -1 or ``num_blocks``."""

HELD_WEIGHT = 3.0
"""An id names a held block this many times as often as a free one or the null block: most
batch verbs take held blocks, and a batch of two held blocks is what order bugs need."""

_LAST_STATE: PoolState | None = None
"""The state built for this call: the state is the first argument of every contract, so
CrossHair builds it before the batch, whose ids then fit that pool."""


def _batch(choose: _Chooser, fresh) -> tuple:  # type: ignore[no-untyped-def]
    """0…MAX_BATCH values from ``fresh()``, each repeating an earlier one at times."""
    out: list = []
    for _ in range(choose.pick(tuple(range(MAX_BATCH + 1)), _BATCH_LENGTH_WEIGHTS)):
        if out and choose.coin(REPEAT_PROBABILITY):
            out.append(choose.pick(tuple(dict.fromkeys(out))))
        else:
            out.append(fresh())
    return tuple(out)


def make_block_ids(factory: SymbolicFactory, *_type_args: object) -> tuple[int, ...]:
    """CrossHair's creator for ``BlockIds``: a short batch of this pool's ids (concrete)."""
    choose = _Chooser(factory)
    n = _LAST_STATE.num_blocks if _LAST_STATE else MAX_BLOCKS
    ref_cnt = _LAST_STATE.ref_cnt if _LAST_STATE else (0,) * n
    # A free block's count is the concrete 0; a held one's is 1 or symbolic (never compared
    # here: this runs untraced, and comparing a symbolic int would need the solver).
    weights = tuple(1.0 if type(r) is int and r == 0 else HELD_WEIGHT for r in ref_cnt)

    def fresh() -> int:
        if choose.coin(OUT_OF_RANGE_PROBABILITY):
            return choose.pick((-1, n))
        return choose.pick(tuple(range(n)), weights)

    return _batch(choose, fresh)


_GROUPS = (0, 1, MAX_GROUP_ID, -1, MAX_GROUP_ID + 1, True)
"""Group ids a batch draws from: the two the key alphabet uses, the largest valid one, and
the three invalid kinds (below, above, a bool)."""

_GROUP_WEIGHTS = (4.0, 4.0, 1.0, 1.0, 1.0, 1.0)


def make_group_ids(factory: SymbolicFactory, *_type_args: object) -> tuple[int, ...]:
    """CrossHair's creator for ``GroupIds``: a short batch of group ids (concrete)."""
    choose = _Chooser(factory)
    return _batch(choose, lambda: choose.pick(_GROUPS, _GROUP_WEIGHTS))


# ---------------------------------------------------------------------------------------------
# The focused contracts' arguments (kvpool.spec.focused_contracts): small concrete domains
# ---------------------------------------------------------------------------------------------


def _state() -> PoolState:
    if _LAST_STATE is None:  # no state argument built first: nothing to fit the ids to
        raise IgnoreAttempt
    return _LAST_STATE


def _is_free(state: PoolState, block_id: int) -> bool:
    # A free block's count is the concrete 0; a held one's is symbolic (never compared here).
    r = state.ref_cnt[block_id]
    return type(r) is int and r == 0


def _held(state: PoolState) -> list[int]:
    return [b for b in range(1, state.num_blocks) if not _is_free(state, b)]


def _distinct(choose: _Chooser, pool: list[int]) -> tuple[int, ...]:
    """Two to four distinct members of ``pool`` (at most all of it), in any order."""
    if len(pool) < 2:
        raise IgnoreAttempt
    count = choose.pick_balanced(tuple(range(2, min(4, len(pool)) + 1)))
    out: list[int] = []
    for _ in range(count):
        out.append(choose.pick_balanced(tuple(b for b in pool if b not in out)))
    return tuple(out)


def make_released_batch(factory: SymbolicFactory, *_type_args: object) -> tuple[int, ...]:
    state = _state()
    return _distinct(_Chooser(factory), _held(state))


def make_keyed_batch(factory: SymbolicFactory, *_type_args: object) -> tuple[int, ...]:
    state = _state()
    keyed = [b for b in range(1, state.num_blocks) if state.primary_key[b] is not None]
    return _distinct(_Chooser(factory), keyed)


def make_pop_count(factory: SymbolicFactory, *_type_args: object) -> int:
    queued = len(_state().free_queue)
    if queued < 2:
        raise IgnoreAttempt
    return _Chooser(factory).pick_balanced(tuple(range(2, queued + 1)))


BLOCK_HASHES: tuple[bytes, ...] = (b"\x01", b"\x02", b"\x03")
"""The block hashes of ``KEY_ALPHABET``: drawn hashes meet the keys a built state holds."""


def make_cached_hash(factory: SymbolicFactory, *_type_args: object) -> bytes:
    # Favour a hash that several of the state's keys use (a hit in both groups).
    keys = _state().cache
    weights = tuple(1.0 + sum(pack_key(h, g) in keys for g in (0, 1)) ** 2 for h in BLOCK_HASHES)
    return _Chooser(factory).pick_balanced(BLOCK_HASHES, weights)


def make_hit_groups(factory: SymbolicFactory, *_type_args: object) -> tuple[int, ...]:
    choose = _Chooser(factory)
    count = choose.pick_balanced((2, 3, 4), (0.6, 0.25, 0.15))
    return tuple(choose.pick_balanced((0, 1)) for _ in range(count))


def make_block_id(factory: SymbolicFactory, *_type_args: object) -> int:
    """One id of this pool (free and held alike: a refusal may need either), or -1 / N."""
    state = _state()
    choose = _Chooser(factory)
    n = state.num_blocks
    if choose.coin(OUT_OF_RANGE_PROBABILITY):
        return choose.pick_balanced((-1, n))
    return choose.pick_balanced(tuple(range(n)))  # free and held alike: both matter here


_PROBES = ("none", "group", "negative_cached", "negative_full", "no_op", "block_size",
           "table_short", "mask_length", "hashes_short", "out_of_range", "repeat", "free",
           "keyed")
"""How a ``CacheFullProbe`` breaks its well-formed call: not at all, or one §12 row's way."""


def _cache_full_call(choose: _Chooser, state: PoolState, min_candidates: int = 1) -> list:
    """A well-formed call: counts, size, mask and hashes fit; candidates distinct held blocks
    (or null). Whether a candidate's existing key covers too much is left to the solver."""
    n, hbs = state.num_blocks, state.hash_block_size
    held = _held(state)
    length = choose.pick_balanced((1, 2, 3, 4)[min_candidates - 1:])
    num_full = choose.pick_balanced(tuple(range(min_candidates, length + 1)))
    num_cached = choose.pick_balanced(tuple(range(num_full - min_candidates + 1)))
    ratio = choose.pick_balanced((1, 2), (0.7, 0.3))
    ids: list[int] = []
    for k in range(length):
        if num_cached <= k < num_full:
            options = tuple(b for b in held if b not in ids[num_cached:]) + (NULL_BLOCK_ID,)
            weights = tuple(HELD_WEIGHT for _ in options[:-1]) + (1.0,)
            ids.append(choose.pick_balanced(options, weights))
        else:
            ids.append(choose.pick_balanced(tuple(range(n))))
    mask = None
    if choose.coin(0.3):
        mask = tuple(choose.coin(0.75) for _ in range(num_full - num_cached))
    hashes = tuple(choose.pick_balanced(BLOCK_HASHES) for _ in range(num_full * ratio))
    group = choose.pick_balanced((0, 1))
    return [hashes, tuple(ids), num_cached, num_full, hbs * ratio, group, mask]


def _break(choose: _Chooser, state: PoolState, call: list, how: str) -> list:
    hashes, ids, num_cached, num_full, block_size, group, mask = call
    ids = list(ids)
    candidates = range(num_cached, num_full)
    if how == "group":
        group = choose.pick_balanced((-1, MAX_GROUP_ID + 1, True))
    elif how == "negative_cached":
        num_cached = -1
    elif how == "negative_full":
        num_full = -1
    elif how == "no_op":
        num_cached = num_full + choose.pick_balanced((0, 1))
    elif how == "block_size":
        hbs = state.hash_block_size
        block_size = choose.pick_balanced((0, -hbs) + ((hbs + 1,) if hbs > 1 else ()))
    elif how == "table_short":
        ids = ids[: num_full - 1]
    elif how == "mask_length":
        mask = (mask or (True,) * (num_full - num_cached)) + (True,)
        if choose.coin():
            mask = mask[:-2]
    elif how == "hashes_short":
        hashes = hashes[:-1]
    elif how == "out_of_range":
        ids[choose.pick_balanced(tuple(candidates))] = choose.pick_balanced((-1, state.num_blocks))
    elif how == "repeat":  # the call was drawn with two candidates or more
        k, j = choose.pick_balanced(tuple((k, j) for k in candidates for j in candidates
                                          if j < k))
        if ids[j] == NULL_BLOCK_ID:
            held = _held(state)
            if not held:
                raise IgnoreAttempt
            ids[j] = choose.pick_balanced(tuple(held))
        ids[k] = ids[j]
        if mask is not None:
            mask = tuple(True for _ in mask)
    elif how in ("free", "keyed"):
        k = choose.pick_balanced(tuple(candidates))
        if how == "free":
            pool = tuple(b for b in range(1, state.num_blocks) if _is_free(state, b))
        else:
            pool = tuple(b for b in range(1, state.num_blocks)
                         if state.primary_key[b] is not None)
        if not pool:
            raise IgnoreAttempt
        ids[k] = choose.pick_balanced(pool)
        if mask is not None:
            mask = tuple(True for _ in mask)
    return [hashes, tuple(ids), num_cached, num_full, block_size, group, mask]


def make_cache_full_call(factory: SymbolicFactory, *_type_args: object) -> tuple:
    state = _state()
    if not state.enable_caching:  # every call is refused: nothing for this contract to check
        raise IgnoreAttempt
    return tuple(_cache_full_call(_Chooser(factory), state))


def make_cache_full_probe(factory: SymbolicFactory, *_type_args: object) -> tuple:
    state = _state()
    choose = _Chooser(factory)
    how = choose.pick_balanced(_PROBES)
    call = _cache_full_call(choose, state, min_candidates=2 if how == "repeat" else 1)
    return tuple(_break(choose, state, call, how))


def _report_count() -> None:
    # Read by kvpool.verify.crosshair_check: CrossHair prints no iteration count unless -v.
    print(f"kvpool-crosshair: states_built={STATES_BUILT}", file=sys.stderr)


_FOCUSED_CREATORS = {
    ReleasedBatch: make_released_batch,
    KeyedBatch: make_keyed_batch,
    PopCount: make_pop_count,
    CachedHash: make_cached_hash,
    HitGroups: make_hit_groups,
    BlockId: make_block_id,
    CacheFullCall: make_cache_full_call,
    CacheFullProbe: make_cache_full_probe,
}

_registered = False


def register() -> None:
    """Build ``PoolState`` and batches with the creators above; tune the search (idempotent)."""
    global _registered
    if not _registered:
        register_type(PoolState, make_pool_state)
        register_type(BlockIds, make_block_ids)
        register_type(GroupIds, make_group_ids)
        for kind, make in _FOCUSED_CREATORS.items():
            register_type(kind, make)
        tune_search()
        atexit.register(_report_count)
        _registered = True


REALIZATION_CONFORMITY = 0.5
"""How often a realized symbolic int keeps the solver's first value (CrossHair: 1.0, always)."""


def _assume_facts(*facts: object) -> bool:
    """:func:`kvpool.spec.contracts.given` under CrossHair: facts become solver assumptions."""
    space = context_statespace()
    with NoTracing():
        for fact in facts:
            if type(fact) is bool:  # decided already (concrete arguments)
                if not fact:
                    raise IgnoreAttempt
            elif space.is_possible(fact.var):  # type: ignore[attr-defined]
                space.add(fact)
            else:
                raise IgnoreAttempt
    return True


def tune_search() -> None:
    """Two changes to how CrossHair searches; neither changes what a counterexample means.

    * ``contracts.given`` facts (implied by every valid call) become assumptions instead of
      branches. Without this, a call with two block ids passes its range checks on about one
      path in ten and ``move_block_hashes`` reached its body on 0 of 201 paths; with it, most
      paths are valid calls.
    * A symbolic int that the code realizes (a slice bound, a list index on a write, a hash)
      keeps the solver's first model value only half of the time instead of always. CrossHair
      otherwise explores ``get_new_blocks(state, 0)`` almost exclusively (measured: 120 of 130
      calls), since 0 is the first value the solver offers and the subtree below never ends.

    Both reach into CrossHair internals (``StateSpace.find_model_value``, ``StateSpace.add``;
    developed against crosshair-tool 0.0.113): ``tests/spec/test_crosshair_finds_bugs.py``
    fails if an upgrade breaks them.
    """
    import kvpool.spec.contracts as contracts

    contracts.given = _assume_facts
    original = StateSpace.find_model_value

    def find_model_value(self, expr, choice_conformity=1.0):  # type: ignore[no-untyped-def]
        return original(self, expr, min(choice_conformity, REALIZATION_CONFORMITY))

    StateSpace.find_model_value = find_model_value  # type: ignore[method-assign]
