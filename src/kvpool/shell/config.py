"""What every backend is built with: the constructor settings and the metrics collector.

Checked before a core is built, so a wrong setting is an :class:`~kvpool.errors.InvalidConfig`
at construction, never a surprise at the first allocation.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from kvpool.errors import InvalidConfig

METRICS_METHODS = ("on_block_allocated", "on_block_accessed", "on_block_evicted", "reset")
"""What a ``metrics_collector`` must offer (checked at construction)."""




@dataclass(frozen=True)
class PoolConfig:
    """Constructor settings shared by every backend."""

    num_gpu_blocks: int
    enable_caching: bool = True
    hash_block_size: int = 16
    enable_kv_cache_events: bool = False
    num_hash_lookahead_tokens: int = 0
    medium: str = "GPU"
    use_int_block_hashes: bool = True

    def validate(self) -> None:
        """Raise :class:`InvalidConfig` for the first setting of the wrong type or range."""
        check_count("num_gpu_blocks", self.num_gpu_blocks, minimum=1)
        check_count("hash_block_size", self.hash_block_size, minimum=1)
        check_count("num_hash_lookahead_tokens", self.num_hash_lookahead_tokens, minimum=0)
        for name in ("enable_caching", "enable_kv_cache_events", "use_int_block_hashes"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                # A string "False" is truthy: accepting it would silently turn a feature on.
                raise InvalidConfig(f"{name} must be a bool, got {value!r}")
        if not isinstance(self.medium, str):
            raise InvalidConfig(f"medium must be a str, got {self.medium!r}")


def check_count(name: str, value: object, *, minimum: int) -> None:
    if (
        not isinstance(value, numbers.Integral)
        or isinstance(value, (bool, np.bool_))
        or value < minimum
    ):
        raise InvalidConfig(f"{name} must be an int >= {minimum}, got {value!r}")


def check_metrics_collector(collector: object) -> None:
    """``None`` or an object with the four callable :data:`METRICS_METHODS`; else
    :class:`InvalidConfig` (a wrong object would fail only at the first allocation)."""
    if collector is None:
        return
    missing = [m for m in METRICS_METHODS if not callable(getattr(collector, m, None))]
    if missing:
        raise InvalidConfig(
            f"metrics_collector {collector!r} lacks callable {', '.join(missing)} "
            "(see kvpool.MetricsCollector)"
        )


