"""BlockHasher.hash_blocks: the multi-block entry point every algorithm shares."""

from __future__ import annotations

import pytest

from kvpool.errors import InvalidArgument
from kvpool.hashing import BlockHasher, available_hash_algorithms


@pytest.mark.parametrize("name", available_hash_algorithms())
def test_hash_blocks_chains_full_blocks_and_ignores_the_partial_tail(name: str) -> None:
    hasher = BlockHasher(name, seed="s")
    tokens = list(range(37))
    extra_keys = [None, (("lora", "a", ""),)]

    hashes = hasher.hash_blocks(None, tokens, 16, extra_keys)

    first = hasher.hash_block_tokens(None, tokens[:16])
    second = hasher.hash_block_tokens(first, tokens[16:32], (("lora", "a", ""),))
    assert hashes == [first, second]
    assert hasher.hash_blocks(first, tokens[16:32], 16, extra_keys[1:]) == [second]


def test_hash_blocks_validates_its_arguments() -> None:
    hasher = BlockHasher("sha256", seed="s")

    with pytest.raises(InvalidArgument, match="block_size"):
        hasher.hash_blocks(None, [1, 2], 0)
    with pytest.raises(InvalidArgument, match="2 entries for 1 full blocks"):
        hasher.hash_blocks(None, [1, 2, 3], 2, [None, None])
    assert hasher.hash_blocks(None, [1], 2) == []
