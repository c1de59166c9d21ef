"""The request block hasher: only new full blocks, salt isolation, MM start index, lookahead."""

from __future__ import annotations

import hashlib
import pickle
from typing import Any

import pytest

from kvpool.errors import InvalidArgument, InvalidConfig
from kvpool.hashing import BlockHasher, HashAlgorithm, get_request_block_hasher, sha256
from kvpool.request import LoRARequest, MultiModalFeature, Request


def _sha(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=5)).digest()


NONE_HASH = _sha("vllm-none-hash")


def _hasher() -> BlockHasher:
    return BlockHasher("sha256", environ={})


def test_prompt_blocks_are_hashed_at_creation_and_the_partial_block_waits() -> None:
    request = Request("r", list(range(40)), block_hasher=get_request_block_hasher(16, _hasher()))

    first = _sha((NONE_HASH, tuple(range(16)), None))
    second = _sha((first, tuple(range(16, 32)), None))
    assert request.block_hashes == [first, second]


class _Spy:
    """A sha256 algorithm that records every object it hashes."""

    def __init__(self) -> None:
        self.hashed: list[Any] = []

    def __call__(self, obj: Any) -> bytes:
        self.hashed.append(obj)
        return sha256(obj)


def test_appending_output_tokens_hashes_only_blocks_that_became_full() -> None:
    spy = _Spy()
    hasher = BlockHasher(HashAlgorithm("spy", spy, 32, True, True), seed="vllm-none-hash")
    spy.hashed.clear()  # forget NONE_HASH
    request = Request("r", list(range(40)), block_hasher=get_request_block_hasher(16, hasher))
    assert len(spy.hashed) == 2
    prefix = list(request.block_hashes)

    request.append_output_token_ids(list(range(40, 47)))
    assert len(spy.hashed) == 2  # 47 tokens: block [32, 48) is still partial

    request.append_output_token_ids(47)
    assert len(spy.hashed) == 3
    assert spy.hashed[-1] == (prefix[1], tuple(range(32, 48)), None)
    assert request.block_hashes[:2] == prefix  # append-only

    whole = Request("w", list(range(48)), block_hasher=get_request_block_hasher(16, _hasher()))
    assert whole.block_hashes == request.block_hashes


def test_request_token_views() -> None:
    request = Request("r", [1, 2, 3], output_token_ids=[4])
    request.append_output_token_ids([5, 6])

    assert request.all_token_ids == [1, 2, 3, 4, 5, 6]
    assert (request.num_tokens, request.num_prompt_tokens) == (6, 3)
    assert request.block_hashes == []  # no hasher, no hashes


def test_different_salts_change_the_first_hash_and_so_every_later_one() -> None:
    block_hasher = get_request_block_hasher(16, _hasher())
    tokens = list(range(48))
    alice = Request("a", tokens, cache_salt="alice", block_hasher=block_hasher)
    bob = Request("b", tokens, cache_salt="bob", block_hasher=block_hasher)
    unsalted = Request("u", tokens, block_hasher=block_hasher)

    assert len(alice.block_hashes) == 3
    for i in range(3):
        assert len({alice.block_hashes[i], bob.block_hashes[i], unsalted.block_hashes[i]}) == 3
    assert alice.block_hashes[0] == _sha((NONE_HASH, tuple(range(16)), (("cache_salt", "alice"),)))
    # Later blocks carry no salt key: they differ only through the chained parent.
    assert alice.block_hashes[1] == _sha((alice.block_hashes[0], tuple(range(16, 32)), None))


def test_lora_requests_hash_name_and_path_into_every_block() -> None:
    block_hasher = get_request_block_hasher(16, _hasher())
    tokens = list(range(32))
    lora = Request("l", tokens, lora_request=LoRARequest("a", 1, "/a"), block_hasher=block_hasher)
    moved = Request("m", tokens, lora_request=LoRARequest("a", 1, "/b"), block_hasher=block_hasher)

    key = (("lora", "a", "/a"),)
    assert lora.block_hashes[0] == _sha((NONE_HASH, tuple(range(16)), key))
    assert lora.block_hashes[1] == _sha((lora.block_hashes[0], tuple(range(16, 32)), key))
    assert moved.block_hashes[0] != lora.block_hashes[0]


def test_a_generated_block_finds_every_item_it_overlaps_not_only_the_last() -> None:
    features = [MultiModalFeature("a", 14, 4), MultiModalFeature("b", 19, 1)]
    request = Request(
        "r",
        list(range(20)),
        mm_features=features,
        block_hasher=get_request_block_hasher(16, _hasher()),
    )
    assert request.block_hashes == [_sha((NONE_HASH, tuple(range(16)), (("mm", "a", 14),)))]

    request.append_output_token_ids(range(20, 32))

    expected_keys = (("mm", "a", -2), ("mm", "b", 3))
    assert request.block_hashes[1] == _sha(
        (request.block_hashes[0], tuple(range(16, 32)), expected_keys)
    )


def test_lookahead_hashes_a_block_once_its_following_tokens_exist() -> None:
    block_hasher = get_request_block_hasher(4, _hasher(), num_hash_lookahead_tokens=2)
    request = Request("r", list(range(10)), block_hasher=block_hasher)

    first = _sha((NONE_HASH, (0, 1, 2, 3), (None, 4, 5)))
    second = _sha((first, (4, 5, 6, 7), (None, 8, 9)))
    assert request.block_hashes == [first, second]

    request.append_output_token_ids([10, 11, 12])  # 13 tokens: block [8, 12) needs 14
    assert len(request.block_hashes) == 2
    request.append_output_token_ids(13)
    assert request.block_hashes[2] == _sha((second, (8, 9, 10, 11), (None, 12, 13)))


def test_lookahead_keys_cover_the_lookahead_and_rewind_the_multimodal_index() -> None:
    # The item sits at token 4: inside block 0's lookahead window [0, 6) and inside block 1.
    block_hasher = get_request_block_hasher(4, _hasher(), num_hash_lookahead_tokens=2)
    request = Request(
        "r",
        list(range(10)),
        mm_features=[MultiModalFeature("img", 4, 1)],
        block_hasher=block_hasher,
    )

    first = _sha((NONE_HASH, (0, 1, 2, 3), ((("mm", "img", 4),), 4, 5)))
    second = _sha((first, (4, 5, 6, 7), ((("mm", "img", 0),), 8, 9)))
    assert request.block_hashes == [first, second]


def test_hasher_arguments_are_validated() -> None:
    with pytest.raises(InvalidConfig, match="hash_block_size"):
        get_request_block_hasher(0, _hasher())
    with pytest.raises(InvalidConfig, match="num_hash_lookahead_tokens"):
        get_request_block_hasher(16, _hasher(), num_hash_lookahead_tokens=-1)
    with pytest.raises(InvalidConfig, match="BlockHasher"):
        get_request_block_hasher(16, sha256)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "features",
    [
        [MultiModalFeature("a", 10, 4), MultiModalFeature("b", 2, 4)],  # unsorted
        [MultiModalFeature("a", 0, 10), MultiModalFeature("b", 5, 4)],  # overlapping
        [MultiModalFeature("a", -1, 4)],
        [MultiModalFeature("a", 0, -4)],
    ],
)
def test_requests_reject_unsorted_overlapping_or_negative_items(
    features: list[MultiModalFeature],
) -> None:
    with pytest.raises(InvalidArgument):
        Request("r", list(range(32)), mm_features=features)


@pytest.mark.parametrize("prompt_len, appended", [(40, 30), (32, 20), (10, 50), (16, 16)])
def test_blocks_filled_by_output_tokens_hash_the_same_tokens_as_the_whole_sequence(
        prompt_len: int, appended: int) -> None:
    """The hasher reads only the new tokens of a Request (prompt, output, or both sides of
    the boundary) and gets the chain that hashing ``all_token_ids`` block by block gives."""
    hasher = get_request_block_hasher(16, _hasher())
    request = Request("r", list(range(prompt_len)), block_hasher=hasher)
    for t in range(appended):
        request.append_output_token_ids(1000 + t)
    tokens = request.all_token_ids
    expected, parent = [], NONE_HASH
    for start in range(0, len(tokens) // 16 * 16, 16):
        parent = _sha((parent, tuple(tokens[start : start + 16]), None))
        expected.append(parent)
    assert request.block_hashes == expected
