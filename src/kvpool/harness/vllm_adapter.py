"""vLLM's own ``BlockPool`` behind kvpool's id-based protocol, so the harness can check it.

Importable without vLLM: only :func:`make_vllm_pool` imports ``vllm`` (and raises
:class:`~kvpool.errors.BackendUnavailable` when it is missing). :class:`VllmBlockPoolAdapter`
works on any object with vLLM's layout (vLLM 0.30+ pool internals):

* ``pool.blocks``: ``KVCacheBlock`` objects with ``block_id``, ``ref_cnt``, ``block_hash``
  (primary key), ``block_hash_num_tokens``;
* ``pool.free_block_queue.get_all_free_blocks()``: the queue, front first;
* ``pool.cached_block_hash_to_block``: a ``BlockHashToBlockMap`` whose ``_cache`` maps a key
  to one block or to an insertion-ordered ``{block_id: block}`` (older pools: a plain dict);
* ``pool.cached_block_hashes_by_block``: secondary keys per block id (vLLM: a *set*);
* ``pool._reuse_watchers``: pending reuse watchers by block id (0.30+);
* ``pool.kv_event_queue`` / ``pool.take_events()``: vLLM's event objects (no sequence
  numbers; the adapter numbers them in order).

Use ``kvpool check --backends spec,vllm`` (add ``--valid-only`` to skip §12's invalid calls,
which vLLM does not validate) or ``make_differential_test(["spec", make_vllm_pool])``.
``docs/harness.md`` lists the divergences to expect and the BEHAVIOUR.md §12 rows behind them.
"""

from __future__ import annotations

import inspect
from typing import Any

from kvpool.errors import BackendUnavailable
from kvpool.harness.adapter import ObjectPoolAdapter
from kvpool.spec.state import PoolState


def _cache_entries(table: Any) -> dict[bytes, tuple[int, ...]]:
    """``BlockHashToBlockMap`` contents as key → block ids (earliest inserted first)."""
    raw = getattr(table, "_cache", table)
    out: dict[bytes, tuple[int, ...]] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            if value:  # an emptied inner map would be a vLLM bug; keep it visible
                out[bytes(key)] = tuple(int(i) for i in value)
            else:
                out[bytes(key)] = ()
        else:
            out[bytes(key)] = (int(value.block_id),)
    return out


class VllmBlockPoolAdapter(ObjectPoolAdapter):
    """A vLLM-layout ``BlockPool`` as a kvpool backend (reads internals for ``abstract()``)."""

    backend_name = "vllm"

    def snapshot(self) -> PoolState:
        pool = self.pool
        blocks = pool.blocks
        primary = tuple(None if b.block_hash is None else bytes(b.block_hash) for b in blocks)
        tokens = tuple(
            None if key is None else b.block_hash_num_tokens
            for key, b in zip(primary, blocks, strict=True)
        )
        secondary = {
            int(block_id): tuple(bytes(k) for k in keys)  # vLLM: set order (BEHAVIOUR §12)
            for block_id, keys in getattr(pool, "cached_block_hashes_by_block", {}).items()
            if keys
        }
        return PoolState(
            num_blocks=len(blocks),
            enable_caching=bool(pool.enable_caching),
            hash_block_size=self.hash_block_size,
            enable_events=bool(getattr(pool, "enable_kv_cache_events", False)),
            ref_cnt=tuple(int(b.ref_cnt) for b in blocks),
            free_queue=tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
            primary_key=primary,
            primary_tokens=tokens,
            secondary_keys=secondary,
            cache=_cache_entries(pool.cached_block_hash_to_block),
            watchers=tuple(int(b) for b in getattr(pool, "_reuse_watchers", {})),
            event_count=self.events_emitted() if getattr(pool, "enable_kv_cache_events", False)
            else 0,
        )


def require_vllm() -> None:
    """Raise :class:`BackendUnavailable` unless vLLM's ``BlockPool`` can be imported."""
    try:
        from vllm.v1.core.block_pool import BlockPool  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(
            f"backend 'vllm' needs vLLM installed ({exc}); pip install vllm"
        ) from exc


def make_vllm_pool(num_blocks: int, **options: Any) -> VllmBlockPoolAdapter:
    """vLLM's ``BlockPool(num_blocks, ...)`` wrapped for the harness.

    ``options`` are ``make_pool``'s; those vLLM's constructor does not accept are dropped
    (e.g. ``use_int_block_hashes``, a process-wide environment switch in vLLM).
    """
    require_vllm()
    from vllm.v1.core.block_pool import BlockPool

    accepted = inspect.signature(BlockPool).parameters
    kwargs = {k: v for k, v in options.items() if k in accepted}
    kwargs.setdefault("enable_caching", True)
    if "hash_block_size" in accepted:
        kwargs.setdefault("hash_block_size", 16)
    pool = BlockPool(num_blocks, **kwargs)
    return VllmBlockPoolAdapter(pool, hash_block_size=options.get("hash_block_size", 16))


make_vllm_pool.backend_name = "vllm"  # type: ignore[attr-defined]

__all__ = ["VllmBlockPoolAdapter", "make_vllm_pool", "require_vllm"]
