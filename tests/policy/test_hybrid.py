"""The hybrid coordinator's fixed point (BEHAVIOUR.md §9) and invariant 26."""

from __future__ import annotations

from kvpool.policy import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from kvpool.policy.hybrid import HybridKVCacheCoordinator

from .helpers import manager, request

FULL = FullAttentionSpec(block_size=16)


def prefill_in_chunks(m, r, chunk: int) -> None:
    while r.num_computed_tokens < r.num_tokens:
        n = min(chunk, r.num_tokens - r.num_computed_tokens)
        assert m.allocate_slots(r, n) is not None
        r.num_computed_tokens += n
        m.new_step_starts()


def eagle_mamba():
    m = manager(FULL, MambaSpec(block_size=32, mamba_cache_mode="align"), num_blocks=64,
                use_eagle=True)
    prefill_in_chunks(m, request("a", list(range(128))), 32)
    return m, request("b", list(range(128)) + [5000] * 22)


def test_eagle_mamba_hit_never_exceeds_the_full_attention_blocks() -> None:
    m, b = eagle_mamba()
    hits, n = m.get_computed_blocks(b)
    assert n == 96
    assert len(hits.blocks[0]) * 16 == n and len(hits.blocks[1]) * 32 == n


def test_without_the_cap_the_hit_would_outgrow_full_attention(monkeypatch) -> None:
    """The 0.25.1 behaviour the cap prevents (BEHAVIOUR.md §9, §12): reproduced here only by
    disabling the cap, to show the test above would fail without it."""
    monkeypatch.setattr(HybridKVCacheCoordinator, "_cap_by_full_attention",
                        lambda self, hits, hit, hashes: hit)
    m, b = eagle_mamba()
    hits, n = m.get_computed_blocks(b)
    assert n == 128 and len(hits.blocks[0]) * 16 < n


def test_every_full_attention_group_is_cut_to_the_hit() -> None:
    """0.33's fix: a second full-attention spec group is truncated too."""
    swa = SlidingWindowSpec(block_size=16, sliding_window=24)
    m = manager(FULL, FullAttentionSpec(block_size=16, head_size=64), swa, num_blocks=80)
    a = request("a", list(range(100)))
    prefill_in_chunks(m, a, 100)
    swa_mgr = m.coordinator.single_type_managers[2]
    # Make the window group miss from block 3 on: evict its cached blocks there.
    m.evict_blocks(swa_mgr.req_to_blocks["a"][3:])
    hits, n = m.get_computed_blocks(request("b", list(range(100))))
    assert n == 48  # the window group's last run ends at block 3
    assert [len(h) for h in hits.blocks] == [3, 3, 3]  # 0.25.1 left group 1 with 6


def test_hybrid_hits_are_multiples_of_the_scheduler_block_size() -> None:
    m = manager(FullAttentionSpec(block_size=32),
                SlidingWindowSpec(block_size=16, sliding_window=40), num_blocks=64)
    prefill_in_chunks(m, request("a", list(range(90))), 90)
    hits, n = m.get_computed_blocks(request("b", list(range(90))))
    assert n % 32 == 0 and n == 64
    assert len(hits.blocks[0]) == 2 and len(hits.blocks[1]) == 4


def test_find_longest_cache_hit_per_group_looks_up_each_group_alone() -> None:
    """§9: every spec group at the cap on its own — no common length (a KV connector reads
    what each group holds); pure. The common hit is the shortest of them here."""
    m = manager(FULL, MambaSpec(block_size=32, mamba_cache_mode="align"), num_blocks=64)
    prefill_in_chunks(m, request("a", list(range(128))), 64)  # Mamba states at 64, 128
    b = request("b", list(range(120)) + [5000] * 30)
    before = m.block_pool.abstract()
    blocks, lengths = m.coordinator.find_longest_cache_hit_per_group(b.block_hashes, 149)
    assert lengths == (96, 64)  # full attention: 7 blocks cut to the 32-token alignment
    assert len(blocks[0]) == 6 and blocks[0] == m.get_block_ids("a")[0][:6]
    assert blocks[1] == [0, m.get_block_ids("a")[1][1]]
    assert m.block_pool.abstract() == before
    hits, n = m.get_computed_blocks(b)
    assert n == min(lengths) and hits.get_block_ids()[1] == blocks[1]


def test_find_longest_cache_hit_per_group_at_hash_granularity_with_partial_hits() -> None:
    m = manager(FullAttentionSpec(block_size=32), MambaSpec(block_size=32,
                                                            mamba_cache_mode="align"),
                num_blocks=32, hbs=16, sbs=32, allow_partial_hash_hits=True)
    a = request("a", list(range(60)))
    assert m.allocate_slots(a, 48) is not None  # both groups: a partial entry at 48
    m.new_step_starts()
    b = request("b", list(range(60)))
    blocks, lengths = m.coordinator.find_longest_cache_hit_per_group(b.block_hashes, 59)
    assert lengths == (48, 48)
    assert blocks == tuple(m.get_block_ids("a"))
