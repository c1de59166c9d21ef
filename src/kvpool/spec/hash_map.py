"""The prefix-cache hash table and a block's keys, as pure functions (BEHAVIOUR.md §5).

``cache`` maps a key to the ids of the blocks under it, earliest inserted first;
``get_one_block`` returns that first id. A block has at most one primary key (with the number
of prefix tokens it covers) and any number of secondary keys.
"""

from __future__ import annotations

from dataclasses import replace

from kvpool.spec.state import PoolState, keys_of_block, replace_at


def get_one_block(cache: dict[bytes, tuple[int, ...]], key: bytes) -> int | None:
    """The earliest-inserted surviving block under ``key``, or ``None``."""
    ids = cache.get(key, ())
    return ids[0] if ids else None


def insert(cache: dict[bytes, tuple[int, ...]], key: bytes, block_id: int) -> dict:
    """``cache`` with ``block_id`` added under ``key`` (newest duplicate last; idempotent)."""
    ids = cache.get(key, ())
    if block_id in ids:
        return cache
    out = dict(cache)
    out[key] = ids + (block_id,)
    return out


def pop(cache: dict[bytes, tuple[int, ...]], key: bytes, block_id: int) -> tuple[dict, bool]:
    """``cache`` without the pair ``(key, block_id)``; whether the pair was present.

    A key whose last block leaves is dropped: the table never holds empty entries.
    """
    ids = cache.get(key, ())
    if block_id not in ids:
        return cache, False
    out = dict(cache)
    rest = tuple(b for b in ids if b != block_id)
    if rest:
        out[key] = rest
    else:
        out.pop(key)
    return out, True


def remove_all_keys(state: PoolState, block_id: int) -> tuple[PoolState, tuple[bytes, ...]]:
    """Strip every key from a block: ``(state, keys actually removed from the table)``.

    Candidates are the primary then the secondaries in insertion order (vLLM iterates a set
    here, whose order differs between processes; kvpool is deterministic).
    """
    cache = state.cache
    removed: list[bytes] = []
    for key in keys_of_block(state, block_id):
        cache, was_present = pop(cache, key, block_id)
        if was_present:
            removed.append(key)
    secondary = dict(state.secondary_keys)
    secondary.pop(block_id, None)
    state = replace(
        state,
        cache=cache,
        secondary_keys=secondary,
        primary_key=replace_at(state.primary_key, block_id, None),
        primary_tokens=replace_at(state.primary_tokens, block_id, None),
    )
    return state, tuple(removed)


def insert_key_on_block(state: PoolState, key: bytes, block_id: int, num_tokens: int) -> PoolState:
    """Give a block one more key (vLLM's ``_insert_block_hash``).

    No-op if the key is already the block's primary or the pair is in the table. Otherwise it
    becomes the primary (with ``num_tokens``) when the block has none, else a secondary.
    """
    if state.primary_key[block_id] == key or block_id in state.cache.get(key, ()):
        return state
    if state.primary_key[block_id] is None:
        state = replace(
            state,
            primary_key=replace_at(state.primary_key, block_id, key),
            primary_tokens=replace_at(state.primary_tokens, block_id, num_tokens),
        )
    else:
        secondary = dict(state.secondary_keys)
        secondary[block_id] = secondary.get(block_id, ()) + (key,)
        state = replace(state, secondary_keys=secondary)
    return replace(state, cache=insert(state.cache, key, block_id))
