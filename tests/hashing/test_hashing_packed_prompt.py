"""A request packs its prompt while validating it; the raw modes hash that packing directly.

The packed path must give exactly the hashes of the token path, be taken only while the
request is being built (never from a stale copy), and step aside for prompts outside int32,
short prompts and the CBOR algorithms (which encode tuples, not the packing). The pickled
vLLM modes take it through :mod:`kvpool.hashing.pickled_blocks` (vLLM's pickles written from
the packing); their byte-for-byte tests are in ``test_hashing_pickled_blocks.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import InvalidArgument
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.hashing.raw import pack_int32
from kvpool.request import Request, _checked_tokens, as_token_ids

BS = 16
RAW = ("kvhash_raw", "sha256_raw", "xxhash_raw")
PACKED = (*RAW, "sha256", "xxhash")  # every mode with a packed chain


class _Counting(BlockHasher):
    """Counts the calls that took the packed path and those that passed tokens."""

    packed_calls = 0
    token_calls = 0

    def hash_packed_blocks(self, parent, packed, block_size):
        hashes = super().hash_packed_blocks(parent, packed, block_size)
        if hashes is not None:
            self.packed_calls += 1
        return hashes

    def hash_blocks(self, parent, token_ids, block_size, extra_keys=None):
        self.token_calls += 1
        return super().hash_blocks(parent, token_ids, block_size, extra_keys)


@pytest.mark.parametrize("name", PACKED)
def test_a_packed_mode_hashes_the_packed_prompt_and_gets_the_token_paths_hashes(name):
    if name.startswith("xxhash"):
        pytest.importorskip("xxhash")
    hasher = _Counting(name, seed="packed-prompt-test")
    prompt = list(range(1000, 1000 + 10 * BS + 5))
    r = Request("r", prompt, block_hasher=get_request_block_hasher(BS, hasher))
    assert hasher.packed_calls == 1 and hasher.token_calls == 0
    assert r.block_hashes == hasher.hash_blocks(None, prompt, BS)
    assert r._packed_prompt is None  # only while the request is built
    # Later blocks (the prompt's tail plus output tokens) take the token path.
    r.append_output_token_ids(list(range(BS)))
    assert hasher.token_calls == 2
    assert r.block_hashes == hasher.hash_blocks(None, r.all_token_ids, BS)


@pytest.mark.parametrize("name", ["sha256_cbor", "xxhash_cbor"])
def test_the_cbor_modes_take_the_token_path(name):
    if name.startswith("xxhash"):
        pytest.importorskip("xxhash")
    hasher = _Counting(name, seed="packed-prompt-test")
    prompt = list(range(10 * BS))
    r = Request("r", prompt, block_hasher=get_request_block_hasher(BS, hasher))
    assert hasher.packed_calls == 0 and hasher.token_calls == 1
    assert r.block_hashes == hasher.hash_blocks(None, prompt, BS)


@pytest.mark.parametrize("block_size", [1, 2, 3])
def test_a_pickled_mode_declines_blocks_under_four_tokens_and_the_tokens_are_hashed(
        block_size):
    hasher = _Counting("sha256")
    prompt = list(range(500, 500 + 40 * block_size))
    r = Request("r", prompt, block_hasher=get_request_block_hasher(block_size, hasher))
    assert hasher.packed_calls == 0 and hasher.token_calls == 1
    assert r.block_hashes == BlockHasher("sha256").hash_blocks(None, prompt, block_size)


@pytest.mark.parametrize("prompt", [
    [2**31] + list(range(10 * BS)),  # outside int32: the raw encoding switches to int64
    list(range(3 * BS)),  # shorter than _PACK_AT_LEAST: checked with min/max
])
def test_prompts_that_do_not_pack_take_the_token_path(prompt):
    hasher = _Counting("kvhash_raw", seed="packed-prompt-test")
    r = Request("r", prompt, block_hasher=get_request_block_hasher(BS, hasher))
    assert hasher.packed_calls == 0
    assert r.block_hashes == hasher.hash_blocks(None, prompt, BS)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-5, 2**31 + 5), st.integers(0, 300),
                          st.sampled_from([-(2**63), 2**63 - 1, 2**63, 2**31 - 1, 2**31])),
                min_size=0, max_size=200))
def test_checking_by_packing_accepts_and_rejects_exactly_what_min_max_does(tokens):
    try:
        expected = as_token_ids(tokens)
    except InvalidArgument as error:
        with pytest.raises(InvalidArgument) as packed_error:
            _checked_tokens(tokens, "token_ids", 0, pack=True)
        assert str(packed_error.value) == str(error)
        return
    got, packed = _checked_tokens(tokens, "token_ids", 0, pack=True)
    assert got == expected
    if packed is not None:
        assert packed == pack_int32(tokens)
        assert np.frombuffer(packed, "<i4").tolist() == tokens


def test_a_numpy_prompt_packs_like_its_list():
    prompt = np.arange(500, 500 + 8 * BS, dtype=np.int64)
    tokens, packed = _checked_tokens(prompt, "prompt_token_ids", 0, pack=True)
    assert tokens == prompt.tolist() and packed == pack_int32(prompt.tolist())


@pytest.mark.parametrize("name", ["kvhash_raw", "sha256"])
@pytest.mark.parametrize("packed, block_size", [
    (pack_int32(list(range(32))), 0), (pack_int32(list(range(32))), -16),
    (pack_int32(list(range(32))), True), (pack_int32(list(range(32))), 16.0),
    (list(range(32)), 16), (np.arange(32, dtype=np.int32), 16), ("tokens", 16),
])
def test_hashing_packed_tokens_rejects_bad_arguments_with_a_typed_error(name, packed,
                                                                       block_size):
    with pytest.raises(InvalidArgument):
        BlockHasher(name, seed="packed-prompt-test").hash_packed_blocks(None, packed, block_size)
