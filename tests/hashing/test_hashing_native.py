"""``kvhash_raw``: one native call per prompt, the same bytes as block-by-block hashing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.hashing import BlockHasher, encode_raw, get_hash_algorithm, native


def plain(fn):
    """The uncompiled source of a kernel (the same function when numba is absent)."""
    return getattr(fn, "py_func", fn)


def test_the_algorithm_is_registered_as_not_vllm_compatible_and_not_cryptographic():
    algorithm = get_hash_algorithm("kvhash_raw")
    assert algorithm.digest_size == 16 and algorithm.chain is native.kvhash_chain
    assert not algorithm.vllm_compatible and not algorithm.cryptographic
    assert len(algorithm.hash_fn("probe")) == 16


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=200))
def test_compiled_and_plain_digests_agree(data):
    buf = np.frombuffer(data, np.uint8)
    compiled, python = np.zeros((1, 16), np.uint8), np.zeros((1, 16), np.uint8)
    native.digest_bytes(buf, compiled)
    plain(native.digest_bytes)(buf, python)
    assert compiled.tobytes() == python.tobytes()


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40),
       block_size=st.integers(1, 6), parent=st.binary(min_size=1, max_size=40))
def test_one_native_call_equals_block_by_block_encoding_and_digest(tokens, block_size, parent):
    got = native.kvhash_chain(parent, tokens, block_size, None)
    expected, previous = [], parent
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        out = np.zeros((1, 16), np.uint8)
        plain(native.digest_bytes)(np.frombuffer(encode_raw((previous, block, None)), np.uint8),
                                   out)
        previous = out.tobytes()
        expected.append(previous)
    assert got == expected


def test_tokens_beyond_int32_and_extra_keys_take_the_per_block_path_with_the_same_bytes():
    hasher = BlockHasher("kvhash_raw", seed="s")
    for tokens, extra in [([2**40, 1, 2, 3], None), ([1, 2, 3, 4], [("lora", 1), None]),
                          ([1, 2, 3, 4], [None, None])]:
        chained = hasher.hash_blocks(None, tokens, 2, extra)
        one_by_one = [
            h := hasher.hash_block_tokens(None, tokens[:2], None if extra is None else extra[0]),
            hasher.hash_block_tokens(h, tokens[2:], None if extra is None else extra[1]),
        ]
        assert chained == one_by_one


def test_distinct_blocks_get_distinct_hashes_and_every_bit_position_varies():
    hasher = BlockHasher("kvhash_raw", seed="s")
    hashes = hasher.hash_blocks(None, list(range(16 * 4096)), 16)
    assert len(set(hashes)) == 4096
    words = np.frombuffer(b"".join(hashes), np.uint64).reshape(-1, 2)
    for lane in range(2):  # 63 bits of each lane are uniform-looking: each is set ~half the time
        ones = [int(((words[:, lane] >> np.uint64(bit)) & np.uint64(1)).sum()) for bit in range(63)]
        assert all(1700 < count < 2400 for count in ones), (lane, min(ones), max(ones))


@pytest.mark.parametrize("seed", ["a", "b"])
def test_the_seed_changes_every_hash(seed):
    tokens = list(range(64))
    assert set(BlockHasher("kvhash_raw", seed=seed).hash_blocks(None, tokens, 16)).isdisjoint(
        BlockHasher("kvhash_raw", seed=seed + "x").hash_blocks(None, tokens, 16))


GOLDEN_DIGESTS = {  # the format is persistent (RAW_FORMAT_VERSION): these bytes never change
    b"": "71f95c54e228b901e41d106852ea8212",
    b"a": "cd106a1d6e0a657168cc69311c89ec6c",
    b"abcdefg": "34d905d47bc4b03e635459d62f30f076",
    b"abcdefgh": "d32337c727d896208cc5f8407891394c",
    bytes(range(106)): "20c702ee95ec551c2f05621356d94109",
    bytes(range(200)): "2ee643707060081aa59fd46fd0733e45",
}


@pytest.mark.parametrize("data", list(GOLDEN_DIGESTS), ids=lambda d: f"{len(d)}B")
@pytest.mark.parametrize("run", ["compiled", "plain"])
def test_the_digest_of_known_inputs_never_changes(data, run):
    out = np.zeros((1, 16), np.uint8)
    (native.digest_bytes if run == "compiled" else plain(native.digest_bytes))(
        np.frombuffer(data, np.uint8), out)
    assert out.tobytes().hex() == GOLDEN_DIGESTS[data]


def test_the_chained_hashes_of_a_known_prompt_never_change():
    hashes = BlockHasher("kvhash_raw", seed="golden").hash_blocks(
        None, list(range(1000, 1000 + 16 * 3 + 5)), 16)
    assert [h.hex() for h in hashes] == ["22c20e5bbedf7b3b4d9b8b8863321716",
                                         "edaa8070a737b81251e456e46f17fe2a",
                                         "1c38a30fbd4ed45a838ca9bd89f2a44e"]


def test_a_digest_ending_in_zero_bytes_keeps_all_sixteen():
    # The chain returns its rows as raw void items; an "S16" item would drop trailing zeros.
    tokens = native.pack_int32(list(range(16)))
    parent = next(p for p in (i.to_bytes(16, "little") for i in range(100_000))
                  if native.kvhash_chain_packed(p, tokens, 16)[0].endswith(b"\x00"))
    (digest,) = native.kvhash_chain_packed(parent, tokens, 16)
    assert len(digest) == 16 and type(digest) is bytes
    assert digest == native.kvhash((parent, tuple(range(16)), None))
