"""What one differential run drives: backends, pool shape and which call families are on."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvpool.harness.api import FULL_API, Backend, PoolApi, PoolFactory


@dataclass(frozen=True)
class HarnessConfig:
    """Parameters of the differential state machine (all have small, bug-finding defaults).

    ``block_size`` is the physical block size every cache call uses; it must be a multiple of
    ``hash_block_size`` (``bs > hbs`` exercises partial entries and their promotion). Group ids
    ``0 … num_groups-1`` are used by valid calls; lookups also ask for group ``num_groups``,
    which is never cached. ``invalid_calls`` turns on the rules that make §12's invalid calls
    and ``raising_watchers`` the reuse watchers that raise (kvpool completes the operation,
    then raises ``WatcherError``); turn both off to check a pool, like vLLM's, that does not
    validate its input. ``watchers`` and ``foreign_blocks`` turn off unpinning and
    multi-pool routing for pools that predate them (vLLM < 0.30); ``api`` (a
    :class:`PoolApi`) is the whole version scope, and ``api.unpin_blocks`` /
    ``api.foreign_blocks`` turn those two families off as well.
    """

    backends: tuple[str | PoolFactory | Backend, ...] = ("spec",)
    num_blocks: int = 16
    hash_block_size: int = 2
    block_size: int = 4
    enable_caching: bool = True
    enable_kv_cache_events: bool = True
    num_groups: int = 2
    invalid_calls: bool = True
    foreign_blocks: bool = True
    watchers: bool = True
    raising_watchers: bool = True
    max_requests: int = 6
    max_table_blocks: int = 6
    request_extras: bool = False
    """Some requests carry a LoRA adapter, multimodal items or a cache salt (events report them)."""
    extra_options: dict[str, Any] = field(default_factory=dict)
    api: PoolApi = FULL_API

    def __post_init__(self) -> None:
        if not self.backends:
            raise ValueError("HarnessConfig needs at least one backend")
        if self.num_blocks < 2:
            raise ValueError("num_blocks must be >= 2 (block 0 is the null block)")
        hbs, bs = self.hash_block_size, self.block_size
        if hbs < 1 or bs < hbs or bs % hbs:
            raise ValueError(
                f"block_size {bs} must be a positive multiple of hash_block_size {hbs}"
            )
        if self.num_groups < 1:
            raise ValueError("num_groups must be >= 1")
        # Families a pool's version lacks are off whatever the flags say.
        if not self.api.unpin_blocks:
            object.__setattr__(self, "watchers", False)
        if not self.api.foreign_blocks:
            object.__setattr__(self, "foreign_blocks", False)

    def pool_options(self) -> dict[str, Any]:
        """The ``make_pool`` keyword arguments every backend is built with."""
        return {
            "enable_caching": self.enable_caching,
            "hash_block_size": self.hash_block_size,
            "enable_kv_cache_events": self.enable_kv_cache_events,
            **self.extra_options,
        }

    def with_backends(self, backends: tuple) -> HarnessConfig:
        return replace(self, backends=tuple(backends))

    def describe(self) -> str:
        return (
            f"{self.num_blocks} blocks, hbs {self.hash_block_size}, bs {self.block_size}, "
            f"caching {'on' if self.enable_caching else 'off'}, "
            f"events {'on' if self.enable_kv_cache_events else 'off'}"
            + "".join(f", {k}={v!r}" for k, v in self.extra_options.items())
        )


__all__ = ["HarnessConfig"]

# PoolApi, FULL_API and common_api live in kvpool.harness.api; imported here for HarnessConfig
# and for the old path kvpool.harness.pool.config.
