"""The contracts hold at runtime on states reached by seeded random walks (icontract enabled).

A wrong postcondition (or a spec bug) raises ``icontract.ViolationError`` here within
milliseconds, long before CrossHair would be asked. Invalid calls are checked too: the
operation raises exactly the error its precondition function names.
"""

from __future__ import annotations

import random
from collections import Counter

import icontract
import pytest

from kvpool.spec import contracts, ops
from kvpool.spec import preconditions as pre
from kvpool.spec.state import NULL_BLOCK_ID, PoolState, initial_state

HASHES = tuple(bytes([h]) * 4 for h in range(5))  # few distinct hashes: duplicates happen


def _held(state: PoolState) -> list[int]:
    return [b for b in range(1, state.num_blocks) if state.ref_cnt[b] > 0]


def _release_batch(rng: random.Random, state: PoolState, with_null: bool) -> tuple[int, ...]:
    """Blocks to release, each at most its ref count (sometimes one too many)."""
    batch = []
    for b in _held(state):
        batch += [b] * rng.randint(0, state.ref_cnt[b])
    if with_null and rng.random() < 0.3:
        batch.append(NULL_BLOCK_ID)
    if batch and rng.random() < 0.05:
        batch.append(rng.choice(batch))  # may over-release: DoubleFree
    rng.shuffle(batch)
    return tuple(batch)


def _some_ids(rng: random.Random, state: PoolState, k: int) -> tuple[int, ...]:
    return tuple(rng.randrange(state.num_blocks) for _ in range(k))


def _request_hashes(rng: random.Random) -> tuple[bytes, ...]:
    return tuple(rng.choice(HASHES) for _ in range(rng.randint(0, 8)))


def _random_call(rng: random.Random, state: PoolState) -> tuple[str, tuple]:
    """An operation name and arguments after the state; mostly valid ones."""
    hbs = state.hash_block_size
    held = _held(state) or [NULL_BLOCK_ID]
    name = rng.choice(list(contracts.CONTRACTS) + ["get_new_blocks", "free_blocks"] * 2)
    if name == "get_new_blocks":
        return name, (rng.randint(0, len(state.free_queue) + (rng.random() < 0.05)),)
    if name in ("touch", "evict_blocks"):
        return name, (_some_ids(rng, state, rng.randint(0, 4)),)
    if name == "free_blocks":
        return name, (_release_batch(rng, state, with_null=True),)
    if name == "unpin_blocks":
        return name, (_release_batch(rng, state, with_null=False),)
    if name == "get_cached_block":
        groups = tuple(rng.choice((0, 1)) for _ in range(1 + rng.randrange(2)))
        return name, (rng.choice(HASHES), groups)
    if name == "cache_full_blocks":
        ratio = rng.choice((1, 2))
        hashes = _request_hashes(rng)
        # Mostly blocks with no key or a short (partial) one: those can be (re)cached.
        short = [b for b in held if (state.primary_tokens[b] or 0) < 2 * ratio * hbs] or held
        partial = [b for b in short if state.primary_tokens[b] is not None]
        table = tuple(rng.choice(short) for _ in range(rng.randint(0, len(hashes) // ratio + 1)))
        if partial and len(table) > 1 and rng.random() < 0.5:
            table = table[:-1] + (rng.choice(partial),)  # a later position: a promotion
        num_full = rng.randint(0, len(table))
        num_cached = rng.randint(0, num_full + 1) if rng.random() < 0.3 else 0
        mask = None
        if rng.random() < 0.3:
            mask = tuple(rng.random() < 0.7 for _ in range(max(num_full - num_cached, 0)))
        return name, (hashes, table, num_cached, num_full, hbs * ratio, rng.choice((0, 1)), mask)
    if name == "cache_partial_block":
        hashes = _request_hashes(rng) or HASHES[:1]
        tokens = hbs * rng.randint(1, min(len(hashes), 2))  # short entries: later promoted
        return name, (hashes, rng.choice(held), tokens, rng.choice((0, 1)), hbs * 2,
                      rng.random() < 0.2)
    if name == "move_block_hashes":
        return name, (rng.choice(held), rng.choice(held))
    if name in ("reset_prefix_cache", "get_usage"):
        return name, ()
    if name == "emit_cached_block_events":
        hashes = _request_hashes(rng)
        return name, (hashes, rng.randint(0, len(hashes)), hbs, rng.choice((0, 1)))
    return name, (rng.randrange(state.num_blocks),)


def _spoiled(rng: random.Random, state: PoolState, name: str, args: tuple) -> tuple:
    """``args`` with one int replaced by an out-of-range value (ids, groups, counts, sizes)."""
    positions = [i for i, a in enumerate(args) if isinstance(a, int) and not isinstance(a, bool)]
    id_tuples = [i for i, a in enumerate(args) if isinstance(a, tuple) and a and
                 all(isinstance(x, int) for x in a)]
    choices = positions + id_tuples
    if not choices:
        return args
    i = rng.choice(choices)
    bad = rng.choice((-1, -2, state.num_blocks, 2**32, 0))
    value = args[i][:-1] + (bad,) if i in id_tuples else bad
    return args[:i] + (value,) + args[i + 1 :]


def _rejection(name: str, state: PoolState, args: tuple):
    if name in ("reset_prefix_cache", "get_usage"):
        return None  # a refused reset is a result, not an error; usage is always valid
    if name == "cache_partial_block":
        args = args[:-1]  # replace_existing cannot make a call invalid
    return getattr(pre, f"{name}_rejection")(state, *args)


def _walk(seed: int, state: PoolState, steps: int) -> Counter:
    """Random calls from ``state``; counts of valid calls per operation and of behaviours."""
    rng = random.Random(seed)
    seen: Counter = Counter()
    for _ in range(steps):
        name, args = _random_call(rng, state)
        if rng.random() < 0.1:
            args = _spoiled(rng, state, name, args)
        error = _rejection(name, state, args)
        # The contract's argument condition is exactly "the precondition function says yes".
        assert contracts.CONTRACTS[name][0](state, *args) == (error is None), (name, args)
        if error is not None:
            with pytest.raises(type(error)):
                getattr(ops, name)(state, *args)
            continue
        # The contracted wrapper checks invariants and the exact effect of this call.
        out = getattr(contracts, name)(state, *args)
        seen[name] += 1
        seen["promotion"] += name == "cache_full_blocks" and any(
            state.primary_key[b] is not None and out.state.primary_key[b] != state.primary_key[b]
            for b in args[1][args[2] : args[3]]
        )
        seen["duplicate key"] += any(len(ids) > 1 for ids in out.state.cache.values())
        seen["secondary key"] += bool(out.state.secondary_keys)
        seen["watcher fired"] += bool(out.fired_watchers)
        seen["reset accepted"] += name == "reset_prefix_cache" and out.result is True
        state = out.state
    return seen


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("events", [True, False])
@pytest.mark.parametrize("num_blocks, hbs", [(1, 1), (4, 2), (9, 1), (16, 4)])
def test_contracts_hold_along_a_random_walk(caching, events, num_blocks, hbs):
    seed = 1000 * num_blocks + 10 * hbs + 2 * caching + events
    state = initial_state(num_blocks, enable_caching=caching, hash_block_size=hbs,
                          enable_events=events)
    seen = _walk(seed, state, steps=400)
    if num_blocks > 1:
        # The walk must actually exercise the operations, not only reject arguments.
        assert seen["get_new_blocks"] > 20 and seen["free_blocks"] > 20, seen
        if caching:
            assert seen["cache_full_blocks"] > 5, seen


def test_the_walks_reach_promotions_duplicates_secondaries_watchers_and_resets():
    seen: Counter = Counter()
    for num_blocks, hbs in [(4, 2), (9, 1), (16, 4)]:
        state = initial_state(num_blocks, hash_block_size=hbs, enable_events=True)
        seen += _walk(num_blocks, state, steps=1500)
    behaviours = ("promotion", "duplicate key", "secondary key", "watcher fired",
                  "reset accepted")
    assert all(seen[b] > 0 for b in behaviours), seen


def test_a_wrong_effect_is_reported_by_the_contract():
    broken = contracts.contract_of("touch")(lambda state, block_ids: ops.Outcome(state))
    with pytest.raises(icontract.ViolationError, match="touch_post"):
        broken(initial_state(3), (1,))


def test_an_invalid_state_is_refused_before_the_call():
    state = initial_state(3)
    bad = PoolState(**{**state.__dict__, "ref_cnt": (0, 1, 0)})  # held block still queued
    with pytest.raises(icontract.ViolationError, match="invariants_hold_before"):
        contracts.touch(bad, ())
