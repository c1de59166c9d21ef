"""What one differential run drives: backends, pool shape and which call families are on."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # backends.py imports this module for PoolApi
    from kvpool.harness.backends import Backend, PoolFactory


@dataclass(frozen=True)
class PoolApi:
    """Which calls and behaviours a pool under test offers (its version scope).

    The harness generates only calls the pool has. kvpool's backends offer everything (the
    defaults); vLLM's ``BlockPool`` is described by :func:`kvpool.harness.vllm_adapter.
    vllm_api` (detected from the installed class, or named by version). A backend object or
    factory declares its scope with a ``pool_api`` attribute; :func:`common_api` combines
    several (a call is generated only if every backend has it).

    * ``unpin_blocks``: ``unpin_blocks`` and reuse watchers (vLLM 0.30+);
    * ``is_block_writable`` (0.29+); ``move_block_hashes``, ``emit_cached_block_events``
      (0.26+); ``replace_existing_hashes``: that flag of ``cache_partial_block`` (0.30+);
    * ``foreign_blocks``: ``free_blocks`` routes another pool's blocks to it (0.30+);
    * ``null_block_skipped``: ``touch``/``free_blocks`` skip the null block (0.33; older
      versions change its ref count, so the harness keeps it out of their batches);
    * ``partial_any_boundary``: ``cache_partial_block`` takes any hbs boundary, including
      one that completes the block (0.33; 0.25.1 asserts ``bs > hbs`` and a boundary
      strictly inside the block);
    * ``lookahead``: ``num_hash_lookahead_tokens`` (0.33);
    * ``mm_window_index``: events of a partial entry find a multimodal item by window search
      (0.31; 0.25.1 assumes only the last item can overlap, so its events differ for
      requests with several items): without it the harness makes no multimodal requests;
    * ``secondary_key_order``: ``"insertion"`` (kvpool, §12) or ``"set"`` (vLLM keeps
      secondary keys in a Python set, so their order depends on ``PYTHONHASHSEED``): the
      lockstep then compares secondary keys, and runs of ``BlockRemoved`` events, as sets.
    """

    unpin_blocks: bool = True
    is_block_writable: bool = True
    move_block_hashes: bool = True
    emit_cached_block_events: bool = True
    replace_existing_hashes: bool = True
    foreign_blocks: bool = True
    null_block_skipped: bool = True
    partial_any_boundary: bool = True
    lookahead: bool = True
    mm_window_index: bool = True
    secondary_key_order: str = "insertion"

    def missing(self) -> list[str]:
        """Names of the features this scope lacks (for reports)."""
        full = PoolApi()
        return [f.name for f in fields(self) if f.type in ("bool", bool)
                and getattr(full, f.name) and not getattr(self, f.name)]


FULL_API = PoolApi()


def common_api(apis: list[PoolApi]) -> PoolApi:
    """The calls every one of ``apis`` offers; set order if any pool declares it."""
    values: dict[str, bool | str] = {}
    for f in fields(PoolApi):
        if f.name == "secondary_key_order":
            orders = {a.secondary_key_order for a in apis}
            values[f.name] = "set" if "set" in orders else "insertion"
        else:
            values[f.name] = all(getattr(a, f.name) for a in apis)
    return PoolApi(**values)  # type: ignore[arg-type]  # per field: bool, or the order str


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


__all__ = ["FULL_API", "HarnessConfig", "PoolApi", "common_api"]
