"""Batched block copy: the policy layer's pending copy-on-write pairs, executed.

A step drains ``(pairs, retained) = manager.take_kv_cache_block_copies()`` and hands both to
:meth:`BlockCopier.copy` (as the manager's ``BlockCopy`` list, or an int64 ``[n, 3]`` array,
the cheapest): the whole batch is checked and planned in one jitted pass
(:mod:`kvpool.gpu.copy_plan`), runs of consecutive ids are merged, and **one** launch copies
every run in every layer of its group, K and V. The retained endpoints are *not* released
then: BEHAVIOUR.md §10.4 requires each to be freed exactly once after the copy has executed,
past the step that runs it, so they wait until :meth:`BlockCopier.end_step` (which first
waits for the device), then go to the ``release`` callback (the facade's
``release_copy_endpoints``) in one call.

Where a batch is refused nothing was copied and nothing released: the endpoints are still the
caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvpool.errors import InvalidArgument
from kvpool.gpu import copy_plan
from kvpool.gpu.kv_cache import PagedKVCache


@dataclass(frozen=True)
class CopyStats:
    """What one launch moved: pairs asked, runs after merging, segments launched, bytes."""

    pairs: int
    runs: int
    segments: int
    bytes: int


def launch_segments(src: PagedKVCache, dst: PagedKVCache, segments: np.ndarray) -> None:
    """Copy ``segments`` from ``src``'s flat buffer into ``dst``'s: one kernel call.

    Both on the CPU: the Numba kernel. Either on CUDA: the numba-cuda kernel on torch's
    current stream (a pinned host side is read or written in place through unified
    addressing).
    """
    if not len(segments):
        return
    if src.device.type == "cpu" and dst.device.type == "cpu":
        from kvpool.gpu.cpu_kernels import OK, copy_segments

        a, b = src.words().numpy(), dst.words().numpy()
        bad = copy_segments(a, b, segments, src.word_bytes)
        if bad != OK:  # unreachable after the planner's checks; the kernel guards anyway
            raise RuntimeError(f"copy kernel refused segment {bad}: {segments[bad]}")
        return
    from numba import cuda

    from kvpool.gpu import cuda_kernels

    device = src.device if src.device.type == "cuda" else dst.device
    seg = torch.from_numpy(segments).to(device, non_blocking=False)
    cuda_kernels.launch_copy(_device_view(src.words()), _device_view(dst.words()),
                             cuda.as_cuda_array(seg, sync=False), cuda_kernels.torch_stream())


def _device_view(words: torch.Tensor):
    """A numba device array over a CUDA tensor, or over pinned host memory (its device
    pointer under unified addressing)."""
    from numba import cuda

    if words.device.type == "cuda":
        return cuda.as_cuda_array(words, sync=False)  # launched on the same stream
    if not words.is_pinned():
        raise InvalidArgument("a host buffer in a device transfer must be pinned "
                              "(PagedKVCache(..., pin_memory=True))")
    interface = {"shape": tuple(words.shape), "strides": None, "version": 3,
                 "typestr": np.dtype(str(words.dtype).replace("torch.", "")).str,
                 "data": (words.data_ptr(), False)}
    return cuda.from_cuda_array_interface(interface, owner=words, sync=False)


class BlockCopier:
    """Executes block-copy batches on one :class:`PagedKVCache`.

    ``ref_cnts`` enables the "destination still shared" check: the pool's
    ``observe().ref_cnts`` (asked once per batch about its destinations), or an integer array
    of ref counts by block id (read at each batch). ``release`` receives the retained
    endpoints at :meth:`end_step`.
    """

    def __init__(self, cache: PagedKVCache, *,
                 ref_cnts: copy_plan.RefCounts | None = None,
                 release: Callable[[list[int]], None] | None = None) -> None:
        self.cache = cache
        self.ref_cnts = ref_cnts
        self.release = release
        self._pending_release: list[int] = []
        self.launches = 0
        self.planner = copy_plan.CopyPlanner(cache, cache, same_space=True)

    def copy(self, pairs: Iterable[Sequence[int]] | np.ndarray,
             retained: Sequence[int] = ()) -> CopyStats:
        """Check, merge and launch one batch; the endpoints wait for :meth:`end_step`."""
        cache = self.cache
        retained = [int(b) for b in retained]
        plan = self.planner.plan(pairs, ref_cnts=self.ref_cnts, retained=retained)
        seg = plan.segments
        launch_segments(cache, cache, seg)
        if len(seg):
            self.launches += 1
        self._pending_release.extend(retained)
        return CopyStats(len(plan.pairs), plan.runs, len(seg), plan.words * cache.word_bytes)

    def end_step(self) -> list[int]:
        """The step's copies are done: wait for the device, then release every retained
        endpoint once (``release`` gets them in one call). Returns what was released."""
        done, self._pending_release = self._pending_release, []
        if self.cache.device.type == "cuda":
            torch.cuda.current_stream(self.cache.device).synchronize()
        if done and self.release is not None:
            self.release(done)
        return done


__all__ = ["BlockCopier", "CopyStats", "launch_segments"]
