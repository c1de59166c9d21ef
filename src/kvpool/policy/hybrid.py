"""The hybrid coordinator: several attention types, one hit length (BEHAVIOUR.md §9).

Groups with equal specs form a *spec group*, looked up together (a position hits only if
every member hits). Full-attention spec groups come first. The search is a fixed point: each
spec group either accepts the current candidate length or shortens it, and any shortening
restarts the pass, so the result is the longest length *every* group can serve, a multiple
of ``scheduler_block_size``. Full attention needs no second lookup: a prefix of a hit is a
hit, so its result is just cut to the candidate length.

kvpool keeps invariant 26 where vLLM 0.25.1 does not (§9, §12): with EAGLE, a Mamba group is
looked up one block past the full-attention group (it ignores the EAGLE drop), and vLLM's
single pass could then report a hit longer than the full-attention blocks it returns. Here,
after the loop, a full-attention group that covers less than the hit caps it, and the other
spec groups are looked up again at the capped length until nothing shrinks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.errors import InvalidConfig
from kvpool.hashing.coarse import resolve_block_hashes
from kvpool.policy.coordinator import KVCacheCoordinator
from kvpool.policy.manager import SingleTypeKVCacheManager
from kvpool.policy.specs import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    cdiv,
    is_prefix_cacheable,
)


@dataclass
class SpecGroup:
    """Groups sharing one spec; ``use_eagle`` if any member is an EAGLE group."""

    spec: KVCacheSpec
    group_ids: list[int]
    manager_cls: type[SingleTypeKVCacheManager]
    use_eagle: bool

    @property
    def is_full_attention(self) -> bool:
        return isinstance(self.spec, FullAttentionSpec)


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several specs over one pool; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        groups = self.kv_cache_config.kv_cache_groups
        for i, g in enumerate(groups):
            if is_prefix_cacheable(g.kv_cache_spec) and \
                    g.kv_cache_spec.block_size % self.hash_block_size:
                raise InvalidConfig(
                    f"kv_cache_groups[{i}].kv_cache_spec.block_size "
                    f"({g.kv_cache_spec.block_size}) must be a multiple of hash_block_size "
                    f"({self.hash_block_size})")
        managers = self.single_type_managers
        if any(m.dcp_world_size * m.pcp_world_size > 1 for m in managers):
            raise InvalidConfig("dcp_world_size/pcp_world_size must be 1 for a hybrid model")
        self.attention_groups: list[SpecGroup] = []
        distinct = len({g.kv_cache_spec for g in groups})
        for i, g in enumerate(groups):
            if not is_prefix_cacheable(g.kv_cache_spec):
                continue  # per-request scratch (circular buffer): never looked up
            eagle = i in self.eagle_group_ids
            for sg in self.attention_groups:
                if sg.spec == g.kv_cache_spec:
                    sg.group_ids.append(i)
                    sg.use_eagle = sg.use_eagle or eagle
                    break
            else:
                self.attention_groups.append(
                    SpecGroup(g.kv_cache_spec, [i], type(managers[i]), eagle))
        if distinct < 2 or not self.attention_groups:
            raise InvalidConfig(
                f"kv_cache_groups: a hybrid model needs at least two distinct specs, one of "
                f"them prefix-cacheable, got {distinct} spec(s), "
                f"{len(self.attention_groups)} cacheable (one spec: merge the groups; "
                f"caching off: enable_caching=False)")
        self.attention_groups.sort(key=lambda sg: not sg.is_full_attention)  # stable
        for sg in self.attention_groups:
            if sg.use_eagle:
                for gid in sg.group_ids:
                    managers[gid].use_eagle = True
        self.num_uncached_common_prefix_tokens = 0
        if self.allow_partial_hash_hits and self.enable_caching and \
                partial_hash_hits_supported(groups, managers, self.hash_block_size):
            if self.eagle_group_ids:
                raise InvalidConfig(
                    "allow_partial_hash_hits: kvpool does not combine partial prefix hits "
                    "with EAGLE (use_eagle / is_eagle_group); turn one of them off")
            self.partial_hash_hits = True
            for manager in managers:
                manager.partial_hits = manager.supports_partial_hits

    @property
    def cache_hit_alignment_tokens(self) -> int:
        """Hits are multiples of this: hbs with partial hits, else the scheduler block."""
        return self.hash_block_size if self.partial_hash_hits else self.scheduler_block_size

    def _hashes(self, spec: KVCacheSpec, block_hashes: Sequence[bytes]) -> Sequence[bytes]:
        return resolve_block_hashes(block_hashes, self.hash_block_size, spec.block_size)

    def _lookup(self, sg: SpecGroup, block_hashes: Sequence[bytes], max_length: int,
                drop_eagle_block: bool) -> tuple[list[int], ...]:
        return sg.manager_cls.find_longest_cache_hit(
            self._hashes(sg.spec, block_hashes), max_length, sg.group_ids, self.block_pool,
            sg.spec, drop_eagle_block, self.scheduler_block_size)

    def _lookup_partial(self, sg: SpecGroup, block_hashes: Sequence[bytes],
                        max_length: int) -> tuple[tuple[list[int], ...], int]:
        """A lookup at hash-block granularity; a family without it has bs == hbs."""
        if sg.manager_cls.supports_partial_hits:
            return sg.manager_cls.find_longest_partial_cache_hit(  # type: ignore[attr-defined]
                block_hashes, max_length, sg.group_ids, self.block_pool, sg.spec)
        result = sg.manager_cls.find_longest_cache_hit(
            block_hashes, max_length, sg.group_ids, self.block_pool, sg.spec, False,
            self.hash_block_size)
        return result, len(result[0]) * sg.spec.block_size

    def _find_partial_hit(self, block_hashes: Sequence[bytes],
                          max_cache_hit_length: int) -> tuple[tuple[list[int], ...], int]:
        """The fixed point at hash-block granularity (vLLM 0.33, §10.4): the same passes,
        but lengths are exact token counts and full attention keeps ``cdiv(hit, bs)``
        blocks, the last one possibly shared only in part."""
        hits: list[list[int] | None] = [None] * len(self.kv_cache_config.kv_cache_groups)
        lengths = [0] * len(hits)
        hit = max_cache_hit_length
        longest = 0
        simple = len(self.attention_groups) == 2 and self.attention_groups[0].is_full_attention
        while True:
            curr = hit
            for sg in self.attention_groups:
                first = sg.group_ids[0]
                if sg.is_full_attention and hits[first] is not None:
                    curr = min(curr, lengths[first])
                    continue
                result, length = self._lookup_partial(sg, block_hashes, curr)
                curr = length
                for gid, blocks in zip(sg.group_ids, result, strict=True):
                    hits[gid] = blocks
                    lengths[gid] = length
                longest = max(longest, curr)
            if curr >= hit:
                break
            hit = curr
            if simple:
                break
        for sg in self.attention_groups:
            if sg.is_full_attention:
                keep = cdiv(hit, sg.spec.block_size)
                for gid in sg.group_ids:
                    kept = hits[gid]
                    if kept is not None:
                        del kept[keep:]
        self.num_uncached_common_prefix_tokens = longest - hit
        return tuple(b if b is not None else [] for b in hits), hit

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes],
                               max_cache_hit_length: int) -> tuple[tuple[list[int], ...], int]:
        """Per group its hit blocks, and the one hit length all groups serve."""
        if self.partial_hash_hits:
            return self._find_partial_hit(block_hashes, max_cache_hit_length)
        hits: list[list[int] | None] = [None] * len(self.kv_cache_config.kv_cache_groups)
        hit = max_cache_hit_length
        longest = 0
        simple = len(self.attention_groups) == 2 and self.attention_groups[0].is_full_attention
        verified: set[int] = set()  # EAGLE spec groups already looked up with the drop
        while True:
            curr = hit
            for idx, sg in enumerate(self.attention_groups):
                bs = sg.spec.block_size
                if sg.is_full_attention and hits[sg.group_ids[0]] is not None:
                    curr = curr // bs * bs  # a prefix of a full-attention hit is a hit
                    continue
                drop = sg.use_eagle and idx not in verified
                max_length = min(curr + bs, max_cache_hit_length) if drop else curr
                result = self._lookup(sg, block_hashes, max_length, drop)
                length = len(result[0]) * bs
                if drop:
                    verified.add(idx)
                elif length < curr:
                    verified.clear()
                curr = length
                for gid, blocks in zip(sg.group_ids, result, strict=True):
                    hits[gid] = blocks
                longest = max(longest, curr)
            if curr >= hit:
                break
            hit = curr
            if simple:
                break
        hit = self._cap_by_full_attention(hits, hit, block_hashes)
        for sg in self.attention_groups:
            if sg.is_full_attention:
                keep = hit // sg.spec.block_size
                for gid in sg.group_ids:
                    kept = hits[gid]
                    if kept is not None:
                        del kept[keep:]
        self.num_uncached_common_prefix_tokens = longest - hit
        return tuple(b if b is not None else [] for b in hits), hit

    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int,
    ) -> tuple[tuple[list[int], ...], tuple[int, ...]]:
        """Each spec group's own longest hit at ``max_cache_hit_length`` (its EAGLE drop
        applied, the usual alignment), with no common length: the blocks and the hit tokens
        per group. Pure. A KV connector uses it to learn what each group holds locally
        (vLLM's scheduler does so for Mamba hybrids); ``allocate_slots`` needs the common
        hit of :meth:`find_longest_cache_hit` instead."""
        hits: list[list[int]] = [[] for _ in self.kv_cache_config.kv_cache_groups]
        lengths = [0] * len(hits)
        for sg in self.attention_groups:
            if self.partial_hash_hits:
                result, length = self._lookup_partial(sg, block_hashes, max_cache_hit_length)
            else:
                result = self._lookup(sg, block_hashes, max_cache_hit_length, sg.use_eagle)
                length = len(result[0]) * sg.spec.block_size
            for gid, blocks in zip(sg.group_ids, result, strict=True):
                hits[gid] = blocks
                lengths[gid] = length
        return tuple(hits), tuple(lengths)

    def _cap_by_full_attention(self, hits: list[list[int] | None], hit: int,
                               block_hashes: Sequence[bytes]) -> int:
        """Invariant 26: no full-attention group may cover less than the hit (§12)."""
        sbs = self.scheduler_block_size
        while True:
            cover = min((len(hits[sg.group_ids[0]] or []) * sg.spec.block_size
                         for sg in self.attention_groups if sg.is_full_attention),
                        default=hit)
            if cover >= hit:
                return hit
            hit = cover // sbs * sbs
            for sg in self.attention_groups:
                if sg.is_full_attention:
                    continue
                result = self._lookup(sg, block_hashes, hit, False)
                hit = len(result[0]) * sg.spec.block_size
                for gid, blocks in zip(sg.group_ids, result, strict=True):
                    hits[gid] = blocks

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Every group caches up to the aligned length (EAGLE groups one block further:
        their lookups drop that block again)."""
        sbs = self.scheduler_block_size
        aligned = num_computed_tokens // sbs * sbs
        if self.partial_hash_hits:
            # Hits may end at any hash boundary, so no rounding (it would re-key a Mamba
            # state that a copy-on-write made private). No EAGLE in this mode.
            aligned = num_computed_tokens
        for manager in self.single_type_managers:
            n = aligned
            if manager.use_eagle and aligned > 0:
                n = min(num_computed_tokens, aligned + manager.block_size)
            manager.cache_blocks(request, n, self.retention_interval)


def partial_hash_hits_supported(groups: Sequence[Any], managers: Sequence[Any],
                                hash_block_size: int) -> bool:
    """vLLM 0.33's condition for partial hits: an align-mode Mamba group with blocks
    larger than a hash block, every Mamba group in align mode, and every other group
    either able to look up inside a block or hashed at its own block size."""
    specs = [g.kv_cache_spec for g in groups]
    pairs = [(s, m) for s, m in zip(specs, managers, strict=True) if is_prefix_cacheable(s)]
    if not any(isinstance(s, MambaSpec) and s.mamba_cache_mode == "align"
               and s.block_size > hash_block_size for s in specs):
        return False
    for spec, manager in pairs:
        if isinstance(spec, MambaSpec) and spec.mamba_cache_mode != "align":
            return False
        if not manager.supports_partial_hits and spec.block_size != hash_block_size:
            return False
    return True


__all__ = ["HybridKVCacheCoordinator", "SpecGroup", "partial_hash_hits_supported"]
