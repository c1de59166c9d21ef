"""Where each layer's paged KV tensor lives inside one flat buffer.

The whole KV cache of a model — every group, every layer, K and V — is **one** allocation.
Each layer sees its own contiguous view ``[2, num_blocks, block_size, num_kv_heads,
head_dim]`` (vLLM's layout); the copy and swap kernels see the flat buffer, so one launch
moves a block in every layer of its group at once. Offsets are rounded up to
:data:`ALIGN_BYTES` so every view and every block starts on a 256-byte boundary (what CUDA's
allocator guarantees, and what 16-byte vector copies need).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.errors import InvalidConfig
from kvpool.policy.specs import AttentionSpec, CrossAttentionSpec, KVCacheConfig

ALIGN_BYTES = 256


@dataclass(frozen=True)
class LayerSlice:
    """One layer's tensor: its group, its name and its element offset in the flat buffer."""

    group_id: int
    name: str
    offset: int  # in elements
    shape: tuple[int, int, int, int, int]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GroupLayout:
    """A group's geometry: elements per block (one of K or V, one layer) and its layers."""

    group_id: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    layers: tuple[LayerSlice, ...]

    @property
    def block_numel(self) -> int:
        return self.block_size * self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class KVCacheLayout:
    """The flat buffer's plan: total elements and, per group, its layers' slices.

    Groups whose spec is not attention (Mamba) hold no KV tensors here (``layers == ()``).
    """

    num_blocks: int
    itemsize: int
    groups: tuple[GroupLayout, ...]
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @classmethod
    def plan(cls, config: KVCacheConfig, itemsize: int, num_layers: int | None = None,
             num_blocks: int | None = None) -> KVCacheLayout:
        """Lay out every attention group of ``config``: its ``layer_names`` (or
        ``num_layers`` unnamed layers when a group names none), ``num_blocks`` blocks
        (default: the pool's)."""
        blocks = config.num_blocks if num_blocks is None else num_blocks
        if not isinstance(blocks, int) or isinstance(blocks, bool) or blocks < 1:
            raise InvalidConfig(f"num_blocks must be an int >= 1, got {blocks!r}")
        align = ALIGN_BYTES // itemsize if ALIGN_BYTES % itemsize == 0 else 1
        offset = 0
        groups = []
        for g, group in enumerate(config.kv_cache_groups):
            spec = group.kv_cache_spec
            if not isinstance(spec, AttentionSpec) or isinstance(spec, CrossAttentionSpec):
                groups.append(GroupLayout(g, spec.block_size, 0, 0, ()))
                continue
            names = group.layer_names
            if not names:
                if num_layers is None or num_layers < 1:
                    raise InvalidConfig(
                        f"group {g} names no layers: pass num_layers >= 1 or set layer_names")
                names = tuple(f"group{g}.layer{i}" for i in range(num_layers))
            shape = (2, blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
            layers = []
            for name in names:
                offset = -(-offset // align) * align
                layer = LayerSlice(g, name, offset, shape)
                layers.append(layer)
                offset += layer.numel
            groups.append(GroupLayout(g, spec.block_size, spec.num_kv_heads, spec.head_size,
                                      tuple(layers)))
        return cls(blocks, itemsize, tuple(groups), offset)


__all__ = ["ALIGN_BYTES", "GroupLayout", "KVCacheLayout", "LayerSlice"]
