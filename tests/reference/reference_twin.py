"""Helpers for the reference tests: requests with known hashes, and a spec/reference twin.

:class:`Twin` drives a spec pool and a reference pool with the same calls. Every call must
return equal results or raise errors of the same type, and leave equal ``abstract()`` values
and a reference pool whose invariants all hold. Tests still assert concrete expectations:
the twin catches disagreement, the expectations catch a spec and reference that agree on
something wrong.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvpool import make_pool
from kvpool.request import Request


def block_hash(label: str) -> bytes:
    """A deterministic 32-byte digest standing in for a real block hash."""
    return hashlib.sha256(label.encode()).digest()


def request_with_hashes(num_hashes: int, *, prefix: str = "r", hbs: int = 16) -> Request:
    """A request of ``num_hashes * hbs`` tokens hashed as ``prefix:0``, ``prefix:1``, …

    Two requests with the same prefix share their hashes (a shared prompt prefix).
    """
    request = Request(request_id=prefix, prompt_token_ids=list(range(num_hashes * hbs)))
    request.block_hashes.extend(block_hash(f"{prefix}:{i}") for i in range(num_hashes))
    return request


class Twin:
    """A spec pool and a reference pool in lockstep (see the module docstring)."""

    def __init__(self, num_blocks: int = 8, *, check_contracts: bool = False, **options: Any):
        self.spec = make_pool(num_blocks, backend="spec", **options)
        self.ref = make_pool(
            num_blocks, backend="reference", check_contracts=check_contracts, **options
        )
        self.fired: dict[str, list[int]] = {"spec": [], "reference": []}

    def _pools(self):
        return (("spec", self.spec), ("reference", self.ref))

    def _run(self, name: str, per_pool_args) -> Any:
        outcomes = []
        for label, pool in self._pools():
            args, kwargs = per_pool_args(label)
            try:
                outcomes.append((getattr(pool, name)(*args, **kwargs), None))
            except Exception as exc:  # noqa: BLE001 - compared below, then re-raised
                outcomes.append((None, exc))
        (spec_result, spec_error), (ref_result, ref_error) = outcomes
        assert type(ref_error) is type(spec_error), (name, spec_error, ref_error)
        assert ref_result == spec_result, (name, spec_result, ref_result)
        assert self.ref.abstract() == self.spec.abstract(), name
        assert self.ref.check_invariants() == [], name
        assert self.fired["reference"] == self.fired["spec"], name
        if ref_error is not None:
            raise ref_error
        return ref_result

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._run(name, lambda _label: (args, kwargs))

        return call

    def unpin_blocks(self, blocks: list[int]) -> None:
        """Unpin on both pools; each pool's watcher calls are recorded in ``fired``."""

        def per_pool(label: str):
            return (blocks, self.fired[label].append), {}

        return self._run("unpin_blocks", per_pool)

    @property
    def state(self):
        """The (agreed) spec state of the pools."""
        return self.ref.abstract().state
