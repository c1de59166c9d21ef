"""Prefix-cache statistics the facade records with ``log_stats`` (BEHAVIOUR.md §10.1)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    """Counts since the last ``make_prefix_cache_stats``; ``reset`` after a cache reset.

    Lookups of preempted requests (``num_preemptions > 0``) are counted apart: their hits
    are re-hits of their own blocks, not sharing.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """One lookup of a request with ``num_tokens`` tokens that hit ``num_hits``."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


__all__ = ["PrefixCacheStats"]
