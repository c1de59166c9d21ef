"""Model shapes a simulation can run: the KV cache groups of a model, as vLLM groups them.

A model's layers are grouped by what their KV cache needs (BEHAVIOUR.md §8). All groups draw
blocks from one pool, so a hybrid model spends part of the pool on each:

* ``full`` — one full-attention group: every layer keeps every token's KV (Llama, Qwen).
* ``full+swa`` — full attention plus a sliding-window group (window 1,024 tokens): blocks
  that fall out of the window are freed as the request grows (Gemma, Mistral-style hybrids).
* ``full+mamba`` — full attention plus a Mamba (state-space) group in ``align`` mode: one
  state per block boundary, only the newest matters (Jamba, Nemotron-H-style hybrids).

:func:`build_manager` turns a shape, a pool size and a block size into the
:class:`kvpool.policy.KVCacheManager` a scheduler drives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpool.errors import InvalidConfig
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    SlidingWindowSpec,
    make_kv_cache_manager,
)

SLIDING_WINDOW_TOKENS = 1024
"""The window of the ``full+swa`` model's sliding-window group."""


@dataclass(frozen=True)
class ModelShape:
    """A named model shape: its one-line description and its groups for a block size."""

    name: str
    description: str
    groups: Callable[[int], tuple[KVCacheGroupSpec, ...]]


def _full(bs: int) -> tuple[KVCacheGroupSpec, ...]:
    return (KVCacheGroupSpec(FullAttentionSpec(block_size=bs)),)


def _full_swa(bs: int) -> tuple[KVCacheGroupSpec, ...]:
    return (*_full(bs),
            KVCacheGroupSpec(SlidingWindowSpec(block_size=bs,
                                               sliding_window=SLIDING_WINDOW_TOKENS)))


def _full_mamba(bs: int) -> tuple[KVCacheGroupSpec, ...]:
    return (*_full(bs), KVCacheGroupSpec(MambaSpec(block_size=bs, mamba_cache_mode="align")))


MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("full", "one full-attention group (Llama-style)", _full),
    ModelShape("full+swa", f"full attention + sliding window of {SLIDING_WINDOW_TOKENS} "
               "tokens (Gemma-style hybrid)", _full_swa),
    ModelShape("full+mamba", "full attention + Mamba state, align mode (Jamba-style hybrid)",
               _full_mamba),
)}
"""The model shapes of ``kvpool simulate --model``."""


def full_attention_groups(groups: tuple[KVCacheGroupSpec, ...]) -> list[int]:
    """Indices of the groups that keep every token (their tables only grow)."""
    return [i for i, g in enumerate(groups) if type(g.kv_cache_spec) is FullAttentionSpec]


def build_manager(model: str, num_blocks: int, block_size: int, max_model_len: int, *,
                  backend: str | Any = "fast", enable_kv_cache_events: bool = True,
                  policy: str = "auto") -> KVCacheManager:
    """The facade for ``model`` over a fresh ``backend`` pool of ``num_blocks`` blocks: the
    fast policy where it serves the model and backend (``policy="auto"``), else the generic
    one (:func:`kvpool.policy.make_kv_cache_manager`)."""
    shape = MODELS.get(model)
    if shape is None:
        raise InvalidConfig(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    groups = shape.groups(block_size)
    return make_kv_cache_manager(  # type: ignore[no-any-return]
        KVCacheConfig(num_blocks, groups), max_model_len, block_size, block_size,
        max_num_batched_tokens=max_model_len, enable_kv_cache_events=enable_kv_cache_events,
        backend=backend, policy=policy)


__all__ = ["MODELS", "ModelShape", "SLIDING_WINDOW_TOKENS", "build_manager",
           "full_attention_groups"]
