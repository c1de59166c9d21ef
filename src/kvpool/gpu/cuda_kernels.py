"""CUDA kernels of the GPU layer (numba-cuda; under ``NUMBA_ENABLE_CUDASIM=1`` they run in
Numba's CUDA simulator on numpy arrays, which is how CI tests them without a GPU).

Why numba-cuda rather than Triton: the fast backend already depends on Numba, so the same
toolchain compiles the CPU and the CUDA kernels; numba-cuda is a 2 MB wheel (Triton's is
~290 MB) and its simulator runs the *same* kernel source on the CPU, thread by thread.

:func:`copy_segments_kernel` is the one launch of a step's copies (or of a swap): CUDA block
``k`` walks segments ``k, k + gridDim, …``; its threads copy a segment's words with
consecutive threads on consecutive words (coalesced). A segment outside either buffer is
skipped, so no caller's ids can make the kernel touch memory it was not given (the planner
has refused such a batch already).
"""

from __future__ import annotations

from numba import cuda

THREADS = 256
MAX_BLOCKS = 4096


@cuda.jit
def copy_segments_kernel(src, dst, segments):
    num_segments = segments.shape[0]
    k = cuda.blockIdx.x
    while k < num_segments:
        s = segments[k, 0]
        d = segments[k, 1]
        n = segments[k, 2]
        # written so that no sum can overflow (hostile segments): n <= size, s <= size - n
        if s >= 0 and d >= 0 and n >= 0 and n <= src.shape[0] and n <= dst.shape[0] and \
                s <= src.shape[0] - n and d <= dst.shape[0] - n:
            i = cuda.threadIdx.x
            while i < n:
                dst[d + i] = src[s + i]
                i += cuda.blockDim.x
        k += cuda.gridDim.x


def launch_copy(src, dst, segments, stream=0, *, threads: int = THREADS,
                max_blocks: int = MAX_BLOCKS) -> None:
    """One launch over all ``segments`` (device arrays, or numpy under the simulator)."""
    n = segments.shape[0]
    if n == 0:
        return
    copy_segments_kernel[min(n, max_blocks), threads, stream](src, dst, segments)


def torch_stream():
    """Numba's handle on torch's current CUDA stream (kernels order with torch's work)."""
    import torch

    return cuda.external_stream(torch.cuda.current_stream().cuda_stream)


__all__ = ["copy_segments_kernel", "launch_copy", "torch_stream"]
