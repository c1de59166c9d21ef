"""The CUDA copy kernel under Numba's CUDA simulator (run by test_cuda_sim.py in a process
with ``NUMBA_ENABLE_CUDASIM=1``; the simulator must be chosen before numba.cuda loads)."""

import numpy as np
import torch

from kvpool.gpu import PagedKVCache
from kvpool.gpu import copy_plan as plan
from kvpool.gpu.cpu_kernels import copy_segments
from kvpool.gpu.cuda_kernels import launch_copy
from kvpool.policy import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

CONFIG = KVCacheConfig(6, (
    KVCacheGroupSpec(FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=4)),
    KVCacheGroupSpec(SlidingWindowSpec(block_size=2, num_kv_heads=1, head_size=2,
                                       sliding_window=4)),
))


def check_the_kernel_matches_the_cpu_kernel() -> None:
    for dtype in (torch.float16, torch.float32):
        cache = PagedKVCache(CONFIG, dtype, num_layers=2)
        cache.flat.copy_(torch.randn(cache.flat.shape).to(dtype))
        seg = plan.CopyPlanner(cache, cache, same_space=True).plan(
            [(1, 3, 0), (2, 4, 0), (1, 5, 1)]).segments
        want = cache.words().numpy().copy()
        assert copy_segments(want, want, seg, cache.word_bytes) == -1
        got = cache.words().numpy().copy()
        # fewer CUDA blocks than segments: the grid-stride loop must cover the rest
        launch_copy(got, got, seg, threads=8, max_blocks=3)
        assert (got == want).all(), dtype


def check_swap_between_two_buffers() -> None:
    dev = PagedKVCache(CONFIG, torch.float16, num_layers=2)
    dev.flat.copy_(torch.randn(dev.flat.shape).to(torch.float16))
    host = PagedKVCache(CONFIG, torch.float16, num_layers=2, num_blocks=3)
    seg = plan.CopyPlanner(dev, host, same_space=False, null_dst=False).plan(
        np.array([(4, 0, 0), (5, 2, 1)])).segments
    h = host.words().numpy()
    launch_copy(dev.words().numpy(), h, seg, threads=4, max_blocks=2)
    assert torch.equal(host.layer(0, 1)[:, 0], dev.layer(0, 1)[:, 4])
    assert torch.equal(host.layer(1, 0)[:, 2], dev.layer(1, 0)[:, 5])


def check_segments_outside_a_buffer_are_skipped() -> None:
    src = np.arange(32, dtype=np.int64)
    dst = np.zeros(16, dtype=np.int64)
    seg = np.array([[0, 0, 4], [30, 4, 4], [4, 14, 4], [-1, 8, 2], [8, 8, 2]], dtype=np.int64)
    launch_copy(src, dst, seg, threads=4, max_blocks=2)
    assert dst.tolist() == [0, 1, 2, 3] + [0] * 4 + [8, 9] + [0] * 6


def check_segments_whose_bounds_overflow_are_skipped() -> None:
    src = np.arange(32, dtype=np.int64)
    dst = np.zeros(16, dtype=np.int64)
    big = np.iinfo(np.int64).max
    seg = np.array([[2**62, 0, 2**62], [0, 2**62, 2**62], [big, 0, 1], [1, 0, big],
                    [4, 12, 4]], dtype=np.int64)
    launch_copy(src, dst, seg, threads=4, max_blocks=2)
    assert dst.tolist() == [0] * 12 + [4, 5, 6, 7]


if __name__ == "__main__":
    for name, check in sorted(globals().items()):
        if name.startswith("check_"):
            check()
            print("ok", name)
