"""Runtime contract checking (``check_contracts=True``): the reference runs the spec in lockstep.

:func:`install_contract_checks` keeps a *shadow* spec state next to the pool and wraps each
``_core_*`` method of that one pool object. Every call then also runs the spec operation on
the shadow and checks that:

* both succeed, or both raise an error of the same type (the first failing check agrees);
* results, event records (with their sequence numbers) and fired watchers are equal;
* the pool's converted state equals the shadow afterwards — also after an error, which
  proves the rejected call changed nothing;
* the object graph is still wired soundly (queue links, ids, map filing).

Any difference raises ``AssertionError`` naming the operation and the first differing field.
The wrappers are instance attributes installed only on request, so a pool built without
``check_contracts`` runs the plain class methods: the checking costs nothing when off.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from kvpool.reference.invariants import CORE_STRUCTURAL_CHECKS, structural_violations
from kvpool.reference.parts import ReferenceParts
from kvpool.spec import ops
from kvpool.spec import preconditions as pre
from kvpool.spec.state import PoolState, initial_state

SpecStep = Callable[..., tuple[PoolState, Any]]
"""``(state, *core args) -> (new state, expected core return, normalised)``."""

Normalise = Callable[[Any], Any]
"""Turns a core method's return value into the comparable form its spec step produces."""


def _outcome(out: ops.Outcome, *parts: str) -> tuple[PoolState, Any]:
    values = tuple(getattr(out, p) for p in parts)
    return out.state, values[0] if len(values) == 1 else values


def _error_type(error: BaseException | None) -> type | None:
    return None if error is None else type(error)


def _ids(ids: Any) -> tuple[int, ...] | None:
    return None if ids is None else tuple(int(b) for b in ids)


# core method -> (the spec step it mirrors, how to normalise the core's return value)
COUNTERPARTS: dict[str, tuple[SpecStep, Normalise]] = {
    "_core_get_new_blocks": (
        lambda s, n: _outcome(ops.get_new_blocks(s, n), "result", "events", "fired_watchers"),
        lambda r: (_ids(r[0]), tuple(r[1]), _ids(r[2])),
    ),
    "_core_touch": (lambda s, ids: (ops.touch(s, ids).state, None), lambda r: r),
    "_core_check_free": (
        lambda s, ids: (s, _error_type(pre.free_blocks_rejection(s, ids))),
        _error_type,
    ),
    "_core_free": (lambda s, ids: (ops.free_blocks(s, ids).state, None), lambda r: r),
    "_core_unpin": (lambda s, ids: (ops.unpin_blocks(s, ids).state, None), lambda r: r),
    "_core_get_cached_block": (
        lambda s, h, groups: _outcome(ops.get_cached_block(s, h, groups), "result"),
        _ids,
    ),
    "_core_cache_full_blocks": (
        lambda s, hashes, *rest: _outcome(ops.cache_full_blocks(s, tuple(hashes), *rest), "events"),
        tuple,
    ),
    "_core_cache_partial_block": (
        lambda s, hashes, *rest: _outcome(
            ops.cache_partial_block(s, tuple(hashes), *rest), "result", "events"
        ),
        lambda r: (r[0], tuple(r[1])),
    ),
    "_core_move_block_hashes": (
        lambda s, src, dst: (ops.move_block_hashes(s, src, dst).state, None),
        lambda r: r,
    ),
    "_core_evict_blocks": (lambda s, ids: _outcome(ops.evict_blocks(s, ids), "events"), tuple),
    "_core_reset_prefix_cache": (
        lambda s: _outcome(ops.reset_prefix_cache(s), "result", "events", "fired_watchers"),
        lambda r: (r[0], tuple(r[1]), _ids(r[2])),
    ),
    "_core_emit_cached_block_events": (
        lambda s, hashes, *rest: _outcome(
            ops.emit_cached_block_events(s, tuple(hashes), *rest), "events"
        ),
        tuple,
    ),
    "_core_is_block_writable": (
        lambda s, b: _outcome(ops.is_block_writable(s, b), "result"),
        bool,
    ),
    "_core_num_free_blocks": (lambda s: (s, ops.get_num_free_blocks(s)), int),
}


def _short(value: object) -> str:
    return reprlib.repr(value)


def first_difference(ours: PoolState, spec: PoolState) -> str | None:
    """Where two states first differ (fields in declaration order), described; ``None`` if equal."""
    for f in fields(PoolState):
        a, b = getattr(ours, f.name), getattr(spec, f.name)
        if a == b:
            continue
        where = f.name
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
            i = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
            where, a, b = f"{f.name}[{i}]", a[i], b[i]
        elif isinstance(a, dict) and isinstance(b, dict):
            key = next(k for k in [*a, *b] if a.get(k) != b.get(k))
            where, a, b = f"{f.name}[{key!r}]", a.get(key), b.get(key)
        return f"field {where}: reference {_short(a)} != spec {_short(b)}"
    return None


class ContractChecker:
    """The shadow spec state of one reference pool and the wrappers that keep it honest."""

    def __init__(self, pool: ReferenceParts) -> None:
        self.pool = pool
        config = pool.config
        self.shadow = initial_state(
            config.num_gpu_blocks,
            enable_caching=config.enable_caching,
            hash_block_size=config.hash_block_size,
            enable_events=config.enable_kv_cache_events,
        )
        self._check_state("__init__", ())

    def _fail(self, operation: str, args: tuple, what: str) -> AssertionError:
        call = f"{operation.removeprefix('_core_')}({', '.join(_short(a) for a in args)})"
        return AssertionError(f"contract check failed after {call}: {what}")

    def _check_state(self, operation: str, args: tuple) -> None:
        difference = first_difference(self.pool._core_state(), self.shadow)
        if difference is not None:
            raise self._fail(operation, args, difference)
        broken = structural_violations(self.pool, CORE_STRUCTURAL_CHECKS)
        if broken:
            name, witnesses = broken[0]
            raise self._fail(operation, args, f"invariant {name} broken: {_short(witnesses)}")

    def wrap(self, operation: str, core: Callable[..., Any]) -> Callable[..., Any]:
        """``core`` checked against its spec counterpart (see the module docstring)."""
        spec_step, normalise = COUNTERPARTS[operation]

        def checked(*args: Any) -> Any:
            spec_error: Exception | None = None
            try:
                spec_state, expected = spec_step(self.shadow, *args)
            except Exception as exc:  # noqa: BLE001 - compared with the core's error below
                spec_error = exc
            try:
                result = core(*args)
            except Exception as exc:
                if spec_error is None:
                    raise self._fail(
                        operation, args, f"reference raised {exc!r}, the spec succeeded"
                    ) from exc
                if type(exc) is not type(spec_error):
                    raise self._fail(
                        operation, args, f"reference raised {exc!r}, the spec {spec_error!r}"
                    ) from exc
                self._check_state(operation, args)  # a rejected call must change nothing
                raise
            if spec_error is not None:
                raise self._fail(
                    operation, args, f"the spec raised {spec_error!r}, the reference did not"
                ) from spec_error
            self.shadow = spec_state
            got = normalise(result)
            if got != expected:
                raise self._fail(
                    operation, args, f"result: reference {_short(got)} != spec {_short(expected)}"
                )
            self._check_state(operation, args)
            return result

        checked.__name__ = operation
        checked.__doc__ = core.__doc__
        return checked


def install_contract_checks(pool: ReferenceParts) -> ContractChecker:
    """Wrap every ``_core_*`` method of ``pool`` (this object only) with its spec check."""
    checker = ContractChecker(pool)
    for operation in COUNTERPARTS:
        setattr(pool, operation, checker.wrap(operation, getattr(pool, operation)))
    pool.contract_checker = checker
    return checker
