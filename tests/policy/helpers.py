"""Small builders shared by the policy tests."""

from __future__ import annotations

import random
from collections.abc import Callable

from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    RequestStatus,
    SchedulerRequest,
)

HASHER = BlockHasher("sha256", seed="kvpool-policy-tests")


def request(rid: str, tokens: list[int], hbs: int = 16, **kw: object) -> SchedulerRequest:
    return SchedulerRequest(rid, tokens, block_hasher=get_request_block_hasher(hbs, HASHER),
                            **kw)


def groups(*specs: object, eagle: tuple[int, ...] = ()) -> tuple[KVCacheGroupSpec, ...]:
    return tuple(KVCacheGroupSpec(s, is_eagle_group=i in eagle)  # type: ignore[arg-type]
                 for i, s in enumerate(specs))


def manager(*specs: object, num_blocks: int = 32, hbs: int = 16, sbs: int | None = None,
            backend: str = "reference", **kw: object) -> KVCacheManager:
    specs = specs or (FullAttentionSpec(block_size=16),)
    sizes = [s.block_size for s in specs]  # type: ignore[attr-defined]
    if sbs is None:
        from math import lcm
        sbs = lcm(*sizes)
    return KVCacheManager(KVCacheConfig(num_blocks, groups(*specs)), max_model_len=4096,
                          scheduler_block_size=sbs, hash_block_size=hbs, backend=backend,
                          **kw)


def run_prefill(m: KVCacheManager, r: SchedulerRequest) -> tuple[list[int], ...]:
    """Admit ``r`` with its hits and compute its whole prompt in one chunk."""
    hits, n = m.get_computed_blocks(r)
    out = m.allocate_slots(r, r.num_tokens - n, n, hits)
    assert out is not None
    r.num_computed_tokens = r.num_tokens
    return m.get_block_ids(r.request_id)


def walk_fast_beside_generic(stacks: dict[str, KVCacheManager], seed: int, steps: int,
                             check: Callable[[KVCacheManager], None], *,
                             max_prompt: int = 60, vocabulary: int = 4,
                             in_flight: bool = False) -> int:
    """A random walk of admissions, running steps (a token, or a chunk; sometimes drafts;
    tokens in flight when asked) and frees, the same draws on ``stacks["fast"]`` and
    ``stacks["generic"]``: every answer and the pool state must agree after each call, and
    ``check`` (the fast policy's own bounds) must hold. The number of idle steps taken."""
    rng = random.Random(seed)
    requests: dict[str, dict[str, SchedulerRequest]] = {p: {} for p in stacks}
    make = get_request_block_hasher(16, HASHER)
    idle = 0
    for step in range(steps):
        rid = f"r{rng.randrange(6)}"
        prompt = [rng.randrange(vocabulary) for _ in range(rng.randrange(1, max_prompt))]
        if rid not in requests["fast"] and rng.random() < 0.5:
            for p in stacks:
                requests[p][rid] = SchedulerRequest(rid, list(prompt), block_hasher=make)
        # One draw per step, shared by both stacks.
        free_it = rng.random() < 0.03  # finished or preempted
        num_new = 1 if rng.random() < 0.8 else rng.randrange(1, 40)  # a token, or a chunk
        lookahead = rng.choice((0, 0, 0, 2))  # sometimes drafts
        flying = rng.choice((0, 0, 1)) if in_flight else 0  # a token not back yet (async)
        token = rng.randrange(vocabulary)
        answers = []
        for p, m in stacks.items():
            r = requests[p].get(rid)
            if r is None:
                continue
            if free_it:
                m.free(r)
                del requests[p][rid]
                answers.append(("freed",))
            elif r.num_computed_tokens == 0 and not m.is_running(rid):
                hits, n = m.get_computed_blocks(r)
                got = m.allocate_slots(r, r.num_tokens - n, n, hits)
                if got is not None:
                    r.num_computed_tokens = r.num_tokens
                    r.status = RequestStatus.RUNNING
                # (what the lookup reports uncached in common: vLLM 0.33 reads it)
                uncached = getattr(m.coordinator, "num_uncached_common_prefix_tokens", None)
                answers.append(("admit", n, uncached,
                                None if got is None else got.get_block_ids()))
            else:  # a running step, now and then past max_model_len (the generic caps it)
                if in_flight:
                    r.num_in_flight_tokens = min(flying, r.num_computed_tokens)
                got = m.allocate_slots(r, num_new, num_lookahead_tokens=lookahead)
                answers.append(("step", None if got is None else got.get_block_ids()))
                if got is not None:
                    idle += p == "fast" and not any(got.get_block_ids())
                    r.num_computed_tokens += num_new
                    if r.num_computed_tokens >= r.num_tokens:
                        r.append_output_token_ids(token)
        if len(answers) == 2:
            assert answers[0] == answers[1], (step, rid, answers)
        assert stacks["fast"].block_pool.abstract() == stacks["generic"].block_pool.abstract()
        check(stacks["fast"])
    assert {rid: seen[:2] for rid, seen in stacks["fast"]._live.items()} == \
        stacks["generic"]._live
    return idle
