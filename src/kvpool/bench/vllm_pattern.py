"""The kit's workload in vLLM's call pattern, on a kvpool pool (for ``--vs-vllm``).

The vLLM kit's ``bench.py`` drives ``vllm.v1.core.block_pool.BlockPool`` as vLLM's scheduler
does for one full-attention group: one ``get_cached_block`` per prefix position until the
first miss, ``touch`` of the hits, one ``get_new_blocks`` per admission and per decode block,
one ``cache_full_blocks`` per admission and per filled block, one ``free_blocks`` per
finished request. :func:`replay_vllm_pattern` issues exactly those calls, in that order, to
any kvpool pool through the public protocol, with kvpool's own :class:`~kvpool.request.Request`
hashing blocks as tokens are appended (vLLM's ``sha256``, byte-identical), and times them the
kit's way: a clock read before and after each pool section (``pool_s``), around each request
build and token append (``hash_s``) and around the whole replay (``wall_s``). ``clock`` is
``time.perf_counter`` (wall) or ``time.thread_time`` (CPU), as the vLLM side is run with.

:func:`run_micro` is the kit's micro loop set on a kvpool pool, with the same sizes. The
figures and their names are the kit's, so a row of the ``--vs-vllm`` table compares like with
like; ``alloc64_free64_array_blocks_per_s`` (``get_new_blocks_array``, fast pools only) is
kvpool's own API shape of the same loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

from kvpool.backends import make_pool
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.request import Request

BLOCK = 16
NUM_BLOCKS = 20_000
MAX_RUNNING = 64
Clock = Callable[[], float]

KitRequest = tuple[str, int, Sequence[int], Sequence[int]]
"""``(id, arrival_step, prompt tokens, output tokens)``: a request as the kit's bench holds it."""

DETERMINISTIC_KEYS = ("requests", "steps", "blocks_allocated", "prompt_tokens", "hit_tokens",
                      "cache_lookups", "blocks_cached", "evictions")
"""The kit's decision figures (``bench.DETERMINISTIC_KEYS`` less the trace's own counts)."""


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


def replay_vllm_pattern(pool: Any, trace: Sequence[KitRequest], hasher: BlockHasher,
                        clock: Clock = time.perf_counter, max_running: int = MAX_RUNNING
                        ) -> dict[str, Any]:
    """The kit's ``run_trace`` loop on ``pool`` (see the module docstring); its figures."""
    pc = clock
    block_hasher = get_request_block_hasher(BLOCK, hasher)
    get_cached, touch = pool.get_cached_block, pool.touch
    get_new, cache_full, free = pool.get_new_blocks, pool.cache_full_blocks, pool.free_blocks
    num_free = pool.get_num_free_blocks
    group = [0]
    held = [0] * pool.num_gpu_blocks  # running requests per block: vLLM's block.ref_cnt
    pending = deque(sorted(trace, key=lambda r: r[1]))
    waiting: deque[KitRequest] = deque()
    running: list[list[Any]] = []
    staged: tuple[Request, Sequence[int]] | None = None
    t_pool = t_hash = 0.0
    reserved = lookups = hit_tokens = prompt_tokens = 0
    n_alloc = n_cached = finished = 0
    n = len(trace)
    step = -1
    began = pc()
    while finished < n:
        step += 1
        if not (running or waiting or staged) and pending and pending[0][1] > step:
            step = pending[0][1]
        while pending and pending[0][1] <= step:
            waiting.append(pending.popleft())
        while len(running) < max_running and (waiting or staged):
            if staged is None:
                rid, _, prompt, outputs = waiting.popleft()
                t0 = pc()
                # The Request copies the prompt once, as vLLM's does.
                staged = (Request(rid, cast(list[int], prompt), block_hasher=block_hasher),
                          outputs)
                t_hash += pc() - t0
            req, outputs = staged
            t0 = pc()
            prompt_len = req.num_tokens
            hits = []
            for h in req.block_hashes[: (prompt_len - 1) // BLOCK]:
                lookups += 1
                cached = get_cached(h, group)
                if cached is None:
                    break
                hits.append(cached[0])
            evictable = sum(1 for b in hits if not held[b])  # vLLM reads b.ref_cnt
            n_new = _cdiv(prompt_len, BLOCK) - len(hits)
            n_future = _cdiv(prompt_len + len(outputs), BLOCK) - _cdiv(prompt_len, BLOCK)
            ok = num_free() - reserved >= n_new + evictable + n_future
            t_pool += pc() - t0
            if not ok:
                if not running:
                    raise RuntimeError(f"request {req.request_id!r} never fits the pool")
                break
            staged = None
            prompt_tokens += prompt_len
            hit_tokens += len(hits) * BLOCK
            t0 = pc()
            touch(hits)
            blocks = hits + get_new(n_new)
            num_full = prompt_len // BLOCK
            cache_full(req, blocks, len(hits), num_full, BLOCK, 0)
            t_pool += pc() - t0
            for b in blocks:
                held[b] += 1
            n_alloc += n_new
            n_cached += num_full - len(hits)
            reserved += n_future
            req.append_output_token_ids(outputs[0])
            running.append([req, blocks, num_full, 1, outputs, n_future])
        still = []
        for entry in running:
            req, blocks, num_cached, generated, outputs, owed = entry
            if generated >= len(outputs):
                t0 = pc()
                free(blocks[::-1])
                t_pool += pc() - t0
                for b in blocks:
                    held[b] -= 1
                reserved -= owed
                finished += 1
                continue
            t0 = pc()
            if req.num_tokens > len(blocks) * BLOCK:
                blocks.extend(get_new(1))
                held[blocks[-1]] = 1
                n_alloc += 1
                entry[5] -= 1
                reserved -= 1
            num_full = req.num_tokens // BLOCK
            if num_full > num_cached:
                cache_full(req, blocks, num_cached, num_full, BLOCK, 0)
                n_cached += num_full - num_cached
                entry[2] = num_full
            t_pool += pc() - t0
            t0 = pc()
            req.append_output_token_ids(outputs[generated])
            t_hash += pc() - t0
            entry[3] = generated + 1
            still.append(entry)
        running = still
    wall = pc() - began
    state = pool.abstract().state if hasattr(pool, "abstract") else None
    still_keyed = (sum(key is not None for key in state.primary_key) if state is not None
                   else None)
    return {
        "requests": n,
        "steps": step + 1,
        "wall_s": wall,
        "pool_s": t_pool,
        "hash_s": t_hash,
        "blocks_allocated": n_alloc,
        "prompt_tokens": prompt_tokens,
        "hit_tokens": hit_tokens,
        "cache_lookups": lookups,
        "blocks_cached": n_cached,
        "evictions": None if still_keyed is None else n_cached - still_keyed,
    }


def _kvhash() -> BlockHasher:
    return BlockHasher("kvhash_raw", seed="kvpool-bench")


class _Hashed:
    """The part of a request ``cache_full_blocks`` reads (events off)."""

    __slots__ = ("all_token_ids", "block_hashes")

    def __init__(self, hashes: list[bytes]) -> None:
        self.block_hashes = hashes
        self.all_token_ids: list[int] = []


def run_micro(backend: str, hasher: BlockHasher, clock: Clock = time.perf_counter,
              n_blocks: int = NUM_BLOCKS, iters: int = 200_000) -> dict[str, float]:
    """The kit's ``run_micro`` loops on a kvpool pool of ``backend``; ops per second."""
    pc = clock
    res: dict[str, float] = {}
    pool = make_pool(n_blocks, backend=backend, hash_block_size=BLOCK)
    get_new, free = pool.get_new_blocks, pool.free_blocks
    t0 = pc()
    for _ in range(iters):
        free(get_new(1))
    res["alloc1_free1_pairs_per_s"] = iters / (pc() - t0)
    reps = iters // 64
    t0 = pc()
    for _ in range(reps):
        free(get_new(64)[::-1])
    res["alloc64_free64_blocks_per_s"] = reps * 64 / (pc() - t0)
    get_array = getattr(pool, "get_new_blocks_array", None)
    if get_array is not None:
        t0 = pc()
        for _ in range(reps):
            free(get_array(64)[::-1])
        res["alloc64_free64_array_blocks_per_s"] = reps * 64 / (pc() - t0)
    toks = list(range(BLOCK))
    parent = None
    hash_block = hasher.hash_block_tokens
    t0 = pc()
    for _ in range(iters // 4):
        parent = hash_block(parent, toks, None)
    res["hash_block_tokens_sha256_per_s"] = (iters // 4) / (pc() - t0)
    # kvpool's shape: a whole prompt (256 blocks of 16) per call, vLLM-compatible and raw
    prompt = list(range(256 * BLOCK))
    for name, prompt_hasher in (("sha256", hasher), ("kvhash_raw", _kvhash())):
        calls = max(1, iters // 4 // 256)
        t0 = pc()
        for _ in range(calls):
            prompt_hasher.hash_blocks(None, prompt, BLOCK)
        res[f"hash_prompt_{name}_blocks_per_s"] = calls * 256 / (pc() - t0)
    fill = Request("fill", list(range((n_blocks - 1) * BLOCK)),
                   block_hasher=get_request_block_hasher(BLOCK, hasher))
    blocks = get_new(n_blocks - 1)
    pool.cache_full_blocks(fill, blocks, 0, n_blocks - 1, BLOCK, 0)
    free(blocks[::-1])
    hs = fill.block_hashes
    get_cached = pool.get_cached_block
    group = [0]
    t0 = pc()
    for i in range(iters):
        get_cached(hs[i % len(hs)], group)
    res["get_cached_block_hit_per_s"] = iters / (pc() - t0)
    miss = [hasher.hash_block_tokens(None, [-1, i], ("miss",)) for i in range(1024)]
    t0 = pc()
    for i in range(iters):
        get_cached(miss[i & 1023], group)
    res["get_cached_block_miss_per_s"] = iters / (pc() - t0)
    touch = pool.touch
    t0 = pc()
    for i in range(iters):
        b = [blocks[(i * 7919) % len(blocks)]]
        touch(b)
        free(b)
    res["touch1_free1_pairs_per_s"] = iters / (pc() - t0)
    got: list[int] = []
    t0 = pc()
    for _ in range(n_blocks - 1):
        got.extend(get_new(1))
    res["alloc1_evicting_per_s"] = (n_blocks - 1) / (pc() - t0)
    free(got[::-1])
    return res


__all__ = ["DETERMINISTIC_KEYS", "replay_vllm_pattern", "run_micro"]
