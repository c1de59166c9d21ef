"""NONE_HASH seeds: resolution order, the warning, explicit seeds, and other processes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kvpool.hashing
from kvpool.errors import InvalidConfig
from kvpool.hashing import (
    DEFAULT_NONE_HASH_SEED,
    BlockHasher,
    NonReproducibleHashWarning,
    resolve_none_hash_seed,
    resolve_seed,
)

needs_xxhash = pytest.mark.skipif(
    importlib.util.find_spec("xxhash") is None, reason="xxhash is not installed"
)


def test_pythonhashseed_wins_for_every_algorithm() -> None:
    env = {"PYTHONHASHSEED": "123"}

    assert resolve_seed(True, env).seed == "123"
    assert resolve_seed(False, env).seed == "123"
    assert resolve_seed(True, env).source == "env"
    hasher = BlockHasher("sha256", environ=env)
    assert hasher.seed == "123"
    assert hasher.none_hash == hashlib.sha256(pickle.dumps("123", protocol=5)).digest()


def test_empty_pythonhashseed_is_still_a_seed() -> None:
    assert resolve_none_hash_seed(False, {"PYTHONHASHSEED": ""}) == ""


def test_cryptographic_algorithms_default_to_the_public_constant() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hasher = BlockHasher("sha256_cbor", environ={})

    assert DEFAULT_NONE_HASH_SEED == "vllm-none-hash"
    assert hasher.seed == "vllm-none-hash"
    assert hasher.seed_source == "default"
    assert hasher.reproducible


def test_non_cryptographic_algorithms_get_a_random_seed_and_a_warning() -> None:
    with pytest.warns(NonReproducibleHashWarning, match="not reproducible across processes"):
        first = resolve_seed(False, {})
    with pytest.warns(NonReproducibleHashWarning):
        second = resolve_seed(False, {})

    assert first.source == "random"
    assert len(first.seed) == 64
    int(first.seed, 16)  # 32 random bytes as hex
    assert first.seed != second.seed


@needs_xxhash
def test_random_seed_is_readable_back_and_reproduces_none_hash() -> None:
    with pytest.warns(NonReproducibleHashWarning):
        hasher = BlockHasher("xxhash", environ={})

    again = BlockHasher("xxhash", seed=hasher.seed)

    assert not hasher.reproducible
    assert again.none_hash == hasher.none_hash
    assert hasher.seed not in repr(hasher)


def test_explicit_seed_skips_the_environment() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hasher = BlockHasher("sha256_raw", seed="mine", environ={"PYTHONHASHSEED": "9"})

    assert hasher.seed == "mine"
    assert hasher.seed_source == "explicit"


def test_a_non_string_seed_is_rejected() -> None:
    with pytest.raises(InvalidConfig, match="seed must be a str"):
        BlockHasher("sha256", seed=b"bytes")  # type: ignore[arg-type]


def test_without_environ_the_process_environment_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "99")
    assert BlockHasher("sha256").seed == "99"
    monkeypatch.delenv("PYTHONHASHSEED")
    assert BlockHasher("sha256").seed == "vllm-none-hash"


def test_none_hash_belongs_to_each_hasher_not_to_the_process() -> None:
    default = BlockHasher("sha256", environ={})
    seeded = BlockHasher("sha256", seed="other")

    assert default.none_hash != seeded.none_hash
    assert BlockHasher("sha256", environ={}).none_hash == default.none_hash
    assert default.hash_block_tokens(None, [1]) != seeded.hash_block_tokens(None, [1])


_CHILD = """
import json, sys, warnings
warnings.simplefilter("ignore")
from kvpool.hashing import BlockHasher
result = {}
for name in sys.argv[1:]:
    hasher = BlockHasher(name)
    block = hasher.hash_block_tokens(None, range(16))
    result[name] = [hasher.seed_source, hasher.none_hash.hex(), block.hex()]
print(json.dumps(result))
"""


def _run_child(names: list[str], pythonhashseed: str | None) -> dict[str, list[str]]:
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)
    if pythonhashseed is not None:
        env["PYTHONHASHSEED"] = pythonhashseed
    # The child must import this checkout's kvpool whether or not it is installed.
    src_dir = str(Path(kvpool.hashing.__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src_dir, env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, "-c", _CHILD, *names],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, list[str]] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def test_sha256_hashes_agree_across_processes_without_pythonhashseed() -> None:
    first = _run_child(["sha256", "sha256_cbor", "sha256_raw"], None)
    second = _run_child(["sha256", "sha256_cbor", "sha256_raw"], None)

    assert first == second
    assert first["sha256"][0] == "default"
    here = BlockHasher("sha256", environ={})
    assert first["sha256"][1:] == [
        here.none_hash.hex(),
        here.hash_block_tokens(None, range(16)).hex(),
    ]


@needs_xxhash
def test_xxhash_hashes_differ_across_processes_unless_pythonhashseed_is_set() -> None:
    names = ["xxhash", "xxhash_cbor", "xxhash_raw"]
    first = _run_child(names, None)
    second = _run_child(names, None)
    for name in names:
        assert first[name][0] == "random"
        assert first[name][1] != second[name][1]
        assert first[name][2] != second[name][2]

    seeded_first = _run_child(names, "42")
    seeded_second = _run_child(names, "42")
    assert seeded_first == seeded_second
    here = BlockHasher("xxhash", seed="42")
    assert seeded_first["xxhash"] == [
        "env",
        here.none_hash.hex(),
        here.hash_block_tokens(None, range(16)).hex(),
    ]
