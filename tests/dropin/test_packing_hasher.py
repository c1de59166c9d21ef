"""The drop-in's packing block hasher without vLLM: a stand-in ``Request`` with vLLM's
hashing protocol (0.25 and 0.33 alike: ``block_hashes = []``, ``_block_hasher``,
``update_block_hashes`` after every token) and a chained hasher shaped like vLLM's. The same
checks on vLLM's own ``Request`` run in the optional tier (test_scheduler_conformance.py)."""

from __future__ import annotations

import hashlib
import sys
import types

import pytest

import kvpool.vllm as dropin
from kvpool.errors import InvalidConfig
from kvpool.hash_list import BlockHashList
from kvpool.vllm import hashes as packing

BLOCK = 4


def vllm_like_hasher(block_size: int):
    """Digests of the request's new full blocks, each chained to the one before (vLLM's
    shape: it reads how many digests the request has and how many tokens)."""

    def request_block_hasher(request) -> list[bytes]:
        start = len(request.block_hashes) * block_size
        out = []
        parent = request.block_hashes[-1] if request.block_hashes else b"none"
        while start + block_size <= len(request.tokens):
            block = request.tokens[start:start + block_size]
            parent = hashlib.sha256(parent + repr(block).encode()).digest()
            out.append(parent)
            start += block_size
        return out

    return request_block_hasher


class Request:
    """vLLM's ``Request`` as far as hashing goes."""

    def __init__(self, tokens: list[int], block_hasher) -> None:
        self.tokens = list(tokens)
        self.block_hashes: list[bytes] = []
        self._block_hasher = block_hasher
        self.update_block_hashes()

    def append_output_token_ids(self, token: int) -> None:
        self.tokens.append(token)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))


def test_a_request_gets_vllms_digests_with_its_prompt_packed_and_then_vllms_hasher() -> None:
    stock = vllm_like_hasher(BLOCK)
    plain = Request(list(range(23)), stock)
    packed = Request(list(range(23)), packing.packing_block_hasher(stock))
    assert type(packed.block_hashes) is BlockHashList
    assert packed.block_hashes == plain.block_hashes and len(plain.block_hashes) == 5
    assert packed.block_hashes.packed_count == 5  # packed while hot, at construction
    assert bytes(packed.block_hashes.packed(5)) == b"".join(plain.block_hashes)
    assert packed._block_hasher is stock  # no frame of kvpool's in any later call
    for token in range(100, 130):  # decoding: the same digests at the same positions
        plain.append_output_token_ids(token)
        packed.append_output_token_ids(token)
        assert packed.block_hashes == plain.block_hashes
    assert len(plain.block_hashes) == 13 and packed.block_hashes.packed_count == 5
    # Digests appended later are packed when read.
    assert bytes(packed.block_hashes.packed(13)) == b"".join(plain.block_hashes)


def test_a_scheduler_that_clears_or_cuts_the_list_and_hashes_again_gets_vllms_digests() -> None:
    """vLLM 0.33 clears a request's hashes (and cuts a session's tail) and hashes again."""
    stock = vllm_like_hasher(BLOCK)
    plain = Request(list(range(30)), stock)
    packed = Request(list(range(30)), packing.packing_block_hasher(stock))
    for request in (plain, packed):
        request.block_hashes.clear()
        request.update_block_hashes()
    assert packed.block_hashes == plain.block_hashes
    assert bytes(packed.block_hashes.packed(7)) == b"".join(plain.block_hashes)
    for request in (plain, packed):
        del request.block_hashes[3:]
        request.tokens[13] = -1  # the session's new input after the kept prefix
        request.update_block_hashes()
    assert packed.block_hashes == plain.block_hashes
    assert bytes(packed.block_hashes.packed(7)) == b"".join(plain.block_hashes)


def test_a_prompt_shorter_than_a_block_gets_an_empty_packed_list() -> None:
    stock = vllm_like_hasher(BLOCK)
    request = Request([1, 2], packing.packing_block_hasher(stock))
    assert type(request.block_hashes) is BlockHashList and request.block_hashes == []
    assert request._block_hasher is stock
    for token in (3, 4, 5):
        request.append_output_token_ids(token)
    assert request.block_hashes == Request([1, 2, 3, 4, 5], stock).block_hashes


def test_a_request_that_is_not_as_described_gets_vllms_digests_unchanged() -> None:
    stock = vllm_like_hasher(BLOCK)
    wrapper = packing.packing_block_hasher(stock)
    other = Request(list(range(12)), stock)  # its hasher is not the wrapper
    before = list(other.block_hashes)
    other.tokens += [7] * BLOCK
    new = wrapper(other)
    assert type(other.block_hashes) is list and other.block_hashes == before
    assert other._block_hasher is stock and len(new) == 1
    started = Request(list(range(12)), stock)  # hashes already in its list
    started._block_hasher = wrapper
    started.tokens += [7] * BLOCK
    started.update_block_hashes()
    assert type(started.block_hashes) is list and len(started.block_hashes) == 4
    assert started._block_hasher is stock  # handed over all the same
    bare = types.SimpleNamespace(tokens=list(range(8)), block_hashes=[])  # no _block_hasher
    assert wrapper(bare) == stock(types.SimpleNamespace(tokens=list(range(8)), block_hashes=[]))
    assert bare.block_hashes == [] and not hasattr(bare, "_block_hasher")


def test_the_factory_wraps_each_hasher_it_builds_and_keeps_vllms_signature() -> None:
    factory = packing.packing_factory(vllm_like_hasher)
    assert factory.__wrapped__ is vllm_like_hasher  # type: ignore[attr-defined]
    hasher = factory(BLOCK)
    request = Request(list(range(9)), hasher)
    assert request.block_hashes == Request(list(range(9)), vllm_like_hasher(BLOCK)).block_hashes
    assert type(request.block_hashes) is BlockHashList


@pytest.fixture
def fake_vllm(monkeypatch):
    """``vllm.v1.core.kv_cache_utils`` and ``vllm.v1.engine.core`` as module objects, the
    engine core holding the name it imported from kv_cache_utils."""
    utils = types.ModuleType("vllm.v1.core.kv_cache_utils")
    utils.get_request_block_hasher = vllm_like_hasher  # type: ignore[attr-defined]
    engine = types.ModuleType("vllm.v1.engine.core")
    engine.get_request_block_hasher = vllm_like_hasher  # type: ignore[attr-defined]
    core = types.ModuleType("vllm.v1.core")
    core.kv_cache_utils = utils  # type: ignore[attr-defined]
    for name, module in (("vllm", types.ModuleType("vllm")),
                         ("vllm.v1", types.ModuleType("vllm.v1")), ("vllm.v1.core", core),
                         ("vllm.v1.core.kv_cache_utils", utils),
                         ("vllm.v1.engine.core", engine)):
        monkeypatch.setitem(sys.modules, name, module)
    yield utils, engine
    packing.uninstall()


def test_install_patches_where_the_engine_finds_the_factory_and_uninstall_restores(
        fake_vllm) -> None:
    utils, engine = fake_vllm
    packing.install()
    packing.install()  # idempotent: wrapped once
    assert packing.installed()
    for module in (utils, engine):
        assert module.get_request_block_hasher.__wrapped__ is vllm_like_hasher
    request = Request(list(range(9)), engine.get_request_block_hasher(BLOCK))
    assert type(request.block_hashes) is BlockHashList
    packing.uninstall()
    assert not packing.installed()
    assert utils.get_request_block_hasher is vllm_like_hasher
    assert engine.get_request_block_hasher is vllm_like_hasher


def test_install_leaves_a_factory_someone_else_replaced(fake_vllm) -> None:
    utils, engine = fake_vllm

    def theirs(*args):
        return vllm_like_hasher(*args)

    engine.get_request_block_hasher = theirs
    packing.install()
    assert engine.get_request_block_hasher is theirs
    packing.uninstall()
    assert engine.get_request_block_hasher is theirs


def test_the_switch_is_typed_before_vllm_is_imported(monkeypatch) -> None:
    with pytest.raises(InvalidConfig, match="pack_hashes must be True or False"):
        dropin.install("fast", pack_hashes="yes")  # type: ignore[arg-type]
    monkeypatch.setenv("KVPOOL_VLLM_BACKEND", "fast")
    monkeypatch.setenv("KVPOOL_VLLM_PACK_HASHES", "maybe")
    with pytest.raises(InvalidConfig, match="KVPOOL_VLLM_PACK_HASHES must be 1 or 0"):
        dropin.register()  # (without vLLM installed, importing it first would fail otherwise)


def test_a_hasher_or_factory_that_is_not_callable_is_a_typed_error() -> None:
    for make in (packing.packing_block_hasher, packing.packing_factory):
        with pytest.raises(InvalidConfig, match="must be callable, got 5"):
            make(5)  # type: ignore[arg-type]
