"""The raw-bytes mode: canonical, deterministic, different from vLLM, fast path = naive path."""

from __future__ import annotations

import hashlib
import importlib.util
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.hashing import BlockHasher, encode_raw, get_hash_algorithm

needs_xxhash = pytest.mark.skipif(
    importlib.util.find_spec("xxhash") is None, reason="xxhash is not installed"
)
RAW_NAMES = [
    "sha256_raw",
    pytest.param("xxhash_raw", marks=needs_xxhash),
    "kvhash_raw",
]

# sha256_raw with the default seed; computed once by hand from the documented encoding.
SHA256_RAW_NONE_HASH = "6bef9ae3852d3ac2f65b6f9c4784d9d7256e50b4fc66c797eff7cc5102d77c76"
SHA256_RAW_BLOCK0 = "1ac6438cc8a11790c6ecc08f1a87c0250f9248b83a293bad27b92441e5039185"


def _u32(value: int) -> bytes:
    return struct.pack("<I", value)


def test_raw_sha256_follows_the_documented_encoding_and_is_pinned() -> None:
    none_hash = hashlib.sha256(b"s" + _u32(14) + b"vllm-none-hash").digest()
    block = (
        b"t"
        + _u32(3)
        + b"b"
        + _u32(32)
        + none_hash
        + b"i"
        + _u32(16)
        + struct.pack("<16i", *range(16))
        + b"N"
    )
    hasher = BlockHasher("sha256_raw", environ={})

    assert hasher.none_hash == none_hash
    assert hasher.hash_block_tokens(None, range(16)) == hashlib.sha256(block).digest()
    assert hasher.none_hash.hex() == SHA256_RAW_NONE_HASH
    assert hasher.hash_block_tokens(None, range(16)).hex() == SHA256_RAW_BLOCK0


@pytest.mark.parametrize(
    ("value", "encoding"),
    [
        (None, b"N"),
        (True, b"?\x01"),
        (-2, b"q" + struct.pack("<q", -2)),
        (2**70, b"Z" + _u32(9) + (2**70).to_bytes(9, "little", signed=True)),
        (0.5, b"d" + struct.pack("<d", 0.5)),
        (b"ab", b"b" + _u32(2) + b"ab"),
        ("é", b"s" + _u32(2) + "é".encode()),
        ((1, 2), b"i" + _u32(2) + struct.pack("<2i", 1, 2)),
        ([1, 2], b"i" + _u32(2) + struct.pack("<2i", 1, 2)),
        ((2**31,), b"l" + _u32(1) + struct.pack("<q", 2**31)),
        ((), b"i" + _u32(0)),
        (("x", None), b"t" + _u32(2) + b"s" + _u32(1) + b"x" + b"N"),
    ],
)
def test_encoding_table(value: Any, encoding: bytes) -> None:
    assert encode_raw(value) == encoding


def test_unencodable_values_raise_type_error() -> None:
    with pytest.raises(TypeError, match="cannot encode a value of type dict"):
        encode_raw({"a": 1})


@pytest.mark.parametrize("name", RAW_NAMES)
def test_raw_modes_are_deterministic_and_differ_from_pickled_modes(name: str) -> None:
    pickled_name = {"kvhash_raw": "sha256"}.get(name, name.removesuffix("_raw"))
    raw = BlockHasher(name, seed="s")
    again = BlockHasher(name, seed="s")
    pickled = BlockHasher(pickled_name, seed="s")
    tokens = list(range(64))

    assert raw.hash_blocks(None, tokens, 16) == again.hash_blocks(None, tokens, 16)
    assert raw.none_hash != pickled.none_hash
    assert set(raw.hash_blocks(None, tokens, 16)).isdisjoint(pickled.hash_blocks(None, tokens, 16))
    assert not get_hash_algorithm(name).vllm_compatible


extra_key = st.recursive(
    st.none() | st.integers() | st.text(max_size=4) | st.binary(max_size=4),
    lambda children: st.tuples(children, children) | st.lists(children, max_size=3),
    max_leaves=6,
)


@pytest.mark.parametrize("name", RAW_NAMES)
@settings(max_examples=60, deadline=None)
@given(
    block_size=st.integers(1, 5),
    token_ids=st.lists(st.integers(0, 2**31 - 1) | st.integers(-(2**40), 2**40), max_size=24),
    parent=st.none() | st.binary(min_size=1, max_size=40),
    extras=st.none() | st.lists(extra_key, min_size=24, max_size=24),
)
def test_multi_block_fast_path_equals_hashing_block_by_block(
    name: str,
    block_size: int,
    token_ids: list[int],
    parent: bytes | None,
    extras: list[Any] | None,
) -> None:
    hasher = BlockHasher(name, seed="s")
    num_blocks = len(token_ids) // block_size
    extra_keys = None if extras is None else extras[:num_blocks]

    fast = hasher.hash_blocks(parent, token_ids, block_size, extra_keys)

    naive = []
    previous = parent
    for i in range(num_blocks):
        block = token_ids[i * block_size : (i + 1) * block_size]
        previous = hasher.hash_block_tokens(
            previous, block, None if extra_keys is None else extra_keys[i]
        )
        naive.append(previous)
    assert fast == naive
