"""Prefix-cache keys: a block hash with its KV cache group id (BEHAVIOUR.md §1).

A key is ``hash bytes ‖ group id as 4 bytes big-endian unsigned``: bytes, not a tuple, so it
hashes and compares as fast as the digest itself and is exactly what vLLM stores. These few
functions are the only place that knows the layout.
"""

from __future__ import annotations

GROUP_ID_BYTES = 4
MAX_GROUP_ID = 2**32 - 1

BlockHash = bytes
"""Raw digest bytes of one block (32 for SHA-256, 16 for xxh3-128; any length is legal)."""

BlockHashWithGroupId = bytes
"""A packed key: ``block hash ‖ group id (4 bytes, big-endian)``."""

ExternalBlockHash = int | bytes
"""What events carry: the low 64 bits of the digest as an int, or the raw digest."""


def is_valid_group_id(group_id: object) -> bool:
    """Whether ``group_id`` is an int in ``[0, 2**32)`` (bools are not group ids)."""
    return (
        isinstance(group_id, int)
        and not isinstance(group_id, bool)
        and 0 <= group_id <= MAX_GROUP_ID
    )


def pack_key(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """The key for ``block_hash`` in group ``group_id``. Caller validates ``group_id``."""
    return bytes(block_hash) + group_id.to_bytes(GROUP_ID_BYTES, "big", signed=False)


def key_hash(key: BlockHashWithGroupId) -> BlockHash:
    """The block hash part of a key (everything but the last 4 bytes)."""
    return key[:-GROUP_ID_BYTES]


def key_group(key: BlockHashWithGroupId) -> int:
    """The group id part of a key (the last 4 bytes, big-endian)."""
    return int.from_bytes(key[-GROUP_ID_BYTES:], "big", signed=False)


def external_block_hash(block_hash: BlockHash, *, use_int: bool = True) -> ExternalBlockHash:
    """The hash as events report it: last 8 bytes read big-endian, or the raw bytes."""
    if use_int:
        return int.from_bytes(block_hash[-8:], "big", signed=False)
    return bytes(block_hash)
