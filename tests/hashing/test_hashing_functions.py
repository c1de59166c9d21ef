"""Hash functions by name: vLLM's exact bytes, pinned digests, and the xxhash dependency."""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import sys

import cbor2
import pytest

from kvpool.errors import InvalidConfig
from kvpool.hashing import (
    HASH_ALGORITHM_NAMES,
    VLLM_HASH_ALGORITHM_NAMES,
    BlockHasher,
    available_hash_algorithms,
    get_hash_algorithm,
    get_hash_fn_by_name,
    hash_block_tokens,
    sha256,
    sha256_cbor,
    xxhash,
    xxhash_cbor,
)

needs_xxhash = pytest.mark.skipif(
    importlib.util.find_spec("xxhash") is None, reason="xxhash is not installed"
)

# Literal digests, computed once with hashlib/pickle/cbor2/xxhash alone. If one of these
# changes, every prefix-cache hash shared with vLLM (or stored by a previous kvpool) changes.
SHA256_NONE_HASH = "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
SHA256_BLOCK0 = "fe8fa5dda3210d0ca2031e37cbe3b001186773cd1c710beb2d45fcb51d434798"
SHA256_BLOCK1 = "8be7aaa33831156d316f1f463ae57e643deb63f42e633e2d631df88815cc4629"
SHA256_BLOCK0_WITH_EXTRA_KEYS = "309c6f3660e85c3f5a572ceaded7bb84aa2306d176512fdf7ea98e163ab8ade3"
SHA256_CBOR_NONE_HASH = "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
SHA256_CBOR_BLOCK0 = "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749"
XXHASH_SEED0_NONE_HASH = "6fb31cc38bba6066183f7f2104b9c051"
XXHASH_SEED0_BLOCK0 = "8ef953407c0da43eacbb3639ed2bff4d"
XXHASH_CBOR_SEED0_NONE_HASH = "1ebe36576dcb573f26b99533a20aaeca"
XXHASH_CBOR_SEED0_BLOCK0 = "209f5d549fc07c8e39d823615ede61ce"

EXTRA_KEYS = (("lora", "adapter", "/adapters/a"), ("mm", "img-0", -6), ("cache_salt", "tenant-a"))


def _pickled(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=5)


def test_default_sha256_chain_equals_hashlib_over_pickled_tuples() -> None:
    none_hash = hashlib.sha256(_pickled("vllm-none-hash")).digest()
    block0 = hashlib.sha256(_pickled((none_hash, tuple(range(16)), None))).digest()
    block1 = hashlib.sha256(_pickled((block0, tuple(range(16, 32)), None))).digest()

    hasher = BlockHasher("sha256", environ={})

    assert hasher.none_hash == none_hash
    assert hasher.hash_block_tokens(None, range(16)) == block0
    assert hasher.hash_block_tokens(block0, list(range(16, 32))) == block1


def test_default_sha256_digests_are_pinned() -> None:
    hasher = BlockHasher("sha256", environ={})
    block0 = hasher.hash_block_tokens(None, range(16))

    assert hasher.none_hash.hex() == SHA256_NONE_HASH
    assert block0.hex() == SHA256_BLOCK0
    assert hasher.hash_block_tokens(block0, range(16, 32)).hex() == SHA256_BLOCK1
    assert hasher.hash_block_tokens(None, range(16), EXTRA_KEYS).hex() == (
        SHA256_BLOCK0_WITH_EXTRA_KEYS
    )


def test_extra_keys_are_hashed_as_the_third_tuple_element() -> None:
    hasher = BlockHasher("sha256", environ={})
    expected = hashlib.sha256(_pickled((hasher.none_hash, tuple(range(16)), EXTRA_KEYS))).digest()

    assert hasher.hash_block_tokens(None, range(16), EXTRA_KEYS) == expected
    assert expected != hasher.hash_block_tokens(None, range(16))


def test_cbor_algorithms_hash_canonical_cbor_and_are_pinned() -> None:
    none_hash = hashlib.sha256(cbor2.dumps("vllm-none-hash", canonical=True)).digest()
    block0 = hashlib.sha256(
        cbor2.dumps((none_hash, tuple(range(16)), None), canonical=True)
    ).digest()

    hasher = BlockHasher("sha256_cbor", environ={})

    assert hasher.none_hash == none_hash
    assert hasher.hash_block_tokens(None, range(16)) == block0
    assert none_hash.hex() == SHA256_CBOR_NONE_HASH
    assert block0.hex() == SHA256_CBOR_BLOCK0


@needs_xxhash
@pytest.mark.parametrize(
    ("name", "pinned_none", "pinned_block0"),
    [
        ("xxhash", XXHASH_SEED0_NONE_HASH, XXHASH_SEED0_BLOCK0),
        ("xxhash_cbor", XXHASH_CBOR_SEED0_NONE_HASH, XXHASH_CBOR_SEED0_BLOCK0),
    ],
)
def test_xxhash_algorithms_with_a_seed_are_pinned(
    name: str, pinned_none: str, pinned_block0: str
) -> None:
    hasher = BlockHasher(name, seed="0")
    block0 = hasher.hash_block_tokens(None, range(16))

    assert len(hasher.none_hash) == 16
    assert hasher.none_hash.hex() == pinned_none
    assert block0.hex() == pinned_block0


@needs_xxhash
def test_module_level_functions_match_their_definitions() -> None:
    import xxhash as xxhash_module

    obj = (b"\x01" * 32, (1, 2, 3), None)

    assert sha256(obj) == hashlib.sha256(_pickled(obj)).digest()
    assert sha256_cbor(obj) == hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
    assert xxhash(obj) == xxhash_module.xxh3_128_digest(_pickled(obj))
    assert xxhash_cbor(obj) == xxhash_module.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


@needs_xxhash
def test_lookup_by_name_returns_the_same_functions_results() -> None:
    obj = ("x", (1, 2), None)
    for name, function in [
        ("sha256", sha256),
        ("sha256_cbor", sha256_cbor),
        ("xxhash", xxhash),
        ("xxhash_cbor", xxhash_cbor),
    ]:
        assert get_hash_fn_by_name(name)(obj) == function(obj)
        assert get_hash_algorithm(name).vllm_compatible


def test_unknown_hash_name_raises_unsupported_hash_function() -> None:
    with pytest.raises(ValueError, match=r"^Unsupported hash function: md5$") as caught:
        get_hash_algorithm("md5")
    assert isinstance(caught.value, InvalidConfig)
    with pytest.raises(InvalidConfig, match="Unsupported hash function: SHA256"):
        BlockHasher("SHA256", seed="s")


def test_pickled_modes_distinguish_lists_from_tuples_like_vllm() -> None:
    hasher = BlockHasher("sha256", seed="s")

    assert hasher((1, 2)) != hasher([1, 2])


def test_falsy_parent_is_replaced_by_this_hashers_none_hash() -> None:
    hasher = BlockHasher("sha256", seed="one")
    other = BlockHasher("sha256", seed="two")
    expected = hashlib.sha256(_pickled((hasher.none_hash, (7, 8), None))).digest()

    assert hash_block_tokens(hasher, None, [7, 8]) == expected
    assert hash_block_tokens(hasher, b"", [7, 8]) == expected
    assert hash_block_tokens(hasher, hasher.none_hash, [7, 8]) == expected
    assert hash_block_tokens(other, None, [7, 8]) != expected


def test_missing_xxhash_raises_module_not_found_with_install_advice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "xxhash", None)

    for name in ("xxhash", "xxhash_cbor", "xxhash_raw"):
        with pytest.raises(ModuleNotFoundError) as caught:
            BlockHasher(name, seed="s")
        message = str(caught.value)
        assert "xxhash is required for the 'xxhash' prefix caching hash algorithms" in message
        assert "pip install xxhash" in message
    with pytest.raises(ModuleNotFoundError, match="pip install xxhash"):
        xxhash(b"data")
    assert available_hash_algorithms() == ("sha256", "sha256_cbor", "sha256_raw", "kvhash_raw")


@needs_xxhash
def test_every_name_is_listed_and_vllm_names_come_first() -> None:
    assert HASH_ALGORITHM_NAMES[:4] == VLLM_HASH_ALGORITHM_NAMES
    assert set(available_hash_algorithms()) == set(HASH_ALGORITHM_NAMES)
    for name in HASH_ALGORITHM_NAMES:
        algorithm = get_hash_algorithm(name)
        assert algorithm.name == name
        assert len(algorithm.hash_fn("probe")) == algorithm.digest_size
