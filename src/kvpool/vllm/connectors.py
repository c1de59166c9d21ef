"""Which KV connectors the drop-in serves, whatever the vLLM version.

A connector is served when it talks to the KV cache manager through the manager's public
calls only (hits, external tokens, block ids). One that binds vLLM's own block pool or manager
(``bind_gpu_block_pool``, vLLM 0.25+; ``bind_kv_cache_manager``, 0.33) reads their internals —
offloading connectors do — and would get kvpool's view of them instead: refused at engine
start, never answered wrongly. vLLM 0.33 adds rules of its own (:mod:`kvpool.vllm.v033_checks`).
"""

from __future__ import annotations

from typing import Any

BINDING_HOOKS = ("bind_kv_cache_manager", "bind_gpu_block_pool")


def binding_refusal(connector: Any) -> str | None:
    """Why the drop-in cannot serve ``connector`` (it binds vLLM's pool or manager), or
    ``None``; ``None`` for no connector."""
    if connector is None:
        return None
    for hook in BINDING_HOOKS:
        if _overrides(connector, hook):
            return (f"the KV connector {type(connector).__name__} overrides {hook} "
                    "(it reads vLLM's own pool)")
    return None


def _overrides(obj: Any, method: str) -> bool:
    """Whether ``obj``'s class defines ``method`` below vLLM's connector base class."""
    for cls in type(obj).__mro__:
        if cls.__name__ == "KVConnectorBase_V1":
            return False
        if method in vars(cls):
            return True
    return False


__all__ = ["BINDING_HOOKS", "binding_refusal"]
