"""Paged KV tensors: layout, dtype/device, independent views, the fit check."""

import pytest
import torch

from kvpool.errors import InvalidConfig, KvPoolError
from kvpool.gpu import KVCacheDoesNotFit, PagedKVCache
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

FULL = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8)
SWA = SlidingWindowSpec(block_size=4, num_kv_heads=3, head_size=4, sliding_window=8)


def config(*specs, num_blocks=10, names=None):
    groups = tuple(KVCacheGroupSpec(s, layer_names=(names or {}).get(i, ()))
                   for i, s in enumerate(specs))
    return KVCacheConfig(num_blocks, groups)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_layer_gets_the_vllm_layout_in_the_callers_dtype(dtype, device) -> None:
    cache = PagedKVCache(config(FULL, SWA), dtype, device, num_layers=2)
    assert [tuple(t.shape) for t in cache.layers(0)] == [(2, 10, 4, 2, 8)] * 2
    assert [tuple(t.shape) for t in cache.layers(1)] == [(2, 10, 4, 3, 4)] * 2
    for t in cache.layers(0) + cache.layers(1):
        assert t.dtype == dtype and t.device.type == torch.device(device).type
        assert t.is_contiguous()
    assert cache.estimate_bytes() == cache.flat.numel() * cache.flat.element_size()
    assert PagedKVCache.estimate(config(FULL, SWA), dtype, num_layers=2) == \
        cache.estimate_bytes()


def test_layers_do_not_overlap(device) -> None:
    cache = PagedKVCache(config(FULL, SWA), torch.float32, device, num_layers=3)
    layers = cache.layers(0) + cache.layers(1)
    for i, t in enumerate(layers):
        t.fill_(float(i + 1))
    for i, t in enumerate(layers):
        assert bool((t == float(i + 1)).all())


def test_named_layers_and_groups_without_kv() -> None:
    cfg = config(FULL, MambaSpec(block_size=4, mamba_cache_mode="align"),
                 names={0: ("model.layers.0.attn", "model.layers.2.attn")})
    cache = PagedKVCache(cfg, torch.float16)
    assert list(cache.kv) == ["model.layers.0.attn", "model.layers.2.attn"]
    assert cache.layers(1) == []  # Mamba state is not a paged KV tensor
    with pytest.raises(InvalidConfig, match="num_layers"):
        PagedKVCache(config(FULL), torch.float16)


def test_too_large_a_cache_names_what_was_asked_and_what_is_free() -> None:
    cfg = config(FULL, num_blocks=1000)
    need = PagedKVCache.estimate(cfg, torch.float16, num_layers=4)
    with pytest.raises(KVCacheDoesNotFit) as info:
        PagedKVCache(cfg, torch.float16, num_layers=4, free_bytes=need - 1)
    error = info.value
    assert isinstance(error, KvPoolError) and isinstance(error, MemoryError)
    assert (error.asked_bytes, error.free_bytes) == (need, need - 1)
    assert str(need) in str(error) and str(need - 1) in str(error)
    PagedKVCache(cfg, torch.float16, num_layers=4, free_bytes=need)  # exactly fits


def test_the_real_free_memory_is_checked_before_allocating() -> None:
    huge = config(FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128),
                  num_blocks=2**20)
    with pytest.raises(KVCacheDoesNotFit, match="GiB"):
        PagedKVCache(huge, torch.float16, num_layers=64)  # ~ 4 TiB
