"""The hybrid fast policy's idle step reads three bounds it records per request
(``FastHybridKVCacheManager._record``): the tokens every group's table takes, the aligned
token count that fills a group's next unkeyed block, and the computed tokens at which a
window frees its first block still held. They cache the tables, so a bound must never be
above what they say (else a step that needs a block, a key or a free would be called idle),
and the steps must decide exactly as the generic policy's. The window's bound inverts the
window's rule (``fewest_tokens_skipping``), checked here against the rule itself."""

from __future__ import annotations

import random

import pytest

from kvpool.errors import InvalidArgument
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SchedulerRequest,
    SlidingWindowSpec,
    make_kv_cache_manager,
)
from kvpool.policy.chunked_local import ChunkedLocalAttentionManager
from kvpool.policy.fast_base import _NEVER
from kvpool.policy.fast_hybrid import FastHybridKVCacheManager
from kvpool.policy.sliding_window import SlidingWindowManager
from kvpool.policy.stats import PrefixCacheStats

from .helpers import walk_fast_beside_generic

BS = 16
HASHER = BlockHasher("sha256", seed="hybrid-bounds")
WINDOWS = {
    "swa-65": SlidingWindowSpec(block_size=BS, sliding_window=65),
    "swa-32": SlidingWindowSpec(block_size=BS, sliding_window=32),
    "chunked-48": ChunkedLocalAttentionSpec(block_size=BS, attention_chunk_size=48),
}


@pytest.mark.parametrize("spec", list(WINDOWS.values()), ids=list(WINDOWS))
def test_fewest_tokens_skipping_inverts_the_window_rule(spec) -> None:
    manager_class = SlidingWindowManager if isinstance(spec, SlidingWindowSpec) \
        else ChunkedLocalAttentionManager
    manager = manager_class.__new__(manager_class)  # the two rules read the spec alone
    manager.kv_cache_spec, manager.block_size = spec, BS
    for blocks in range(1, 12):
        fewest = manager.fewest_tokens_skipping(blocks)
        assert manager.get_num_skipped_tokens(fewest) // BS >= blocks
        assert manager.get_num_skipped_tokens(fewest - 1) // BS < blocks
    for bad in (0, -1, 1.0, True, None):
        with pytest.raises(InvalidArgument, match="num_blocks must be an int >= 1"):
            manager.fewest_tokens_skipping(bad)


def managers(window: str, caching: bool, watermark: float) -> dict[str, object]:
    config = KVCacheConfig(64, [KVCacheGroupSpec(FullAttentionSpec(block_size=BS)),
                                KVCacheGroupSpec(WINDOWS[window])])
    out = {p: make_kv_cache_manager(config, 330, BS, BS, enable_caching=caching,
                                    watermark=watermark, backend="fast", policy=p)
           for p in ("fast", "generic")}
    assert isinstance(out["fast"], FastHybridKVCacheManager)
    return out


def leading_nulls(table: list[int], null: int) -> int:
    n = 0
    while n < len(table) and table[n] == null:
        n += 1
    return n


def check_bounds(m: FastHybridKVCacheManager) -> None:
    for rid, seen in m._live.items():
        _, _, room, key_at, skip_at = seen
        for tables, keyed, bs, _, null, fewest, *_ in m._groups:
            table = tables.get(rid, [])
            assert room <= len(table) * bs, (rid, room)
            if m.enable_caching:
                align = m._cache_alignment  # the coordinator keys aligned lengths only
                assert key_at <= -(-(keyed.get(rid, 0) + 1) * bs // align) * align, (rid, key_at)
            else:
                assert key_at == _NEVER
            nulls = leading_nulls(table, null)
            if fewest is not None and nulls < len(table):
                assert skip_at <= fewest(nulls + 1), (rid, skip_at, nulls)


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("caching, watermark", [(True, 0.0), (False, 0.0), (True, 0.1)])
@pytest.mark.parametrize("seed", range(2))
def test_steps_decide_as_the_generic_policy_and_bounds_stay_below_the_tables(
        window, caching, watermark, seed) -> None:
    stacks = managers(window, caching, watermark)
    idle = walk_fast_beside_generic(stacks, seed, 500, check_bounds,  # type: ignore[arg-type]
                                    max_prompt=90, vocabulary=3, in_flight=True)
    assert idle > 50


@pytest.mark.parametrize("window", list(WINDOWS))
def test_lookups_answer_as_the_generic_policy(window) -> None:
    """``get_computed_blocks`` (one probe when the full-attention group's first block
    misses) against the generic lookup: the hits, the hit tokens, what the coordinator
    reports uncached in common, the stats — on prompts that share nothing, a first block,
    or more, while the cache fills and windows lose blocks."""
    stacks = managers(window, caching=True, watermark=0.0)
    for m in stacks.values():
        m.prefix_cache_stats = PrefixCacheStats()
    rng = random.Random(5)
    make = get_request_block_hasher(BS, HASHER)
    probed = uncached = 0
    for i in range(120):
        shared = [rng.randrange(3)] * rng.choice((0, 8, 20, 40, 70))  # a system prompt
        prompt = shared + [100 + i] * rng.randrange(1, 60)
        admit, evict = rng.random() < 0.5, rng.random() < 0.3  # (one draw, both stacks)
        answers = []
        for m in stacks.values():
            r = SchedulerRequest(f"q{i}", list(prompt), block_hasher=make)
            hits, n = m.get_computed_blocks(r)
            answers.append((m.hit_block_ids(hits), n,
                            m.coordinator.num_uncached_common_prefix_tokens,
                            vars(m.prefix_cache_stats)))
            got = m.allocate_slots(r, r.num_tokens - n, n, hits if n else None) \
                if admit else None
            if got is not None:
                r.num_computed_tokens = r.num_tokens
                m.free(r)  # its blocks stay cached ...
                if evict:  # ... but for the window's new ones: a later hit runs shorter
                    m.block_pool.evict_blocks(got.get_block_ids()[1])
        assert answers[0] == answers[1], (i, answers)
        probed += answers[0][1] == 0
        uncached += answers[0][2] > 0
    assert 10 < probed < 110 and uncached > 3, (probed, uncached)
