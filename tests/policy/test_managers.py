"""Single-type manager rules (BEHAVIOUR.md §8), each on a crafted scenario."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvpool.errors import CachingDisabled, HashStateError
from kvpool.policy import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    RSWASpec,
    SlidingWindowSpec,
)
from kvpool.policy.full_attention import FullAttentionManager
from kvpool.policy.mamba import MambaManager
from kvpool.policy.sliding_window import SlidingWindowManager

from .helpers import manager, request, run_prefill

FULL = FullAttentionSpec(block_size=16)


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_full_attention_hit_is_the_longest_cached_prefix_minus_the_last_token(backend) -> None:
    m = manager(FULL, backend=backend)
    a = request("a", tokens(64))
    run_prefill(m, a)
    b = request("b", tokens(64))  # fully cached, block aligned: loses its whole last block
    hits, n = m.get_computed_blocks(b)
    assert n == 48 and hits.get_block_ids() == (m.get_block_ids("a")[0][:3],)
    c = request("c", tokens(40) + [9999] * 30)
    assert m.get_computed_blocks(c)[1] == 32


def test_eagle_lookup_drops_the_last_hit_block() -> None:
    m = manager(FULL, use_eagle=True)
    run_prefill(m, request("a", tokens(80)))
    assert m.get_computed_blocks(request("b", tokens(80)))[1] == 48


def test_lookup_touches_nothing_until_allocate_slots() -> None:
    m = manager(FULL, num_blocks=8)
    a = request("a", tokens(64))
    run_prefill(m, a)
    m.free(a)
    free = m.block_pool.get_num_free_blocks()
    hits, n = m.get_computed_blocks(request("b", tokens(64)))
    assert n == 48 and m.block_pool.get_num_free_blocks() == free


def test_evictable_hits_count_against_the_budget() -> None:
    m = manager(FULL, num_blocks=6)  # 5 usable
    a = request("a", tokens(64))
    run_prefill(m, a)  # 4 blocks
    m.free(a)  # all 4 cached and free
    b = request("b", tokens(64) + tokens(33, 500))  # 97 tokens: 7 blocks, 3 hit (capped)
    hits, n = m.get_computed_blocks(b)
    assert n == 64 - 16 or n == 64
    mgr = m.coordinator.single_type_managers[0]
    need = mgr.get_num_blocks_to_allocate("b", 97, hits.blocks[0], n, 97)
    assert need == (7 - len(hits.blocks[0])) + len(hits.blocks[0])  # new + evictable hits
    assert m.allocate_slots(b, 97 - n, n, hits) is None  # 7 > 5 free
    assert m.block_pool.observe().ref_cnts(list(hits.blocks[0])) == [0] * len(hits.blocks[0])


def test_free_releases_the_table_tail_first() -> None:
    m = manager(FULL, num_blocks=10)
    a = request("a", tokens(40))  # 3 blocks, 2 full (cached), 1 partial
    run_prefill(m, a)
    table = m.get_block_ids("a")[0]
    m.free(a)
    queue = m.block_pool.observe().queue_front(9)
    # The partial tail (no key) goes to the front; the cached ones to the tail, tail first.
    assert queue[0] == table[2]
    assert queue[-2:] == [table[1], table[0]]


def test_sliding_window_nulls_out_of_window_blocks_tail_first() -> None:
    m = manager(FULL, SlidingWindowSpec(block_size=16, sliding_window=32), num_blocks=40,
                sbs=16)
    a = request("a", tokens(100))
    run_prefill(m, a)
    swa = m.coordinator.single_type_managers[1]
    table_before = list(swa.req_to_blocks["a"])
    freed: list[list[int]] = []
    original = m.block_pool.free_blocks
    m.block_pool.free_blocks = lambda ids: (freed.append(list(ids)), original(ids))[1]
    try:
        a.append_output_token_ids([7])
        assert m.allocate_slots(a, 1) is not None  # computed 100: skipped = 69 → 4 blocks
    finally:
        m.block_pool.free_blocks = original
    table = swa.req_to_blocks["a"]
    assert table[:4] == [0, 0, 0, 0] and table[4:7] == table_before[4:7]
    assert freed == [table_before[3::-1]]  # one call, tail first


def test_sliding_window_hit_is_the_last_window_with_nulls_before() -> None:
    spec = SlidingWindowSpec(block_size=16, sliding_window=32)
    m = manager(FULL, spec, num_blocks=40, sbs=16)
    run_prefill(m, request("a", tokens(100)))
    hits, n = m.get_computed_blocks(request("b", tokens(100)))
    assert n == 96
    swa_hits = hits.blocks[1]
    assert len(swa_hits) == 6 and list(swa_hits[:4]) == [0, 0, 0, 0] and 0 not in swa_hits[4:]


def test_sliding_window_reachability_mask_keeps_each_segments_tail() -> None:
    spec = SlidingWindowSpec(block_size=16, sliding_window=20)  # needs 2 blocks
    mask = SlidingWindowManager.reachable_block_mask(0, 8, 64, spec, False)
    assert mask == [False, False, True, True] * 2
    # EAGLE: one block more per run, shifted by the block the lookup drops.
    assert SlidingWindowManager.reachable_block_mask(0, 8, 64, spec, True) == \
        [False, False, True, True, True, False, True, True]
    assert SlidingWindowManager.reachable_block_mask(0, 8, 16, spec, False) is None
    # A retention interval no longer than a hit's run keys every block, EAGLE or not.
    for eagle in (False, True):
        assert SlidingWindowManager.reachable_block_mask(0, 8, 64, spec, eagle, 32) is None
    assert SlidingWindowManager.reachable_block_mask(0, 4, 64, spec, False, 0, 100) == \
        [False, False, True, True]  # retention 0: only the run ending at the boundary


def test_chunked_local_hit_nulls_everything_before_the_current_chunk() -> None:
    m = manager(FULL, ChunkedLocalAttentionSpec(block_size=16, attention_chunk_size=64),
                num_blocks=40)
    run_prefill(m, request("a", tokens(100)))
    hits, n = m.get_computed_blocks(request("b", tokens(100)))
    assert n == 96
    assert list(hits.blocks[1][:4]) == [0, 0, 0, 0] and len(hits.blocks[1]) == 6


def test_full_attention_common_prefix_counts_blocks_every_request_holds() -> None:
    m = manager(FULL, num_blocks=20)
    run_prefill(m, request("a", tokens(64)))
    b = request("b", tokens(40) + [777] * 10)
    run_prefill(m, b)
    assert m.get_num_common_prefix_blocks("a") == [2]


def test_rswa_frees_the_gap_between_prompt_and_window() -> None:
    spec = RSWASpec(block_size=16, rswa_window=32)
    m = manager(spec, num_blocks=40)
    a = request("a", tokens(20))
    run_prefill(m, a)
    for _ in range(80):
        a.append_output_token_ids([1])
        assert m.allocate_slots(a, a.num_tokens - a.num_computed_tokens) is not None
        a.num_computed_tokens = a.num_tokens
    table = m.get_block_ids("a")[0]
    # prompt = 2 blocks kept; gap up to (computed - 32) // 16 nulled; window kept.
    gap_end = (99 - 32) // 16
    assert table[:2] != [0, 0] and table[2:gap_end] == [0] * (gap_end - 2)
    assert 0 not in table[gap_end:]


def prefill_in_aligned_chunks(m, r, chunk: int = 96) -> None:
    """Align mode checkpoints a state only where a chunk ends on a block boundary."""
    assert m.allocate_slots(r, chunk) is not None
    r.num_computed_tokens = chunk
    assert m.allocate_slots(r, r.num_tokens - chunk) is not None
    r.num_computed_tokens = r.num_tokens


def test_mamba_hit_is_the_newest_aligned_state_only() -> None:
    m = manager(FULL, MambaSpec(block_size=32, mamba_cache_mode="align"), num_blocks=40)
    prefill_in_aligned_chunks(m, request("a", tokens(100)))
    m.new_step_starts()
    hits, n = m.get_computed_blocks(request("b", tokens(100)))
    assert n == 96
    assert list(hits.blocks[1][:2]) == [0, 0] and hits.blocks[1][2] != 0


def test_mamba_state_cached_this_step_is_not_hit_until_the_next_step() -> None:
    m = manager(FULL, MambaSpec(block_size=32, mamba_cache_mode="align"), num_blocks=40)
    prefill_in_aligned_chunks(m, request("a", tokens(100)))
    b = request("b", tokens(100))
    hits, n = m.get_computed_blocks(b)
    assert n == 96
    assert m.allocate_slots(b, 4, n, hits) is None  # deferred: may not be computed yet
    m.new_step_starts()
    hits, n = m.get_computed_blocks(b)
    assert m.allocate_slots(b, 4, n, hits) is not None


def test_mamba_align_relocates_speculative_blocks_to_the_end() -> None:
    m = manager(FULL, MambaSpec(block_size=16, mamba_cache_mode="align",
                                num_speculative_blocks=1), num_blocks=40)
    mamba = m.coordinator.single_type_managers[1]
    assert isinstance(mamba, MambaManager)
    a = request("a", tokens(40))
    assert m.allocate_slots(a, 40) is not None
    first = list(mamba.req_to_blocks["a"])  # [null, null, state, spec]
    assert first[:2] == [0, 0] and 0 not in first[2:] and len(first) == 4
    a.num_computed_tokens = 40
    a.append_output_token_ids(list(range(32)))  # 72 tokens: the state jumps two blocks
    assert m.allocate_slots(a, 32) is not None
    table = mamba.req_to_blocks["a"]
    assert table[:3] == [0, 0, first[2]] and table[3] == 0  # old spec slot emptied...
    assert table[4] == first[3] and len(table) == 6  # ...its block moved to the new state
    assert mamba.last_state_block_idx["a"] == 2  # freed once the next step is past it


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_mamba_align_refuses_to_relocate_a_shared_speculative_block(backend) -> None:
    """vLLM 0.33 asserts is_block_writable before moving a speculative block: a block that
    another holder reads would be written under it. A typed error, and nothing changed."""
    m = manager(FULL, MambaSpec(block_size=16, mamba_cache_mode="align",
                                num_speculative_blocks=1), num_blocks=40, backend=backend)
    mamba = m.coordinator.single_type_managers[1]
    a = request("a", tokens(40))
    assert m.allocate_slots(a, 40) is not None
    speculative = mamba.req_to_blocks["a"][3]
    m.block_pool.touch([speculative])  # a second holder: no longer writable in place
    a.num_computed_tokens = 40
    a.append_output_token_ids(list(range(32)))
    tables, pool = m.get_block_ids("a"), m.block_pool.abstract()
    with pytest.raises(HashStateError, match="relocated"):
        m.allocate_slots(a, 32)
    assert m.get_block_ids("a") == tables and m.block_pool.abstract() == pool


def test_cross_attention_is_sized_by_encoder_tokens_and_never_cached() -> None:
    m = manager(FULL, CrossAttentionSpec(block_size=16), enable_caching=False)
    a = request("a", tokens(20))
    out = m.allocate_slots(a, 20, num_encoder_tokens=50)
    assert [len(g) for g in out.get_block_ids()] == [2, 4]
    cross = m.coordinator.single_type_managers[1]
    with pytest.raises(CachingDisabled):
        cross.cache_blocks(a, 16)


def test_managers_hold_no_backend_objects() -> None:
    m = manager(FULL, backend="fast")
    mgr = m.coordinator.single_type_managers[0]
    assert isinstance(mgr, FullAttentionManager)
    run_prefill(m, request("a", tokens(40)))
    assert all(type(b) is int for b in mgr.req_to_blocks["a"])


def test_mamba_align_sizing_counts_the_external_block_so_nothing_fails_half_way() -> None:
    """vLLM 0.25.1 counts 1 Mamba block here, takes 2, and raises after allocating (§12)."""
    m = manager(FULL, MambaSpec(block_size=32, mamba_cache_mode="align"), num_blocks=6)
    a = request("a", tokens(52))  # full: 4 blocks; Mamba: 1 external + 1 state = 6 > 5
    before = m.block_pool.abstract()
    assert m.allocate_slots(a, 33, num_external_computed_tokens=19) is None
    assert m.block_pool.abstract() == before
    m2 = manager(FULL, MambaSpec(block_size=32, mamba_cache_mode="align"), num_blocks=7)
    out = m2.allocate_slots(request("a", tokens(52)), 33, num_external_computed_tokens=19)
    # Only allocate_new_blocks' blocks are returned; the external ones are in the tables.
    assert [len(g) for g in out.get_block_ids()] == [2, 1]
    assert [len(t) for t in m2.get_block_ids("a")] == [4, 2]
    assert m2.block_pool.get_num_free_blocks() == 0


@pytest.mark.parametrize("window", [20, 33, 64, 200])
@pytest.mark.parametrize("sbs", [None, 16, 32, 64])
@pytest.mark.parametrize("retention", [None, 0, 128])
@pytest.mark.parametrize("eagle", [False, True])
def test_keys_every_block_means_no_write_is_ever_masked(window, sbs, retention, eagle) -> None:
    """``keys_every_block`` (the hybrid fast policy skips the mask when it holds) is true
    exactly when every range's mask is ``None``; the base rule always keys every block."""
    spec = SlidingWindowSpec(block_size=16, sliding_window=window)
    m = SlidingWindowManager.__new__(SlidingWindowManager)  # the rule reads these alone
    m.kv_cache_spec, m.block_size, m.scheduler_block_size, m.use_eagle = spec, 16, sbs, eagle
    request = SimpleNamespace(num_prompt_tokens=300)
    masks = [m.write_mask(request, start, stop, retention)
             for start in range(12) for stop in range(start + 1, 14)]
    assert m.keys_every_block(retention) == all(mask is None for mask in masks)
    full = FullAttentionManager.__new__(FullAttentionManager)
    assert full.keys_every_block(retention)
