"""End to end: a tiny decoder served through KVCacheManager + pool + paged tensors equals
dense attention over each full sequence, on every backend — and planted bugs break that.

Each scenario also asserts that what it is about really happened (hits, null blocks,
evictions, preemptions, reloads, watcher firings, copies), so a quiet scheduler cannot pass
it vacuously.
"""

import pytest
import torch

from kvpool.events import BlockRemoved
from kvpool.gpu.toy import TOLERANCE, ToyDecoder, ToyEngine
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    SchedulerRequest,
    SlidingWindowSpec,
)

from .conftest import DEVICE

BACKENDS = ("spec", "reference", "fast")
HEADS = {"num_kv_heads": 2, "head_size": 8}


def hybrid_swa(backend: str, num_blocks: int) -> KVCacheManager:
    config = KVCacheConfig(num_blocks, (
        KVCacheGroupSpec(FullAttentionSpec(block_size=4, **HEADS)),
        KVCacheGroupSpec(SlidingWindowSpec(block_size=4, sliding_window=6, **HEADS)),
    ))
    return KVCacheManager(config, max_model_len=256, scheduler_block_size=4, hash_block_size=4,
                          backend=backend, enable_kv_cache_events=True)


def full_mamba(backend: str, num_blocks: int = 40) -> KVCacheManager:
    config = KVCacheConfig(num_blocks, (
        KVCacheGroupSpec(FullAttentionSpec(block_size=8, **HEADS)),
        KVCacheGroupSpec(MambaSpec(block_size=8, mamba_cache_mode="align")),
    ))
    manager = KVCacheManager(config, max_model_len=256, scheduler_block_size=8,
                             hash_block_size=4, backend=backend, allow_partial_hash_hits=True)
    assert manager.partial_hash_hits_enabled
    return manager


def shared_prefix_load(engine: ToyEngine, hbs: int = 4) -> None:
    """Requests sharing a 13-token prefix in two waves, plus unrelated ones that push the
    cached blocks out; each decodes a scripted continuation."""
    hasher = get_request_block_hasher(hbs, BlockHasher("sha256", seed="toy"))
    prefix = list(range(1, 14))
    for i in range(4):
        engine.add(SchedulerRequest(f"p{i}", prefix + [20 + i, 30 + i], block_hasher=hasher),
                   [40 + i, 41 + i, 42, 43, 44, 45, 46])
    for i in range(3):
        engine.add(SchedulerRequest(f"u{i}", [60 + i] * 11, block_hasher=hasher),
                   [70 + i, 71, 72])
    for i in range(3):
        engine.add(SchedulerRequest(f"q{i}", prefix + [25 + i], block_hasher=hasher),
                   [50 + i, 51, 52, 53])


def served(manager: KVCacheManager, **options) -> ToyEngine:
    engine = ToyEngine(manager, ToyDecoder(manager, num_layers=2), device=DEVICE,
                       token_budget=options.pop("token_budget", 12), **options)
    return engine


def evictions(manager: KVCacheManager) -> int:
    return sum(isinstance(e, BlockRemoved) for e in manager.take_events())


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_prefixes_windows_eviction_and_preemption(backend: str) -> None:
    manager = hybrid_swa(backend, num_blocks=18)
    engine = served(manager)
    shared_prefix_load(engine)
    engine.run()
    assert engine.max_error() <= TOLERANCE[torch.float32]
    assert engine.hit_tokens > 0  # shared prefixes served from the cache, not rewritten
    assert engine.null_positions > 0  # sliding-window positions dropped to the null block
    assert engine.preemptions > 0 and evictions(manager) > 0
    assert manager.usage == 0.0 and len(engine.done) == 10


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("on_reuse", ["finish", "invalidate"])
def test_offload_and_reload(backend: str, on_reuse: str) -> None:
    manager = hybrid_swa(backend, num_blocks=20)
    engine = served(manager, host_blocks=64, on_reuse=on_reuse)
    shared_prefix_load(engine)
    engine.run()
    assert engine.max_error() <= TOLERANCE[torch.float32]
    assert engine.preemptions > 0 and engine.reloaded_tokens > 0
    assert engine.offloader.reused_in_flight > 0  # blocks reused while a copy-out was pending
    assert engine.offloader.free_host_blocks == 64 and manager.usage == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_on_write_of_partial_blocks(backend: str) -> None:
    manager = full_mamba(backend)
    engine = served(manager, token_budget=32)
    hasher = get_request_block_hasher(4, BlockHasher("sha256", seed="toy"))
    prefix = list(range(1, 15))
    engine.add(SchedulerRequest("a", prefix + [50], block_hasher=hasher), [60, 61, 62])
    for i in range(3):
        engine.add(SchedulerRequest(f"r{i}", prefix[:13] + [20 + i, 30 + i],
                                    block_hasher=hasher), [40 + i, 41 + i, 42, 43])
    engine.run()
    assert engine.max_error() <= TOLERANCE[torch.float32]
    assert engine.copied_pairs > 0 and engine.hit_tokens > 0
    # at most one launch per step (none for a step whose pairs are Mamba states only)
    assert 1 <= engine.copier.launches <= engine.copy_launch_steps
    assert manager.retained_copy_endpoints == {} and manager.usage == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_caches(dtype: torch.dtype) -> None:
    manager = hybrid_swa("fast", num_blocks=18)
    engine = served(manager, dtype=dtype, host_blocks=64)
    shared_prefix_load(engine)
    engine.run()
    assert engine.max_error() <= TOLERANCE[dtype]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrong_cached_block_is_caught(backend: str) -> None:
    manager = hybrid_swa(backend, num_blocks=18)
    engine = served(manager, planted="wrong-cached-block")
    shared_prefix_load(engine)
    engine.run()
    assert engine.max_error() > 100 * TOLERANCE[torch.float32]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_copy_before_its_source_is_final_is_caught(backend: str) -> None:
    manager = full_mamba(backend)
    engine = served(manager, token_budget=32, planted="copy-before-source-final")
    hasher = get_request_block_hasher(4, BlockHasher("sha256", seed="toy"))
    prefix = list(range(1, 15))
    engine.add(SchedulerRequest("a", prefix + [50], block_hasher=hasher), [60, 61, 62])
    engine.add(SchedulerRequest("b", prefix[:13] + [20, 30], block_hasher=hasher), [40, 41])
    engine.run()
    assert engine.copied_pairs > 0
    assert engine.max_error() > 100 * TOLERANCE[torch.float32]


@pytest.mark.skipif(DEVICE != "cpu", reason="on CUDA the copy-out races the new owner's "
                    "writes on another stream: whether it tears is a matter of timing")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reuse_watcher_that_does_nothing_is_caught(backend: str) -> None:
    manager = hybrid_swa(backend, num_blocks=20)
    engine = served(manager, host_blocks=64, planted="ignore-reuse-watcher")
    shared_prefix_load(engine)
    engine.run()
    assert engine.reloaded_tokens > 0
    assert engine.max_error() > 100 * TOLERANCE[torch.float32]


def test_hits_are_never_written() -> None:
    """The engine checks every step that no request writes into a prefix hit it holds."""
    config = KVCacheConfig(24, (KVCacheGroupSpec(FullAttentionSpec(block_size=4, **HEADS)),))
    manager = KVCacheManager(config, max_model_len=256, scheduler_block_size=4,
                             hash_block_size=4, backend="fast")
    engine = served(manager, planted="rewrite-hits")
    shared_prefix_load(engine)
    with pytest.raises(AssertionError, match="writes into a hit"):
        engine.run()
