"""Comparing a pool that keeps secondary keys in a Python *set* (vLLM) with the spec.

vLLM stores a block's secondary keys in a ``set`` of bytes. Its iteration order depends on
``PYTHONHASHSEED``, so the order of secondary keys, of the ``BlockRemoved`` events that
removing them emits, and of the keys ``move_block_hashes`` hands over changes from one
process to the next (BEHAVIOUR.md §12, "order of secondary keys"). kvpool keeps insertion
order. For a pool that declares ``secondary_key_order = "set"`` the lockstep compares these
*as sets*: :func:`align` reorders the pool's value to the oracle's wherever the two hold the
same elements, and reports whether it had to. Everything else is compared exactly: a
different key, a missing event or a different primary key is still a divergence.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvpool.events import BlockRemoved

DEVIATION = (
    "secondary keys kept in a Python set (BEHAVIOUR.md §12 'order of secondary keys'): "
    "compared as sets"
)


def _unnumbered(event: Any) -> Any:
    return dataclasses.replace(event, seq=-1)


def _same_elements(x: list, y: list) -> bool:
    return sorted(map(repr, x)) == sorted(map(repr, y))


def align_events(expected: list, actual: list) -> tuple[list, bool]:
    """``actual`` with each run of consecutive ``BlockRemoved`` events put in ``expected``'s
    order when the run holds the same events (sequence numbers aside); ``(events, changed)``."""
    if len(expected) != len(actual):
        return list(actual), False
    out = list(actual)
    changed = False
    i = 0
    while i < len(out):
        if not (isinstance(expected[i], BlockRemoved) and isinstance(out[i], BlockRemoved)):
            i += 1
            continue
        j = i
        while (j < len(out) and isinstance(expected[j], BlockRemoved)
               and isinstance(out[j], BlockRemoved)):
            j += 1
        run_x = [_unnumbered(e) for e in expected[i:j]]
        run_y = [_unnumbered(e) for e in out[i:j]]
        if run_x != run_y and _same_elements(run_x, run_y):
            out[i:j] = [dataclasses.replace(e, seq=a.seq)
                        for e, a in zip(expected[i:j], out[i:j], strict=True)]
            changed = True
        i = j
    return out, changed


def align_state(expected: Any, actual: Any) -> tuple[Any, bool]:
    """``actual`` (a ``PoolState``) with each block's secondary keys in ``expected``'s order
    when they are the same set; ``(state, changed)``."""
    secondary = dict(actual.secondary_keys)
    changed = False
    for b, keys in secondary.items():
        want = expected.secondary_keys.get(b)
        if want is not None and keys != want and set(keys) == set(want) \
                and len(keys) == len(want):
            secondary[b] = want
            changed = True
    if not changed:
        return actual, False
    return dataclasses.replace(actual, secondary_keys=secondary), True


def align_abstract(expected: Any, actual: Any) -> tuple[Any, bool]:
    """A ``PoolAbstract`` aligned field by field (state, then pending events)."""
    state, moved_keys = align_state(expected.state, actual.state)
    events, moved_events = align_events(list(expected.pending_events),
                                        list(actual.pending_events))
    if not (moved_keys or moved_events):
        return actual, False
    return dataclasses.replace(actual, state=state, pending_events=tuple(events)), True


__all__ = ["DEVIATION", "align_abstract", "align_events", "align_state"]
