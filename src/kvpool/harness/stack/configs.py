"""The model configurations the whole-stack machine drives (issue 10 §5).

Each is small on purpose — a few dozen blocks — so that memory pressure, eviction of cached
prefixes, allocation failure and preemption happen within a few hundred steps. Block sizes
differ between groups where vLLM allows it (the hybrid coordinator then aligns hits to the
LCM, the scheduler block size), because that is where alignment bugs live.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpool.policy.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)


@dataclass(frozen=True)
class StackConfiguration:
    """One model + manager configuration: everything ``KVCacheManager`` is built with."""

    name: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int = 48
    hash_block_size: int = 16
    scheduler_block_size: int = 16
    max_model_len: int = 320
    max_num_batched_tokens: int = 96
    enable_caching: bool = True
    use_eagle: bool = False
    num_lookahead_tokens: int = 0
    watermark: float = 0.0
    #: KV cache events: on wherever the prefix cache is, unless set (vLLM's engines run
    #: with them off by default: the fast pool then evicts without reporting).
    kv_events: bool | None = None
    #: vLLM 0.33's partial hits and copy-on-write (§10.4); the machine then runs the
    #: copy hand-over each step and ends some prefill chunks at the prompt's last hash
    #: boundary (where a Mamba state is checkpointed inside a block).
    allow_partial_hash_hits: bool = False
    #: The vLLM whose facade this configuration is compared with (conformance tier): 0.33
    #: for the features only it has (copy-on-write, circular buffers).
    vllm: tuple[int, int] = (0, 25)

    def prepare(self, manager: Any) -> Any:
        """``manager`` (a kvpool facade) set up for this configuration's vLLM: 0.33's rules
        for freeing Mamba states where it is compared with 0.33."""
        if self.vllm >= (0, 33):
            from kvpool.policy.mamba import follow_vllm_033_rules

            follow_vllm_033_rules(manager)
        return manager

    @property
    def enable_kv_cache_events(self) -> bool:
        return self.enable_caching if self.kv_events is None else self.kv_events

    def kv_cache_config(self) -> KVCacheConfig:
        return KVCacheConfig(self.num_blocks, self.groups)

    def manager_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`kvpool.policy.KVCacheManager` (bar ``backend``)."""
        return dict(
            kv_cache_config=self.kv_cache_config(), max_model_len=self.max_model_len,
            scheduler_block_size=self.scheduler_block_size,
            hash_block_size=self.hash_block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_caching=self.enable_caching, use_eagle=self.use_eagle,
            enable_kv_cache_events=self.enable_kv_cache_events, watermark=self.watermark,
            **({"allow_partial_hash_hits": True} if self.allow_partial_hash_hits else {}),
        )


def _g(spec: object, eagle: bool = False) -> KVCacheGroupSpec:
    return KVCacheGroupSpec(spec, is_eagle_group=eagle)  # type: ignore[arg-type]


FULL = FullAttentionSpec(block_size=16)

CONFIGURATIONS: dict[str, StackConfiguration] = {c.name: c for c in (
    StackConfiguration("full", (_g(FULL),)),
    # vLLM's defaults: a prefix cache, no events (quiet evictions; the fast policy keys a
    # filled block in the call that takes the next one).
    StackConfiguration("full-quiet", (_g(FULL),), kv_events=False),
    StackConfiguration("full-eagle", (_g(FULL),), use_eagle=True, num_lookahead_tokens=2),
    StackConfiguration("full-watermark", (_g(FULL),), num_blocks=40, watermark=0.1),
    StackConfiguration(
        "full+swa",
        (_g(FullAttentionSpec(block_size=32)),
         _g(SlidingWindowSpec(block_size=16, sliding_window=40))),
        num_blocks=64, scheduler_block_size=32),
    # Quiet hybrids, every group at the hash block size: the hybrid fast policy's running
    # steps as one pool call (group_step), under a watermark in the second.
    StackConfiguration(
        "full+swa-quiet",
        (_g(FULL), _g(SlidingWindowSpec(block_size=16, sliding_window=40))),
        num_blocks=64, kv_events=False),
    StackConfiguration(
        "full+chunked-quiet",
        (_g(FULL), _g(ChunkedLocalAttentionSpec(block_size=16, attention_chunk_size=64))),
        num_blocks=56, kv_events=False, watermark=0.05),
    StackConfiguration(
        "full+mamba",
        (_g(FULL), _g(MambaSpec(block_size=32, mamba_cache_mode="align"))),
        num_blocks=64, scheduler_block_size=32),
    StackConfiguration(
        "full+mamba-eagle",
        (_g(FULL), _g(MambaSpec(block_size=32, mamba_cache_mode="align",
                                num_speculative_blocks=1))),
        num_blocks=64, scheduler_block_size=32, use_eagle=True, num_lookahead_tokens=1),
    StackConfiguration(
        "full+chunked",
        (_g(FULL), _g(ChunkedLocalAttentionSpec(block_size=16, attention_chunk_size=64))),
        num_blocks=64),
    StackConfiguration(
        "2full+swa",
        (_g(FullAttentionSpec(block_size=16, head_size=64)),
         _g(FullAttentionSpec(block_size=16, head_size=128)),
         _g(SlidingWindowSpec(block_size=16, sliding_window=24))),
        num_blocks=80),
    StackConfiguration(
        "full+mamba-cow",
        (_g(FullAttentionSpec(block_size=32)),
         _g(MambaSpec(block_size=32, mamba_cache_mode="align"))),
        num_blocks=64, scheduler_block_size=32, allow_partial_hash_hits=True, vllm=(0, 33)),
    StackConfiguration(
        "2full+mamba-cow",
        (_g(FullAttentionSpec(block_size=64)),
         _g(FullAttentionSpec(block_size=16, head_size=64)),
         _g(MambaSpec(block_size=64, mamba_cache_mode="align"))),
        num_blocks=96, scheduler_block_size=64, allow_partial_hash_hits=True, vllm=(0, 33)),
    StackConfiguration(
        "full+ring",
        (_g(FULL), _g(CircularBufferSpec(block_size=16))),
        num_blocks=48, vllm=(0, 33)),
    StackConfiguration(
        "nocache",
        (_g(FULL), _g(SlidingWindowSpec(block_size=16, sliding_window=32))),
        enable_caching=False, watermark=0.05),
)}
"""The configurations of ``kvpool check --layer stack`` (all of them by default)."""


__all__ = ["CONFIGURATIONS", "StackConfiguration"]
