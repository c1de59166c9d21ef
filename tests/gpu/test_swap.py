"""Swap to host memory with unpin_blocks semantics: in flight until flushed or reused; a
reuse finishes the copy-out first, or invalidates the host copy."""

import pytest
import torch

from kvpool import make_pool
from kvpool.errors import InvalidArgument
from kvpool.gpu import NO_COPY, Offloader, PagedKVCache
from kvpool.policy import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

CONFIG = KVCacheConfig(8, (
    KVCacheGroupSpec(FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8)),
    KVCacheGroupSpec(SlidingWindowSpec(block_size=4, num_kv_heads=2, head_size=8,
                                       sliding_window=4)),
))


def caches(device="cpu", host_blocks=6):
    dev = PagedKVCache(CONFIG, torch.float16, device, num_layers=2)
    dev.flat.copy_(torch.randn(dev.flat.shape).to(torch.float16))
    host = PagedKVCache(CONFIG, torch.float16, "cpu", num_layers=2, num_blocks=host_blocks,
                        pin_memory=True)
    return dev, host


def block(cache, g, b):
    return torch.stack([layer[:, b] for layer in cache.layers(g)]).cpu()


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
@pytest.mark.parametrize("policy", ["finish", "invalidate"])
def test_a_reused_block_finishes_or_invalidates_the_copy_out(backend, policy, device) -> None:
    dev, host = caches(device)
    pool = make_pool(8, backend=backend)
    ids = pool.get_new_blocks(7)  # 1..7
    tables = [[ids[0], ids[1]], [0, ids[2]]]  # group 1's position 0 left the window
    originals = {(0, ids[0]): block(dev, 0, ids[0]), (0, ids[1]): block(dev, 0, ids[1]),
                 (1, ids[2]): block(dev, 1, ids[2])}
    off = Offloader(dev, host, on_reuse=policy)
    transfer = off.swap_out(tables)
    assert transfer.host_ids[1][0] == NO_COPY and off.free_host_blocks == 3
    pool.free_blocks(ids[3:])
    pool.unpin_blocks([ids[2], ids[1], ids[0]], off.on_reuse)
    assert not transfer.done  # in flight: nothing has moved to the host yet
    # Pressure: the pool hands out every free block, the unpinned ones last (queue tail).
    reused = pool.get_new_blocks(7)
    assert set(reused) == set(ids)
    # "finish" completes the whole transfer at the first reuse; "invalidate" marks each block.
    assert off.reused_in_flight == (1 if policy == "finish" else 3)
    for g, b in originals:  # the new owners overwrite the blocks
        dev.layers(g)[0][:, b] = 0
    if policy == "finish":
        assert transfer.done
        assert [transfer.valid_blocks(g) for g in (0, 1)] == [2, 2]
    else:
        assert [transfer.valid_blocks(g) for g in (0, 1)] == [0, 1]  # null is not data
    off.flush()
    if policy == "finish":  # what reached the host is what the blocks held before reuse
        for (g, b), want in originals.items():
            j = tables[g].index(b)
            assert torch.equal(block(host, g, transfer.host_ids[g][j]), want)


def test_swap_in_restores_the_blocks_in_one_launch(device) -> None:
    dev, host = caches(device)
    off = Offloader(dev, host)
    tables = [[1, 2, 3], [0, 4, 5]]
    want = {(g, j): block(dev, g, b) for g, t in enumerate(tables)
            for j, b in enumerate(t) if b}
    transfer = off.swap_out(tables)
    off.flush()
    dev.flat.zero_()
    new_tables = [[6, 7, 1], [0, 2, 3]]
    assert off.swap_in(transfer, new_tables, [range(0, 3), range(1, 3)]) == 5
    for (g, j), value in want.items():
        assert torch.equal(block(dev, g, new_tables[g][j]), value)
    off.release(transfer)
    assert off.free_host_blocks == 6
    with pytest.raises(InvalidArgument, match="released"):
        off.swap_in(transfer, new_tables, [range(0, 1), range(0, 0)])


def test_bad_transfers_are_refused_before_anything_moves() -> None:
    dev, host = caches(host_blocks=2)
    off = Offloader(dev, host)
    with pytest.raises(InvalidArgument, match="host room"):
        off.swap_out([[1, 2, 3], []])
    assert off.free_host_blocks == 2
    transfer = off.swap_out([[1], [2]])
    with pytest.raises(InvalidArgument, match="no valid host copy"):
        off.swap_in(transfer, [[5, 6], [7]], [range(0, 2), range(0, 1)])
    with pytest.raises(InvalidArgument, match="policy|on_reuse"):
        Offloader(dev, host, on_reuse="ignore")
    other = PagedKVCache(CONFIG, torch.float32, "cpu", num_layers=2, num_blocks=4)
    with pytest.raises(InvalidArgument, match="dtype"):
        Offloader(dev, other)


def test_two_offloads_of_a_shared_block_are_both_told_of_its_reuse() -> None:
    dev, host = caches()
    pool = make_pool(8, backend="fast")
    shared, a, b = pool.get_new_blocks(3)
    pool.touch([shared])  # a second request holds the prefix block
    off = Offloader(dev, host, on_reuse="invalidate")
    first = off.swap_out([[shared, a], []])
    second = off.swap_out([[shared, b], []])
    pool.unpin_blocks([a, shared], off.on_reuse)
    pool.unpin_blocks([b, shared], off.on_reuse)  # the pool keeps one watcher per block
    pool.get_new_blocks(pool.get_num_free_blocks())
    assert first.valid_blocks(0) == 0 and second.valid_blocks(0) == 0


def test_offloading_a_request_the_manager_does_not_hold_changes_nothing() -> None:
    from kvpool.errors import UnknownRequest
    from kvpool.policy import KVCacheManager, SchedulerRequest

    dev, host = caches()
    manager = KVCacheManager(CONFIG, max_model_len=64, scheduler_block_size=4,
                             hash_block_size=4, backend="fast")
    off = Offloader(dev, host)
    with pytest.raises(UnknownRequest):
        off.offload(manager, SchedulerRequest("ghost", [1, 2, 3]))
    assert off.free_host_blocks == 6 and off.flush() == 0
