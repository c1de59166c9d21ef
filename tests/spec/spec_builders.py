"""Hand-built pool states for the spec's unit tests (readable, not necessarily valid)."""

from __future__ import annotations

from kvpool.keys import pack_key
from kvpool.spec.state import PoolState


def key(h: int, group: int = 0) -> bytes:
    """A short, readable key: one-byte block hash ``h`` in ``group``."""
    return pack_key(bytes([h]), group)


def make_state(
    num_blocks: int = 5,
    *,
    ref: dict[int, int] | None = None,
    queue: tuple[int, ...] | None = None,
    keys: dict[int, tuple[bytes, int]] | None = None,
    secondary: dict[int, tuple[bytes, ...]] | None = None,
    cache: dict[bytes, tuple[int, ...]] | None = None,
    watchers: tuple[int, ...] = (),
    caching: bool = True,
    events: bool = False,
    hbs: int = 1,
    event_count: int = 0,
) -> PoolState:
    """A state from the few facts a test cares about.

    ``ref``: block → ref_cnt (others 0); ``queue`` defaults to the free non-null blocks in id
    order; ``keys``: block → (primary key, tokens); ``cache`` defaults to every block's keys,
    blocks in id order under each key.
    """
    ref = ref or {}
    keys = keys or {}
    secondary = secondary or {}
    ref_cnt = tuple(ref.get(b, 0) for b in range(num_blocks))
    if queue is None:
        queue = tuple(b for b in range(1, num_blocks) if ref_cnt[b] == 0)
    if cache is None:
        cache = {}
        for b in range(num_blocks):
            carried = ((keys[b][0],) if b in keys else ()) + secondary.get(b, ())
            for k in carried:
                cache[k] = cache.get(k, ()) + (b,)
    return PoolState(
        num_blocks=num_blocks,
        enable_caching=caching,
        hash_block_size=hbs,
        enable_events=events,
        ref_cnt=ref_cnt,
        free_queue=queue,
        primary_key=tuple(keys[b][0] if b in keys else None for b in range(num_blocks)),
        primary_tokens=tuple(keys[b][1] if b in keys else None for b in range(num_blocks)),
        secondary_keys=dict(secondary),
        cache=cache,
        watchers=watchers,
        event_count=event_count,
    )
