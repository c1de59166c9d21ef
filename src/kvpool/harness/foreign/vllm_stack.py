"""vLLM's own ``KVCacheManager`` as a stack of the whole-stack machine (conformance tier).

:class:`VllmFacade` builds vLLM's facade for a :class:`StackConfiguration` (the same groups,
sizes and flags) and answers the calls the machine makes with kvpool's value types: block
ids instead of block objects, :class:`kvpool.policy.KVCacheBlocks` results. Each kvpool
request gets a vLLM twin ``Request`` whose block hasher hands over the kvpool request's own
hashes, so both managers see the very same keys and events carry the same hashes.

Needs vLLM importable (the kit venvs: ``/tmp/anchors/vllm025/venv`` for vLLM 0.25.1,
``/tmp/anchors/vllm033/venv`` for 0.33.0, whose facade has the partial-hit / copy-on-write
extension); see :func:`run_conformance` and ``docs/policy.md`` for how to point the tier at
a kit. Only this module imports vLLM; :func:`vllm_version` says which one it found.
"""

from __future__ import annotations

from typing import Any

from kvpool.errors import BackendUnavailable
from kvpool.harness.stack.configs import StackConfiguration
from kvpool.policy import specs as kv
from kvpool.policy.blocks import KVCacheBlocks
from kvpool.policy.request import RequestStatus


def vllm_version() -> tuple[int, int]:
    """(major, minor) of the importable vLLM; :class:`BackendUnavailable` without one."""
    try:
        import vllm
    except ImportError as exc:
        raise BackendUnavailable(f"the conformance tier needs vLLM ({exc})") from exc
    major, minor = str(vllm.__version__).split(".")[:2]
    return int(major), int(minor)


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
    if isinstance(spec, kv.CircularBufferSpec):
        return vi.CircularBufferSpec(**attn)
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
        self.version = vllm_version()
        #: vLLM 0.33's requests say how many tokens are in flight (async scheduling), and
        #: its windows free behind the processed ones; 0.25.1 has no such field.
        self.models_tokens_in_flight = self.version >= (0, 33)
        # 0.33 renamed the batch budget; its hybrid coordinator allows partial hits by
        # default wherever the configuration supports them (kvpool: opt-in).
        budget = "max_in_flight_tokens" if self.version >= (0, 33) \
            else "max_num_batched_tokens"
        self.manager = KVCacheManager(
            KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[],
                          kv_cache_groups=groups),
            max_model_len=config.max_model_len,
            scheduler_block_size=config.scheduler_block_size,
            hash_block_size=config.hash_block_size,
            enable_caching=config.enable_caching, use_eagle=config.use_eagle,
            enable_kv_cache_events=config.enable_kv_cache_events, watermark=config.watermark,
            **{budget: config.max_num_batched_tokens})
        partial = getattr(self.manager.coordinator, "enable_partial_hash_hits", False)
        if partial != config.allow_partial_hash_hits:
            raise BackendUnavailable(
                f"vLLM {self.version} {'has' if partial else 'lacks'} partial hash hits for "
                f"configuration {config.name!r}; kvpool's is "
                f"{'on' if config.allow_partial_hash_hits else 'off'}")
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
        if self.models_tokens_in_flight:
            twin.num_in_flight_tokens = request.num_in_flight_tokens
        twin.status = getattr(VStatus, _STATUS[request.status])
        twin.num_preemptions = request.num_preemptions
        return twin

    @staticmethod
    def _ids(blocks: Any) -> KVCacheBlocks:
        return KVCacheBlocks(tuple([b.block_id for b in g] for g in blocks.blocks))

    # -- the facade -------------------------------------------------------------------------

    def get_computed_blocks(self, request: Any) -> tuple[KVCacheBlocks, int]:
        # 0.33 adds a third value (a shared-prefix boundary kvpool does not model).
        blocks, n = self.manager.get_computed_blocks(self._twin(request))[:2]
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

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        self.manager.cache_blocks(self._twin(request), num_computed_tokens)

    def pop_blocks_for_free(self, request: Any) -> list[int]:
        if self.version < (0, 33):
            return [b.block_id for b in self.manager.pop_blocks_for_free(self._twin(request))]
        # 0.33 hands each group's table over without its null head (the caller skips
        # nulls when freeing anyway); kvpool returns the tables whole, as 0.25.1 does.
        # The tables are compared whole, and vLLM's list must be exactly them trimmed.
        tables = self.get_block_ids(request.request_id)
        popped = [b.block_id for b in self.manager.pop_blocks_for_free(self._twin(request))]
        trimmed = []
        for table in tables:
            head = next((i for i, b in enumerate(table) if b != 0), len(table))
            trimmed += table[head:]
        if popped != trimmed:
            raise AssertionError(f"vLLM popped {popped}, not its tables {tables} trimmed")
        return [b for table in tables for b in table]

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return tuple(list(g) for g in self.manager.get_block_ids(request_id))

    def new_step_starts(self) -> None:
        self.manager.new_step_starts()

    def get_num_common_prefix_blocks(self, request_id: str) -> list[int]:
        return list(self.manager.get_num_common_prefix_blocks(request_id))

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[int]]:
        """vLLM 0.33's copies with the group each came from (vLLM's pairs do not say; the
        managers are drained in group order exactly as its facade does)."""
        from kvpool.policy.facade import BlockCopy

        copies, retained = [], []
        for g, mgr in enumerate(self.manager.coordinator.single_type_managers):
            for src, dst in mgr.take_pending_cow_copies():
                copies.append(BlockCopy(src.block_id, dst.block_id, g))
                retained += [src.block_id, dst.block_id]
        return copies, retained

    def release_copy_endpoints(self, block_ids: list[int]) -> None:
        """What vLLM 0.33's scheduler does once the copies ran: one ``free_blocks``."""
        self.block_pool.free_blocks(list(block_ids))

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


__all__ = ["VllmFacade", "vllm_version"]
