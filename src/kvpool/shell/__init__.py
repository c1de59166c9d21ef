"""The public, id-based pool API, written once over a backend *core* (BEHAVIOUR.md §6).

A backend (spec, reference, fast) owns the bookkeeping; everything around it is the same for
every backend and lives here, one concern per module:

* :mod:`~kvpool.shell.config` — constructor settings and the metrics collector, checked;
* :mod:`~kvpool.shell.arguments` — ids as ints, numpy integers or arrays; blocks of other
  pools as :class:`BlockRef`; group ids, masks, a request's hashes;
* :mod:`~kvpool.shell.dims` — a pool's shape as the spec's state-free checks read it;
* :mod:`~kvpool.shell.cache_checks` — a cache write's checks before its blocks are read;
* :mod:`~kvpool.shell.core` — the ``_core_*`` methods a backend implements;
* :mod:`~kvpool.shell.callbacks` — reuse watchers and metrics callbacks, delivered after;
* :mod:`~kvpool.shell.observe` — the pool read as values (per-block facts, the abstract);
* :mod:`~kvpool.shell.pool` — :class:`PoolShell`, which puts them together.
"""

from kvpool.shell.arguments import (
    BlockRef,
    as_block_id,
    as_block_ids,
    as_group_id,
    as_group_ids,
    as_mask,
    candidate_table,
    check_id_array,
    request_block_hashes,
)
from kvpool.shell.callbacks import OnReuse
from kvpool.shell.config import METRICS_METHODS, PoolConfig, check_metrics_collector
from kvpool.shell.observe import PoolAbstract, StateObserver
from kvpool.shell.pool import PoolShell

__all__ = [
    "METRICS_METHODS",
    "BlockRef",
    "OnReuse",
    "PoolAbstract",
    "PoolConfig",
    "PoolShell",
    "StateObserver",
    "as_block_id",
    "as_block_ids",
    "as_group_id",
    "as_group_ids",
    "as_mask",
    "candidate_table",
    "check_id_array",
    "check_metrics_collector",
    "request_block_hashes",
]
