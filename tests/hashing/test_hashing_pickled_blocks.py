"""vLLM's block pickles written from packed tokens must be ``pickle.dumps``'s, byte for byte.

:mod:`kvpool.hashing.pickled_blocks` writes every block's ``(parent, tuple(tokens), None)``
pickle (protocol 5) of a prompt in one pass, so that ``sha256`` and ``xxhash`` hash a packed
prompt without the pickler. The records are compared with ``pickle.dumps`` for tokens of
every width (BININT1, BININT2, BININT, negatives), parents of every short length and many
block sizes, through the compiled writer and the plain-Python one; the chains are compared
with per-block hashing, and the shapes outside the pattern must be declined.
"""

from __future__ import annotations

import hashlib
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.hashing import BlockHasher
from kvpool.hashing.pickled_blocks import block_pickles, pickled_packed_chain, write_records
from kvpool.hashing.raw import pack_int32

_BOUNDARIES = [0, 1, 255, 256, 65535, 65536, 2**24, 2**31 - 1, -1, -255, -256, -65536,
               -(2**31)]
tokens = st.one_of(st.integers(0, 255), st.integers(256, 65535),
                   st.integers(65536, 2**31 - 1), st.integers(-(2**31), -1),
                   st.sampled_from(_BOUNDARIES))


def _records(parent: bytes, parent_len: int, toks: list[int], block_size: int, writer):
    """Each record of ``block_pickles``, with parent ``parent`` written into its slot (the
    first block's parent is ``parent``, later ones ``parent_len`` bytes of 0xAB)."""
    layout = block_pickles(len(parent), parent_len, pack_int32(toks), block_size, writer)
    assert layout is not None
    buf, starts, ends, slots = layout
    out = []
    for i, (start, end, slot) in enumerate(zip(starts, ends, slots, strict=True)):
        record = bytearray(buf[start:end].tobytes())
        p = parent if i == 0 else b"\xab" * parent_len
        record[slot - start : slot - start + len(p)] = p
        out.append((bytes(record), p))
    return out


@pytest.mark.parametrize("compiled", [True, False])
@settings(max_examples=150, deadline=None)
@given(block_size=st.integers(4, 40), num_blocks=st.integers(1, 4), extra=st.integers(0, 3),
       parent_len=st.sampled_from([0, 1, 16, 32, 255]), later_len=st.sampled_from([16, 32]),
       data=st.data())
def test_every_record_is_the_pickle_of_its_block(compiled, block_size, num_blocks, extra,
                                                 parent_len, later_len, data):
    toks = data.draw(st.lists(tokens, min_size=num_blocks * block_size + extra,
                              max_size=num_blocks * block_size + extra))
    parent = data.draw(st.binary(min_size=parent_len, max_size=parent_len))
    writer = None if compiled else write_records
    records = _records(parent, later_len, toks, block_size, writer)
    assert len(records) == num_blocks
    for i, (record, p) in enumerate(records):
        block = tuple(toks[i * block_size : (i + 1) * block_size])
        assert record == pickle.dumps((p, block, None), protocol=5)


@pytest.mark.parametrize("block_size", [4, 16, 100, 2000])
def test_the_chain_equals_per_block_hashing(block_size):
    toks = [(i * 2654435761) % (2**31) >> (i % 24) for i in range(7 * block_size + 3)]
    chain = pickled_packed_chain(lambda b: hashlib.sha256(b).digest(), 32)
    parent = b"\x07" * 32
    expected = []
    for i in range(7):
        block = tuple(toks[i * block_size : (i + 1) * block_size])
        parent = hashlib.sha256(pickle.dumps((parent, block, None), protocol=5)).digest()
        expected.append(parent)
    assert chain(b"\x07" * 32, pack_int32(toks), block_size) == expected


@pytest.mark.parametrize("name", ["sha256", "xxhash"])
def test_the_hasher_gets_the_per_block_hashes_from_the_packing(name):
    if name == "xxhash":
        pytest.importorskip("xxhash")
    hasher = BlockHasher(name, seed="pickled-blocks-test")
    toks = list(range(60_000, 60_000 + 16 * 20)) + [5] * 16
    assert hasher.hash_packed_blocks(None, pack_int32(toks), 16) == hasher.hash_blocks(
        None, toks, 16)
    assert hasher.hash_packed_blocks(None, pack_int32(toks[:15]), 16) == []


@pytest.mark.parametrize("parent_len, block_size", [
    (256, 16),  # BINBYTES, not SHORT_BINBYTES
    (32, 3), (32, 1),  # TUPLE3 / TUPLE1, not MARK ... TUPLE
    (32, 0), (32, -4),  # no block at all: declined, not divided by
    (-1, 16),  # not a length
    (32, 20_000),  # the pickler would split its frame
])
def test_shapes_outside_the_pattern_are_declined(parent_len, block_size):
    packed = pack_int32([1] * max(2 * block_size, 8))
    assert block_pickles(parent_len, 32, packed, block_size) is None
    if block_size > 0 and parent_len >= 0:
        chain = pickled_packed_chain(lambda b: hashlib.sha256(b).digest(), 32)
        assert chain(b"\x00" * parent_len, packed, block_size) is None


def test_a_digest_of_the_wrong_length_fails_loudly():
    chain = pickled_packed_chain(lambda b: hashlib.sha256(b).digest()[:20], 32)
    with pytest.raises(ValueError):
        chain(b"\x00" * 32, pack_int32(list(range(64))), 16)
