"""kvpool inside vLLM: the drop-in KV cache manager for vLLM's own scheduler.

::

    import kvpool.vllm
    kvpool.vllm.install(backend="fast")     # before the engine is built

or, with no code change, ``KVPOOL_VLLM_BACKEND=fast`` in the engine's environment (kvpool
declares a vLLM general plugin; :mod:`kvpool.vllm.install` says what it reads). vLLM's
``Scheduler`` then builds :class:`~kvpool.vllm.manager.KvpoolKVCacheManager`, which makes the
same decisions as vLLM's own manager (the conformance tier checks every scheduler step) on
kvpool's checked, faster pool and policy. ``docs/vllm.md`` is the guide.

Importing this package does not import vLLM; :func:`install` does.
"""

from __future__ import annotations

from kvpool.vllm.config import UnsupportedConfig, convert_kv_cache_config, convert_spec
from kvpool.vllm.install import install, installed, register, uninstall

__all__ = ["UnsupportedConfig", "convert_kv_cache_config", "convert_spec", "install",
           "installed", "register", "uninstall"]
