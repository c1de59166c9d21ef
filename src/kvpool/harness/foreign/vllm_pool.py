"""vLLM's own ``BlockPool`` behind kvpool's id-based protocol, so the harness can check it.

Importable without vLLM: only :func:`make_vllm_pool` imports ``vllm`` (and raises
:class:`~kvpool.errors.BackendUnavailable` when it is missing). :class:`VllmBlockPoolAdapter`
works on any object with vLLM's layout (vLLM 0.30+ pool internals):

* ``pool.blocks``: ``KVCacheBlock`` objects with ``block_id``, ``ref_cnt``, ``block_hash``
  (primary key), ``block_hash_num_tokens``;
* ``pool.free_block_queue.get_all_free_blocks()``: the queue, front first;
* ``pool.cached_block_hash_to_block``: a ``BlockHashToBlockMap`` whose ``_cache`` maps a key
  to one block or to an insertion-ordered ``{block_id: block}`` (older pools: a plain dict);
* ``pool.cached_block_hashes_by_block``: secondary keys per block id (vLLM: a *set*);
* ``pool._reuse_watchers``: pending reuse watchers by block id (0.30+);
* ``pool.kv_event_queue`` / ``pool.take_events()``: vLLM's event objects (no sequence
  numbers; the adapter numbers them in order).

Use ``kvpool check --backends spec,vllm`` (add ``--valid-only`` to skip §12's invalid calls,
which vLLM does not validate) or ``make_differential_test(["spec", make_vllm_pool])``.
``docs/harness.md`` lists the divergences to expect and the BEHAVIOUR.md §12 rows behind them.

Version scope: :func:`vllm_api` says which calls a vLLM version's pool has (detected from
the installed class, optionally narrowed to a named version), and the harness generates only
those. Requests are translated to the attribute names vLLM reads (:class:`VllmRequestView`:
``lora_request.adapter_id``/``name``, ``mm_features[i].mm_position``...). Options vLLM's
constructor lacks raise :class:`BackendUnavailable` unless they are at their default, and
``use_int_block_hashes`` (a process-wide environment switch in vLLM) is pinned around every
call of the wrapped pool.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Any

from kvpool.errors import BackendUnavailable
from kvpool.harness.api import PoolApi, common_api
from kvpool.harness.foreign.objects import ObjectPoolAdapter
from kvpool.spec.state import PoolState

FIRST_IN: dict[str, tuple[int, int]] = {
    "move_block_hashes": (0, 26),
    "emit_cached_block_events": (0, 26),
    "is_block_writable": (0, 29),
    "unpin_blocks": (0, 30),
    "foreign_blocks": (0, 30),
    "replace_existing_hashes": (0, 30),
    "null_block_skipped": (0, 33),
    "partial_any_boundary": (0, 33),
    "lookahead": (0, 33),
    "mm_window_index": (0, 31),
}
"""The vLLM release each :class:`PoolApi` feature first appeared in (BEHAVIOUR.md §0)."""

INT_HASHES_ENV = "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"


def parse_version(text: str) -> tuple[int, int]:
    """``"0.25.1"`` → ``(0, 25)``; :class:`ValueError` for anything else."""
    parts = text.strip().lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"not a vLLM version: {text!r} (expected e.g. 0.25.1)") from None


def api_of_version(version: str) -> PoolApi:
    """The pool API of vLLM ``version`` according to :data:`FIRST_IN` (set-ordered keys)."""
    v = parse_version(version)
    return PoolApi(secondary_key_order="set",
                   **{name: v >= first for name, first in FIRST_IN.items()})


def detect_api(block_pool_class: Any, version: str) -> PoolApi:
    """What the installed ``BlockPool`` offers: its methods and parameters, and for the
    behaviours no signature shows (null skipping, partial boundaries) its version."""

    init = inspect.signature(block_pool_class).parameters
    partial = getattr(block_pool_class, "cache_partial_block", None)
    partial_params = inspect.signature(partial).parameters if partial else {}
    try:
        from vllm.v1.core.kv_cache_utils import KVCacheBlock

        has_owner = "pool" in inspect.signature(KVCacheBlock).parameters
    except (ImportError, TypeError, ValueError):
        has_owner = False
    found = PoolApi(
        unpin_blocks=hasattr(block_pool_class, "unpin_blocks"),
        is_block_writable=hasattr(block_pool_class, "is_block_writable"),
        move_block_hashes=hasattr(block_pool_class, "move_block_hashes"),
        emit_cached_block_events=hasattr(block_pool_class, "emit_cached_block_events"),
        replace_existing_hashes="replace_existing_hashes" in partial_params,
        foreign_blocks=has_owner,
        lookahead="num_hash_lookahead_tokens" in init,
        secondary_key_order="set",
    )
    return common_api([found, api_of_version(version)])


def installed_vllm_version() -> str:
    require_vllm()
    import vllm

    return str(getattr(vllm, "__version__", "0.0"))


def vllm_api(version: str | None = None) -> PoolApi:
    """The scope the harness checks vLLM in: the installed pool's API, narrowed to
    ``version``'s if one is named (naming a newer version than installed adds nothing)."""
    from vllm.v1.core.block_pool import BlockPool


    api = detect_api(BlockPool, installed_vllm_version())
    return api if version is None else common_api([api, api_of_version(version)])


def _cache_entries(table: Any) -> dict[bytes, tuple[int, ...]]:
    """``BlockHashToBlockMap`` contents as key → block ids (earliest inserted first)."""
    raw = getattr(table, "_cache", table)
    out: dict[bytes, tuple[int, ...]] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            if value:  # an emptied inner map would be a vLLM bug; keep it visible
                out[bytes(key)] = tuple(int(i) for i in value)
            else:
                out[bytes(key)] = ()
        else:
            out[bytes(key)] = (int(value.block_id),)
    return out


@dataclass(frozen=True)
class _PlaceholderRange:
    offset: int
    length: int


@dataclass(frozen=True)
class _MultiModalFeatureView:
    """What vLLM reads of one multimodal item: ``identifier`` and ``mm_position``."""

    identifier: str | None
    mm_position: _PlaceholderRange


@dataclass(frozen=True)
class _LoRARequestView:
    """vLLM's ``LoRARequest`` attribute names over kvpool's :class:`~kvpool.request.LoRARequest`."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id


class VllmRequestView:
    """A kvpool :class:`~kvpool.request.Request` under the attribute names vLLM's pool reads.

    ``block_hashes`` is the request's own (append-only) list, so hashes appended later are
    seen; token ids are read live as well. LoRA and multimodal items are translated to vLLM's
    shapes (``adapter_id``/``name``, ``mm_position.offset/length``).
    """

    def __init__(self, request: Any) -> None:
        self._request = request
        self.request_id = request.request_id
        self.block_hashes = request.block_hashes
        lora = getattr(request, "lora_request", None)
        self.lora_request = None if lora is None else _LoRARequestView(
            lora.lora_name, lora.lora_int_id, getattr(lora, "lora_path", ""))
        self.mm_features = [
            _MultiModalFeatureView(f.identifier, _PlaceholderRange(f.offset, f.length))
            for f in getattr(request, "mm_features", ())
        ]
        self.cache_salt = getattr(request, "cache_salt", None)
        self.prompt_embeds = getattr(request, "prompt_embeds", None)
        self.session_id = getattr(request, "session_id", None)
        self._prompt_embeds_per_block_hashes: dict = {}

    @property
    def all_token_ids(self) -> list[int]:
        return list(self._request.all_token_ids)

    @property
    def num_tokens(self) -> int:
        return int(self._request.num_tokens)

    @property
    def num_prompt_tokens(self) -> int:
        return int(self._request.num_prompt_tokens)


class _EnvPinned:
    """A pool whose method calls run with environment variables pinned (then restored).

    vLLM reads ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` at event time, process-wide; pinning it
    per call lets two pools with different settings live in one process.
    """

    def __init__(self, pool: Any, env: dict[str, str]) -> None:
        object.__setattr__(self, "_pool", pool)
        object.__setattr__(self, "_env", env)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._pool, name)
        if not (callable(value) and inspect.ismethod(value)):
            return value

        def pinned(*args: Any, **kwargs: Any) -> Any:
            saved = {k: os.environ.get(k) for k in self._env}
            os.environ.update(self._env)
            try:
                return value(*args, **kwargs)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

        return pinned

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._pool, name, value)


class VllmBlockPoolAdapter(ObjectPoolAdapter):
    """A vLLM-layout ``BlockPool`` as a kvpool backend (reads internals for ``abstract()``)."""

    backend_name = "vllm"

    def __init__(self, pool: Any, *, num_gpu_blocks: int | None = None,
                 hash_block_size: int | None = None, pool_api: PoolApi | None = None) -> None:
        super().__init__(pool, num_gpu_blocks=num_gpu_blocks, hash_block_size=hash_block_size)
        self.pool_api = pool_api or PoolApi(secondary_key_order="set")
        self._views: dict[int, tuple[Any, VllmRequestView]] = {}

    def to_request(self, request: Any) -> Any:
        """vLLM's view of a kvpool request (one per request, kept for the pool's lifetime)."""
        from kvpool.request import Request

        if not isinstance(request, Request):
            return request  # already vLLM-shaped (a fake's own request, a vLLM Request)
        entry = self._views.get(id(request))
        if entry is None or entry[0] is not request:
            entry = (request, VllmRequestView(request))
            self._views[id(request)] = entry
        return entry[1]

    def snapshot(self) -> PoolState:
        pool = self.pool
        blocks = pool.blocks
        primary = tuple(None if b.block_hash is None else bytes(b.block_hash) for b in blocks)
        tokens = tuple(
            None if key is None else b.block_hash_num_tokens
            for key, b in zip(primary, blocks, strict=True)
        )
        secondary = {
            int(block_id): tuple(bytes(k) for k in keys)  # vLLM: set order (BEHAVIOUR §12)
            for block_id, keys in getattr(pool, "cached_block_hashes_by_block", {}).items()
            if keys
        }
        return PoolState(
            num_blocks=len(blocks),
            enable_caching=bool(pool.enable_caching),
            hash_block_size=self.hash_block_size,
            enable_events=bool(getattr(pool, "enable_kv_cache_events", False)),
            ref_cnt=tuple(int(b.ref_cnt) for b in blocks),
            free_queue=tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
            primary_key=primary,
            primary_tokens=tokens,
            secondary_keys=secondary,
            cache=_cache_entries(pool.cached_block_hash_to_block),
            watchers=tuple(int(b) for b in getattr(pool, "_reuse_watchers", {})),
            event_count=self.events_emitted() if getattr(pool, "enable_kv_cache_events", False)
            else 0,
        )


def require_vllm() -> None:
    """Raise :class:`BackendUnavailable` unless vLLM's ``BlockPool`` can be imported."""
    try:
        from vllm.v1.core.block_pool import BlockPool  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(
            f"backend 'vllm' needs vLLM installed ({exc}); pip install vllm"
        ) from exc


_DEFAULTS: dict[str, Any] = {
    "enable_kv_cache_events": False,
    "num_hash_lookahead_tokens": 0,
    "medium": "GPU",
    "use_int_block_hashes": True,
    "metrics_collector": None,
}
"""``make_pool`` options with their defaults: an option vLLM lacks may only take this value."""


def make_vllm_pool(num_blocks: int, *, pool_api: PoolApi | None = None,
                   **options: Any) -> VllmBlockPoolAdapter:
    """vLLM's ``BlockPool(num_blocks, ...)`` wrapped for the harness.

    ``options`` are ``make_pool``'s. One the installed vLLM's constructor lacks is accepted
    only at its default (``num_hash_lookahead_tokens=2`` on 0.25.1 raises
    :class:`BackendUnavailable` instead of silently checking something else);
    ``use_int_block_hashes`` becomes vLLM's environment switch, pinned per call.
    """
    require_vllm()
    from vllm.v1.core.block_pool import BlockPool

    accepted = inspect.signature(BlockPool).parameters
    kwargs: dict[str, Any] = {}
    env: dict[str, str] = {}
    for name, value in options.items():
        if name == "use_int_block_hashes":
            env[INT_HASHES_ENV] = "1" if value else "0"
        elif name in accepted:
            kwargs[name] = value
        elif name not in _DEFAULTS or value != _DEFAULTS[name]:
            raise BackendUnavailable(
                f"vLLM {installed_vllm_version()}'s BlockPool has no {name!r} option "
                f"(asked for {name}={value!r})"
            )
    kwargs.setdefault("enable_caching", True)
    if "hash_block_size" in accepted:
        kwargs.setdefault("hash_block_size", 16)
    pool: Any = BlockPool(num_blocks, **kwargs)
    if env:
        pool = _EnvPinned(pool, env)
    return VllmBlockPoolAdapter(pool, hash_block_size=options.get("hash_block_size", 16),
                                pool_api=pool_api or vllm_api())


make_vllm_pool.backend_name = "vllm"  # type: ignore[attr-defined]


def vllm_factory(version: str | None = None) -> Any:
    """A harness factory for vLLM's pool, scoped to ``version`` (``None``: as installed)."""
    api = vllm_api(version)

    def factory(num_blocks: int, **options: Any) -> VllmBlockPoolAdapter:
        return make_vllm_pool(num_blocks, pool_api=api, **options)

    factory.backend_name = "vllm"  # type: ignore[attr-defined]
    factory.pool_api = api  # type: ignore[attr-defined]
    return factory


__all__ = [
    "FIRST_IN",
    "VllmBlockPoolAdapter",
    "VllmRequestView",
    "api_of_version",
    "detect_api",
    "installed_vllm_version",
    "make_vllm_pool",
    "parse_version",
    "require_vllm",
    "vllm_api",
    "vllm_factory",
]
