"""Every configuration vLLM only asserts is an InvalidConfig at construction, naming the
field (BEHAVIOUR.md §9, §10, §12)."""

from __future__ import annotations

import pytest

from kvpool.errors import InvalidConfig
from kvpool.policy import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheManager,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from kvpool.policy.coordinator import KVCacheCoordinatorNoPrefixCache, UnitaryKVCacheCoordinator
from kvpool.policy.hybrid import HybridKVCacheCoordinator

from .helpers import groups, manager

FULL = FullAttentionSpec(block_size=16)
SWA = SlidingWindowSpec(block_size=16, sliding_window=64)


def test_factory_picks_no_prefix_cache_unitary_and_hybrid() -> None:
    assert isinstance(manager(FULL, enable_caching=False).coordinator,
                      KVCacheCoordinatorNoPrefixCache)
    assert isinstance(manager(FULL).coordinator, UnitaryKVCacheCoordinator)
    assert isinstance(manager(FULL, SWA).coordinator, HybridKVCacheCoordinator)


def test_no_prefix_cache_takes_zero_groups() -> None:
    m = KVCacheManager(KVCacheConfig(8, ()), 128, 16, 16, enable_caching=False)
    assert m.get_num_common_prefix_blocks("x") == []


@pytest.mark.parametrize(("build", "field"), [
    (lambda: manager(FULL, hbs=8), "hash_block_size"),
    (lambda: manager(FULL, FullAttentionSpec(block_size=16)), "kv_cache_groups"),
    (lambda: manager(FULL, SWA, dcp_world_size=2), "dcp_world_size"),
    (lambda: manager(FULL, sbs=24), "scheduler_block_size"),
    (lambda: manager(FULL, SWA, hbs=32, sbs=32), "hash_block_size"),
    (lambda: manager(FULL, retention_interval=16), "retention_interval"),
    (lambda: manager(FULL, SWA, retention_interval=24), "retention_interval"),
    (lambda: manager(FULL, SWA, retention_interval=-16), "retention_interval"),
    (lambda: manager(FULL, watermark=-0.1), "watermark"),
    (lambda: manager(CrossAttentionSpec(block_size=16)), "cross attention"),
    (lambda: manager(FULL, ChunkedLocalAttentionSpec(block_size=16, attention_chunk_size=64),
                     use_eagle=True), "EAGLE"),
    (lambda: manager(FullAttentionSpec(block_size=32),
                     ChunkedLocalAttentionSpec(block_size=16, attention_chunk_size=64)),
     "scheduler_block_size"),
    (lambda: manager(MambaSpec(block_size=16), dcp_world_size=2), "dcp_world_size"),
    (lambda: SinkFullAttentionSpec(block_size=16, sink_len=24), "sink_len"),
    (lambda: MambaSpec(block_size=16, mamba_cache_mode="bogus"), "mamba_cache_mode"),
    (lambda: KVCacheConfig(0, groups(FULL)), "num_blocks"),
    (lambda: FullAttentionSpec(block_size=0), "block_size"),
])
def test_invalid_configuration_raises_invalid_config_naming_the_field(build, field) -> None:
    with pytest.raises(InvalidConfig, match=field):
        build()


def test_retention_interval_group_check_comes_before_the_multiple_check() -> None:
    with pytest.raises(InvalidConfig, match="no sliding-window or Mamba"):
        manager(FULL, retention_interval=7)


def test_unitary_accepts_dcp_with_a_scaled_block_size() -> None:
    m = manager(FULL, hbs=32, sbs=32, dcp_world_size=2)
    assert m.coordinator.block_size == 32


def test_cross_attention_is_fine_without_caching() -> None:
    m = manager(FULL, CrossAttentionSpec(block_size=16), enable_caching=False)
    assert m.coordinator.single_type_managers[1].block_size == 16
