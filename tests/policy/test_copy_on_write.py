"""Partial prefix hits and copy-on-write (BEHAVIOUR.md §10.4, vLLM 0.33's extension).

A hybrid full-attention + Mamba (align) model hashed at 16 tokens with 32-token blocks: a
prompt's last hash boundary (``prompt − 1`` rounded down to 16) may lie inside a block. The
owner registers a *partial* entry there; a later request that hits it shares a block it
will write past, so it gets a private copy (new request), or the owner moves the entry to a
fresh copy before overwriting its state (running request). The copies and the blocks held
for them are handed to the GPU layer by ``take_kv_cache_block_copies``.
"""

from __future__ import annotations

import pytest

from kvpool.errors import InvalidConfig, KvPoolError, NotRetained
from kvpool.policy import (
    BlockCopy,
    FullAttentionSpec,
    MambaSpec,
    RequestStatus,
    SlidingWindowSpec,
)

from .helpers import manager, request

FULL32 = FullAttentionSpec(block_size=32)
MAMBA32 = MambaSpec(block_size=32, mamba_cache_mode="align")
BACKENDS = ("spec", "reference", "fast")


def cow_manager(backend: str = "reference", num_blocks: int = 32, **kw: object):
    return manager(FULL32, MAMBA32, num_blocks=num_blocks, hbs=16, sbs=32, backend=backend,
                   allow_partial_hash_hits=True, enable_kv_cache_events=True, **kw)


def refs(m, *blocks: int) -> list[int]:
    return m.block_pool.observe().ref_cnts(list(blocks))


def producer(m):
    """``a``: a 60-token prompt computed up to its last hash boundary (48) in one chunk,
    so both groups register a partial entry at 48 tokens inside their second block."""
    a = request("a", list(range(60)))
    assert m.allocate_slots(a, 48) is not None
    a.num_computed_tokens, a.status = 48, RequestStatus.RUNNING
    m.new_step_starts()
    return a


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_request_gets_a_private_copy_of_the_shared_tail(backend: str) -> None:
    m = cow_manager(backend)
    a = producer(m)
    (fa_a, mamba_a) = m.get_block_ids("a")
    b = request("b", list(range(56)) + [999] * 4)
    hits, n = m.get_computed_blocks(b)
    assert n == 48  # inside the second 32-token block
    assert hits.get_block_ids() == (fa_a, [0, mamba_a[1]])
    free_before = m.block_pool.get_num_free_blocks()
    new = m.allocate_slots(b, b.num_tokens - n, n, hits)
    fa_b, mamba_b = m.get_block_ids("b")
    # The shared tails are replaced by fresh blocks, reported as newly allocated.
    assert fa_b[0] == fa_a[0] and fa_b[1] not in fa_a
    assert mamba_b[1] not in mamba_a
    assert new.get_block_ids() == ([fa_b[1]], [mamba_b[1]])
    assert free_before - m.block_pool.get_num_free_blocks() == 2
    # dst: table + retention; source: a's table + b's hit ref, now a retention.
    assert refs(m, fa_b[1], mamba_b[1]) == [2, 2]
    assert refs(m, fa_a[1], mamba_a[1]) == [2, 2]
    # The copy is keyed once it is full: the cached count stops before it.
    fa_manager = m.coordinator.single_type_managers[0]
    assert fa_manager.num_cached_block["b"] == 1
    copies, retained = m.take_kv_cache_block_copies()
    assert copies == [BlockCopy(fa_a[1], fa_b[1], 0), BlockCopy(mamba_a[1], mamba_b[1], 1)]
    assert retained == [fa_a[1], fa_b[1], mamba_a[1], mamba_b[1]]
    assert m.take_kv_cache_block_copies() == ([], [])  # drained
    m.release_copy_endpoints(retained)
    assert refs(m, fa_b[1], mamba_b[1], fa_a[1], mamba_a[1]) == [1, 1, 1, 1]
    assert m.retained_copy_endpoints == {}
    m.free(b)
    m.free(a)
    assert m.usage == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_running_request_keeps_its_block_and_the_entry_moves(backend: str) -> None:
    m = cow_manager(backend)
    a = producer(m)
    source = m.get_block_ids("a")[1][1]
    table_before = m.get_block_ids("a")
    assert m.allocate_slots(a, 12) is not None  # the next step overwrites the state
    assert m.get_block_ids("a") == table_before  # append-only for the worker
    copies, retained = m.take_kv_cache_block_copies()
    assert len(copies) == 1 and copies[0].src_block_id == source and copies[0].group_id == 1
    dst = copies[0].dst_block_id
    assert dst not in m.get_block_ids("a")[1]
    assert refs(m, source, dst) == [2, 1]  # source: table + retention; dst: retention
    # The entry lives on dst now; a hit in the same step is deferred (the copy runs
    # with this step's forward), the next step it is served from dst.
    b = request("b", list(range(56)) + [7] * 4)
    hits, n = m.get_computed_blocks(b)
    assert n == 48 and hits.get_block_ids()[1] == [0, dst]
    assert m.allocate_slots(b, b.num_tokens - n, n, hits) is None
    m.release_copy_endpoints(retained)
    assert refs(m, source, dst) == [1, 0]  # dst is a cached candidate in the free queue
    m.new_step_starts()
    hits, n = m.get_computed_blocks(b)
    assert m.allocate_slots(b, b.num_tokens - n, n, hits) is not None
    copies, _ = m.take_kv_cache_block_copies()
    assert [(c.src_block_id, c.group_id) for c in copies][-1] == (dst, 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("num_blocks", "fits"), [(7, False), (8, True)])
def test_the_copy_block_is_reserved_by_sizing(backend: str, num_blocks: int,
                                              fits: bool) -> None:
    """One extra block per partially hit group, though the hit covers b's whole table:
    with one free block b does not fit (``None``, nothing touched); with two it does."""
    m = cow_manager(backend, num_blocks=num_blocks)
    producer(m)  # holds 2 + 1 blocks
    assert m.allocate_slots(request("f", [5000 + i for i in range(32)]), 32) is not None
    assert m.block_pool.get_num_free_blocks() == num_blocks - 6
    b = request("b", list(range(56)) + [3] * 4)
    hits, n = m.get_computed_blocks(b)
    assert m.coordinator.get_num_blocks_to_allocate(
        "b", b.num_tokens, hits.blocks, 0, n, b.num_tokens, num_local_computed_tokens=n) == 2
    before = m.block_pool.abstract()
    out = m.allocate_slots(b, b.num_tokens - n, n, hits)
    assert (out is not None) is fits
    if not fits:
        assert m.block_pool.abstract() == before and m.get_block_ids("b") == ([], [])


def test_partial_hits_are_opt_in_and_need_a_supporting_configuration() -> None:
    off = manager(FULL32, MAMBA32, num_blocks=32, hbs=16, sbs=32)
    assert not off.partial_hash_hits_enabled
    a = producer(off)
    hits, n = off.get_computed_blocks(request("b", list(range(56)) + [1] * 4))
    assert n == 0 and off.take_kv_cache_block_copies() == ([], [])  # no state at 32
    off.free(a)
    # Asked for, but no Mamba align group hashed finer than its blocks: vLLM 0.33 turns
    # it off silently, and so does kvpool (the property tells).
    swa = manager(FULL32, SlidingWindowSpec(block_size=16, sliding_window=32), num_blocks=32,
                  hbs=16, sbs=32, allow_partial_hash_hits=True)
    assert not swa.partial_hash_hits_enabled
    with pytest.raises(InvalidConfig, match="EAGLE"):
        manager(FULL32, MAMBA32, num_blocks=32, hbs=16, sbs=32, use_eagle=True,
                allow_partial_hash_hits=True)


def test_releasing_anything_but_a_retained_endpoint_is_refused_and_changes_nothing() -> None:
    m = cow_manager()
    a = producer(m)
    b = request("b", list(range(56)) + [999] * 4)
    hits, n = m.get_computed_blocks(b)
    m.allocate_slots(b, b.num_tokens - n, n, hits)
    with pytest.raises(NotRetained):  # pending, not yet handed out
        m.release_copy_endpoints([m.get_block_ids("b")[0][1]])
    _, retained = m.take_kv_cache_block_copies()
    table_block = m.get_block_ids("a")[0][0]
    for bad in ([table_block], [retained[0], table_block], retained + retained[:1], [-1]):
        before = (m.block_pool.abstract(), m.retained_copy_endpoints)
        with pytest.raises(NotRetained) as info:
            m.release_copy_endpoints(bad)
        assert isinstance(info.value, (KvPoolError, ValueError))
        assert (m.block_pool.abstract(), m.retained_copy_endpoints) == before
    m.release_copy_endpoints(retained[:2])
    with pytest.raises(NotRetained):
        m.release_copy_endpoints(retained[:1])  # released twice
    m.release_copy_endpoints(retained[2:])
    m.free(a)
    m.free(b)
    assert m.usage == 0.0


def test_two_copies_of_one_source_retain_it_twice() -> None:
    m = cow_manager()
    producer(m)
    for rid in ("b", "c"):
        r = request(rid, list(range(56)) + [ord(rid)] * 4)
        hits, n = m.get_computed_blocks(r)
        assert n == 48 and m.allocate_slots(r, r.num_tokens - n, n, hits) is not None
    copies, retained = m.take_kv_cache_block_copies()
    source = m.get_block_ids("a")[0][1]
    assert [c.src_block_id for c in copies if c.group_id == 0] == [source, source]
    assert m.retained_copy_endpoints[source] == 2
    assert refs(m, source) == [3]  # a's table + two retentions
    m.release_copy_endpoints([source])
    assert refs(m, source) == [2] and m.retained_copy_endpoints[source] == 1


def test_partial_entries_are_stored_at_hash_granularity_and_promoted_when_full() -> None:
    from kvpool.events import BlockRemoved, BlockStored

    m = cow_manager()
    a = producer(m)
    stored = [e for e in m.take_events() if isinstance(e, BlockStored)]
    partial = [e for e in stored if e.block_size == 16]
    assert sorted(e.group_idx for e in partial) == [0, 1]  # both groups, one hash each
    assert all(len(e.block_hashes) == 1 and len(e.token_ids) == 16 for e in partial)
    fa_tail = m.get_block_ids("a")[0][1]
    assert m.block_pool.observe().key_tokens(fa_tail) == 48
    a.status = RequestStatus.RUNNING
    assert m.allocate_slots(a, 12) is not None  # the rest of the prompt (60 tokens)
    a.num_computed_tokens = 60
    a.append_output_token_ids([1, 2, 3, 4])
    assert m.allocate_slots(a, 4) is not None   # 64 tokens: the full-attention tail is full
    events = m.take_events()
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert any(e.group_idx == 0 for e in removed)  # the partial entry made way
    assert m.block_pool.observe().key_tokens(fa_tail) == 64
