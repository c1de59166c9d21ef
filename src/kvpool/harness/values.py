"""Argument markers and result normalisation shared by the lockstep driver and reproductions.

Every value the harness passes to a pool has a ``repr`` that is valid Python, so a logged call
pastes straight into a test: ints, lists, bytes, ``None``, bools, requests (rendered by name)
and the three markers defined here. A marker stands for something each backend must be given
its *own* copy of: a block of that backend's sibling pool (:class:`Foreign`), or a reuse
watcher that records into that backend's firing log (:data:`RECORD`, :data:`RAISE`).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Foreign:
    """Block ``block_id`` of the *sibling* pool (a second pool of the same backend).

    Each backend receives ``sibling.ref(block_id)``, a :class:`~kvpool.shell.BlockRef`:
    ``free_blocks`` routes it to its owner, every other operation must reject it.
    """

    block_id: int

    def __repr__(self) -> str:
        return f"Foreign({self.block_id!r})"


class WatcherKind:
    """A reuse watcher to register with ``unpin_blocks``: records, or records then raises.

    ``reenter(pool, block_id)``, when set, is called after recording: a watcher that calls
    back into its own pool (:mod:`kvpool.harness.rules.hostile_values`).
    """

    __slots__ = ("name", "raises", "reenter")

    def __init__(self, name: str, raises: bool, reenter: Any = None) -> None:
        self.name = name
        self.raises = raises
        self.reenter = reenter

    def __repr__(self) -> str:
        return self.name


RECORD = WatcherKind("RECORD", raises=False)
"""Watcher that appends ``(watcher number, block id)`` to its backend's firing log."""

RAISE = WatcherKind("RAISE", raises=True)
"""Watcher that records like :data:`RECORD`, then raises :class:`WatcherRefused`."""


class WatcherRefused(RuntimeError):
    """What a :data:`RAISE` watcher raises; a pool must wrap it in ``WatcherError``."""


def normalize(value: Any) -> Any:
    """A backend's result as plain comparable data: ids become lists of ints, etc.

    Backends may return tuples, lists or numpy arrays of numpy or Python integers; the
    protocol only promises "a sequence of ids", so results are compared after this.
    """
    if value is None or isinstance(value, (bool, str, bytes, float)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return normalize(value.tolist())
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    return value


__all__ = ["RAISE", "RECORD", "Foreign", "WatcherKind", "WatcherRefused", "normalize"]
