"""Does ``kvpool contracts`` find a weakened refusal or a broken batch order? (a self-check)

:mod:`kvpool.verify.mutate` makes every small change it can and asks the *unit tests* to
notice. This module asks the same of *CrossHair*, for the bugs the contracts are there to
catch: for each refusal row of BEHAVIOUR.md §12 that a batch verb raises, and for each
postcondition about the order of a batch (the free queue, events, watchers), it plants one
hand-written weakening, a *plant*, in a copy of the spec and searches, at the CI budget
(``.ci/run``: 10 CPU seconds per operation contract, 4 per precondition contract), the verb's
large contract and, if that misses it, the focused contract aimed at it
(:mod:`kvpool.spec.focused_contracts`): found by either is found by ``kvpool contracts``.
A plant is a text replacement in one module of ``spec/`` that must match exactly once, so a
plant that no longer applies fails loudly instead of testing nothing.

Run::

    python -m kvpool.verify.selfcheck                  # every plant, a table (~6 minutes)
    python -m kvpool.verify.selfcheck --only free_blocks.front_order_reversed --json

Exit 0 when every plant is found. ``docs/contracts.md`` has the table of a full run and the
reasons for the §12 rows with no plant here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvpool.verify.crosshair_check import check_one
from kvpool.verify.mutate import SPEC

PACKAGE = SPEC.parent

CI_OPERATION_BUDGET_S = 10.0
"""CPU seconds per operation contract in CI (``--per-condition 10``)."""

CI_PRECONDITION_BUDGET_S = 8.0
"""CPU seconds per precondition contract in CI (``--per-precondition 8``; 4 until session
18, when a slower machine built 89-109 paths in 4 s and the repeated-id plant needs 117)."""


@dataclass(frozen=True)
class Plant:
    """One weakening of the spec, and the contract that must find it."""

    name: str
    kind: str
    """``refusal`` (a §12 row no longer refused) or ``order`` (a batch-order postcondition)."""
    row: str
    """What the spec promises: the §12 row, or the ordering clause."""
    module: str
    old: str
    new: str
    contract: str
    """The large contract of the verb (``kvpool.spec.contracts`` / ``precondition_contracts``)."""
    focused: str = ""
    """The focused contract aimed at this row (``kvpool.spec.focused_contracts``), if any."""

    @property
    def contracts(self) -> tuple[str, ...]:
        """Every contract of ``kvpool contracts`` searched for this plant, in this order."""
        return (self.contract,) + ((self.focused,) if self.focused else ())

    @property
    def budget_s(self) -> float:
        return ci_budget(self.contract)


def ci_budget(contract: str) -> float:
    """A contract's CPU budget in CI: precondition contracts (``<op>_rejection…``) get less."""
    is_precondition = "_rejection" in contract
    return CI_PRECONDITION_BUDGET_S if is_precondition else CI_OPERATION_BUDGET_S


FOCUSED = {
    "free_blocks": "free_blocks_releasing",
    "unpin_blocks": "unpin_blocks_releasing",
    "evict_blocks": "evict_blocks_keyed",
    "get_new_blocks": "get_new_blocks_evicting",
    "get_cached_block": "get_cached_block_hits",
    "cache_full_blocks": "cache_full_blocks_call",
    "cache_full_blocks_rejection": "cache_full_blocks_rejection_probe",
    "move_block_hashes_rejection": "move_block_hashes_rejection_drawn",
}
"""The focused contract (``kvpool.spec.focused_contracts``) searched after a large one."""


def _refusal(name: str, row: str, old: str, new: str, contract: str) -> Plant:
    return Plant(name, "refusal", row, "preconditions.py", old, new, contract,
                 FOCUSED.get(contract, ""))


def _order(name: str, row: str, old: str, new: str, contract: str, module: str = "ops.py") -> Plant:
    return Plant(name, "order", row, module, old, new, contract, FOCUSED.get(contract, ""))


_FREE_RANGE = "return bad_block_id(state, block_ids) or over_release(state, block_ids)"
_TOUCH_RANGE = "return bad_block_id(state, block_ids) or over_reference(state, block_ids)"
_RELEASE_PAST_ZERO = "if releases[b] > state.ref_cnt[b]:"
_RELEASE_COUNT = "releases[b] += 1"

PLANTS: tuple[Plant, ...] = (
    # --- free_blocks --------------------------------------------------------------------------
    _refusal("free_blocks.range_checks_the_first_id_only", "free_blocks: InvalidBlockId",
             _FREE_RANGE, _FREE_RANGE.replace("(state, block_ids) or", "(state, block_ids[:1]) or"),
             "free_blocks_rejection"),
    _refusal("free_blocks.frees_a_free_block", "free_blocks: DoubleFree (block with ref 0)",
             _RELEASE_PAST_ZERO, "if releases[b] > state.ref_cnt[b] and state.ref_cnt[b] > 0:",
             "free_blocks_rejection"),
    _refusal("free_blocks.counts_a_repeated_id_once", "free_blocks: DoubleFree (repeated id)",
             _RELEASE_COUNT, "releases[b] = 1", "free_blocks_rejection"),
    _order("free_blocks.front_order_reversed", "free_blocks_post: keyless blocks to the front "
           "in batch order", "prepend_n(state.free_queue, tuple(to_front))",
           "prepend_n(state.free_queue, tuple(reversed(to_front)))", "free_blocks"),
    _order("free_blocks.tail_order_reversed", "free_blocks_post: keyed blocks to the tail "
           "in batch order", "append_n(queue, tuple(to_tail))",
           "append_n(queue, tuple(reversed(to_tail)))", "free_blocks"),
    # --- touch --------------------------------------------------------------------------------
    _refusal("touch.range_checks_the_first_id_only", "touch: InvalidBlockId", _TOUCH_RANGE,
             _TOUCH_RANGE.replace("(state, block_ids) or", "(state, block_ids[:1]) or"),
             "touch_rejection"),
    _refusal("touch.shortcut_ignores_the_batch", "touch: RefCountOverflow (one block)",
             "limit = MAX_REF_CNT - len(block_ids)", "limit = MAX_REF_CNT", "touch_rejection"),
    _refusal("touch.counts_a_repeated_id_once", "touch: RefCountOverflow (repeated id)",
             "Counter(b for b in block_ids if b != NULL_BLOCK_ID)",
             "Counter(set(block_ids) - {NULL_BLOCK_ID})", "touch_rejection"),
    # --- unpin_blocks -------------------------------------------------------------------------
    _refusal("unpin_blocks.range_checks_the_first_id_only", "unpin_blocks: InvalidBlockId",
             "error = bad_block_id(state, block_ids)\n    if error:\n        return error\n"
             "    if NULL_BLOCK_ID in block_ids:",
             "error = bad_block_id(state, block_ids[:1])\n    if error:\n        return error\n"
             "    if NULL_BLOCK_ID in block_ids:", "unpin_blocks_rejection"),
    _refusal("unpin_blocks.refuses_a_leading_null_block_only", "unpin_blocks: NullBlockMisuse",
             "if NULL_BLOCK_ID in block_ids:", "if tuple(block_ids[:1]) == (NULL_BLOCK_ID,):",
             "unpin_blocks_rejection"),
    _refusal("unpin_blocks.unpins_a_free_block", "unpin_blocks: DoubleFree (block with ref 0)",
             _RELEASE_PAST_ZERO, "if releases[b] > state.ref_cnt[b] and state.ref_cnt[b] > 0:",
             "unpin_blocks_rejection"),
    _refusal("unpin_blocks.counts_a_repeated_id_once", "unpin_blocks: DoubleFree (repeated id)",
             _RELEASE_COUNT, "releases[b] = 1", "unpin_blocks_rejection"),
    _order("unpin_blocks.tail_order_reversed", "unpin_blocks_post: released blocks to the "
           "tail in batch order", "append_n(state.free_queue, tuple(released))",
           "append_n(state.free_queue, tuple(reversed(released)))", "unpin_blocks"),
    _order("unpin_blocks.new_watchers_first", "unpin_blocks_post: new watchers join the "
           "table's end in batch order", "watchers = watchers + (b,)",
           "watchers = (b,) + watchers", "unpin_blocks"),
    # --- evict_blocks -------------------------------------------------------------------------
    _refusal("evict_blocks.lets_negative_ids_through", "evict_blocks: InvalidBlockId (id < 0)",
             "return bad_block_id(state, block_ids)\n\n\ndef emit",
             "return bad_block_id(state, tuple(b for b in block_ids if b >= 0))\n\n\ndef emit",
             "evict_blocks_rejection"),
    _refusal("evict_blocks.lets_ids_past_the_end_through", "evict_blocks: InvalidBlockId "
             "(id >= N)", "return bad_block_id(state, block_ids)\n\n\ndef emit",
             "return bad_block_id(state, tuple(b for b in block_ids if b < state.num_blocks))"
             "\n\n\ndef emit", "evict_blocks_rejection"),
    _order("evict_blocks.events_in_reverse_batch_order", "evict_blocks_post: one event per "
           "key, in batch order", "for b in block_ids:\n        state, removed = hash_map",
           "for b in reversed(block_ids):\n        state, removed = hash_map", "evict_blocks"),
    _order("evict_blocks.secondaries_removed_before_the_primary", "remove_all_keys: primary "
           "first, then secondaries in insertion order (§12)",
           "for key in keys_of_block(state, block_id):",
           "for key in reversed(keys_of_block(state, block_id)):", "evict_blocks",
           module="hash_map.py"),
    # --- get_new_blocks and reset (watcher firing order) ---------------------------------------
    _order("get_new_blocks.watchers_fire_in_table_order", "get_new_blocks_post: watchers fire "
           "in pop order", "fired = tuple(b for b in popped if b in state.watchers)",
           "fired = tuple(b for b in state.watchers if b in popped)", "get_new_blocks"),
    _order("get_new_blocks.evictions_in_reverse_pop_order", "get_new_blocks_post: one event "
           "per evicted key, in pop order", "for b in popped:\n        if state.enable_caching",
           "for b in reversed(popped):\n        if state.enable_caching", "get_new_blocks"),
    _order("reset_prefix_cache.watchers_fire_reversed", "reset_prefix_cache_post: watchers "
           "fire in table order", "fired = state.watchers", "fired = state.watchers[::-1]",
           "reset_prefix_cache"),
    # --- cache_full_blocks ----------------------------------------------------------------------
    _refusal("cache_full_blocks.ignores_caching_disabled", "cache_full_blocks: CachingDisabled",
             'return CachingDisabled("cache_full_blocks on a pool with caching disabled")',
             "pass", "cache_full_blocks_rejection"),
    _refusal("cache_full_blocks.skips_the_group_check", "cache_full_blocks: InvalidGroupId",
             "error = bad_group_id(group_id)\n    if error:\n        return error\n"
             "    if not is_count(num_cached)",
             "if not is_count(num_cached)", "cache_full_blocks_rejection"),
    _refusal("cache_full_blocks.accepts_a_negative_num_cached", "cache_full_blocks: "
             "InvalidArgument (negative counts)",
             "if not is_count(num_cached) or not is_count(num_full):",
             "if not is_count(num_full):", "cache_full_blocks_rejection"),
    _refusal("cache_full_blocks.skips_the_block_size_check", "cache_full_blocks: "
             "InvalidArgument (block size not a positive multiple of hbs)",
             "error = bad_block_size(state, block_size)\n    if error:\n        return error\n"
             "    assert isinstance(block_size, int)\n    if num_full",
             "if num_full", "cache_full_blocks_rejection"),
    _refusal("cache_full_blocks.one_block_short_passes", "cache_full_blocks: InvalidArgument "
             "(num_full > len(blocks))", "if num_full > len(block_ids):",
             "if num_full > len(block_ids) + 1:", "cache_full_blocks_rejection"),
    _refusal("cache_full_blocks.accepts_a_longer_mask", "cache_full_blocks: InvalidArgument "
             "(mask length)", "len(mask) != num_full - num_cached:",
             "len(mask) < num_full - num_cached:", "cache_full_blocks_rejection"),
    _refusal("cache_full_blocks.one_hash_short_passes", "cache_full_blocks: InvalidArgument "
             "(hash list too short)", "if available < num_full:",
             "if available < num_full - 1:", "cache_full_blocks_rejection"),
    _refusal("cache_full_blocks.range_checks_the_first_candidate_only", "cache_full_blocks: "
             "InvalidBlockId", "error = bad_block_id(state, candidates)",
             "error = bad_block_id(state, candidates[:1])", "cache_full_blocks_rejection"),
    _refusal("cache_full_blocks.accepts_a_repeated_block", "cache_full_blocks: InvalidArgument "
             "(one block at two positions)", "        seen.add(b)\n", "",
             "cache_full_blocks_rejection"),
    _refusal("cache_full_blocks.caches_a_free_block", "cache_full_blocks: HashStateError "
             "(free block)",
             'if state.ref_cnt[b] == 0:\n            return HashStateError(f"cannot cache',
             'if state.ref_cnt[b] < 0:\n            return HashStateError(f"cannot cache',
             "cache_full_blocks_rejection"),
    _refusal("cache_full_blocks.recaches_the_same_key", "cache_full_blocks: HashStateError "
             "(block already keyed that far)", "tokens >= (k + 1) * block_size:",
             "tokens > (k + 1) * block_size:", "cache_full_blocks_rejection"),
    _order("cache_full_blocks.stored_positions_reversed", "cache_full_blocks_post: BlockStored "
           "lists the cached positions in order", "positions.append(k)",
           "positions.insert(0, k)", "cache_full_blocks"),
    # --- move_block_hashes ----------------------------------------------------------------------
    _refusal("move_block_hashes.ignores_caching_disabled", "move_block_hashes: CachingDisabled",
             'return CachingDisabled("move_block_hashes on a pool with caching disabled")',
             "pass", "move_block_hashes_rejection"),
    _refusal("move_block_hashes.range_checks_src_only", "move_block_hashes: InvalidBlockId",
             "error = bad_block_id(state, (src, dst))", "error = bad_block_id(state, (src,))",
             "move_block_hashes_rejection"),
    _refusal("move_block_hashes.accepts_a_null_dst", "move_block_hashes: NullBlockMisuse",
             "if NULL_BLOCK_ID in (src, dst):", "if src == NULL_BLOCK_ID:",
             "move_block_hashes_rejection"),
    _refusal("move_block_hashes.accepts_src_is_dst", "move_block_hashes: InvalidArgument "
             "(src is dst)", "if src == dst:", "if src == dst and src < 0:",
             "move_block_hashes_rejection"),
    _refusal("move_block_hashes.overwrites_a_keyed_dst", "move_block_hashes: HashStateError "
             "(dst already keyed)", "if keys_of_block(state, dst):",
             "if keys_of_block(state, dst) and keys_of_block(state, src):",
             "move_block_hashes_rejection"),
    _refusal("move_block_hashes.moves_to_a_free_dst", "move_block_hashes: HashStateError "
             "(free src or dst)", "for b in (src, dst):\n        if state.ref_cnt[b] == 0:",
             "for b in (src,):\n        if state.ref_cnt[b] == 0:",
             "move_block_hashes_rejection"),
    # --- get_cached_block -----------------------------------------------------------------------
    _refusal("get_cached_block.accepts_no_groups", "get_cached_block: InvalidArgument "
             "(no group ids)", "if len(group_ids) == 0:", "if len(group_ids) < 0:",
             "get_cached_block_rejection"),
    _refusal("get_cached_block.checks_the_first_group_only", "get_cached_block: "
             "InvalidGroupId", "for g in group_ids:\n        error = bad_group_id(g)",
             "for g in group_ids[:1]:\n        error = bad_group_id(g)",
             "get_cached_block_rejection"),
    _order("get_cached_block.hits_in_reverse_group_order", "get_cached_block_post: one hit "
           "per group, in the order of the groups", "hits.append(b)", "hits.insert(0, b)",
           "get_cached_block"),
)
"""Every plant, grouped by verb: each §12 refusal row of a batch verb, then its order clauses."""

UNPLANTED_ROWS: dict[str, str] = {
    "touch: NotQueued": "cannot arise for a local id: a non-null block with ref 0 is always "
    "queued (invariant 5), so the spec has no such check to weaken",
    "touch / free_blocks / unpin_blocks / cache_*: ForeignBlock": "raised by the shell "
    "(kvpool.shell) before the spec is asked: the spec's ids are this pool's ids",
}
"""§12 rows of the batch verbs with no plant, and why (the table in docs/contracts.md)."""


@dataclass(frozen=True)
class Search:
    """One contract searched on a planted spec."""

    contract: str
    budget_s: float
    status: str
    """``found`` (a counterexample), ``missed`` (searched to its budget, none), or the
    contract's status when the search gave no verdict (``not-finished``, ``error``)."""
    states_built: int | None
    seconds: float
    broken: str = ""


@dataclass(frozen=True)
class PlantResult:
    plant: Plant
    searches: tuple[Search, ...]
    """The plant's contracts in order, up to the first that found it."""

    @property
    def status(self) -> str:
        """``found`` if some contract found the plant, else the last search's status."""
        return "found" if self.found_by else self.searches[-1].status

    @property
    def found_by(self) -> str:
        return next((s.contract for s in self.searches if s.status == "found"), "")

    @property
    def states_built(self) -> int | None:
        return self.searches[-1].states_built

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.searches)

    @property
    def broken(self) -> str:
        return self.searches[-1].broken


def planted_source(plant: Plant) -> str:
    """The spec module with the plant applied (it must match exactly once)."""
    text = (SPEC / plant.module).read_text()
    count = text.count(plant.old)
    if count != 1:
        raise ValueError(f"plant {plant.name}: its text occurs {count} times in "
                         f"spec/{plant.module}, not once (did the spec change?)")
    return text.replace(plant.old, plant.new)


def planted_package(plant: Plant, into: Path) -> Path:
    """A copy of the kvpool package under ``into`` with the plant applied; the path to add
    to ``PYTHONPATH`` (it comes before the installed package)."""
    root = into / "planted"
    shutil.copytree(PACKAGE, root / "kvpool",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "kvpool" / "spec" / plant.module).write_text(planted_source(plant))
    return root


def check_plant(plant: Plant, budget_s: float | None = None,
                contracts: tuple[str, ...] | None = None) -> PlantResult:
    """Search the plant's contracts (``contracts``: by default the large one, then the focused
    one) on a planted copy of the spec, each at its CI budget unless ``budget_s``; stop at the
    first that finds it."""
    searches: list[Search] = []
    with tempfile.TemporaryDirectory(prefix="kvpool-plant-") as tmp:
        root = planted_package(plant, Path(tmp))
        for contract in contracts or plant.contracts:
            budget = budget_s or ci_budget(contract)
            result = check_one(contract, budget, pythonpath=[root])
            status = {"counterexample": "found", "checked": "missed"}.get(result.status,
                                                                           result.status)
            broken = (result.explanations[0] or "") if result.explanations else ""
            searches.append(Search(contract, budget, status, result.states_built,
                                   result.seconds, broken))
            if status == "found":
                break
    return PlantResult(plant, tuple(searches))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpool.verify.selfcheck",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME", default=None,
                        help="run this plant only (repeatable)")
    parser.add_argument("--budget", type=float, default=None, metavar="S",
                        help="CPU seconds per plant (default: the CI budget of its contract)")
    parser.add_argument("--contract", action="append", metavar="NAME", default=None,
                        help="search this contract instead of the plant's own (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the plants and exit")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    plants = [p for p in PLANTS if not args.only or p.name in args.only]
    if args.only and len(plants) != len(set(args.only)):
        print(f"unknown plant(s); known: {', '.join(p.name for p in PLANTS)}", file=sys.stderr)
        return 2
    if args.list:
        for p in plants:
            print(f"{p.name:60} {p.kind:8} {' then '.join(p.contracts)}")
        return 0
    contracts = tuple(args.contract) if args.contract else None
    results = []
    for plant in plants:
        result = check_plant(plant, args.budget, contracts)
        results.append(result)
        tried = ", ".join(f"{s.contract}: {s.status} in {s.states_built} paths, "
                          f"{s.seconds:.1f} s" for s in result.searches)
        print(f"[{len(results)}/{len(plants)}] {result.status:8} {plant.name}  ({tried})",
              file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([{"plant": r.plant.name, "kind": r.plant.kind, "row": r.plant.row,
                           "status": r.status, "found_by": r.found_by,
                           "searches": [{"contract": s.contract, "budget_s": s.budget_s,
                                         "status": s.status, "paths": s.states_built,
                                         "seconds": round(s.seconds, 1), "broken": s.broken}
                                        for s in r.searches]}
                          for r in results], indent=2))
    else:
        for r in results:
            cells = "; ".join(f"`{s.contract}` ({s.budget_s:g} s): "
                              f"{'**found**' if s.status == 'found' else s.status}, "
                              f"{s.states_built} paths" for s in r.searches)
            print(f"| {r.plant.kind} | {r.plant.row} | `{r.plant.name}` | {cells} | "
                  f"{'**found**' if r.status == 'found' else 'not found'} |")
    return 0 if all(r.status == "found" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
