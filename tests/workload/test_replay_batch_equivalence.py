"""The batch-verb replay decides exactly as a scheduler written with single protocol verbs.

:func:`protocol_replay` is a deliberately plain twin of :mod:`kvpool.workload.driver`, shaped
like vLLM's scheduler loop (the kit's ``bench.py``): admission first (one lookup per
position, touch, allocate, cache, the prefill samples a token), then one pass over the
running requests in order, each either freeing its table or allocating one block for its
last sampled token (one ``get_new_blocks(1)`` each) and caching the block it filled, with
frees and allocations interleaved as the loop meets them. Every decision figure of
``replay`` (all but timings and call counts) must equal the twin's, on every backend, and so
must the final pool state — including block size 1, where a block fills as it starts.
"""

from __future__ import annotations

import importlib.util
from collections import deque

import pytest

from kvpool import make_pool
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.request import Request
from kvpool.workload.driver import HASH_SEED, replay
from kvpool.workload.synthetic import ChatWorkload
from kvpool.workload.tokens import output_tokens
from kvpool.workload.trace import TraceRequest

BACKENDS = ["spec", "reference"] + (["fast"] if importlib.util.find_spec("numba") else [])
COUNTS = ("pool_calls", "verb_calls")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def protocol_replay(pool, trace, *, block_size: int, max_running: int) -> dict:
    """The decisions of the replay policy, issued as single protocol verbs."""
    bs, caching = block_size, pool.enable_caching
    hasher = get_request_block_hasher(bs, BlockHasher("sha256", seed=HASH_SEED))
    held, keyed = [0] * pool.num_gpu_blocks, set()
    out = dict(requests=0, prompt_tokens=0, hit_tokens=0, evictions=0, peak_usage=0.0,
               blocks_allocated=0, steps=0, decode_tokens=0)
    running: list[dict] = []
    reserved = 0

    def allocate(n: int) -> list[int]:
        blocks = pool.get_new_blocks(n)
        for b in blocks:
            out["evictions"] += b in keyed
            keyed.discard(b)
            held[b] = 1
        out["blocks_allocated"] += len(blocks)
        return blocks

    pending, waiting, step = deque(sorted(trace, key=lambda r: r.arrival_step)), deque(), 0
    while pending or waiting or running:
        if not waiting and not running and pending[0].arrival_step > step:
            step = pending[0].arrival_step
        while pending and pending[0].arrival_step <= step:
            waiting.append([pending.popleft(), None])
        changed = False
        while waiting and len(running) < max_running:
            spec, request = waiting[0]
            if request is None:
                request = waiting[0][1] = Request(spec.id, list(spec.prompt))
                if caching:
                    request.block_hashes.extend(hasher(request))
            prompt = len(spec.prompt)
            hits = []
            for h in request.block_hashes[: (prompt - 1) // bs] if caching else ():
                hit = pool.get_cached_block(h, [0])
                if hit is None:
                    break
                hits.append(hit[0])
            evictable = sum(held[b] == 0 for b in hits)
            blocks, future = cdiv(prompt, bs), cdiv(prompt + spec.output_len, bs) - cdiv(prompt, bs)
            if blocks - len(hits) + evictable + future + reserved > pool.get_num_free_blocks():
                break
            waiting.popleft()
            if hits:
                pool.touch(hits)
                for b in hits:
                    held[b] += 1
            table = hits + allocate(blocks - len(hits))
            full = prompt // bs if caching else 0
            if full > len(hits):
                pool.cache_full_blocks(request, table, len(hits), full, bs, 0)
                keyed.update(table[len(hits) : full])
            outputs = output_tokens(spec.id, spec.output_len)
            if outputs:
                request.output_token_ids.append(outputs[0])  # the prefill samples a token
                out["decode_tokens"] += 1
            running.append(dict(spec=spec, request=request, table=table,
                                generated=len(outputs[:1]), cached=max(len(hits), full),
                                outputs=outputs, owed=future))
            reserved += future
            out["requests"] += 1
            out["prompt_tokens"] += prompt
            out["hit_tokens"] += len(hits) * bs
            changed = True
        still = []
        for r in running:
            request = r["request"]
            if r["generated"] >= r["spec"].output_len:  # the last token is never computed
                pool.free_blocks(r["table"][::-1])
                for b in r["table"]:
                    held[b] -= 1
                reserved -= r["owed"]
                continue
            position = request.num_tokens - 1  # the last sampled token gets its KV now
            if position % bs == 0:
                r["table"] += allocate(1)
                r["owed"] -= 1
                reserved -= 1
                changed = True
            if caching and (position + 1) % bs == 0:
                request.block_hashes.extend(hasher(request))
                full = len(request.block_hashes)
                if full > r["cached"]:
                    pool.cache_full_blocks(request, r["table"], r["cached"], full, bs, 0)
                    keyed.update(r["table"][r["cached"] : full])
                    r["cached"] = full
            request.output_token_ids.append(r["outputs"][r["generated"]])
            r["generated"] += 1
            out["decode_tokens"] += 1
            still.append(r)
        running = still
        if changed:
            out["peak_usage"] = max(out["peak_usage"], pool.get_usage())
        step += 1
        out["steps"] += 1
    out["hit_rate"] = out["hit_tokens"] / out["prompt_tokens"] if out["prompt_tokens"] else 0.0
    return out


def small_chat(seed: int) -> list[TraceRequest]:
    return ChatWorkload(num_requests=30, seed=seed, system_prompt_tokens=(20, 60),
                        user_message_tokens=12, output_tokens=12, max_prompt_tokens=160,
                        conversation_rate=0.4, think_steps=3.0).generate()


@pytest.mark.parametrize(("block_size", "num_blocks", "caching"),
                         [(4, 80, True), (4, 400, True), (1, 300, True), (3, 60, False)],
                         ids=["bs4-pressure", "bs4-roomy", "bs1", "no-caching"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_replay_decides_as_the_protocol_level_twin(backend, block_size, num_blocks, caching):
    trace = small_chat(seed=block_size)
    options = dict(hash_block_size=block_size, enable_caching=caching)
    twin_pool = make_pool(num_blocks, backend="spec", **options)
    expected = protocol_replay(twin_pool, trace, block_size=block_size, max_running=6)
    pool = make_pool(num_blocks, backend=backend, **options)
    report = replay(pool, trace, block_size=block_size, max_running=6)
    decisions = {k: v for k, v in report.decisions().items() if k not in COUNTS}
    assert {k: decisions[k] for k in expected} == expected
    assert pool.abstract().state == twin_pool.abstract().state
    assert expected["requests"] == len(trace)
    assert report.pool_calls == sum(report.verb_calls.values())


def test_the_last_sampled_token_gets_no_block_and_its_block_is_not_cached():
    # 8 prompt tokens (2 blocks of 4) + 5 outputs: KV for 8 + 4 tokens. The 4th output fills
    # block 2 (cached); the 5th would start block 3, but it is never computed (as in vLLM).
    trace = [TraceRequest("a", 0, tuple(range(100, 108)), 5)]
    for backend in BACKENDS:
        pool = make_pool(8, backend=backend, hash_block_size=4)
        report = replay(pool, trace, block_size=4, max_running=2)
        assert report.blocks_allocated == 3, backend
        assert report.decode_tokens == 5
        assert report.steps == 5  # admitted (and first decode) at step 0, freed at step 4
        state = pool.abstract().state
        assert sum(key is not None for key in state.primary_key) == 3
        assert pool.get_num_free_blocks() == 7
