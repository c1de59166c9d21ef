"""Batched block copy: exact bytes in every layer, runs merged, one launch, bad batches
refused before anything moves, endpoints released once after the step."""

import numpy as np
import pytest
import torch

from kvpool.errors import InvalidArgument, InvalidBlockId, InvalidGroupId, KvPoolError
from kvpool.gpu import BlockCopier, InvalidCopyPair, PagedKVCache
from kvpool.gpu.copy_plan import as_pair_array, coalesce
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

CONFIG = KVCacheConfig(14, (
    KVCacheGroupSpec(FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8)),
    KVCacheGroupSpec(SlidingWindowSpec(block_size=2, num_kv_heads=1, head_size=4,
                                       sliding_window=4)),
    KVCacheGroupSpec(MambaSpec(block_size=4, mamba_cache_mode="align")),
))


def filled(dtype=torch.float16, device="cpu", config=CONFIG) -> PagedKVCache:
    cache = PagedKVCache(config, dtype, device, num_layers=3)
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(cache.flat.shape, generator=gen)
    cache.flat.copy_(values.to(dtype))
    return cache


def expected_after(cache: PagedKVCache, pairs) -> list[list[torch.Tensor]]:
    """The reference: per layer, K and V of each dst become the src's (slow, obvious)."""
    out = [[t.clone() for t in cache.layers(g)] for g in range(cache.num_groups)]
    for src, dst, g in pairs:
        for before, after in zip(cache.layers(g), out[g], strict=True):
            after[:, dst] = before[:, src]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8])
def test_every_layer_of_the_group_gets_the_source_bytes(dtype, device) -> None:
    cache = filled(dtype, device)
    pairs = [(1, 5, 0), (2, 6, 0), (3, 7, 0), (9, 4, 0), (8, 11, 1), (3, 10, 1), (2, 13, 2)]
    want = expected_after(cache, pairs)
    copier = BlockCopier(cache)
    stats = copier.copy(pairs)
    for g in range(cache.num_groups):
        for got, exp in zip(cache.layers(g), want[g], strict=True):
            assert torch.equal(got.view(torch.uint8) if dtype != torch.uint8 else got,
                               exp.view(torch.uint8) if dtype != torch.uint8 else exp)
    # 1-3 -> 5-7 is one run; 9->4, 8->11, 3->10 their own; the Mamba pair moves nothing here.
    assert stats.runs == 5 and stats.segments == 4 * 3 * 2
    assert copier.launches == 1


def test_runs_merge_only_when_both_ids_advance_together() -> None:
    pairs = as_pair_array([(4, 9, 0), (2, 7, 0), (3, 8, 0), (5, 11, 0), (6, 12, 1), (7, 13, 1)])
    assert coalesce(pairs).tolist() == [[0, 2, 7, 3], [0, 5, 11, 1], [1, 6, 12, 2]]


def test_unaligned_blocks_take_the_word_loop() -> None:
    odd = KVCacheConfig(6, (KVCacheGroupSpec(FullAttentionSpec(block_size=3, num_kv_heads=1,
                                                               head_size=3)),))
    cache = filled(torch.uint8, config=odd)
    assert cache.word_bytes == 1
    want = expected_after(cache, [(1, 4, 0), (2, 5, 0)])
    BlockCopier(cache).copy([(1, 4, 0), (2, 5, 0)])
    assert all(torch.equal(a, b) for a, b in zip(cache.layers(0), want[0], strict=True))


class Refs:
    """A pool's ref counts as the copier reads them (``observe().ref_cnts``)."""

    def __init__(self, **counts: int) -> None:
        self.counts = {int(k[1:]): v for k, v in counts.items()}

    def __call__(self, ids):
        return [self.counts.get(b, 1) for b in ids]


@pytest.mark.parametrize(("pairs", "retained", "error", "match"), [
    ([(1, 5, 0), (2, 14, 0)], [], InvalidBlockId, "destination block 14"),
    ([(-1, 5, 0)], [], InvalidBlockId, "source block -1"),
    ([(1, 5, 3)], [], InvalidGroupId, "group 3"),
    ([(1, 5, 0), (0, 6, 0)], [], InvalidCopyPair, "null"),
    ([(1, 0, 0)], [], InvalidCopyPair, "null"),
    ([(1, 5, 0), (2, 5, 0)], [], InvalidCopyPair, "already the destination"),
    ([(1, 5, 0), (5, 6, 0)], [], InvalidCopyPair, "also a source"),
    ([(1, 5, 0), (2, 6, 1)], [1, 5, 2, 6], InvalidCopyPair, "destination block 6 is still shared"),
    ([(1, 5, 0), ("2", 6, 0)], [], InvalidArgument, "pairs"),
    ([(1, 5)], [], InvalidArgument, "pairs"),
    ([(True, 5, 0)], [], InvalidArgument, "pairs"),
    ([7], [], InvalidArgument, "pairs"),
    ([(1, 5, 0), (2, 6, 0), (3, 5, 0)], [], InvalidCopyPair, r"pairs\[2\].*pairs\[0\]"),
])
def test_a_bad_batch_copies_nothing_and_releases_nothing(pairs, retained, error,
                                                         match) -> None:
    cache = filled()
    before = cache.flat.clone()
    released = []
    copier = BlockCopier(cache, ref_cnts=Refs(b5=2, b6=3), release=released.extend)
    with pytest.raises(error, match=match) as info:
        copier.copy(pairs, retained)
    assert isinstance(info.value, KvPoolError)
    assert torch.equal(cache.flat.view(torch.uint8), before.view(torch.uint8))
    assert copier.end_step() == [] and released == [] and copier.launches == 0


def test_a_destination_held_by_its_table_and_its_retention_is_writable() -> None:
    cache = filled()
    copier = BlockCopier(cache, ref_cnts=Refs(b1=2, b5=2))  # §10.4: table + retention
    copier.copy([(1, 5, 0)], retained=[1, 5])
    with pytest.raises(InvalidCopyPair, match="still shared"):
        copier.copy([(1, 5, 0)])  # the same ref counts without the retention


def test_endpoints_are_released_once_after_the_step() -> None:
    cache = filled()
    released: list[list[int]] = []
    copier = BlockCopier(cache, ref_cnts=Refs(b5=2, b6=2), release=released.append)
    copier.copy([(1, 5, 0)], retained=[1, 5])
    copier.copy([(1, 6, 0)], retained=[1, 6])  # a source copied twice is retained twice
    assert released == []  # not while the step (which reads the copies) runs
    assert copier.end_step() == [1, 5, 1, 6]
    assert released == [[1, 5, 1, 6]]
    assert copier.end_step() == [] and released == [[1, 5, 1, 6]]


def test_the_cpu_kernel_guards_its_own_bounds() -> None:
    from kvpool.gpu.cpu_kernels import OK, copy_segments

    a = np.arange(64, dtype=np.int64)
    before = a.copy()
    for seg in ([[0, 60, 8]], [[60, 0, 8]], [[-1, 0, 2]], [[0, 8, 4], [0, 0, -1]]):
        assert copy_segments(a, a, np.array(seg, dtype=np.int64), 8) != OK
        assert (a == before).all()  # nothing copied, not even the good segment first
    assert copy_segments(a, a, np.array([[0, 32, 4]], dtype=np.int64), 8) == OK
    assert a[32:36].tolist() == [0, 1, 2, 3]
