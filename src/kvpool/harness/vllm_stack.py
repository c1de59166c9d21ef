"""vLLM's own ``KVCacheManager`` as a stack of the whole-stack machine (conformance tier).

:class:`VllmFacade` builds vLLM's facade for a :class:`StackConfiguration` (the same groups,
sizes and flags) and answers the calls the machine makes with kvpool's value types: block
ids instead of block objects, :class:`kvpool.policy.KVCacheBlocks` results. Each kvpool
request gets a vLLM twin ``Request`` whose block hasher hands over the kvpool request's own
hashes, so both managers see the very same keys and events carry the same hashes.

Needs vLLM importable (the kit venv: ``/tmp/anchors/vllm025/venv``); see
:func:`run_conformance` and ``docs/policy.md`` for how to point the tier at a kit.
Only this module imports vLLM.
"""

from __future__ import annotations

from typing import Any

from kvpool.errors import BackendUnavailable
from kvpool.harness.stack_configs import StackConfiguration
from kvpool.policy import specs as kv
from kvpool.policy.blocks import KVCacheBlocks
from kvpool.policy.request import RequestStatus


def _vllm_spec(spec: kv.KVCacheSpec) -> Any:
    import torch
    from vllm.v1 import kv_cache_interface as vi

    common = dict(block_size=spec.block_size)
    if isinstance(spec, kv.MambaSpec):
        return vi.MambaSpec(shapes=((1,),), dtypes=(torch.float16,),
                            mamba_cache_mode=spec.mamba_cache_mode,
                            num_speculative_blocks=spec.num_speculative_blocks, **common)
    assert isinstance(spec, kv.AttentionSpec)
    attn = dict(common, num_kv_heads=spec.num_kv_heads, head_size=spec.head_size,
                dtype=torch.float16)
    if isinstance(spec, kv.SlidingWindowSpec):
        return vi.SlidingWindowSpec(sliding_window=spec.sliding_window, **attn)
    if isinstance(spec, kv.ChunkedLocalAttentionSpec):
        return vi.ChunkedLocalAttentionSpec(attention_chunk_size=spec.attention_chunk_size,
                                            **attn)
    if isinstance(spec, kv.FullAttentionSpec) and type(spec) is kv.FullAttentionSpec:
        return vi.FullAttentionSpec(**attn)
    raise BackendUnavailable(f"no vLLM twin for {type(spec).__name__} in this tier")


_STATUS = {RequestStatus.WAITING: "WAITING", RequestStatus.RUNNING: "RUNNING",
           RequestStatus.PREEMPTED: "PREEMPTED", RequestStatus.FINISHED: "FINISHED_STOPPED"}


class _PoolView:
    """The few pool calls the machine makes, on vLLM's ``BlockPool``, by id."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.null_block = 0
        self.num_gpu_blocks = pool.num_gpu_blocks

    def free_blocks(self, ids: list[int]) -> None:
        self.pool.free_blocks([self.pool.blocks[b] for b in ids])

    def get_num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()


class VllmFacade:
    """vLLM's ``KVCacheManager`` behind the machine's facade calls (module docstring)."""

    def __init__(self, config: StackConfiguration) -> None:
        try:
            from vllm.v1.core.kv_cache_manager import KVCacheManager
            from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
        except ImportError as exc:
            raise BackendUnavailable(f"the conformance tier needs vLLM ({exc})") from exc
        groups = [KVCacheGroupSpec([f"layer{i}"], _vllm_spec(g.kv_cache_spec), g.is_eagle_group)
                  for i, g in enumerate(config.groups)]
        self.manager = KVCacheManager(
            KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[],
                          kv_cache_groups=groups),
            max_model_len=config.max_model_len,
            scheduler_block_size=config.scheduler_block_size,
            hash_block_size=config.hash_block_size,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enable_caching=config.enable_caching, use_eagle=config.use_eagle,
            enable_kv_cache_events=config.enable_caching, watermark=config.watermark)
        self.block_pool = _PoolView(self.manager.block_pool)
        self._twins: dict[str, Any] = {}
        self._hits: dict[str, Any] = {}

    # -- requests -------------------------------------------------------------------------

    def _twin(self, request: Any) -> Any:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request
        from vllm.v1.request import RequestStatus as VStatus

        twin = self._twins.get(request.request_id)
        if twin is None:
            def hasher(vreq: Any, source: Any = request) -> list[bytes]:
                return list(source.block_hashes[len(vreq.block_hashes):])

            twin = Request(request.request_id, list(request.prompt_token_ids),
                           SamplingParams(max_tokens=1 << 20), None,
                           cache_salt=request.cache_salt, block_hasher=hasher)
            self._twins[request.request_id] = twin
        missing = request.output_token_ids[len(twin.output_token_ids):]
        if missing:
            twin.append_output_token_ids(list(missing))
        twin.num_computed_tokens = request.num_computed_tokens
        twin.status = getattr(VStatus, _STATUS[request.status])
        twin.num_preemptions = request.num_preemptions
        return twin

    @staticmethod
    def _ids(blocks: Any) -> KVCacheBlocks:
        return KVCacheBlocks(tuple([b.block_id for b in g] for g in blocks.blocks))

    # -- the facade -------------------------------------------------------------------------

    def get_computed_blocks(self, request: Any) -> tuple[KVCacheBlocks, int]:
        blocks, n = self.manager.get_computed_blocks(self._twin(request))
        self._hits[request.request_id] = blocks
        return self._ids(blocks), n

    def allocate_slots(self, request: Any, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_lookahead_tokens: int = 0,
                       full_sequence_must_fit: bool = False,
                       **options: Any) -> KVCacheBlocks | None:
        hits = self._hits.pop(request.request_id, None) if new_computed_blocks is not None \
            else None
        out = self.manager.allocate_slots(
            self._twin(request), num_new_tokens, num_new_computed_tokens, hits,
            num_lookahead_tokens=num_lookahead_tokens,
            full_sequence_must_fit=full_sequence_must_fit, **options)
        return None if out is None else self._ids(out)

    def free(self, request: Any) -> None:
        self.manager.free(self._twin(request))

    def pop_blocks_for_free(self, request: Any) -> list[int]:
        return [b.block_id for b in self.manager.pop_blocks_for_free(self._twin(request))]

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return tuple(list(g) for g in self.manager.get_block_ids(request_id))

    def new_step_starts(self) -> None:
        self.manager.new_step_starts()

    def take_events(self) -> list[Any]:
        return self.manager.take_events()

    def reset_prefix_cache(self) -> bool:
        return self.manager.reset_prefix_cache()

    def evict_blocks(self, ids: list[int]) -> None:
        # vLLM's engine passes a set; the list keeps the machine's order on both sides.
        self.manager.evict_blocks(list(ids))

    def pool_projection(self) -> Any:
        """Ref counts (bar the null block), free queue, primary keys, key → block ids."""
        pool = self.manager.block_pool
        blocks = pool.blocks
        cache: dict[bytes, tuple[int, ...]] = {}
        for key, value in pool.cached_block_hash_to_block._cache.items():
            ids = tuple(value) if isinstance(value, dict) else (value.block_id,)
            cache[bytes(key)] = tuple(int(i) for i in ids)
        return (tuple(b.ref_cnt for b in blocks[1:]),
                tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
                tuple(None if b.block_hash is None else bytes(b.block_hash)
                      for b in blocks[1:]),
                cache)


__all__ = ["VllmFacade"]
