"""KV cache group specs: what one group of layers needs from the pool (BEHAVIOUR.md §8).

A spec is a frozen value. Two groups whose specs are *equal* (same class, same fields) are
looked up together by the hybrid coordinator, so the identity fields (``num_kv_heads``,
``head_size``) matter even though the pool never reads them: two full-attention groups with
different head sizes stay separate spec groups, exactly as in vLLM.

The class hierarchy is vLLM's, because manager resolution and the event "kind" both walk it:
R-SWA and sink attention *are* full attention (they are sorted first by the hybrid
coordinator and looked up like full attention); MLA is full attention in another format.

>>> spec = SlidingWindowSpec(block_size=16, sliding_window=128)
>>> spec_kind(spec), spec_sliding_window(spec)
('sliding_window', 128)
>>> spec.max_admission_blocks_per_request(max_num_batched_tokens=256, max_model_len=4096)
25
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.errors import InvalidConfig


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


def _positive_int(owner: str, name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidConfig(f"{owner}.{name} must be an int > 0, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec:
    """Base of every spec: the number of tokens one block holds."""

    block_size: int

    def __post_init__(self) -> None:
        _positive_int(type(self).__name__, "block_size", self.block_size)


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """An attention layer's cache. Head fields only distinguish otherwise equal specs."""

    num_kv_heads: int = 8
    head_size: int = 128


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Every token attends to every earlier token: a request keeps all its blocks."""


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: full attention in a compressed format."""


@dataclass(frozen=True, kw_only=True)
class RSWASpec(FullAttentionSpec):
    """Reference sliding window: the prompt stays visible, decode keeps ``rswa_window``."""

    rswa_window: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("RSWASpec", "rswa_window", self.rswa_window)


@dataclass(frozen=True, kw_only=True)
class SinkFullAttentionSpec(FullAttentionSpec):
    """Full attention with attention sinks; ``sink_len`` is a positive multiple of bs."""

    sink_len: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("SinkFullAttentionSpec", "sink_len", self.sink_len)
        if self.sink_len % self.block_size:
            raise InvalidConfig(
                f"SinkFullAttentionSpec.sink_len ({self.sink_len}) must be a multiple of "
                f"block_size ({self.block_size})"
            )


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """Each token attends to the ``sliding_window`` tokens ending at itself."""

    sliding_window: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int(type(self).__name__, "sliding_window", self.sliding_window)

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int,
                                         max_model_len: int) -> int:
        """Most blocks a request holds at once: the window behind a chunk plus the chunk.

        +1 because the window need not start at a block boundary.
        """
        tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return cdiv(tokens, self.block_size) + 1


@dataclass(frozen=True, kw_only=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """Sliding window in MLA format."""


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Tokens attend only within their ``attention_chunk_size``-token chunk."""

    attention_chunk_size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("ChunkedLocalAttentionSpec", "attention_chunk_size",
                      self.attention_chunk_size)

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int,
                                         max_model_len: int) -> int:
        """Most blocks a request holds at once: one chunk behind plus the scheduled chunk."""
        tokens = min(self.attention_chunk_size + max_num_batched_tokens, max_model_len)
        return cdiv(tokens, self.block_size)


@dataclass(frozen=True, kw_only=True)
class CrossAttentionSpec(AttentionSpec):
    """Encoder-decoder cross attention: sized by encoder tokens, never cached."""


@dataclass(frozen=True, kw_only=True)
class CircularBufferSpec(AttentionSpec):
    """A ring of ``block_size`` token rows, one block per request for its whole life
    (vLLM 0.33, e.g. the keys of a group still being compressed): never prefix-cached."""


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """A state-space layer: only the newest state matters.

    ``mamba_cache_mode`` is ``"none"`` (one state block, plus speculative ones),
    ``"align"`` (states checkpointed at block boundaries so they can be prefix-cached) or
    ``"all"`` (every state kept; for the managers of vLLM 0.25.1 it sizes like ``"none"``).
    ``state_tag`` only distinguishes otherwise equal specs (vLLM: shapes and dtypes).
    """

    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    state_tag: str = field(default="")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mamba_cache_mode not in ("none", "align", "all"):
            raise InvalidConfig(
                f"MambaSpec.mamba_cache_mode must be 'none', 'align' or 'all', got "
                f"{self.mamba_cache_mode!r}"
            )
        n = self.num_speculative_blocks
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise InvalidConfig(f"MambaSpec.num_speculative_blocks must be an int >= 0, got {n!r}")


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """One KV cache group: layers sharing a block table. ``is_eagle_group`` marks draft
    (EAGLE/MTP) layers, whose lookups drop the last hit block."""

    kv_cache_spec: KVCacheSpec
    is_eagle_group: bool = False
    layer_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class KVCacheConfig:
    """The pool size and the groups that share it (group id = index)."""

    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_cache_groups", tuple(self.kv_cache_groups))
        n = self.num_blocks
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise InvalidConfig(f"KVCacheConfig.num_blocks must be an int > 0, got {n!r}")
        for i, group in enumerate(self.kv_cache_groups):
            if not isinstance(group, KVCacheGroupSpec) or not isinstance(
                group.kv_cache_spec, KVCacheSpec
            ):
                raise InvalidConfig(
                    f"KVCacheConfig.kv_cache_groups[{i}] must be a KVCacheGroupSpec with a "
                    f"KVCacheSpec, got {group!r}"
                )


# Most specific first: the event "kind" is the first name whose class the spec is.
_KINDS: tuple[tuple[type, str], ...] = (
    (SlidingWindowMLASpec, "sliding_window_mla"),
    (MLAAttentionSpec, "mla_attention"),
    (SinkFullAttentionSpec, "sink_full_attention"),
    (FullAttentionSpec, "full_attention"),
    (ChunkedLocalAttentionSpec, "chunked_local_attention"),
    (SlidingWindowSpec, "sliding_window"),
    (MambaSpec, "mamba"),
    (CrossAttentionSpec, "cross_attention"),
)


def spec_kind(spec: KVCacheSpec) -> str:
    """The ``kv_cache_spec_kind`` events report for a group of this spec (§7)."""
    for cls, name in _KINDS:
        if isinstance(spec, cls):
            return name
    return "unknown"


def is_prefix_cacheable(spec: KVCacheSpec) -> bool:
    """Whether a group of this spec takes part in prefix caching (a circular buffer is
    per-request scratch: no lookups, no keys)."""
    return not isinstance(spec, CircularBufferSpec)


def spec_sliding_window(spec: KVCacheSpec) -> int | None:
    """The window events report: a sliding-window spec's, ``None`` for any other spec."""
    return spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None


__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheSpec",
    "MLAAttentionSpec",
    "MambaSpec",
    "RSWASpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "cdiv",
    "is_prefix_cacheable",
    "spec_kind",
    "spec_sliding_window",
]
