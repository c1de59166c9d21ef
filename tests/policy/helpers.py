"""Small builders shared by the policy tests."""

from __future__ import annotations

from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
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
