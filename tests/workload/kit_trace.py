"""The vLLM kit's reference workload (``vllm-kit/gen_trace.py``), rebuilt for kvpool's tests.

Same RNG stream as the kit's ``make_trace()`` (``random.Random(1234)``; 2,000 requests of
U[256, 4096] prompt tokens, half of them starting with one of 20 shared system prompts of
U[256, 2048] tokens; 64 output tokens each; all arriving at step 0), so a replay of it must
make vLLM 0.25.1's decisions, which the kit's ``bench.py --only trace`` reports.
"""

from __future__ import annotations

import random

from kvpool.workload.trace import TraceRequest

KIT_POOL_BLOCKS = 20_000
KIT_MAX_RUNNING = 64
KIT_BLOCK_SIZE = 16

VLLM_025_DECISIONS = {
    "blocks_allocated": 215_407,
    "hit_tokens": 1_239_920,
    "prompt_tokens": 4_545_538,
    "evictions": 193_552,
    "steps": 2_048,
    "requests": 2_000,
}
"""What the kit's ``bench.py --only trace`` reports for real vLLM 0.25.1 on this trace."""


def kit_trace(num_requests: int = 2000, num_prefixes: int = 20, vocab: int = 32000,
              output_len: int = 64, seed: int = 1234) -> list[TraceRequest]:
    """The kit's trace as kvpool trace requests (ids ``"0"``, ``"1"``, ...)."""
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(vocab) for _ in range(rng.randint(256, 2048))]
        for _ in range(num_prefixes)
    ]
    trace = []
    for i in range(num_requests):
        total = rng.randint(256, 4096)
        if rng.random() < 0.5:
            prefix = prefixes[rng.randrange(num_prefixes)]
            tokens = prefix + [rng.randrange(vocab) for _ in range(max(total - len(prefix), 1))]
        else:
            tokens = [rng.randrange(vocab) for _ in range(total)]
        for _ in range(output_len):  # the kit draws output tokens here; keep the stream
            rng.randrange(vocab)
        trace.append(TraceRequest(str(i), 0, tuple(tokens), output_len))
    return trace
