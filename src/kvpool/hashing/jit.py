"""The hashing kernels' compiled entry points: one signature each, called without a dispatcher.

A Numba dispatcher types every argument on every call before it runs the machine code
(measured: ~0.6 µs of a one-block ``kvhash_raw`` chain's ~6 µs, and a read-only
``np.frombuffer`` view takes its slow path). The entry point of a signature compiled once
skips that, and with :func:`bytes_type` in the signature it reads a ``bytes`` argument in
place. It trusts its arguments' types: only wrappers that pass ``bytes`` and arrays they made
themselves may call it. Numba is imported only when a kernel is first compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def bytes_type() -> Any:
    """Numba's type of a ``bytes`` argument, read in place (read-only)."""
    from numba import types

    return types.Bytes(types.uint8, 1, "C", readonly=True)


def entry_point(dispatcher: Any, signature: tuple) -> Callable[..., Any] | None:
    """``dispatcher`` compiled (or loaded from its on-disk cache) for ``signature``, as the
    entry point; ``None`` when it is not a dispatcher (``NUMBA_DISABLE_JIT=1`` makes
    ``njit`` hand back the plain function)."""
    if not hasattr(dispatcher, "compile"):
        return None
    entry: Callable[..., Any] = dispatcher.compile(signature)
    return entry


__all__ = ["bytes_type", "entry_point"]
