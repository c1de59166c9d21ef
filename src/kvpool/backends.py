"""Choosing a backend by name: ``make_pool(num_blocks, backend=...)``."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvpool.errors import BackendUnavailable, InvalidConfig

if TYPE_CHECKING:
    from kvpool.shell import PoolShell

# name -> (module, class, what to install when the import fails)
BACKENDS: dict[str, tuple[str, str, str]] = {
    "spec": ("kvpool.spec.pool", "SpecPool", ""),
    "reference": ("kvpool.reference", "ReferenceBlockPool", ""),
    "fast": ("kvpool.fast", "FastBlockPool", "pip install 'kvpool[fast]' (numba)"),
}


def backend_class(backend: str) -> type[PoolShell]:
    """The pool class of a backend; :class:`BackendUnavailable` if unknown (a name that is
    not a key of :data:`BACKENDS`, or not a string at all) or not installed."""
    try:
        module_name, class_name, hint = BACKENDS[backend]
    except (KeyError, TypeError):  # TypeError: an unhashable "name" (a list, a dict)
        known = ", ".join(sorted(BACKENDS))
        raise BackendUnavailable(f"unknown backend {backend!r}; known: {known}") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(
            f"backend {backend!r} is not available ({exc}); {hint or 'reinstall kvpool'}"
        ) from exc
    pool_class: type[PoolShell] = getattr(module, class_name)
    return pool_class


@functools.cache
def constructor_options(cls: type) -> frozenset[str]:
    """The keyword arguments ``cls(num_blocks, **options)`` accepts: the parameters of its
    ``__init__`` and, while an ``__init__`` passes ``**kwargs`` on, of its bases'."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        forwards = False
        for p in inspect.signature(init).parameters.values():
            if p.kind is p.VAR_KEYWORD:
                forwards = True
            elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                names.add(p.name)
        if not forwards:
            break
    names.discard("self")
    return frozenset(names)


def make_pool(num_blocks: int, *, backend: str = "spec", **options: Any) -> Any:
    """A block pool of ``num_blocks`` blocks (block 0 is the null block).

    ``options`` are the constructor settings: ``enable_caching=True``, ``hash_block_size=16``,
    ``enable_kv_cache_events=False``, ``metrics_collector=None``,
    ``num_hash_lookahead_tokens=0``, ``medium="GPU"``, ``use_int_block_hashes=True``, and
    a backend's own (``check_contracts`` of ``reference``, ``jit`` of ``fast``). An option
    the backend does not know raises :class:`InvalidConfig` (not ``TypeError``); an unknown
    backend, or one that is not a name, :class:`BackendUnavailable`.
    """
    cls: type = backend_class(backend)
    accepted = constructor_options(cls) - {"num_gpu_blocks"}  # that one is num_blocks
    unknown = sorted(set(options) - accepted)
    if unknown:
        known = ", ".join(sorted(n for n in accepted if not n.startswith("_")))
        raise InvalidConfig(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for "
            f"backend {backend!r}; known: {known}"
        )
    return cls(num_blocks, **options)


@dataclass(frozen=True)
class PoolRecipe:
    """A backend by name plus constructor options: a pool factory, ``recipe(num_blocks,
    **settings)``, that still names its backend.

    The policy layer takes a backend name or any pool factory; it picks the policy that
    drives a backend by its name (:func:`kvpool.policy.make_kv_cache_manager`), which a
    plain factory hides. A recipe keeps it. Its ``options`` win over the settings the
    caller passes (``enable_kv_cache_events=False`` turns events off whatever the manager
    was told).

    >>> recipe = PoolRecipe("spec", {"enable_kv_cache_events": False})
    >>> pool = recipe(8, enable_kv_cache_events=True)
    >>> pool.num_gpu_blocks, pool.enable_kv_cache_events, backend_name(recipe)
    (8, False, 'spec')
    """

    backend: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, num_blocks: int, **settings: Any) -> Any:
        return make_pool(num_blocks, backend=self.backend, **{**settings, **self.options})


def backend_name(backend: object) -> str | None:
    """The backend a policy-layer ``backend`` argument builds: the name itself, a
    :class:`PoolRecipe`'s name, or ``None`` for any other factory."""
    if isinstance(backend, str):
        return backend
    if isinstance(backend, PoolRecipe):
        return backend.backend
    return None
