"""Which policy serves a configuration: the fast policy where it applies, else the generic.

:func:`make_kv_cache_manager` takes :class:`~kvpool.policy.facade.KVCacheManager`'s arguments
plus ``policy``: ``"generic"`` — the readable policy layer over any pool backend (the
reference of this layer); ``"fast"`` — the fast policy (:mod:`kvpool.policy.fast`), refused
with :class:`~kvpool.errors.InvalidConfig` where it does not serve the configuration;
``"auto"`` (default) — the fast policy where it serves, the generic one otherwise. Both make
the same decisions (the stack differential machine checks it); the choice shows in ``repr``.
"""

from __future__ import annotations

import logging
from typing import Any

from kvpool.errors import InvalidConfig
from kvpool.policy.facade import KVCacheManager

logger = logging.getLogger("kvpool")

POLICIES = ("auto", "fast", "generic")


def make_kv_cache_manager(*args: Any, policy: str = "auto", **kwargs: Any) -> Any:
    """A KV cache manager for these arguments (module docstring)."""
    if policy not in POLICIES:
        raise InvalidConfig(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy != "generic":
        from kvpool.policy.fast import fast_policy_class

        served = fast_policy_class(*args, **kwargs)
        if not isinstance(served, str):
            manager = served(*args, **kwargs)
            logger.debug("kvpool: %r", manager)
            return manager
        if policy == "fast":
            raise InvalidConfig(f"the fast policy does not serve this configuration: {served}")
    return KVCacheManager(*args, **kwargs)


__all__ = ["POLICIES", "make_kv_cache_manager"]
