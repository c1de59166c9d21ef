"""A tiny attention-only decoder served through the whole stack: the end-to-end proof.

:class:`ToyDecoder` has, per attention group, a few layers whose query, key and value for a
token are a deterministic function of the token and its position (seeded embeddings turned
by a position-dependent rotation), so the right answer is computable without any cache:
:meth:`ToyDecoder.dense` attends over the whole sequence directly.

:class:`ToyEngine` serves requests the way an engine does: a scheduler step asks the
:class:`~kvpool.policy.KVCacheManager` for prefix hits and slots (preempting the newest
running request when a step does not fit), syncs the :class:`~kvpool.gpu.BlockTables`,
computes the slot mapping, writes the new tokens' K/V into the :class:`~kvpool.gpu.PagedKVCache`
(prefix hits are *not* written: they must already be there), executes the manager's pending
copy-on-write pairs in one launch, attends by reading K/V back through the block table
(positions out of a sliding window sit in the null block and are never read), and releases
the copies' retained endpoints after the step. Preempted requests are either recomputed or
offloaded (:class:`~kvpool.gpu.Offloader`) and reloaded as KV-connector tokens.

Every output of every step is recorded; :meth:`ToyEngine.max_error` compares them with the
dense model over each request's final sequence. Anything the cache gets wrong — a wrong
cached block, a copy taken before its source was written, a block reused while an offload
still needed it — shows up there.

Step order inside the forward pass (why): tokens whose slot is in a copy *destination* are
written after the copy, every other token before it. The copy's source may be a block that
this very step fills (a request admitted in the step that cached the prefix it hits), so the
copy must follow those writes; and it must precede the writes into the destination, or it
would overwrite them. (This toy's K/V do not depend on earlier layers, so one copy launch
serves all layers; a real model runner copies at the start of the step and lets the
scheduler defer a copy whose source is written in the same step.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from kvpool.gpu.block_table import BlockTables, write_kv
from kvpool.gpu.copier import BlockCopier
from kvpool.gpu.kv_cache import PagedKVCache
from kvpool.gpu.swap import Offloader, SwapOut
from kvpool.policy import KVCacheManager, RequestStatus, SchedulerRequest
from kvpool.policy.specs import AttentionSpec, CrossAttentionSpec, SlidingWindowSpec, cdiv


class ToyDecoder:
    """Layers per attention group; q, k, v of (token, position) fixed by ``seed``."""

    def __init__(self, manager: KVCacheManager, num_layers: int = 2, vocab: int = 101,
                 seed: int = 0) -> None:
        self.groups: list[tuple[list[tuple[torch.Tensor, ...]], int | None] | None] = []
        gen = torch.Generator().manual_seed(seed)
        for group in manager.kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            if not isinstance(spec, AttentionSpec) or isinstance(spec, CrossAttentionSpec):
                self.groups.append(None)
                continue
            h, d = spec.num_kv_heads, spec.head_size
            layers = [tuple(torch.randn(vocab, h, d, generator=gen) for _ in range(3))
                      for _ in range(num_layers)]
            window = spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None
            self.groups.append((layers, window))
        self.num_layers = num_layers
        self.vocab = vocab
        dim = max(s.head_size for g in manager.kv_cache_config.kv_cache_groups
                  if isinstance(s := g.kv_cache_spec, AttentionSpec))
        self.freq = 1.0 / (10.0 ** (torch.arange(dim, dtype=torch.float32) / dim))

    def _attention(self, group: int) -> tuple[list[tuple[torch.Tensor, ...]], int | None]:
        """The layers and window of an attention group."""
        entry = self.groups[group]
        if entry is None:
            raise ValueError(f"group {group} is not an attention group")
        return entry

    def qkv(self, group: int, layer: int, tokens: torch.Tensor, positions: torch.Tensor):
        """``[tokens, heads, dim]`` float32 query, key and value."""
        q, k, v = self._attention(group)[0][layer]
        d = q.shape[-1]
        angle = positions.to(torch.float32)[:, None, None] * self.freq[None, None, :d]
        c, s = torch.cos(angle), torch.sin(angle)
        return (q[tokens] * c + q[tokens].roll(1, -1) * s,
                k[tokens] * c - k[tokens].roll(1, -1) * s,
                v[tokens] * (1.0 + 0.5 * s))

    def visible(self, group: int, position: int) -> range:
        """Positions a query at ``position`` attends to (its window, or all before it)."""
        window = self._attention(group)[1]
        return range(0 if window is None else max(0, position - window + 1), position + 1)

    @staticmethod
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One query ``[heads, dim]`` over ``[n, heads, dim]`` keys/values → ``[heads*dim]``."""
        scores = torch.einsum("hd,nhd->hn", q, k) / math.sqrt(q.shape[-1])
        return torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v).reshape(-1)

    def dense(self, tokens: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Outputs ``[len(tokens), features]`` without any cache (K/V rounded to ``dtype``,
        as the cache stores them)."""
        t = torch.tensor(list(tokens), dtype=torch.long)
        pos = torch.arange(len(t))
        rows: list[list[torch.Tensor]] = [[] for _ in range(len(t))]
        for g, group in enumerate(self.groups):
            if group is None:
                continue
            for i in range(self.num_layers):
                q, k, v = self.qkv(g, i, t, pos)
                k, v = k.to(dtype).float(), v.to(dtype).float()
                for p in range(len(t)):
                    span = self.visible(g, p)
                    rows[p].append(self.attend(q[p], k[span.start:p + 1], v[span.start:p + 1]))
        return torch.stack([torch.cat(r) for r in rows])


@dataclass(eq=False)
class ToyRequest:
    """A request plus its scripted continuation (teacher forcing) and what was computed."""

    request: SchedulerRequest
    script: list[int]
    outputs: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    transfer: SwapOut | None = None
    offloaded_tokens: int = 0
    finished: bool = False
    hits: tuple[list[int], ...] = ()  # its prefix hits per group, at its last admission


class _ReuseIgnored(Offloader):
    """Planted ``ignore-reuse-watcher``: a block handed out again while its copy-out is in
    flight is neither finished nor invalidated (the new owner may overwrite it first)."""

    def on_reuse(self, block_id: int) -> None:
        return None


class ToyEngine:
    """Serves :class:`ToyRequest` s through ``manager`` and real paged tensors.

    ``planted`` breaks one thing on purpose (tests show the comparison catches it):
    ``"copy-before-source-final"`` lets a request hit a partial block cached in the same
    step (it restarts the policy's step before each admission), so its copy runs at the
    start of the step whose forward writes the source;
    ``"wrong-cached-block"`` hands out the first full-attention hit block in place of the
    last (a real cached block, holding other tokens); ``"ignore-reuse-watcher"`` registers
    a watcher that does nothing, so a block reused during its copy-out is copied torn;
    ``"rewrite-hits"`` recomputes a request's prefix hits into the shared blocks (refused by
    the engine's own check that hits are never written).
    """

    def __init__(self, manager: KVCacheManager, model: ToyDecoder, *,
                 dtype: torch.dtype = torch.float32, device: str = "cpu",
                 max_num_reqs: int = 16, max_blocks_per_req: int = 64,
                 token_budget: int = 16, host_blocks: int = 0, on_reuse: str = "finish",
                 planted: str | None = None) -> None:
        self.manager = manager
        self.model = model
        self.dtype = dtype
        self.device = torch.device(device)
        config = manager.kv_cache_config
        self.cache = PagedKVCache(config, dtype, self.device, num_layers=model.num_layers)
        self.block_sizes = [g.kv_cache_spec.block_size for g in config.kv_cache_groups]
        self.tables = BlockTables(self.block_sizes, config.num_blocks, max_num_reqs,
                                  max_blocks_per_req, self.device)
        pool = manager.block_pool
        self.copier = BlockCopier(self.cache, ref_cnts=lambda ids: pool.observe().ref_cnts(ids),
                                  release=getattr(manager, "release_copy_endpoints", None))
        self.offloader: Offloader | None = None
        if host_blocks:
            host = PagedKVCache(config, dtype, "cpu", num_layers=model.num_layers,
                                num_blocks=host_blocks, pin_memory=self.device.type == "cuda")
            offloader = _ReuseIgnored if planted == "ignore-reuse-watcher" else Offloader
            self.offloader = offloader(self.cache, host, on_reuse=on_reuse,
                                       ref_cnts=lambda ids: pool.observe().ref_cnts(ids))
        self.token_budget = token_budget
        self.planted = planted
        self.waiting: list[ToyRequest] = []
        self.running: list[ToyRequest] = []
        self.done: list[ToyRequest] = []
        self.written_tokens = 0
        self.hit_tokens = 0
        self.reloaded_tokens = 0
        self.null_positions = 0  # null-block table entries seen by attention groups
        self.copied_pairs = 0
        self.copy_launch_steps = 0  # steps that launched a copy batch (one launch each)
        self.preemptions = 0
        self.steps = 0

    # -- requests -------------------------------------------------------------------------

    def add(self, request: SchedulerRequest, script: Sequence[int]) -> ToyRequest:
        toy = ToyRequest(request, list(script))
        self.waiting.append(toy)
        return toy

    def preempt(self, toy: ToyRequest, offload: bool = False) -> None:
        """Take a running request off the device: recompute later, or offload its blocks."""
        req = toy.request
        if offload and self.offloader is not None and \
                self.offloader.can_hold(self.manager.get_block_ids(req.request_id)):
            toy.transfer = self.offloader.offload(self.manager, req)
            toy.offloaded_tokens = req.num_computed_tokens
        else:
            self.manager.free(req)
        self.tables.remove(req.request_id)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.running.remove(toy)
        self.waiting.insert(0, toy)
        self.preemptions += 1

    # -- scheduling -----------------------------------------------------------------------

    def _schedule(self) -> list[tuple[ToyRequest, int, int]]:
        """(request, first new position, count) for this step."""
        budget = self.token_budget
        scheduled: list[tuple[ToyRequest, int, int]] = []
        for toy in list(self.running):
            if toy not in self.running or budget == 0:
                continue
            req = toy.request
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while self.manager.allocate_slots(req, n) is None:
                victim = self.running[-1]
                self.preempt(victim, offload=self.offloader is not None)
                scheduled = [s for s in scheduled if s[0] is not victim]
                if victim is toy:
                    break
            else:
                scheduled.append((toy, req.num_computed_tokens, n))
                budget -= n
        while self.waiting and budget > 0:
            toy = self.waiting[0]
            if self.planted == "copy-before-source-final":
                self.manager.new_step_starts()
            admitted = self._admit(toy, budget)
            if admitted is None:
                break
            self.waiting.pop(0)
            self.running.append(toy)
            scheduled.append(admitted)
            budget -= admitted[2]
        return scheduled

    def _admit(self, toy: ToyRequest, budget: int) -> tuple[ToyRequest, int, int] | None:
        req = toy.request
        hits, num_hit = self.manager.get_computed_blocks(req)
        if self.planted == "wrong-cached-block" and len(hits.blocks[0]) >= 2:
            blocks = [list(b) for b in hits.blocks]
            blocks[0][-1] = blocks[0][0]  # a cached block, but not this prefix's
            hits = type(hits)(tuple(blocks))
        external = self._reloadable_tokens(toy, num_hit)
        n = min(req.num_tokens - num_hit - external, budget)
        boundary = self._partial_boundary(req)
        if num_hit + external < boundary < num_hit + external + n:
            n = boundary - num_hit - external
        new = self.manager.allocate_slots(req, n, num_hit, hits,
                                          num_external_computed_tokens=external)
        if new is None:
            return None
        self.hit_tokens += num_hit
        toy.hits = tuple([int(b) for b in ids] for ids in hits.blocks)
        self.reloaded_tokens += external
        if external:
            self._reload(toy, num_hit, external)
        elif toy.transfer is not None:
            self._host().release(toy.transfer)
            toy.transfer = None
        req.num_computed_tokens = num_hit + external
        req.status = RequestStatus.RUNNING
        if self.planted == "rewrite-hits" and num_hit:  # recompute the hit tokens too
            req.num_computed_tokens = 0
            return toy, 0, num_hit + n
        return toy, req.num_computed_tokens, n

    def _partial_boundary(self, req: SchedulerRequest) -> int:
        """With partial hits on, a first prefill chunk stops at the prompt's last hash
        boundary, so the state there can be cached (vLLM's align-mode scheduling)."""
        if not getattr(self.manager, "partial_hash_hits_enabled", False):
            return 0
        hbs = self.manager.block_pool.hash_block_size
        return (req.num_prompt_tokens - 1) // hbs * hbs

    def _reload_spans(self, transfer: SwapOut, num_hit: int, end: int) -> list[range] | None:
        """Per group the positions to swap in so tokens ``[num_hit, end)`` count as
        computed: from the first block the request still needs (a window's start) or the
        first block past the hit, to the block holding token ``end - 1``. ``None`` when a
        needed position has no good host copy."""
        spans = []
        for g, bs in enumerate(self.block_sizes):
            group = self.model.groups[g]
            window = group[1] if group is not None else None
            needed = 0 if window is None else max(0, end - window + 1)
            span = range(max(needed // bs, num_hit // bs), cdiv(end, bs))
            if group is not None and not transfer.covers(g, span.start, span.stop):
                return None
            spans.append(span if group is not None else range(0))
        return spans

    def _reloadable_tokens(self, toy: ToyRequest, num_hit: int) -> int:
        """Tokens past the prefix hit that the request's offloaded copy can supply (the
        longest run the host copies cover; a reused-and-invalidated block cuts it)."""
        if toy.transfer is None:
            return 0
        end = min(toy.offloaded_tokens, toy.request.num_tokens - 1)  # last token: computed
        while end > num_hit and self._reload_spans(toy.transfer, num_hit, end) is None:
            end -= 1
        return max(0, end - num_hit)

    def _host(self) -> Offloader:
        if self.offloader is None:
            raise RuntimeError("this engine has no host blocks (host_blocks=0)")
        return self.offloader

    def _reload(self, toy: ToyRequest, num_hit: int, external: int) -> None:
        # external > 0 only when _reloadable_tokens found the transfer's copy covering it
        transfer = toy.transfer
        if transfer is None:
            raise RuntimeError(f"{toy.request.request_id}: nothing offloaded to reload")
        tables = self.manager.get_block_ids(toy.request.request_id)
        spans = self._reload_spans(transfer, num_hit, num_hit + external)
        if spans is None:
            raise RuntimeError(f"{toy.request.request_id}: the host copy does not cover "
                               f"tokens {num_hit}..{num_hit + external}")
        self._host().swap_in(transfer, tables, spans)
        self._host().release(transfer)
        toy.transfer = None

    # -- the forward pass -----------------------------------------------------------------

    def step(self) -> int:
        """One scheduler step and forward pass; the number of tokens computed."""
        self.manager.new_step_starts()
        scheduled = self._schedule()
        if not scheduled:
            self._flush()
            return 0
        self.steps += 1
        for toy, _, _ in scheduled:
            rid = toy.request.request_id
            ids = self.manager.get_block_ids(rid)
            self.tables.update(rid, ids)
            self.null_positions += sum(
                t.count(0) for g, t in enumerate(ids) if self.model.groups[g] is not None)
        self.tables.upload()
        pairs, retained = self._take_copies()
        if pairs or retained:  # one launch, before any write of the step
            self.copier.copy(pairs, retained)
            self.copied_pairs += len(pairs)
            self.copy_launch_steps += 1
        rows, positions, tokens = self._step_tokens(scheduled)
        slots = {g: self.tables.slot_mapping(g, rows, positions)
                 for g, grp in enumerate(self.model.groups) if grp is not None}
        self._check_hits_not_written(scheduled, slots)
        self._write(slots, tokens, positions)
        self._attend(scheduled, rows, positions, tokens)
        self.copier.end_step()
        self._flush()
        for toy, _, n in scheduled:
            self._advance(toy, n)
        return len(positions)

    def _flush(self) -> None:
        """Copy-outs started by this step's preemptions overlap its forward pass (as on a
        side stream) and complete at its end: a block reused meanwhile is protected only by
        the reuse watcher."""
        if self.offloader is not None:
            self.offloader.flush()

    def _take_copies(self) -> tuple[list[tuple[int, int, int]], list[int]]:
        take = getattr(self.manager, "take_kv_cache_block_copies", None)
        if take is None:
            return [], []
        pairs, retained = take()
        return [(int(s), int(d), int(g)) for s, d, g in pairs], [int(b) for b in retained]

    def _step_tokens(self, scheduled):
        rows, positions, tokens = [], [], []
        for toy, start, n in scheduled:
            row = self.tables.row(toy.request.request_id)
            ids = toy.request.all_token_ids
            rows.extend([row] * n)
            positions.extend(range(start, start + n))
            tokens.extend(ids[start:start + n])
        return (np.array(rows, dtype=np.int32), np.array(positions, dtype=np.int64),
                torch.tensor(tokens, dtype=torch.long))

    def _check_hits_not_written(self, scheduled, slots) -> None:
        """A request never writes K/V into a prefix hit it still holds: those tokens were
        computed by whoever cached them (the point of a hit). A hit a window has dropped
        since is no longer protected (the block may come back as a fresh one)."""
        first = 0
        for toy, _, n in scheduled:
            row = self.tables.row(toy.request.request_id)
            for g, hit in enumerate(toy.hits):
                if g not in slots or not hit:
                    continue
                held = self.tables.groups[g].cpu[row, :len(hit)]
                kept = [b for b, h in zip(held.tolist(), hit, strict=True) if b == h and b]
                blocks = slots[g][first:first + n] // self.block_sizes[g]
                if kept and np.isin(blocks, kept).any():
                    raise AssertionError(f"{toy.request.request_id} writes into a hit")
            first += n

    def _write(self, slots, tokens, positions) -> None:
        """K/V of the step's tokens into their slots (hits were computed before: skipped)."""
        pos = torch.from_numpy(positions)
        for g, s in slots.items():
            index = torch.from_numpy(s).to(self.device)
            for i, layer in enumerate(self.cache.layers(g)):
                _, k, v = self.model.qkv(g, i, tokens, pos)
                write_kv(layer, index, k.to(self.device), v.to(self.device))
        self.written_tokens += len(positions)

    def _attend(self, scheduled, rows, positions, tokens) -> None:
        pos = torch.from_numpy(positions)
        out: list[list[torch.Tensor]] = [[] for _ in range(len(positions))]
        for g, group in enumerate(self.model.groups):
            if group is None:
                continue
            table = self.tables.groups[g]
            bs = self.block_sizes[g]
            for i, layer in enumerate(self.cache.layers(g)):
                q, _, _ = self.model.qkv(g, i, tokens, pos)
                flat = layer.view(2, -1, *layer.shape[3:])
                for t, (row, p) in enumerate(zip(rows.tolist(), positions.tolist(),
                                                 strict=True)):
                    span = np.arange(self.model.visible(g, p).start, p + 1)
                    blocks = table.cpu[row, span // bs].astype(np.int64)
                    if (blocks == 0).any():
                        raise AssertionError(f"position {p} reads the null block")
                    index = torch.from_numpy(blocks * bs + span % bs).to(self.device)
                    k = flat[0].index_select(0, index).float().cpu()
                    v = flat[1].index_select(0, index).float().cpu()
                    out[t].append(self.model.attend(q[t], k, v))
        t = 0
        for toy, start, n in scheduled:
            for j in range(n):
                toy.outputs.append((start + j, torch.cat(out[t])))
                t += 1

    def _advance(self, toy: ToyRequest, n: int) -> None:
        req = toy.request
        req.num_computed_tokens += n
        if req.num_computed_tokens < req.num_tokens:
            return
        if toy.script:
            req.append_output_token_ids(toy.script.pop(0))  # "sampled": scripted
            return
        self.manager.free(req)
        self.tables.remove(req.request_id)
        req.status = RequestStatus.FINISHED
        toy.finished = True
        self.running.remove(toy)
        self.done.append(toy)

    # -- driving and checking -------------------------------------------------------------

    def run(self, max_steps: int = 1000) -> None:
        """Step until every request finished."""
        for _ in range(max_steps):
            if not self.waiting and not self.running:
                return
            self.step()
        raise AssertionError(f"requests still unfinished after {max_steps} steps")

    def max_error(self, toys: Sequence[ToyRequest] | None = None) -> float:
        """Largest difference between any recorded output and the dense model's."""
        worst = 0.0
        for toy in self.done if toys is None else toys:
            dense = self.model.dense(toy.request.all_token_ids, self.dtype)
            for p, value in toy.outputs:
                worst = max(worst, float((value - dense[p]).abs().max()))
        return worst


TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}
"""Largest output difference allowed per cache dtype (K/V are rounded to it in both the
engine and the dense reference, so this only absorbs summation order)."""


__all__ = ["TOLERANCE", "ToyDecoder", "ToyEngine", "ToyRequest"]
