"""A small KV cache manager whose every step is recorded as a :class:`Snapshot`.

A :class:`Session` wraps a :class:`~kvpool.policy.KVCacheManager` over a tiny pool (a few
blocks of a few tokens) and offers the scheduler's moves — admit a request, decode tokens,
finish it — each of which records what the pool looks like afterwards: the free queue in
order (with ref counts and hashes), the prefix-cache hash table, every live request's block
table per group, and the events the step emitted. The scenarios of
:mod:`kvpool.explain.scenarios` are short scripts over a session; the renderers draw the
snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpool.backends import make_pool
from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.keys import key_group, key_hash
from kvpool.policy import KVCacheConfig, KVCacheManager, RequestStatus, SchedulerRequest

HASH_LABEL_BYTES = 2
"""A hash is shown by its first bytes, in hex (enough to tell a scenario's hashes apart)."""


def hash_label(block_hash: bytes | int) -> str:
    """The first bytes of a hash, in hex (the sessions' pools report ``bytes`` hashes:
    ``use_int_block_hashes=False``; an int hash is shown whole)."""
    if isinstance(block_hash, int):
        return f"{block_hash:x}"
    return block_hash[:HASH_LABEL_BYTES].hex()


@dataclass(frozen=True)
class BlockView:
    """One block as a step leaves it."""

    block_id: int
    ref_cnt: int
    key: str | None  # "hash/g<group>" or None (no cache identity)
    queue_position: int | None  # 0 = the next block an allocation takes; None = in use


@dataclass(frozen=True)
class Snapshot:
    """What a step did and how it left the pool (see the module docstring)."""

    index: int
    title: str
    explanation: str
    blocks: tuple[BlockView, ...]
    free_queue: tuple[int, ...]
    hash_table: tuple[tuple[str, tuple[int, ...]], ...]
    tables: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]
    events: tuple[str, ...]
    group_names: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def block(self, block_id: int) -> BlockView:
        return self.blocks[block_id]


@dataclass
class Session:
    """A recorded run over a small manager (see the module docstring)."""

    kv_cache_config: KVCacheConfig
    scheduler_block_size: int
    hash_block_size: int
    backend: str = "spec"
    manager_options: dict[str, Any] = field(default_factory=dict)
    snapshots: list[Snapshot] = field(default_factory=list)

    def __post_init__(self) -> None:
        def pool(n: int, **kwargs: Any) -> Any:
            return make_pool(n, backend=self.backend, use_int_block_hashes=False, **kwargs)

        self.manager = KVCacheManager(
            self.kv_cache_config, 4096, self.scheduler_block_size, self.hash_block_size,
            enable_kv_cache_events=True, backend=pool, **self.manager_options)
        self.hasher = get_request_block_hasher(self.hash_block_size,
                                               BlockHasher("sha256", seed="kvpool-explain"))
        self.requests: dict[str, SchedulerRequest] = {}
        self.group_names = tuple(type(g.kv_cache_spec).__name__.removesuffix("Spec")
                                 for g in self.kv_cache_config.kv_cache_groups)

    # -- moves ----------------------------------------------------------------------------

    def record(self, title: str, explanation: str, notes: tuple[str, ...] = ()) -> Snapshot:
        """Snapshot the pool now, with the events since the last snapshot."""
        pool = self.manager.block_pool
        state = pool.abstract().state
        position = {b: i for i, b in enumerate(state.free_queue)}
        blocks = tuple(
            BlockView(b, state.ref_cnt[b], self._key_label(state.primary_key[b]),
                      position.get(b))
            for b in range(state.num_blocks))
        hash_table = tuple(sorted((self._key_label(k) or "", tuple(v))
                                  for k, v in state.cache.items()))
        tables = tuple((rid, tuple(tuple(t) for t in self.manager.get_block_ids(rid)))
                       for rid in self.requests if self.manager.is_running(rid))
        events = tuple(self._event_line(e) for e in self.manager.take_events())
        snapshot = Snapshot(len(self.snapshots), title, explanation, blocks, state.free_queue,
                            hash_table, tables, events, self.group_names, notes)
        self.snapshots.append(snapshot)
        return snapshot

    def admit(self, rid: str, tokens: list[int], explanation: str,
              num_tokens: int | None = None) -> tuple[int, ...]:
        """Look up the prefix cache and allocate the prompt (or its first ``num_tokens``)."""
        request = SchedulerRequest(rid, list(tokens), block_hasher=self.hasher)
        self.requests[rid] = request
        hits, num_hit = self.manager.get_computed_blocks(request)
        todo = (num_tokens or request.num_tokens) - num_hit
        new = self.manager.allocate_slots(request, todo, num_hit, hits)
        if new is None:
            raise RuntimeError(f"scenario bug: {rid} does not fit")
        request.num_computed_tokens = num_hit + todo
        request.status = RequestStatus.RUNNING
        self.manager.new_step_starts()
        note = f"{rid}: {num_hit} of {request.num_tokens} prompt tokens were prefix hits"
        self.record(f"admit {rid}", explanation, (note,))
        return tuple(new.get_block_ids()[0])

    def decode(self, rid: str, tokens: list[int], explanation: str) -> None:
        """Compute the request's pending tokens then append ``tokens`` one per step."""
        request = self.requests[rid]
        for token in tokens:
            request.append_output_token_ids(token)
            pending = request.num_tokens - request.num_computed_tokens
            if self.manager.allocate_slots(request, pending) is None:
                raise RuntimeError(f"scenario bug: {rid} decode does not fit")
            request.num_computed_tokens = request.num_tokens
            self.manager.new_step_starts()
        self.record(f"decode {rid} (+{len(tokens)} tokens)", explanation)

    def finish(self, rid: str, explanation: str) -> None:
        self.manager.free(self.requests[rid])
        self.record(f"finish {rid}", explanation)

    # -- labels ---------------------------------------------------------------------------

    def _key_label(self, key: bytes | None) -> str | None:
        if key is None:
            return None
        label = hash_label(key_hash(key))
        if len(self.group_names) > 1:
            label += f"/g{key_group(key)}"
        return label

    def _event_line(self, event: Any) -> str:
        if isinstance(event, BlockStored):
            hashes = ", ".join(hash_label(h) for h in event.block_hashes)
            where = f" group {event.group_idx}" if event.group_idx is not None else ""
            return f"BlockStored [{hashes}]{where} ({len(event.token_ids)} tokens)"
        if isinstance(event, BlockRemoved):
            hashes = ", ".join(hash_label(h) for h in event.block_hashes)
            where = f" group {event.group_idx}" if event.group_idx is not None else ""
            return f"BlockRemoved [{hashes}]{where}"
        if isinstance(event, AllBlocksCleared):
            return "AllBlocksCleared"
        return type(event).__name__


__all__ = ["BlockView", "Session", "Snapshot", "hash_label"]
