"""The router's view: which keys each engine (and data-parallel rank) holds, from its events.

:class:`RankIndex` applies decoded wire events with the semantics of
:func:`kvpool.events.replay`: a stored hash adds one block under ``(hash, group_idx)``, a
removal takes one away (the key goes at zero; a removal of a key it never saw is counted in
``unknown_removals`` and otherwise ignored, as replay ignores it), a clear empties the index.
vLLM's own removals may list several hashes; each counts (kvpool's always list one).

**What a router would predict.** A KV-aware router scores an incoming prompt by the longest
run of its leading block hashes an engine holds (:meth:`FleetIndex.longest_prefix`). From the
events alone the index estimates the hit rate of that prediction: a ``BlockStored`` that
starts a request's computation says the request had ``parent``'s chain cached, so the router,
had it seen the request, would have predicted ``position(parent) + 1`` hit blocks against
``len(block_hashes)`` blocks to compute. Positions are chain depths learned from the events
(an unseen parent counts as a miss). A one-block store that extends the newest block of an
earlier store is a request growing by decode, not a new request, and is left out; so is, by
the same rule, a new request whose hit ends exactly there and that adds one block, which makes
the estimate a lower bound on reuse in multi-turn traffic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvpool.keys import ExternalBlockHash
from kvpool.wire.encoding import WireBatch, WireBlockRemoved, WireBlockStored, WireEvent

IndexKey = tuple[ExternalBlockHash, int | None]
"""``(external block hash, group_idx)``, the key :func:`kvpool.events.replay` counts under."""

EngineRank = tuple[str, int | None]
"""``(engine name, data-parallel rank)``; the rank is the batch's (``None`` when unset)."""


@dataclass
class RankIndex:
    """The cache index of one engine rank plus the counters of how it was built."""

    blocks: Counter = field(default_factory=Counter)
    positions: dict[IndexKey, int] = field(default_factory=dict)
    tips: set[IndexKey] = field(default_factory=set)
    batches: int = 0
    events: int = 0
    unknown_removals: int = 0
    predicted_hit_blocks: int = 0
    predicted_blocks: int = 0

    def apply_batch(self, batch: WireBatch) -> None:
        for event in batch.events:
            self.apply(event)
        self.batches += 1

    def apply(self, event: WireEvent) -> None:
        """One event (see the module docstring)."""
        self.events += 1
        if isinstance(event, WireBlockStored):
            self._stored(event)
        elif isinstance(event, WireBlockRemoved):
            for h in event.block_hashes:
                self._removed((h, event.group_idx))
        else:
            self.blocks.clear()
            self.positions.clear()
            self.tips.clear()

    def _stored(self, event: WireBlockStored) -> None:
        group = event.group_idx
        hashes = event.block_hashes
        parent = None if event.parent_block_hash is None else (event.parent_block_hash, group)
        parent_pos = -1
        if parent is not None and parent in self.blocks:
            parent_pos = self.positions.get(parent, -1)
        continuation = len(hashes) == 1 and parent in self.tips
        if hashes and not continuation:
            self.predicted_hit_blocks += parent_pos + 1
            self.predicted_blocks += parent_pos + 1 + len(hashes)
        if parent is not None:
            self.tips.discard(parent)
        blocks, positions = self.blocks, self.positions
        for i, h in enumerate(hashes):
            key = (h, group)
            blocks[key] += 1
            positions[key] = parent_pos + 1 + i
        if hashes:
            self.tips.add((hashes[-1], group))

    def _removed(self, key: IndexKey) -> None:
        count = self.blocks.get(key, 0)
        if count <= 0:
            self.unknown_removals += 1
            return
        if count == 1:
            del self.blocks[key]
            self.positions.pop(key, None)
            self.tips.discard(key)
        else:
            self.blocks[key] = count - 1

    def reset(self) -> None:
        """Forget everything (the engine restarted): counters of prediction included."""
        self.__init__()  # type: ignore[misc]

    @property
    def num_keys(self) -> int:
        return len(self.blocks)

    @property
    def num_blocks(self) -> int:
        return sum(self.blocks.values())

    def cache_index(self) -> Counter:
        """A copy comparable with :func:`kvpool.events.cache_index_of` of the pool."""
        return Counter(self.blocks)


class FleetIndex:
    """Cache indexes of many engine ranks, as a KV-aware router keeps them."""

    def __init__(self) -> None:
        self.ranks: dict[EngineRank, RankIndex] = {}

    def rank(self, engine: str, data_parallel_rank: int | None) -> RankIndex:
        key = (engine, data_parallel_rank)
        index = self.ranks.get(key)
        if index is None:
            index = self.ranks[key] = RankIndex()
        return index

    def apply_batch(self, engine: str, batch: WireBatch) -> RankIndex:
        index = self.rank(engine, batch.data_parallel_rank)
        index.apply_batch(batch)
        return index

    def reset_engine(self, engine: str) -> None:
        """Drop every rank of ``engine`` (its publisher restarted with a fresh pool)."""
        for key in [k for k in self.ranks if k[0] == engine]:
            del self.ranks[key]

    def longest_prefix(self, block_hashes: Sequence[ExternalBlockHash],
                       group_idx: int | None = 0) -> dict[EngineRank, int]:
        """Per engine rank, how many leading ``block_hashes`` it holds (a router's score)."""
        scores = {}
        for where, index in self.ranks.items():
            n = 0
            for h in block_hashes:
                if (h, group_idx) not in index.blocks:
                    break
                n += 1
            scores[where] = n
        return scores

    def predicted_hit_rate(self) -> float:
        """Predicted hit blocks over predicted prompt blocks, all ranks (0.0 before any)."""
        hits = sum(i.predicted_hit_blocks for i in self.ranks.values())
        total = sum(i.predicted_blocks for i in self.ranks.values())
        return hits / total if total else 0.0

    def num_keys(self) -> int:
        return sum(i.num_keys for i in self.ranks.values())

    def num_blocks(self) -> int:
        return sum(i.num_blocks for i in self.ranks.values())

    def items(self) -> Iterable[tuple[EngineRank, RankIndex]]:
        return sorted(self.ranks.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0))


__all__ = ["EngineRank", "FleetIndex", "IndexKey", "RankIndex"]
