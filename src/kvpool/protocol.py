"""``BlockPool``: the protocol every kvpool backend implements (BEHAVIOUR.md §6).

Blocks are named by integer id (``0 … num_gpu_blocks-1``; 0 is the null block). Batches are
any iterable of ids, including numpy integer arrays; blocks of another pool travel as
:class:`~kvpool.shell.BlockRef`. The policy layer (managers, coordinators) depends on this
protocol only. :meth:`abstract` is the observer two backends are compared with;
:meth:`observe` answers the few per-block questions policy and batch checks ask (vLLM's
managers read them off block objects) without reaching into a backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from kvpool.events import KVCacheEvent


class BlockObserver(Protocol):
    """Read-only facts about a pool's blocks, as of the moment of the read (never the null
    block). Each fact is O(1) per block on every backend."""

    def ref_cnts(self, block_ids: list[int]) -> list[int]:
        """The ref count of each block."""
        ...

    def key_tokens(self, block_id: int) -> int | None:
        """Tokens covered by the block's primary key, ``None`` without a key."""
        ...

    def max_key_tokens(self, block_ids: Sequence[int]) -> int:
        """The most tokens any of these blocks' primary keys covers, 0 when none has a key
        (the null block never has one): ``max(key_tokens(b) or 0 ...)`` in one read, which
        is how vLLM 0.33 estimates the tokens a request found cached. O(len)."""
        ...

    def queue_front(self, n: int) -> list[int]:
        """The first ``n`` blocks of the free queue (the next ``get_new_blocks(n)``)."""
        ...


@runtime_checkable
class BlockPool(Protocol):
    """The block pool verbs, on block ids."""

    num_gpu_blocks: int
    enable_caching: bool
    hash_block_size: int
    null_block: int

    def get_new_blocks(self, num_blocks: int) -> Sequence[int]: ...
    def touch(self, blocks: Iterable[int]) -> None: ...
    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None: ...
    def unpin_blocks(self, blocks: Iterable[int], on_reuse: Callable[[int], None]) -> None: ...
    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> Sequence[int] | None: ...
    def cache_full_blocks(
        self,
        request: Any,
        blocks: Iterable[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None: ...
    def cache_partial_block(
        self,
        request: Any,
        block: int,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> bytes | None: ...
    def move_block_hashes(self, src_block: int, dst_block: int) -> None: ...
    def is_block_writable(self, block: int) -> bool: ...
    def evict_blocks(self, block_ids: Iterable[int]) -> None: ...
    def reset_prefix_cache(self) -> bool: ...
    def emit_cached_block_events(
        self, request: Any, num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None: ...
    def get_num_free_blocks(self) -> int: ...
    def get_usage(self) -> float: ...
    def take_events(self) -> list[KVCacheEvent]: ...
    def abstract(self) -> Any: ...
    def observe(self) -> BlockObserver: ...


class MetricsCollector(Protocol):
    """Optional observer of block lifecycle (vLLM's ``KVCacheMetricsCollector``), by id."""

    def on_block_allocated(self, block_id: int) -> None: ...
    def on_block_accessed(self, block_id: int) -> None: ...
    def on_block_evicted(self, block_id: int) -> None: ...
    def reset(self) -> None: ...
