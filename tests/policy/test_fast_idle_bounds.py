"""The full-attention fast policy's idle step reads two bounds it records per request (how
many tokens the held blocks take, and where the next unkeyed block fills). They are a cache
of the tables and keyed counts, so two things must hold: a bound is never above what the
request holds (else a step that needs a block or a key would be called idle), and the steps
decide exactly as the generic policy's, including where the bounds are capped (a watermark,
``max_model_len`` not a multiple of the block size, no prefix cache)."""

from __future__ import annotations

import pytest

from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SchedulerRequest,
    make_kv_cache_manager,
)
from kvpool.policy.fast import _NEVER, FastKVCacheManager

from .helpers import walk_fast_beside_generic

BS = 16
HASHER = BlockHasher("sha256", seed="idle-bounds")


def managers(max_len: int, caching: bool, watermark: float) -> dict[str, object]:
    config = KVCacheConfig(48, [KVCacheGroupSpec(FullAttentionSpec(block_size=BS))])
    out = {p: make_kv_cache_manager(config, max_len, BS, BS, enable_caching=caching,
                                    watermark=watermark, backend="fast", policy=p)
           for p in ("fast", "generic")}
    assert isinstance(out["fast"], FastKVCacheManager)
    return out


def check_bounds(m: FastKVCacheManager) -> None:
    for rid, (_, _, room, key_at) in m._live.items():
        held = len(m._tables.get(rid, ())) * BS
        assert room <= (0 if m.watermark_blocks else held), (rid, room, held)
        if m.enable_caching:
            assert key_at <= (m._num_cached.get(rid, 0) + 1) * BS, (rid, key_at)
        else:
            assert key_at == _NEVER


@pytest.mark.parametrize("max_len, caching, watermark", [
    (330, True, 0.0),  # not a multiple of the block size: steps past it are capped
    (320, False, 0.0),  # no prefix cache: nothing is ever keyed
    (320, True, 0.1),  # a watermark: every step is checked against it
])
@pytest.mark.parametrize("seed", range(3))
def test_steps_decide_as_the_generic_policy_and_bounds_stay_below_the_tables(
        max_len, caching, watermark, seed) -> None:
    stacks = managers(max_len, caching, watermark)
    idle = walk_fast_beside_generic(stacks, seed, 400, check_bounds)  # type: ignore[arg-type]
    assert idle > 50


@pytest.mark.parametrize("lookahead", [0, 3])
def test_steps_past_max_model_len_decide_as_the_generic_policy(lookahead) -> None:
    # 330 is not a multiple of 16: the last block (tokens 320..335) reaches past the cap, so
    # steps from 330 on are under the room bound while the generic step caps their counts.
    stacks = managers(330, True, 0.0)
    answers: dict[str, list[object]] = {}
    for p, m in stacks.items():
        r = SchedulerRequest("a", list(range(318)),
                             block_hasher=get_request_block_hasher(BS, HASHER))
        assert m.allocate_slots(r, r.num_tokens) is not None
        r.num_computed_tokens = r.num_tokens
        seen = answers[p] = []
        for token in range(24):
            r.append_output_token_ids(token)
            got = m.allocate_slots(r, 1, num_lookahead_tokens=lookahead)
            seen.append((r.num_computed_tokens, None if got is None else got.get_block_ids(),
                         m.block_pool.abstract()))
            r.num_computed_tokens += 1
        if p == "fast":
            check_bounds(m)  # type: ignore[arg-type]
    assert answers["fast"] == answers["generic"]
    assert answers["fast"][-1][0] > 330
