"""The named scenarios of ``kvpool explain``: short scripts that show one behaviour each.

Every scenario runs on a tiny pool (blocks of 4 tokens) through the KV cache manager, so a
screen shows the whole pool:

* ``lru`` — where freed blocks go: blocks with a cache identity to the *back* of the free
  queue (least recently freed is evicted first: LRU), blocks without one to the *front*
  (reused first: LIFO); a table is freed tail first.
* ``sharing`` — a second request with the same prefix hits the cached blocks: one block,
  two references; freeing one request leaves the other's blocks in use.
* ``eviction`` — lazy eviction: a freed block keeps its key until an allocation takes it;
  only then is the key removed (``BlockRemoved``); a hit on a free cached block pulls it out
  of the queue.
* ``copy-on-write`` — vLLM 0.33's partial hits on a hybrid full-attention + Mamba model
  (hashes every 16 tokens, blocks of 32): a request that hits inside a shared block gets a
  private copy, and both ends stay held until the copy has run.
* ``sliding-window`` — a full-attention + sliding-window model: as a request grows, blocks
  that leave the window are freed and replaced by the null block in its table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvpool.explain.session import Session
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

BS = 4
"""Tokens per block in the scenarios (small, so prompts stay readable)."""


def _tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def _full_session(num_blocks: int, backend: str) -> Session:
    config = KVCacheConfig(num_blocks, (KVCacheGroupSpec(FullAttentionSpec(block_size=BS)),))
    return Session(config, BS, BS, backend)


def lru(backend: str = "spec") -> Session:
    s = _full_session(9, backend)
    s.record("a fresh pool",
             "Block 0 is the null block: never handed out, never freed. Blocks 1-8 wait in "
             "the free queue in id order; an allocation takes from the front (position 0).")
    s.admit("a", _tokens(100, 10),
            "a's 10 tokens need 3 blocks of 4, taken from the front: 1, 2, 3. The two full "
            "blocks get a cache identity (a hash; BlockStored). Block 3 holds 2 tokens: no "
            "hash yet.")
    s.admit("b", _tokens(200, 6),
            "b takes the next two blocks from the front, 4 and 5; block 4 is full and "
            "cached.")
    s.finish("a",
             "a's table is freed tail first (3, 2, 1). Block 3 has no hash: it goes to the "
             "FRONT of the queue (LIFO: reused first, nothing is lost). Blocks 2 and 1 keep "
             "their hashes and go to the BACK in that order (LRU: the end of a prompt is "
             "evicted before its beginning, which more requests share).")
    s.finish("b",
             "Same for b: block 5 (no hash) to the front, ahead of 3; block 4 (cached) to the "
             "back, behind a's blocks: the least recently freed cached block is evicted "
             "first.")
    s.admit("c", _tokens(300, 14),
            "c needs 4 blocks and shares nothing. It takes the front: 5 and 3 (no "
            "identity), then 6 and 7, never used. The cached blocks 2, 1, 4 are still at "
            "the back: their prefixes can still be hit.")
    return s


def sharing(backend: str = "spec") -> Session:
    s = _full_session(9, backend)
    system = _tokens(100, 8)
    s.admit("a", system + _tokens(500, 3),
            "a: an 8-token system prompt and a 3-token question: 3 blocks; the two full "
            "blocks (the system prompt) are cached.")
    s.admit("b", system + _tokens(600, 5),
            "b starts with the same 8 tokens: get_computed_blocks finds both cached blocks "
            "(a hit of 8 tokens), allocate_slots takes a reference on them (touch) and "
            "allocates only the rest. Blocks 1 and 2 now have ref count 2: one copy of the "
            "KV, two readers.")
    s.finish("a",
             "a is freed: blocks 1 and 2 drop to ref count 1 and stay out of the queue (b "
             "still reads them); only a's own last block returns (to the front: no hash).")
    s.finish("b",
             "b is freed: the shared blocks reach ref count 0 and go to the back of the "
             "queue with their hashes: free, but still cached for the next request with "
             "this system prompt.")
    s.admit("c", system + _tokens(700, 2),
            "c hits the system prompt again: the blocks leave the free queue (a hit on a "
            "free cached block takes it out of the queue) without any KV being recomputed.")
    return s


def eviction(backend: str = "spec") -> Session:
    s = _full_session(7, backend)
    s.admit("a", _tokens(100, 9),
            "a: 9 tokens, 3 blocks (1, 2, 3); blocks 1 and 2 are cached.")
    s.finish("a",
             "a is freed. Nothing is evicted: blocks 1 and 2 keep their hashes in the hash "
             "table while they wait at the back of the queue (lazy eviction).")
    s.admit("b", _tokens(200, 17),
            "b needs 5 blocks and shares nothing. The front gives 3, 4, 5, 6 (no identity); "
            "the fifth comes from the cached blocks: block 2 is at the front of them (a was "
            "freed tail first), so block 2 is evicted: its key leaves the hash table only "
            "now (BlockRemoved). Block 1, the start of a's prompt, survives.")
    s.finish("b", "b is freed: its 4 full blocks are cached and go to the back; its last "
             "block (one token, no hash) to the front.")
    s.admit("a2", _tokens(100, 9),
            "a2 repeats a's prompt. Its first block hits block 1 (cached and free: the hit "
            "takes it out of the queue); its second was evicted, and a hit stops at the "
            "first miss. Two new blocks: block 2 from the front (no identity), then block 6, "
            "the oldest cached free block left, so b's last full block is evicted. a2 "
            "recomputes a's second block, and it is cached again under the same hash.")
    return s


def copy_on_write(backend: str = "spec") -> Session:
    config = KVCacheConfig(16, (
        KVCacheGroupSpec(FullAttentionSpec(block_size=32)),
        KVCacheGroupSpec(MambaSpec(block_size=32, mamba_cache_mode="align"))))
    s = Session(config, 32, 16, backend, {"allow_partial_hash_hits": True})
    prompt = _tokens(0, 60)
    s.admit("a", prompt,
            "a: a 60-token prompt computed up to 48 tokens (its last 16-token hash "
            "boundary) on a hybrid model: a full-attention group (g0) and a Mamba group "
            "(g1), blocks of 32 tokens. The hash at 48 lies inside a's second block, so "
            "both groups register a partial entry there.", num_tokens=48)
    s.admit("b", _tokens(0, 56) + [999] * 4,
            "b shares 56 tokens with a: it hits 48 tokens, ending inside a's second block. "
            "b will write past token 48 into that block, so sharing it would overwrite a's "
            "KV: b gets a fresh block in each group, and a pending copy from a's block to "
            "it (copy-on-write). Both ends are held (ref counts) until the copy has run.")
    copies, retained = s.manager.take_kv_cache_block_copies()
    lines = tuple(f"copy block {c.src_block_id} -> {c.dst_block_id} (group {c.group_id})"
                  for c in copies)
    s.record("take_kv_cache_block_copies",
             "The GPU layer takes the pending copies (and the held endpoints) after "
             "scheduling and runs them before the forward pass.", lines)
    s.manager.release_copy_endpoints(retained)
    s.record("release_copy_endpoints",
             "Once the copies have run, the endpoints are released: each block is back to "
             "the references its tables hold.")
    s.finish("b", "b is freed; a keeps its blocks.")
    return s


def sliding_window(backend: str = "spec") -> Session:
    config = KVCacheConfig(16, (
        KVCacheGroupSpec(FullAttentionSpec(block_size=BS)),
        KVCacheGroupSpec(SlidingWindowSpec(block_size=BS, sliding_window=8))))
    s = Session(config, BS, BS, backend)
    s.admit("a", _tokens(100, 10),
            "A hybrid model: full attention (g0) keeps every token; a sliding-window group "
            "(g1) attends to the last 8 tokens only. Both groups take 3 blocks for a's 10 "
            "tokens from the same pool.")
    s.decode("a", _tokens(900, 4),
             "After 4 more tokens the window has moved past a's first blocks: the window "
             "group frees them (they return to the queue, cached) and puts the null block "
             "0 in their place in its table. The full-attention table only grows.")
    s.decode("a", _tokens(950, 4),
             "Four more tokens: one more window block is freed, one more allocated. The "
             "window group's live blocks stay bounded, whatever the length.")
    s.finish("a", "a is freed: every block returns to the queue.")
    return s


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    run: Callable[[str], Session]


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("lru", "where freed blocks go: cached to the back (LRU), others to the front "
             "(LIFO)", lru),
    Scenario("sharing", "two requests share a cached prefix: one block, two references",
             sharing),
    Scenario("eviction", "lazy eviction: keys stay until an allocation reuses the block",
             eviction),
    Scenario("copy-on-write", "a partial hit inside a shared block gets a private copy "
             "(hybrid Mamba)", copy_on_write),
    Scenario("sliding-window", "out-of-window blocks are freed and replaced by the null "
             "block", sliding_window),
)}
"""The scenarios of ``kvpool explain``, by name."""

DEFAULT_SCENARIO = "lru"

__all__ = ["BS", "DEFAULT_SCENARIO", "SCENARIOS", "Scenario"]
