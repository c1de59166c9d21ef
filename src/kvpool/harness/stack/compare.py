"""What the whole-stack machine compares, and how it says where two stacks differ.

A kvpool pool and a foreign one (vLLM's) share a projection of their state
(:func:`pool_projection`); events are compared as their fields (:func:`event_fields`); call
results as data (:func:`normalize`). The two ``*_difference`` functions turn a mismatch into
the line a failure report shows.
"""

from __future__ import annotations

from dataclasses import fields as dataclasses_fields
from typing import Any

from kvpool.policy.blocks import KVCacheBlocks


def pool_projection(manager: Any, native: bool) -> Any:
    """What a foreign pool and a kvpool pool can both show: ref counts (null block aside:
    vLLM 0.25.1 counts on it), the free queue, each block's primary key, and the map.
    ``native``: ``manager`` is kvpool's facade (a foreign one projects itself)."""
    if not native:
        return manager.pool_projection()
    state = manager.block_pool.abstract().state
    return (state.ref_cnt[1:], tuple(state.free_queue), state.primary_key[1:],
            {k: tuple(v) for k, v in state.cache.items()})


def event_fields(event: Any) -> dict[str, Any]:
    """An event as its type and fields, without kvpool's ``seq`` and without 0.33-only
    fields left at their defaults (vLLM 0.25.1 has none of them)."""
    fields = getattr(type(event), "__struct_fields__", None)
    if fields is None:
        fields = [f.name for f in dataclasses_fields(event)]
    out = {"type": type(event).__name__}
    for name in fields:
        value = getattr(event, name)
        if name == "seq" or name in _LATER_FIELDS and value is None:
            continue
        out[name] = value
    return out


_LATER_FIELDS = {"locality", "ownership", "session_id", "lookahead_token_ids"}


Outcome = tuple[Any, ...]


def normalize(value: Any) -> Any:
    """A call's result as comparable data (blocks as their ids)."""
    if isinstance(value, KVCacheBlocks):
        return ("blocks", value.get_block_ids())
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], KVCacheBlocks):
        return ("hit", value[0].get_block_ids(), value[1])
    return value


def outcome_difference(name0: str, a: Outcome, name1: str, b: Outcome) -> str:
    """Two outcomes, or for two lists their first differing element."""
    if a[0] == b[0] == "ok" and isinstance(a[1], list) and isinstance(b[1], list):
        for i, (x, y) in enumerate(zip(a[1], b[1], strict=False)):
            if x != y:
                return f"item {i} differs: {name0} {x!r}, {name1} {y!r}"
        return f"{name0} gave {len(a[1])} items, {name1} {len(b[1])}"
    return f"{name0} gave {a!r}, {name1} gave {b!r}"


def first_difference(a: Any, b: Any) -> str:
    """Where two pool views first differ (for the failure message)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            if isinstance(x, tuple) and isinstance(y, tuple):
                for j, (u, v) in enumerate(zip(x, y, strict=False)):
                    if u != v:
                        return f"part {i}, index {j}: {u!r} vs {v!r}"
                return f"part {i}: lengths {len(x)} vs {len(y)}"
            return f"part {i} differs"
    return "lengths differ"
