"""The tokens a replayed request generates: a fixed function of its id, so traces stay small.

A trace records only how many tokens a request generates. The replay driver decodes
``output_tokens(id, output_len)``, and the synthetic workload builds a conversation's next
prompt from the same function, so a follow-up turn really starts with the blocks its previous
turn decoded, and can hit them in the prefix cache.
"""

from __future__ import annotations

import zlib

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
    tokens = []
    for _ in range(count):
        state = (state * _LCG_A + _LCG_C) & _MASK32
        tokens.append((state >> 8) % OUTPUT_VOCAB_SIZE)
    return tokens


__all__ = ["OUTPUT_VOCAB_SIZE", "output_tokens"]
