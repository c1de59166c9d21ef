"""Helpers for the fast-backend tests: requests with known hashes and a spec/fast lockstep.

:class:`FastTwin` drives a spec pool and fast pools (compiled and/or plain-Python kernels)
with the same calls. Every call must return equal results or raise errors of the same type
and message, and leave equal ``abstract()`` values, sound arrays (:mod:`kvpool.fast.integrity`)
and intact guard rows around every array. Tests still assert concrete expectations: the twin
catches disagreement, the expectations catch pools that agree on something wrong.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvpool import make_pool
from kvpool.fast import FastBlockPool
from kvpool.fast.integrity import violations
from kvpool.request import Request

GUARD_ROWS = 3


def block_hash(label: str, size: int = 32) -> bytes:
    """A deterministic digest of ``size`` bytes standing in for a real block hash."""
    return hashlib.sha256(label.encode()).digest()[:size] if size <= 32 else (
        hashlib.sha512(label.encode()).digest()[:size]
    )


def request_with_hashes(num_hashes: int, *, prefix: str = "r", hbs: int = 16,
                        size: int = 32) -> Request:
    """A request of ``num_hashes * hbs`` tokens hashed as ``prefix:0``, ``prefix:1``, …"""
    request = Request(request_id=prefix, prompt_token_ids=list(range(num_hashes * hbs)))
    request.block_hashes.extend(block_hash(f"{prefix}:{i}", size) for i in range(num_hashes))
    return request


def fast_pool(num_blocks: int, *, jit: bool, **options: Any) -> FastBlockPool:
    """A fast pool with guard rows around every array and a tiny hash table that collides
    and grows often (tests only)."""
    return FastBlockPool(num_blocks, jit=jit, _guard=GUARD_ROWS, _initial_rows=1, **options)


def assert_sound(pool: FastBlockPool) -> None:
    """The fast pool's arrays are structurally sound and nothing was written out of bounds."""
    assert violations(pool._st) == []
    assert pool._st.guards_intact()


def fused_or_definition(fast: Any, spec: Any, fused: str, fused_args: tuple,
                        definition: Any, definition_args: tuple) -> tuple:
    """The fused verb ``fast.<fused>(*fused_args)``, which returns ``None`` when it
    declines, against its definition: a decline leaves ``fast`` as it was and
    ``definition(fast, *definition_args)`` runs instead; the definition also runs on the
    spec pool; outcomes and states must agree. Returns whether the fused verb served, and
    the outcome (``("ok", result)`` or the definition's)."""
    before = fast.abstract()
    got = getattr(fast, fused)(*fused_args)
    if got is None:
        assert fast.abstract() == before
        mine = definition(fast, *definition_args)
    else:
        mine = ("ok", got)
    assert mine == definition(spec, *definition_args)
    assert fast.abstract() == spec.abstract()
    return got is not None, mine


def outcome(pool: Any, name: str, args: tuple, kwargs: dict) -> tuple:
    """``("ok", result)`` or ``("error", type, message)`` of one call."""
    try:
        result = getattr(pool, name)(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared by the caller
        return ("error", type(exc), str(exc), exc)
    return ("ok", result)


class FastTwin:
    """A spec pool and fast pools in lockstep (see the module docstring)."""

    def __init__(self, num_blocks: int = 8, *, jits: tuple[bool, ...] = (True, False),
                 **options: Any) -> None:
        self.spec = make_pool(num_blocks, backend="spec", **options)
        self.fast = [fast_pool(num_blocks, jit=jit, **options) for jit in jits]
        self.fired: dict[int, list[int]] = {id(p): [] for p in self.pools}

    @property
    def pools(self) -> list[Any]:
        return [self.spec, *self.fast]

    def call(self, name: str, *args: Any, per_pool: Any = None, **kwargs: Any) -> Any:
        """Run ``name`` on every pool; compare; return the spec's result or raise its error."""
        results = []
        for pool in self.pools:
            pool_args = per_pool(pool) if per_pool else args
            results.append(outcome(pool, name, pool_args, kwargs))
        expected = results[0]
        for pool, got in zip(self.fast, results[1:], strict=True):
            assert got[:3] == expected[:3], (name, args, expected[:3], got[:3], pool._jit)
            assert pool.abstract() == self.spec.abstract(), (name, args)
            assert_sound(pool)
        fired = [self.fired[id(p)] for p in self.pools]
        assert all(f == fired[0] for f in fired), (name, fired)
        if expected[0] == "error":
            raise expected[3]
        return expected[1]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    def unpin_blocks(self, blocks: Any) -> None:
        """Unpin everywhere; each pool's watcher calls are recorded in ``fired``."""
        return self.call("unpin_blocks",
                         per_pool=lambda pool: (blocks, self.fired[id(pool)].append))

    @property
    def state(self):
        return self.spec.abstract().state

    @property
    def fired_spec(self) -> list[int]:
        return self.fired[id(self.spec)]
