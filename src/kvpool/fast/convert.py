"""Converting caller values to kernel arrays: hash lists to one byte buffer plus lengths.

Contract: the arrays returned here are exactly what the kernels of :mod:`kvpool.fast.kernels`
expect (uint8 bytes back to back, int64 lengths) and encode each hash as
:func:`kvpool.keys.pack_key` would read it (``bytes(h)``), so a key built by a kernel equals
the spec's key byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_UNIFORM_LENS: dict[tuple[int, int], np.ndarray] = {}


def uniform_lens(count: int, length: int) -> np.ndarray:
    """A read-only int64 array of ``count`` copies of ``length`` (cached: hash lists are
    almost always one digest size, and building the array costs more than the lookup)."""
    lens = _UNIFORM_LENS.get((count, length))
    if lens is None:
        lens = np.full(count, length, np.int64)
        lens.flags.writeable = False
        if len(_UNIFORM_LENS) < 1024:
            _UNIFORM_LENS[(count, length)] = lens
    return lens


def hash_buffer(hashes: Sequence[Any], *, all_bytes: bool = False
                ) -> tuple[np.ndarray, np.ndarray, int]:
    """Hashes back to back as uint8, their lengths, and the longest length; each hash is
    read as ``bytes(h)``, as ``pack_key`` reads it. Raises ``TypeError`` for a hash that is
    not ``bytes`` (callers check first; ``bytes(5)`` would be five zero bytes), unless the
    caller has just found every one exactly ``bytes`` (``all_bytes``: no second pass)."""
    if not all_bytes and set(map(type, hashes)) - {bytes} and not all(
            isinstance(h, bytes) for h in hashes):
        raise TypeError("block hashes must be bytes")
    try:
        joined = b"".join(hashes)
    except TypeError:
        joined = None
    if joined is not None:
        widths = set(map(len, hashes))
        if len(widths) == 1:
            width = widths.pop()
            # len() counts items, not bytes, for multi-byte buffers: the total tells.
            if width * len(hashes) == len(joined):
                return np.frombuffer(joined, np.uint8), uniform_lens(len(hashes), width), width
        elif not widths:
            return np.frombuffer(joined, np.uint8), uniform_lens(0, 0), 0
    raw = [bytes(h) for h in hashes]
    lens = list(map(len, raw))
    return np.frombuffer(b"".join(raw), np.uint8), np.array(lens, dtype=np.int64), max(lens)
