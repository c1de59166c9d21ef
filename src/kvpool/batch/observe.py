"""Read-only facts about a pool's blocks, for the up-front checks of a batch composition.

Contract: an :class:`Observer` reads, never changes, and answers from the pool's state at the
time of the read. Every backend answers through the protocol's ``observe()`` query
(:class:`kvpool.protocol.BlockObserver`) with its own O(1) reader; a pool without one (an
adapter, say) is read through its ``abstract()`` (O(N), once per call).
"""

from __future__ import annotations

from typing import Any

from kvpool.protocol import BlockObserver as Observer
from kvpool.shell import StateObserver


def observe(pool: Any) -> Observer:
    """An :class:`Observer` of ``pool`` (see the module docstring)."""
    own = getattr(pool, "observe", None)
    if own is not None:
        return own()
    return StateObserver(pool.abstract().state)


__all__ = ["Observer", "StateObserver", "observe"]
