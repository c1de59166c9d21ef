"""Packed block hashes for vLLM's requests: vLLM's own block hasher, with each request's
prompt digests also kept packed (a :class:`~kvpool.hash_list.BlockHashList`).

**Why.** An admission reads every digest of its prompt: the lookup and then the cache write.
From vLLM's plain ``list`` of ``bytes`` each read is a type pass and a join over ~100
objects that were last touched when the request arrived, long before the scheduler admits
it, so they are cold by then (~13 µs an admission inside vLLM's scheduler, measured). Packed
right after hashing, while they are hot, the pool reads them in place
(:meth:`BlockHashList.packed`). A serving engine builds requests in its input thread
(``EngineCore.preprocess_add_request``, run there to overlap the forward pass), so the pack
also leaves the scheduling loop.

**How.** vLLM's ``Request`` (0.25 and 0.33) sets ``block_hashes = []`` and
``_block_hasher = hasher``, then ``update_block_hashes()`` extends ``block_hashes`` with
``hasher(request)``: once at construction (the prompt), and again after every token. The
engine's hasher comes from ``get_request_block_hasher``. :func:`install` (called by
:func:`kvpool.vllm.install` for the fast backend) replaces that factory, so the engine gets
:func:`packing_block_hasher` around vLLM's own hasher, which answers a request's first call
by:

* computing the digests with vLLM's hasher (so they are vLLM's, byte for byte);
* making ``block_hashes`` a :class:`BlockHashList` of them, packed, and returning nothing for
  vLLM to extend (same digests at the same positions: only the list's type differs);
* handing the request vLLM's hasher itself (``_block_hasher``) for every later call: a decode
  step runs no frame of kvpool's. Digests appended later are plain list appends; the pool
  packs them when it reads them.

A request that does not look like that (no ``_block_hasher`` naming this hasher, or hashes
already in its list) gets vLLM's digests through unchanged. Everything a
scheduler does to the list afterwards (vLLM 0.33 clears it, or deletes a tail, and hashes
again) is a list operation :class:`BlockHashList` sees: its companion is dropped and
rebuilt from the entries as they then are.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from kvpool.errors import InvalidConfig
from kvpool.hash_list import BlockHashList

Hasher = Callable[[Any], list[Any]]

_FACTORY_MODULES = ("vllm.v1.core.kv_cache_utils", "vllm.v1.engine.core")
"""Where the engine finds ``get_request_block_hasher``: its home, and the engine core, which
imported the name (patched there too when already imported; imported later, it reads the
patched one from its home)."""

_stock: dict[str, Any] = {}


def _check_callable(name: str, value: Any) -> None:
    if not callable(value):
        raise InvalidConfig(f"{name} must be callable, got {value!r}")


def packing_block_hasher(hasher: Hasher) -> Hasher:
    """vLLM's request block hasher ``hasher``, packing each request's prompt digests on its
    first call and then leaving the request to ``hasher`` (module docstring)."""
    _check_callable("hasher", hasher)

    def first_call(request: Any) -> list[Any]:
        digests = hasher(request)
        if getattr(request, "_block_hasher", None) is not first_call:
            return digests  # not vLLM's Request as described: vLLM's answer, unchanged
        request._block_hasher = hasher  # every later call goes straight to vLLM's hasher
        hashes = request.block_hashes
        if type(hashes) is not list or hashes:
            return digests
        packed = BlockHashList(digests)
        packed.pack()
        request.block_hashes = packed
        return []  # vLLM extends the list it read before this call: nothing to add

    first_call.__wrapped__ = hasher  # type: ignore[attr-defined]
    first_call.__qualname__ = first_call.__name__ = "kvpool_packing_block_hasher"
    return first_call


def packing_factory(factory: Callable[..., Hasher]) -> Callable[..., Hasher]:
    """``get_request_block_hasher`` whose hashers pack (:func:`packing_block_hasher`)."""
    _check_callable("factory", factory)

    def get_request_block_hasher(*args: Any, **kwargs: Any) -> Hasher:
        return packing_block_hasher(factory(*args, **kwargs))

    get_request_block_hasher.__wrapped__ = factory  # type: ignore[attr-defined]
    get_request_block_hasher.__doc__ = factory.__doc__
    return get_request_block_hasher


def install() -> None:
    """Make vLLM's engine build packing hashers (idempotent; :func:`uninstall` undoes it)."""
    from vllm.v1.core import kv_cache_utils

    stock = _stock.setdefault("factory", kv_cache_utils.get_request_block_hasher)
    patched = _stock.setdefault("patched", packing_factory(stock))
    for name in _FACTORY_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "get_request_block_hasher", None) in (
                stock, patched):
            module.get_request_block_hasher = patched  # type: ignore[attr-defined]


def uninstall() -> None:
    """Give vLLM's engine its own hasher factory back."""
    stock, patched = _stock.pop("factory", None), _stock.pop("patched", None)
    if stock is None:
        return
    for name in _FACTORY_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "get_request_block_hasher", None) is patched:
            module.get_request_block_hasher = stock  # type: ignore[attr-defined]


def installed() -> bool:
    """Whether the engine's hasher factory is the packing one."""
    return "patched" in _stock


__all__ = ["install", "installed", "packing_block_hasher", "packing_factory", "uninstall"]
