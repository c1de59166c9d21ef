"""The wire encoding: golden bytes from vLLM 0.33's encoder, decoding, and what cannot be sent."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("msgspec")

from kvpool.events import BlockStored, replay  # noqa: E402
from kvpool.wire.encoding import (  # noqa: E402
    BatchEncoder,
    WireBlockStored,
    decode_batch,
    encode_batch,
    from_wire,
)

from .cases import CASES  # noqa: E402

# Produced by vLLM 0.33.0 (tests/wire/vllm_encode.py under the kit's python) for CASES.
GOLDEN = {
    "empty_batch": (
        "93cb000000000000000090c0"
    ),
    "cleared_rank_0": (
        "93cb3ff80000000000009181a474797065b0416c6c426c6f636b73436c656172656400"
    ),
    "stored_minimal": (
        "93cb41d954fc4007e6b491de0009a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
        "9201cfffffffffffffffffb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647393010203"
        "aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a9"
        "67726f75705f69647800c0"
    ),
    "stored_every_field": (
        "93cb41d954fc4020000091de0010a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
        "92cf800000000000000007b1706172656e745f626c6f636b5f68617368cd3039a9746f6b656e5f696473dc00"
        "20000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1faa626c6f636b5f73697a65"
        "10a76c6f72615f696403a66d656469756da3435055a96c6f72615f6e616d65a9616461707465722d61aa6578"
        "7472615f6b6579739293a9616461707465722d6192a5696d672d3004a473616c74c0a967726f75705f696478"
        "02b26b765f63616368655f737065635f6b696e64ae736c6964696e675f77696e646f77bc6b765f6361636865"
        "5f737065635f736c6964696e675f77696e646f77cc80a86c6f63616c697479a54c4f43414ca96f776e657273"
        "686970a6746965722d32aa73657373696f6e5f6964a6736573732d39b36c6f6f6b61686561645f746f6b656e"
        "5f69647392922021912203"
    ),
    "stored_bytes_hashes": (
        "93cb400200000000000091de0008a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
        "92c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fc4201f1e1d1c1b1a19"
        "1817161514131211100f0e0d0c0b0a09080706050403020100b1706172656e745f626c6f636b5f68617368c4"
        "10000102030405060708090a0b0c0d0e0fa9746f6b656e5f696473dc00100000000000000000000000000000"
        "0000aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756dc0a96c6f72615f6e616d65c001"
    ),
    "removed": (
        "93cb40080000000000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391"
        "cfffffffffffffffffa66d656469756da3475055a967726f75705f69647800c0"
    ),
    "removed_every_field": (
        "93cb40100000000000009186a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391"
        "c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fa66d656469756da34750"
        "55a967726f75705f69647805a86c6f63616c697479a652454d4f5445a96f776e657273686970a16f07"
    ),
    "mixed": (
        "93cb800000000000000094de0009a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
        "9201cfffffffffffffffffb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647393010203"
        "aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a9"
        "67726f75705f6964780084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739101"
        "a66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c65617265"
        "64de0010a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf8000000000000000"
        "07b1706172656e745f626c6f636b5f68617368cd3039a9746f6b656e5f696473dc0020000102030405060708"
        "090a0b0c0d0e0f101112131415161718191a1b1c1d1e1faa626c6f636b5f73697a6510a76c6f72615f696403"
        "a66d656469756da3435055a96c6f72615f6e616d65a9616461707465722d61aa65787472615f6b6579739293"
        "a9616461707465722d6192a5696d672d3004a473616c74c0a967726f75705f69647802b26b765f6361636865"
        "5f737065635f6b696e64ae736c6964696e675f77696e646f77bc6b765f63616368655f737065635f736c6964"
        "696e675f77696e646f77cc80a86c6f63616c697479a54c4f43414ca96f776e657273686970a6746965722d32"
        "aa73657373696f6e5f6964a6736573732d39b36c6f6f6b61686561645f746f6b656e5f696473929220219122"
        "cdffff"
    ),
}


@pytest.mark.parametrize("name, events, ts, rank", CASES, ids=[c[0] for c in CASES])
def test_a_batch_encodes_to_the_bytes_vllm_produces(name, events, ts, rank):
    assert encode_batch(events, ts, rank).hex() == GOLDEN[name]


def test_every_case_has_golden_bytes():
    assert sorted(GOLDEN) == sorted(name for name, *_ in CASES)


@pytest.mark.parametrize("name, events, ts, rank", CASES, ids=[c[0] for c in CASES])
def test_decoding_gives_back_every_field_but_the_event_seq(name, events, ts, rank):
    batch = decode_batch(bytes.fromhex(GOLDEN[name]))
    assert batch.ts == ts and batch.data_parallel_rank == rank
    back = [from_wire(e, seq=original.seq) for e, original in zip(batch.events, events,
                                                                  strict=True)]
    assert [_plain(e) for e in back] == [_plain(e) for e in events]


def test_numpy_token_ids_encode_as_the_same_ints():
    plain = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[5, 6],
                        block_size=16, lora_id=None, medium="GPU", group_idx=0)
    numpy_ids = BlockStored(block_hashes=[1], parent_block_hash=None,
                            token_ids=list(np.array([5, 6], dtype=np.int64)), block_size=16,
                            lora_id=None, medium="GPU", group_idx=0)
    assert encode_batch([numpy_ids], 1.0) == encode_batch([plain], 1.0)


def test_something_that_is_not_an_event_is_refused():
    with pytest.raises(TypeError, match="not a kvpool KV event"):
        BatchEncoder().encode(["BlockStored"], 1.0)


def test_a_payload_that_is_not_a_batch_is_a_decode_error():
    import msgspec

    with pytest.raises(msgspec.DecodeError):
        decode_batch(b"\x92\x01\x02")


def test_replaying_decoded_events_gives_the_index_of_the_originals():
    _, events, ts, _ = CASES[-1]
    batch = decode_batch(encode_batch(events, ts))
    decoded = [from_wire(e, seq=i) for i, e in enumerate(batch.events)]
    renumbered = [type(e)(**{**_fields(e), "seq": i}) for i, e in enumerate(events)]
    assert replay(decoded) == replay(renumbered)
    assert isinstance(batch.events[0], WireBlockStored)


def _fields(event):
    import dataclasses

    return {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}


def _plain(value):
    """Tuples and lists compare equal: msgpack has one array type."""
    import dataclasses

    if dataclasses.is_dataclass(value):
        return (type(value).__name__, {k: _plain(v) for k, v in _fields(value).items()})
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
