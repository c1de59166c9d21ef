"""Choosing a backend by name: ``make_pool(num_blocks, backend=...)``."""

from __future__ import annotations

import importlib
from typing import Any

from kvpool.errors import BackendUnavailable

# name -> (module, class, what to install when the import fails)
BACKENDS: dict[str, tuple[str, str, str]] = {
    "spec": ("kvpool.spec.pool", "SpecPool", ""),
    "reference": ("kvpool.reference", "ReferenceBlockPool", ""),
    "fast": ("kvpool.fast", "FastBlockPool", "pip install 'kvpool[fast]' (numba)"),
}


def backend_class(backend: str) -> type:
    """The pool class of a backend; :class:`BackendUnavailable` if unknown or not installed."""
    try:
        module_name, class_name, hint = BACKENDS[backend]
    except KeyError:
        known = ", ".join(sorted(BACKENDS))
        raise BackendUnavailable(f"unknown backend {backend!r}; known: {known}") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(
            f"backend {backend!r} is not available ({exc}); {hint or 'reinstall kvpool'}"
        ) from exc
    return getattr(module, class_name)


def make_pool(num_blocks: int, *, backend: str = "spec", **options: Any) -> Any:
    """A block pool of ``num_blocks`` blocks (block 0 is the null block).

    ``options`` are the constructor settings: ``enable_caching=True``, ``hash_block_size=16``,
    ``enable_kv_cache_events=False``, ``metrics_collector=None``,
    ``num_hash_lookahead_tokens=0``, ``medium="GPU"``, ``use_int_block_hashes=True``.
    """
    return backend_class(backend)(num_blocks, **options)
