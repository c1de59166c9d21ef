"""Event batches whose encoding is pinned: golden bytes from vLLM 0.33's own encoder.

Each case is ``(name, events, ts, data_parallel_rank)``; :data:`GOLDEN` holds the payload vLLM
0.33.0's ``msgspec.msgpack.Encoder().encode(KVEventBatch(...))`` produced for it (regenerate
with ``tests/wire/vllm_encode.py`` under the kit's python). The cases cover every field of
every event, default and non-default, int and bytes hashes, and a batch with and without rank.
"""

from __future__ import annotations

from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored

MAX_U64 = 2**64 - 1
SHA = bytes(range(32))


def _stored_minimal() -> BlockStored:
    return BlockStored(block_hashes=[1, MAX_U64], parent_block_hash=None, token_ids=[1, 2, 3],
                       block_size=16, lora_id=None, medium="GPU", group_idx=0, seq=0)


def _stored_everything() -> BlockStored:
    return BlockStored(
        block_hashes=[2**63, 7], parent_block_hash=12345, token_ids=list(range(32)),
        block_size=16, lora_id=3, medium="CPU", lora_name="adapter-a",
        extra_keys=[("adapter-a", ("img-0", 4), "salt"), None], group_idx=2,
        kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128,
        locality="LOCAL", ownership="tier-2", session_id="sess-9",
        lookahead_token_ids=[[32, 33], [34]], seq=1,
    )


def _stored_bytes() -> BlockStored:
    return BlockStored(block_hashes=[SHA, SHA[::-1]], parent_block_hash=SHA[:16],
                       token_ids=[0] * 16, block_size=16, lora_id=None, medium=None,
                       group_idx=None, seq=2)


CASES = [
    ("empty_batch", [], 0.0, None),
    ("cleared_rank_0", [AllBlocksCleared(seq=0)], 1.5, 0),
    ("stored_minimal", [_stored_minimal()], 1700000000.123456, None),
    ("stored_every_field", [_stored_everything()], 1700000000.5, 3),
    ("stored_bytes_hashes", [_stored_bytes()], 2.25, 1),
    ("removed", [BlockRemoved(block_hashes=[MAX_U64], medium="GPU", group_idx=0, seq=0)],
     3.0, None),
    ("removed_every_field", [BlockRemoved(block_hashes=[SHA], medium="GPU", group_idx=5,
                                          locality="REMOTE", ownership="o", seq=0)], 4.0, 7),
    ("mixed", [_stored_minimal(), BlockRemoved(block_hashes=[1], medium="GPU", group_idx=0),
               AllBlocksCleared(), _stored_everything()], -0.0, 65535),
]
