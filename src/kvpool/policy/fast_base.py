"""What the two fast policies share: which configuration each serves, and the base class
that refuses every other (the generic constructor's checks run first, so bad arguments get
their own error). :mod:`kvpool.policy.fast` describes both policies and picks one
(:func:`~kvpool.policy.fast.fast_policy_class`); :mod:`kvpool.policy.fast_hybrid` holds the
hybrid one."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from kvpool.backends import backend_name
from kvpool.errors import InvalidConfig
from kvpool.policy.facade import KVCacheManager
from kvpool.policy.manager import SingleTypeKVCacheManager
from kvpool.policy.pool_access import num_evictable
from kvpool.policy.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

SINGLE = "one full-attention group"  # kvpool.policy.fast.FastKVCacheManager
HYBRID = "hybrid attention"  # kvpool.policy.fast_hybrid.FastHybridKVCacheManager
_POLICY_OF = {SINGLE: "FastKVCacheManager", HYBRID: "FastHybridKVCacheManager"}

_SERVED_SPECS = (FullAttentionSpec, MLAAttentionSpec)
#: Groups whose step is a table that grows, a window that nulls its oldest blocks and a
#: cache write: the hybrid fast policy's idle test covers exactly these.
_ATTENTION_SPECS = (FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec,
                    SlidingWindowMLASpec, ChunkedLocalAttentionSpec)
_ZERO = 0  # the default of the scheduler's count arguments, tested by identity
_NO_GROUPS: tuple[int, ...] = ()  # (one object: the empty tuple is a singleton)
_NEVER = 2**63  # a token count no request reaches
_SIGNATURE = inspect.signature(KVCacheManager.__init__)


def served_kind(*args: Any, **kwargs: Any) -> str:
    """:data:`SINGLE` or :data:`HYBRID`, the kind of fast policy that serves
    :class:`KVCacheManager` built with these arguments, or why none does (bad arguments are
    left to the constructor to refuse)."""
    try:
        bound = _SIGNATURE.bind(None, *args, **kwargs)
    except TypeError:
        return "the arguments do not bind (the constructor will say why)"
    bound.apply_defaults()
    a = bound.arguments
    config = a["kv_cache_config"]
    if not isinstance(config, KVCacheConfig):
        return "kv_cache_config is not a KVCacheConfig"
    if backend_name(a["backend"]) != "fast":  # a factory that names no backend: not known
        return f"backend {a['backend']!r} (the fast policy drives the fast pool)"
    if a["allow_partial_hash_hits"]:
        return "partial hash hits"
    groups = config.kv_cache_groups
    specs = [type(g.kv_cache_spec) for g in groups]
    if len(groups) == 1 and specs[0] in _SERVED_SPECS:
        return SINGLE
    others = [s.__name__ for s in specs if s not in _ATTENTION_SPECS]
    if others or not groups:
        return (f"{', '.join(others) or 'no groups'} (it serves full-attention, MLA, "
                f"sliding-window and chunked-local groups)")
    if a["use_eagle"] or any(g.is_eagle_group for g in groups):
        return "EAGLE groups in a hybrid model (their cache writes reach one block further)"
    return HYBRID


def _never_skips(manager: Any) -> bool:
    """Whether ``manager`` keeps every token in attention: its class keeps the base rule
    (no skipped tokens, ever; full attention and MLA)."""
    return type(manager).get_num_skipped_tokens is SingleTypeKVCacheManager.get_num_skipped_tokens


class FastPolicy(KVCacheManager):
    """A fast policy: built only for the configurations of its kind (:attr:`serves`)."""

    policy_name = "fast"
    serves: ClassVar[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kind = served_kind(*args, **kwargs)
        super().__init__(*args, **kwargs)
        if kind != self.serves:
            why = f"{_POLICY_OF[kind]} serves it" if kind in _POLICY_OF else kind
            raise InvalidConfig(f"{type(self).__name__} does not serve this configuration: "
                                f"{why}")

    def _fits(self, wanted: int, hits: Sequence[int] | None, free: int) -> bool:
        """Whether ``wanted`` blocks fit in ``free`` beside an admission's ``hits``. A hit
        that is a free cached candidate leaves the free count when touched; counting them
        costs more than the rest of a budget check, so they are counted only when the
        answer depends on it: the blocks fit if no hit is one and would not if every hit
        were (a waiting request retried under pressure is refused uncounted)."""
        if hits and wanted <= free < wanted + len(hits):
            wanted += self._num_evictable(hits)
        return wanted <= free

    def _free_table(self, table: Sequence[int]) -> None:
        """Hand a released table to the pool, last block first, as one int64 array: its ids
        are ints of this pool (handed out by it, or hits checked on admission), so one pass
        converts them where a list costs the pool a type pass over every id object as well
        (a free of ~100 blocks inside vLLM's scheduler: 14.7 -> 11.4 µs)."""
        if table:
            self.block_pool.free_blocks(np.fromiter(reversed(table), np.int64, len(table)))

    def _num_evictable(self, hits: Sequence[int]) -> int:
        """How many hits are free cached candidates (the generic policy's count)."""
        return num_evictable(self.block_pool, hits)


__all__ = ["HYBRID", "SINGLE", "FastPolicy", "served_kind"]
