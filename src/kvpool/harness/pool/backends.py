"""Naming the pools the harness drives: backend names, planted bugs and user factories.

A backend is given as

* a name of :data:`kvpool.backends.BACKENDS` (``"spec"``, ``"reference"``, ``"fast"``);
* ``"planted:<name>"``, one of the deliberately broken pools of :mod:`kvpool.harness.bugs.pool`;
* ``"vllm"``, vLLM's own ``BlockPool`` behind :mod:`kvpool.harness.foreign.vllm_pool`, checked
  within the installed version's API; ``"vllm:0.25.1"`` narrows that scope to a version's;
* any callable ``factory(num_blocks, **options) -> pool`` (e.g. an adapter class). Options are
  ``make_pool``'s keyword arguments.

Each resolves to a :class:`Backend`: a label for reports, the factory, and the Python source
that names it again inside a pasted reproduction.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from kvpool.backends import BACKENDS, backend_class
from kvpool.errors import BackendUnavailable
from kvpool.harness.api import FULL_API, Backend, PoolFactory


def _accepts(cls: type, parameter: str) -> bool:
    try:
        return parameter in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def _named_backend(name: str) -> Backend:
    if name.startswith("planted:"):
        from kvpool.harness.bugs.pool import planted_class

        planted = planted_class(name.removeprefix("planted:"))
        return Backend(name, planted, repr(name))
    if name == "vllm" or name.startswith("vllm:"):
        from kvpool.harness.foreign.vllm_pool import require_vllm, vllm_factory

        require_vllm()
        version = name.partition(":")[2] or None
        try:
            factory = vllm_factory(version)
        except ValueError as exc:
            raise BackendUnavailable(str(exc)) from None
        return Backend("vllm", factory, repr(name), factory.pool_api)
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    cls: Any = backend_class(name)  # its own options (check_contracts) are checked here
    if _accepts(cls, "check_contracts"):
        # Contract checking re-runs the spec inside the backend; the harness already compares
        # against the spec after every call, so it would only halve the speed.
        def factory(num_blocks: int, **options: Any) -> Any:
            return cls(num_blocks, check_contracts=False, **options)

        return Backend(name, factory, repr(name))
    return Backend(name, cls, repr(name))


def resolve_backend(spec: str | PoolFactory | Backend) -> Backend:
    """The :class:`Backend` for a name, a factory, or an existing :class:`Backend`."""
    if isinstance(spec, Backend):
        return spec
    if isinstance(spec, str):
        return _named_backend(spec)
    if callable(spec):
        label = getattr(spec, "backend_name", None) or getattr(spec, "__name__", repr(spec))
        module = getattr(spec, "__module__", None)
        qualname = getattr(spec, "__qualname__", None)
        source = f"{module}.{qualname}" if module and qualname else repr(label)
        return Backend(str(label), spec, source, getattr(spec, "pool_api", FULL_API))
    raise TypeError(f"a backend is a name or a pool factory, got {spec!r}")


def resolve_backends(specs: Sequence[str | PoolFactory | Backend]) -> tuple[Backend, ...]:
    """Resolve every entry; the first is the oracle. Labels are made unique (``spec#2``)."""
    if not specs:
        raise ValueError("the harness needs at least one backend")
    out: list[Backend] = []
    seen: dict[str, int] = {}
    for spec in specs:
        backend = resolve_backend(spec)
        count = seen.get(backend.label, 0) + 1
        seen[backend.label] = count
        if count > 1:
            backend = Backend(f"{backend.label}#{count}", backend.factory, backend.source,
                              backend.api)
        out.append(backend)
    return tuple(out)


__all__ = ["resolve_backend", "resolve_backends"]
