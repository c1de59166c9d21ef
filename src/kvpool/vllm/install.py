"""Switching vLLM's scheduler to kvpool's KV cache manager.

Two ways, one effect (vLLM's ``Scheduler`` builds :class:`~kvpool.vllm.manager.
KvpoolKVCacheManager` instead of its own ``KVCacheManager``):

* in code, before the engine is built: ``kvpool.vllm.install(backend="fast")``;
* with no code change: vLLM loads the general plugin kvpool declares (entry point group
  ``vllm.general_plugins``) in every engine process, and :func:`register` installs kvpool
  when ``KVPOOL_VLLM_BACKEND`` names a backend (``fast``, ``reference``, ``spec``); unset or
  empty, the plugin does nothing. ``KVPOOL_VLLM_POLICY`` (``auto``, ``fast``, ``generic``)
  and ``KVPOOL_VLLM_ON_UNSUPPORTED`` (``error``, ``fallback``) set the other two options.

A configuration kvpool cannot serve (a spec class it has no manager for, a vLLM version
whose scheduler contract it does not implement) is refused when the scheduler builds the
manager — at engine start — with :class:`~kvpool.vllm.config.UnsupportedConfig`; with
``on_unsupported="fallback"`` vLLM's own manager is built instead, after one warning.

The fast backend compiles its kernels at :func:`install` (cached on disk by Numba, so only
the first process after an install pays), not at the engine's first scheduled step.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from kvpool.errors import InvalidConfig
from kvpool.vllm import hashes

logger = logging.getLogger("kvpool.vllm")

BACKENDS = ("fast", "reference", "spec")
POLICIES = ("auto", "fast", "generic")
SUPPORTED_VLLM = ((0, 25), (0, 33))
"""(major, minor) of the vLLM versions whose scheduler contract the drop-in implements."""

_installed: dict[str, Any] = {}


def vllm_version() -> tuple[int, int]:
    import vllm

    major, minor = str(vllm.__version__).split(".")[:2]
    return int(major), int(minor)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidConfig(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def install(backend: str = "fast", *, policy: str = "auto",
            on_unsupported: str = "error", warm_up: bool = True,
            pack_hashes: bool = True) -> None:
    """Make vLLM's scheduler build kvpool's KV cache manager (module docstring).

    Idempotent; a second call with other options replaces the first. ``warm_up`` compiles
    (or loads) the fast backend's kernels now, for every model shape, hybrids included (one
    log line with the time it took). ``pack_hashes``
    (fast backend only) has the engine's block hasher keep each prompt's digests packed
    where the fast pool reads them in place (:mod:`kvpool.vllm.hashes`: vLLM's own hasher
    and digests, in a ``list`` subclass)."""
    _choice("backend", backend, BACKENDS)
    if type(pack_hashes) is not bool:
        raise InvalidConfig(f"pack_hashes must be True or False, got {pack_hashes!r}")
    _choice("policy", policy, POLICIES)
    _choice("on_unsupported", on_unsupported, ("error", "fallback"))
    from vllm.v1.core import kv_cache_manager as vllm_manager_module
    from vllm.v1.core.sched import scheduler as scheduler_module

    version = vllm_version()
    stock = _installed.get("stock", scheduler_module.KVCacheManager)
    if version not in SUPPORTED_VLLM:
        supported = ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED_VLLM)
        message = (f"kvpool's drop-in implements the scheduler contract of vLLM {supported}; "
                   f"this is vLLM {version[0]}.{version[1]}")
        if on_unsupported == "error":
            from kvpool.vllm.config import UnsupportedConfig

            raise UnsupportedConfig(message)
        logger.warning("%s: vLLM's own KV cache manager stays in place", message)
        return

    base = _manager_class(version)

    class Configured(base):  # type: ignore[valid-type, misc]
        """The drop-in with this installation's options."""

    Configured.backend, Configured.policy = backend, policy
    Configured.__name__ = Configured.__qualname__ = "KvpoolKVCacheManager"

    def build(*args: Any, **kwargs: Any) -> Any:
        """What vLLM's scheduler calls as ``KVCacheManager(...)``."""
        try:
            _check_scheduler(sys._getframe(1).f_locals.get("self"), version)
            return Configured(*args, **kwargs)
        except InvalidConfig as error:
            if on_unsupported == "error":
                raise
            logger.warning("kvpool cannot serve this configuration (%s): using vLLM's own KV "
                           "cache manager", error)
            return stock(*args, **kwargs)

    _installed.update(stock=stock, backend=backend, policy=policy,
                      on_unsupported=on_unsupported,
                      pack_hashes=pack_hashes and backend == "fast")
    scheduler_module.KVCacheManager = build
    if _installed["pack_hashes"]:
        hashes.install()
    else:
        hashes.uninstall()
    del vllm_manager_module  # imported so that vLLM's own module is loaded first
    if warm_up and backend == "fast":
        from kvpool.workload.simulate import warm_up_engine

        logger.info("kvpool: loading the fast backend's kernels (compiled into Numba's disk "
                    "cache on the first run after an install)")
        seconds = warm_up_engine("fast")
        logger.info("kvpool: fast backend ready in %.2f s", seconds)
    logger.info("kvpool: vLLM's scheduler now uses kvpool's KV cache manager (backend=%s, "
                "policy=%s)", backend, policy)


def _manager_class(version: tuple[int, int]) -> type:
    """The drop-in class implementing this vLLM version's manager contract."""
    if version >= (0, 33):
        from kvpool.vllm.v033 import Kvpool033KVCacheManager

        return Kvpool033KVCacheManager
    from kvpool.vllm.manager import KvpoolKVCacheManager

    return KvpoolKVCacheManager


def _check_scheduler(scheduler: Any, version: tuple[int, int]) -> None:
    """Refuse what the scheduler building the manager uses and kvpool does not serve: a KV
    connector that binds vLLM's pool (:mod:`kvpool.vllm.connectors`) and, on 0.33,
    :func:`kvpool.vllm.v033_checks.scheduler_refusal`. The scheduler is the caller: vLLM
    passes the manager no engine configuration, so its own object is read."""
    from kvpool.vllm.config import UnsupportedConfig
    from kvpool.vllm.connectors import binding_refusal

    config = getattr(scheduler, "kv_cache_config", None)
    if config is None:
        return
    if version >= (0, 33):
        from kvpool.vllm.v033_checks import scheduler_refusal

        why = scheduler_refusal(scheduler, config)
    else:
        why = binding_refusal(getattr(scheduler, "connector", None))
    if why is not None:
        raise UnsupportedConfig(f"kvpool's drop-in for vLLM {version[0]}.{version[1]}: {why}")


def uninstall() -> None:
    """Give vLLM's scheduler its own KV cache manager back."""
    if "stock" not in _installed:
        return
    from vllm.v1.core.sched import scheduler as scheduler_module

    scheduler_module.KVCacheManager = _installed["stock"]
    hashes.uninstall()
    _installed.clear()


def installed() -> dict[str, Any] | None:
    """The options of the current installation, or ``None``."""
    if "stock" not in _installed:
        return None
    return {k: v for k, v in _installed.items() if k != "stock"}


def register() -> None:
    """vLLM general-plugin entry point: install when ``KVPOOL_VLLM_BACKEND`` is set."""
    backend = os.environ.get("KVPOOL_VLLM_BACKEND", "").strip()
    if not backend:
        return
    install(backend,
            policy=os.environ.get("KVPOOL_VLLM_POLICY", "auto").strip() or "auto",
            on_unsupported=os.environ.get("KVPOOL_VLLM_ON_UNSUPPORTED", "error").strip()
            or "error",
            pack_hashes=_switch("KVPOOL_VLLM_PACK_HASHES", True))


def _switch(name: str, default: bool) -> bool:
    """An on/off environment variable (``1``/``0``, ``true``/``false``, ``on``/``off``)."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise InvalidConfig(f"{name} must be 1 or 0 (true/false, on/off), got {value!r}")


__all__ = ["BACKENDS", "POLICIES", "install", "installed", "register", "uninstall"]
