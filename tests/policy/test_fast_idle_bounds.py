"""The full-attention fast policy's idle step reads two bounds it records per request (how
many tokens the held blocks take, and where the next unkeyed block fills). They are a cache
of the tables and keyed counts, so two things must hold: a bound is never above what the
request holds (else a step that needs a block or a key would be called idle), and the steps
decide exactly as the generic policy's, including where the bounds are capped (a watermark,
``max_model_len`` not a multiple of the block size, no prefix cache)."""

from __future__ import annotations

import random

import pytest

from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    RequestStatus,
    SchedulerRequest,
    make_kv_cache_manager,
)
from kvpool.policy.fast import _NEVER, FastKVCacheManager

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
    rng = random.Random(seed)
    stacks = managers(max_len, caching, watermark)
    requests: dict[str, dict[str, SchedulerRequest]] = {p: {} for p in stacks}
    for step in range(400):
        rid = f"r{rng.randrange(6)}"
        prompt = [rng.randrange(4) for _ in range(rng.randrange(1, 60))]
        if rid not in requests["fast"] and rng.random() < 0.5:
            for p in stacks:
                requests[p][rid] = SchedulerRequest(
                    rid, list(prompt), block_hasher=get_request_block_hasher(BS, HASHER))
        # One draw per step, shared by both stacks.
        free_it = rng.random() < 0.03  # finished or preempted
        num_new = 1 if rng.random() < 0.8 else rng.randrange(1, 40)  # a token, or a chunk
        lookahead = rng.choice((0, 0, 0, 2))  # sometimes drafts
        token = rng.randrange(4)
        answers = []
        for p, m in stacks.items():
            r = requests[p].get(rid)
            if r is None:
                continue
            if free_it:
                m.free(r)
                del requests[p][rid]
                answers.append(("freed",))
            elif r.num_computed_tokens == 0 and rid not in m._live:
                hits, n = m.get_computed_blocks(r)
                got = m.allocate_slots(r, r.num_tokens - n, n, hits)
                if got is not None:
                    r.num_computed_tokens = r.num_tokens
                    r.status = RequestStatus.RUNNING
                answers.append(("admit", None if got is None else got.get_block_ids()))
            else:  # a running step, now and then past max_model_len (the generic caps it)
                got = m.allocate_slots(r, num_new, num_lookahead_tokens=lookahead)
                answers.append(("step", None if got is None else got.get_block_ids()))
                if got is not None:
                    r.num_computed_tokens += num_new
                    if r.num_computed_tokens >= r.num_tokens:
                        r.append_output_token_ids(token)
        if len(answers) == 2:
            assert answers[0] == answers[1], (step, rid, answers)
        assert stacks["fast"].block_pool.abstract() == stacks["generic"].block_pool.abstract()
        check_bounds(stacks["fast"])  # type: ignore[arg-type]
    assert {rid: seen[:2] for rid, seen in stacks["fast"]._live.items()} == \
        stacks["generic"]._live  # type: ignore[attr-defined]


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
