"""Paged KV tensors: one flat allocation, one ``[2, num_blocks, block_size, num_kv_heads,
head_dim]`` view per layer (see :mod:`kvpool.gpu.layout`).

The size is estimated and compared with the device's free memory *before* anything is
allocated; too large is a :class:`~kvpool.gpu.errors.KVCacheDoesNotFit` naming both numbers.
"""

from __future__ import annotations

from math import gcd

import torch

from kvpool.gpu.errors import KVCacheDoesNotFit
from kvpool.gpu.layout import ALIGN_BYTES, KVCacheLayout
from kvpool.memory import available_memory_bytes
from kvpool.policy.specs import KVCacheConfig

_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory of ``device``: CUDA's ``mem_get_info``, the host's ``MemAvailable``."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        return available_memory_bytes()
    return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class PagedKVCache:
    """The KV tensors of every attention group of ``config``, on ``device`` in ``dtype``.

    ``layer(g, i)`` is layer ``i`` of group ``g``; ``kv[name]`` the same by layer name.
    ``num_blocks`` defaults to the pool's (``config.num_blocks``); a host mirror for offload
    passes its own count and ``pin_memory=True`` (pinned only where CUDA exists).
    """

    def __init__(self, config: KVCacheConfig, dtype: torch.dtype = torch.float16,
                 device: str | torch.device = "cpu", *, num_layers: int | None = None,
                 num_blocks: int | None = None, pin_memory: bool = False,
                 free_bytes: int | None = None) -> None:
        self.device = torch.device(device)
        self.dtype = dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.layout = KVCacheLayout.plan(config, itemsize, num_layers, num_blocks)
        self.num_blocks = self.layout.num_blocks
        asked = self.estimate_bytes()
        free = free_device_bytes(self.device) if free_bytes is None else free_bytes
        if free is not None and asked > free:
            raise KVCacheDoesNotFit(
                f"the KV cache needs {asked} bytes ({_gib(asked)}: {self.num_blocks} blocks, "
                f"{sum(len(g.layers) for g in self.layout.groups)} layers, {dtype}) but "
                f"{self.device} has {free} bytes ({_gib(free)}) free; use fewer blocks",
                asked, free)
        pin = pin_memory and self.device.type == "cpu" and torch.cuda.is_available()
        self.flat = torch.zeros(self._padded_numel(), dtype=dtype, device=self.device,
                                pin_memory=pin)
        self.pinned = pin
        self._layers = [[self.flat.narrow(0, s.offset, s.numel).view(s.shape)
                         for s in g.layers] for g in self.layout.groups]
        self.kv = {s.name: self._layers[s.group_id][i]
                   for g in self.layout.groups for i, s in enumerate(g.layers)}
        # The widest integer word every block boundary falls on: kernels copy in it.
        width = 8
        for g in self.layout.groups:
            if g.layers:
                width = gcd(width, g.block_numel * itemsize)
        self.word_bytes = width

    def _padded_numel(self) -> int:
        align = max(1, ALIGN_BYTES // self.layout.itemsize)
        return -(-self.layout.numel // align) * align

    def estimate_bytes(self) -> int:
        """Bytes the flat buffer takes (what the fit check compares)."""
        return self._padded_numel() * self.layout.itemsize

    @staticmethod
    def estimate(config: KVCacheConfig, dtype: torch.dtype = torch.float16, *,
                 num_layers: int | None = None, num_blocks: int | None = None) -> int:
        """Bytes a cache of this shape would take, without allocating it."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        layout = KVCacheLayout.plan(config, itemsize, num_layers, num_blocks)
        align = max(1, ALIGN_BYTES // itemsize)
        return -(-layout.numel // align) * align * itemsize

    @property
    def num_groups(self) -> int:
        return len(self.layout.groups)

    def layers(self, group_id: int) -> list[torch.Tensor]:
        return self._layers[group_id]

    def layer(self, group_id: int, index: int) -> torch.Tensor:
        return self._layers[group_id][index]

    def words(self) -> torch.Tensor:
        """The flat buffer as integer words of :attr:`word_bytes` (bit-exact copies of any
        dtype, bf16 and fp8 included)."""
        return self.flat.view(_WORDS[self.word_bytes])

    def block_word_spans(self, group_id: int) -> tuple[list[int], int]:
        """Per layer and K/V the word offset of block 0, and the words per block."""
        g = self.layout.groups[group_id]
        itemsize = self.layout.itemsize
        bases = []
        for s in g.layers:
            for k in range(2):
                element = s.offset + k * self.num_blocks * g.block_numel
                bases.append(element * itemsize // self.word_bytes)
        return bases, g.block_numel * itemsize // self.word_bytes


__all__ = ["PagedKVCache", "free_device_bytes"]
