"""The tokens a replayed request generates: a fixed function of its id, so traces stay small.

A trace records only how many tokens a request generates. The replay driver decodes
``output_tokens(id, output_len)``, and the synthetic workload builds a conversation's next
prompt from the same function, so a follow-up turn really starts with the blocks its previous
turn decoded, and can hit them in the prefix cache.
"""

from __future__ import annotations

import zlib

import numpy as np

OUTPUT_VOCAB_SIZE = 32_000
"""Generated token ids lie in ``[0, OUTPUT_VOCAB_SIZE)``."""

# Numerical Recipes' 32-bit LCG: cheap, and any fixed sequence works; quality is irrelevant
# as long as different ids give different token streams.
_LCG_A = 1_664_525
_LCG_C = 1_013_904_223
_MASK32 = 0xFFFF_FFFF


def output_tokens(request_id: str, count: int) -> list[int]:
    """The first ``count`` tokens request ``request_id`` generates. O(count), deterministic.

    >>> output_tokens("r1", 3) == output_tokens("r1", 5)[:3]
    True
    """
    state = zlib.crc32(request_id.encode("utf-8"))
    if count < _VECTOR_AT_LEAST:
        return _stepped(state, count)
    # The LCG's k-th state is mult[k] * seed + add[k] mod 2**32, which uint32 arithmetic
    # wraps to by itself: every state at once.
    mult, add = _jumps(count)
    states = mult[:count] * np.uint32(state) + add[:count]
    return ((states >> 8) % OUTPUT_VOCAB_SIZE).tolist()


def _stepped(state: int, count: int) -> list[int]:
    """The definition: ``count`` LCG steps from ``state``, one token per step."""
    tokens = []
    for _ in range(count):
        state = (state * _LCG_A + _LCG_C) & _MASK32
        tokens.append((state >> 8) % OUTPUT_VOCAB_SIZE)
    return tokens


_VECTOR_AT_LEAST = 16
"""Shortest run computed with numpy: below it, numpy's fixed cost exceeds the loop's (~0.3 µs
a token against ~4 µs a call)."""

_JUMPS: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.uint32), np.empty(0, np.uint32))


def _jumps(count: int) -> tuple[np.ndarray, np.ndarray]:
    """``(mult, add)`` with ``state_{k+1} = mult[k] * state_0 + add[k]`` (mod 2**32), for k in
    ``[0, count)`` at least; grown by doubling and kept (a trace's outputs share them)."""
    global _JUMPS
    mult, add = _JUMPS
    if mult.shape[0] < count:
        size = max(count, 2 * mult.shape[0], 1024)
        m, a = 1, 0
        ms, adds = [], []
        for _ in range(size):  # compose one more step: s -> A*s + C
            m, a = (m * _LCG_A) & _MASK32, (a * _LCG_A + _LCG_C) & _MASK32
            ms.append(m)
            adds.append(a)
        _JUMPS = mult, add = np.array(ms, np.uint32), np.array(adds, np.uint32)
    return mult, add


__all__ = ["OUTPUT_VOCAB_SIZE", "output_tokens"]
