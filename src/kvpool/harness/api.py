"""What a pool under test is and offers: its version scope and how the harness builds it.

The vocabulary every part of the harness shares: the pool machine generates only the calls a
:class:`PoolApi` offers, the foreign adapters declare theirs, and a :class:`Backend` names one
implementation under test (a kvpool backend, a planted bug, vLLM's pool, a user's factory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class PoolApi:
    """Which calls and behaviours a pool under test offers (its version scope).

    The harness generates only calls the pool has. kvpool's backends offer everything (the
    defaults); vLLM's ``BlockPool`` is described by :func:`kvpool.harness.foreign.vllm_pool.
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


PoolFactory = Callable[..., Any]


@dataclass(frozen=True)
class Backend:
    """One pool implementation under test."""

    label: str
    factory: PoolFactory
    source: str
    """Python expression for ``lockstep([...])`` in a reproduction (a string literal or a
    dotted name of an importable factory)."""

    api: PoolApi = FULL_API
    """The calls this pool offers; the harness generates no others."""

    def make(self, num_blocks: int, **options: Any) -> Any:
        return self.factory(num_blocks, **options)


__all__ = ["FULL_API", "Backend", "PoolApi", "PoolFactory", "common_api"]
