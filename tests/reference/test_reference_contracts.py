"""Keeping the reference honest: runtime contract checking and ``check_invariants``.

Contract checking must pass real workloads and must catch a corrupted or buggy pool, naming
the operation and the first differing field; ``check_invariants`` must name the invariant a
crafted corruption breaks (the spec's predicates, or a structural one of the object graph).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from reference_twin import block_hash, request_with_hashes

from kvpool import make_pool
from kvpool.errors import DoubleFree, InvalidArgument, KvPoolError
from kvpool.reference import ReferenceBlockPool
from kvpool.reference import pool as reference_pool_module
from kvpool.spec import preconditions as spec_preconditions
from kvpool.spec.invariants import INVARIANTS


def contract_pool(num_blocks: int = 6, **options) -> ReferenceBlockPool:
    return make_pool(num_blocks, backend="reference", check_contracts=True, **options)


def names(violations: list[tuple[str, tuple]]) -> list[str]:
    return [name for name, _ in violations]


# -- contract checking -----------------------------------------------------------------------


def test_contract_checking_is_off_by_default_and_then_wraps_nothing():
    pool = make_pool(4, backend="reference")
    assert pool.contract_checker is None
    assert not any(name.startswith("_core_") for name in vars(pool))


def test_contract_checking_wraps_every_core_method_of_that_pool_only():
    checked, plain = contract_pool(), make_pool(6, backend="reference")
    assert "_core_free" in vars(checked) and "_core_free" not in vars(plain)
    assert checked.contract_checker is not None


# Every pool verb, as a call with random (often invalid) arguments: (pool, rng, request, ids).
VERBS = [
    lambda pool, rng, r, ids: pool.get_new_blocks(rng.randrange(-1, 4)),
    lambda pool, rng, r, ids: pool.touch(ids),
    lambda pool, rng, r, ids: pool.free_blocks(ids),
    lambda pool, rng, r, ids: pool.unpin_blocks(ids, lambda b: None),
    lambda pool, rng, r, ids: pool.get_cached_block(
        rng.choice(r.block_hashes), [0, 1][: rng.randrange(3)]
    ),
    lambda pool, rng, r, ids: pool.cache_full_blocks(
        r,
        [abs(b) % pool.num_gpu_blocks for b in ids],
        rng.randrange(2),
        len(ids),
        rng.choice([16, 32]),
        rng.randrange(2),
    ),
    lambda pool, rng, r, ids: pool.cache_partial_block(
        r, rng.randrange(pool.num_gpu_blocks), 16 * rng.randrange(1, 4), 0, 32, rng.random() < 0.3
    ),
    lambda pool, rng, r, ids: pool.move_block_hashes(
        rng.randrange(pool.num_gpu_blocks), rng.randrange(pool.num_gpu_blocks)
    ),
    lambda pool, rng, r, ids: pool.evict_blocks(ids),
    lambda pool, rng, r, ids: pool.is_block_writable(rng.randrange(pool.num_gpu_blocks)),
    lambda pool, rng, r, ids: pool.reset_prefix_cache() if rng.random() < 0.1 else None,
    lambda pool, rng, r, ids: pool.emit_cached_block_events(r, rng.randrange(4), 16, 0),
    lambda pool, rng, r, ids: pool.take_events(),
    lambda pool, rng, r, ids: pool.get_usage(),
]


def _random_workload(pool: ReferenceBlockPool, rng: random.Random, steps: int) -> int:
    """Random calls of every pool verb, valid and invalid; returns how many were rejected."""
    requests = [request_with_hashes(6, prefix=p) for p in "abc"]
    rejected = 0
    for _ in range(steps):
        ids = [rng.randrange(-1, pool.num_gpu_blocks + 1) for _ in range(rng.randrange(4))]
        try:
            rng.choice(VERBS)(pool, rng, rng.choice(requests), ids)
        except KvPoolError:
            rejected += 1
        assert pool.check_invariants() == []
    return rejected


@pytest.mark.parametrize("seed", range(4))
def test_a_random_workload_of_every_verb_passes_contract_checking(seed):
    pool = contract_pool(7, enable_kv_cache_events=seed % 2 == 0, enable_caching=seed != 3)
    rejected = _random_workload(pool, random.Random(seed), 300)
    assert 0 < rejected < 300  # both paths were exercised


def test_contract_checking_catches_a_corrupted_ref_cnt_naming_the_operation_and_field():
    pool = contract_pool()
    pool.get_new_blocks(2)
    pool.blocks[2].ref_cnt = 5
    with pytest.raises(AssertionError, match=r"touch\(\(1,\)\).*field ref_cnt\[2\]: reference 5"):
        pool.touch([1])


def test_contract_checking_catches_freed_cached_blocks_sent_to_the_wrong_end():
    pool = contract_pool()
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request_with_hashes(2), blocks, 0, 2, 16, 0)
    pool.free_block_queue.append_n = pool.free_block_queue.prepend_n  # a wrong-order bug
    with pytest.raises(AssertionError, match=r"free\(\(2, 1\)\).*field free_queue\[0\]"):
        pool.free_blocks(blocks[::-1])


def reference_rejects_frees_with(monkeypatch, error: Exception) -> None:
    """Make the reference (not the shadow spec) reject every free with ``error``."""
    checks = SimpleNamespace(**vars(spec_preconditions))
    checks.free_blocks_rejection = lambda view, ids: error
    monkeypatch.setattr(reference_pool_module, "pre", checks)


def test_contract_checking_catches_a_wrong_error_type(monkeypatch):
    pool = contract_pool()
    reference_rejects_frees_with(monkeypatch, InvalidArgument("wrong"))
    with pytest.raises(AssertionError, match="reference raised InvalidArgument.*DoubleFree"):
        pool.free_blocks([1])


def test_contract_checking_catches_a_wrong_result(monkeypatch):
    pool = contract_pool()
    blocks = pool.get_new_blocks(2)
    request = request_with_hashes(1)
    pool.cache_full_blocks(request, [blocks[1]], 0, 1, 16, 0)
    pool.cache_full_blocks(request, [blocks[0]], 0, 1, 16, 0)
    table = pool.cached_block_hash_to_block
    monkeypatch.setattr(  # answer with the newest duplicate instead of the earliest
        table, "get_one_block", lambda key: list(dict(table.items())[key])[-1]
    )
    with pytest.raises(AssertionError, match=r"result: reference \(1,\) != spec \(2,\)"):
        pool.get_cached_block(block_hash("r:0"), [0])


class HalfwayFreePool(ReferenceBlockPool):
    """A vLLM-style bug: the first release happens before the batch is validated."""

    def _core_free(self, ids):
        self.blocks[ids[0]].ref_cnt -= 1
        super()._core_free(ids[1:])


def test_contract_checking_catches_a_rejected_call_that_changed_state():
    pool = HalfwayFreePool(6, check_contracts=True)
    pool.get_new_blocks(1)
    with pytest.raises(AssertionError, match=r"free\(\(1, 1, 1\)\).*field ref_cnt\[1\]"):
        pool.free_blocks([1, 1, 1])


def test_contract_checking_catches_a_rejection_the_spec_does_not_make(monkeypatch):
    pool = contract_pool()
    pool.get_new_blocks(1)
    reference_rejects_frees_with(monkeypatch, DoubleFree("x"))
    with pytest.raises(AssertionError, match="reference raised DoubleFree.*the spec succeeded"):
        pool.free_blocks([1])


# -- check_invariants ------------------------------------------------------------------------


def test_a_pool_after_a_varied_workload_breaks_no_invariant():
    pool = make_pool(7, backend="reference")
    _random_workload(pool, random.Random(11), 200)
    assert pool.check_invariants() == []


def test_a_queued_block_with_a_holder_breaks_queued_iff_unreferenced():
    pool = make_pool(5, backend="reference")
    pool.blocks[3].ref_cnt = 1
    assert pool.check_invariants() == [("queued_iff_unreferenced", (3,))]


def test_a_negative_ref_cnt_breaks_ref_counts_are_non_negative():
    pool = make_pool(5, backend="reference")
    pool.get_new_blocks(1)
    pool.blocks[1].ref_cnt = -1
    assert "ref_counts_are_non_negative" in names(pool.check_invariants())


def test_a_key_forgotten_on_the_block_but_left_in_the_map_breaks_the_table_invariant():
    pool = make_pool(5, backend="reference")
    pool.get_new_blocks(1)
    pool.cache_full_blocks(request_with_hashes(1), [1], 0, 1, 16, 0)
    pool.blocks[1].reset_hash()
    violations = pool.check_invariants()
    assert names(violations) == ["table_entries_belong_to_their_blocks"]
    assert violations[0][1] == (pool.abstract().state.cache.popitem()[0],)


def test_spec_invariant_names_come_from_the_spec_registry():
    pool = make_pool(5, backend="reference")
    pool.blocks[2].ref_cnt = 1
    pool.blocks[0].ref_cnt = 0
    spec_names = {inv.name for inv in INVARIANTS}
    assert set(names(pool.check_invariants())) <= spec_names


def test_a_half_linked_block_breaks_free_queue_links_are_consistent():
    pool = make_pool(5, backend="reference")
    pool.get_new_blocks(1)
    pool.blocks[1].next_free_block = pool.blocks[2]  # held, yet linked
    violations = dict(pool.check_invariants())
    assert violations["free_queue_links_are_consistent"] == (1,)


def test_a_drifted_counter_breaks_free_count_matches_queue():
    pool = make_pool(5, backend="reference")
    pool.free_block_queue.num_free_blocks += 1
    assert pool.check_invariants() == [("free_count_matches_queue", (5, 4))]


def test_a_cyclic_queue_is_reported_instead_of_walked_for_ever():
    pool = make_pool(5, backend="reference")
    pool.blocks[3].next_free_block = pool.blocks[2]
    witnesses = dict(pool.check_invariants())["free_queue_links_are_consistent"]
    assert "forward walk does not reach the tail sentinel" in witnesses


def test_misplaced_blocks_break_block_ids_match_positions():
    pool = make_pool(5, backend="reference")
    pool.blocks[2], pool.blocks[3] = pool.blocks[3], pool.blocks[2]
    assert dict(pool.check_invariants())["block_ids_match_positions"] == (2, 3)


def test_a_block_of_another_pool_breaks_block_ids_match_positions():
    pool, other = make_pool(4, backend="reference"), make_pool(4, backend="reference")
    pool.blocks[3].pool = other
    assert pool.check_invariants() == [("block_ids_match_positions", (3,))]


def test_an_unflagged_null_block_breaks_null_block_is_flagged():
    pool = make_pool(4, backend="reference")
    pool.blocks[0].is_null = False
    pool.blocks[2].is_null = True
    assert pool.check_invariants() == [("null_block_is_flagged", (0, 2))]


def test_a_misfiled_map_entry_breaks_hash_map_files_blocks_under_their_ids():
    pool = make_pool(4, backend="reference")
    pool.get_new_blocks(2)
    pool.cache_full_blocks(request_with_hashes(1), [1], 0, 1, 16, 0)
    key = pool.blocks[1].block_hash
    pool.cached_block_hash_to_block._cache[key] = {2: pool.blocks[1]}
    assert "hash_map_files_blocks_under_their_ids" in names(pool.check_invariants())


def test_an_empty_secondary_entry_breaks_secondary_index_has_no_empty_entries():
    pool = make_pool(4, backend="reference")
    pool.cached_block_hashes_by_block[2] = {}
    assert pool.check_invariants() == [("secondary_index_has_no_empty_entries", (2,))]


def test_a_watcher_without_a_callback_breaks_watcher_table_matches_callbacks():
    pool = make_pool(4, backend="reference")
    pool.get_new_blocks(1)
    pool.reuse_watcher_ids[1] = None
    assert pool.check_invariants() == [("watcher_table_matches_callbacks", (1,))]
