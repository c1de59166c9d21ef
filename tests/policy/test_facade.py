"""The KV cache manager facade (BEHAVIOUR.md §10): step order, results, and bad calls that
raise a typed error and change nothing (§12)."""

from __future__ import annotations

import pytest

from kvpool.errors import InvalidArgument, KvPoolError
from kvpool.events import BlockStored
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    RequestStatus,
    SlidingWindowSpec,
)

from .helpers import manager, request, run_prefill

FULL = FullAttentionSpec(block_size=16)


def snapshot(m, *rids):
    # The record both policies keep per live request (a fast policy keeps bounds after it,
    # its own cache: tests/policy/test_fast_policy_queries.py checks them).
    return (m.block_pool.abstract(), [m.get_block_ids(r) for r in rids],
            {rid: seen[:2] for rid, seen in m._live.items()})


def test_allocate_slots_returns_only_the_new_blocks_per_group() -> None:
    m = manager(FULL, SlidingWindowSpec(block_size=16, sliding_window=32), num_blocks=40)
    a = request("a", list(range(40)))
    first = m.allocate_slots(a, 40)
    assert [len(g) for g in first.get_block_ids()] == [3, 3]
    a.num_computed_tokens = 40
    assert m.allocate_slots(a, 1) is m.empty_kv_cache_blocks  # still fits in block 3


def test_lookahead_slots_are_allocated_but_drafts_never_cached() -> None:
    m = manager(FULL, num_blocks=20, enable_kv_cache_events=True)
    a = request("a", list(range(30)))
    out = m.allocate_slots(a, 30, num_lookahead_tokens=4)  # 34 slots: 3 blocks
    assert len(out.get_block_ids()[0]) == 3
    stored = [e for e in m.take_events() if isinstance(e, BlockStored)]
    assert [len(e.block_hashes) for e in stored] == [1]  # only the one full prompt block


def test_events_carry_the_groups_kind_and_window() -> None:
    m = manager(FULL, SlidingWindowSpec(block_size=16, sliding_window=48),
                enable_kv_cache_events=True)
    m.allocate_slots(request("a", list(range(40))), 40)
    kinds = [(e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window)
             for e in m.take_events() if isinstance(e, BlockStored)]
    assert kinds == [(0, "full_attention", None), (1, "sliding_window", 48)]


def test_watermark_applies_to_waiting_requests_only() -> None:
    m = manager(FULL, num_blocks=11, watermark=0.5)  # 5 watermark blocks, 10 usable
    a = request("a", list(range(96)))  # 6 blocks: 6 + 5 > 10
    assert m.allocate_slots(a, 96) is None
    a.status = RequestStatus.RUNNING
    assert m.allocate_slots(a, 96) is not None


def test_full_sequence_must_fit_gates_on_the_whole_prompt() -> None:
    m = manager(FULL, num_blocks=6)
    a = request("a", list(range(100)))  # 7 blocks > 5
    assert m.allocate_slots(a, 16, full_sequence_must_fit=True) is None
    assert m.allocate_slots(a, 16) is not None


def test_pop_blocks_for_free_hands_over_tables_in_group_order() -> None:
    m = manager(FULL, SlidingWindowSpec(block_size=16, sliding_window=32), num_blocks=40)
    a = request("a", list(range(40)))
    run_prefill(m, a)
    tables = m.get_block_ids("a")
    popped = m.pop_blocks_for_free(a)
    assert popped == tables[0] + tables[1]
    assert m.get_block_ids("a") == ([], [])
    m.block_pool.free_blocks(popped[::-1])
    assert m.block_pool.get_num_free_blocks() == 39


def test_reset_prefix_cache_needs_every_block_free_and_marks_stats() -> None:
    m = manager(FULL, log_stats=True)
    a = request("a", list(range(40)))
    run_prefill(m, a)
    assert m.reset_prefix_cache() is False
    m.free(a)
    assert m.reset_prefix_cache() is True
    stats = m.make_prefix_cache_stats()
    assert stats.reset and stats.requests == 1  # a's own lookup
    assert m.make_prefix_cache_stats().reset is False


def test_lookups_of_preempted_requests_are_counted_apart() -> None:
    m = manager(FULL, log_stats=True)
    run_prefill(m, request("a", list(range(40))))
    m.get_computed_blocks(request("b", list(range(40))))
    m.get_computed_blocks(request("c", list(range(40)), num_preemptions=1))
    s = m.make_prefix_cache_stats()
    assert (s.requests, s.queries, s.hits) == (2, 80, 32)  # a's miss, then b's hit
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 40, 32)


def test_take_new_block_ids_drains_full_attention_allocations() -> None:
    m = manager(FULL, MambaSpec(block_size=16))
    m.allocate_slots(request("a", list(range(20))), 20)
    ids = m.take_new_block_ids()
    assert len(ids) == 2 and m.take_new_block_ids() == []


def test_get_block_ids_for_computed_tokens_clips_attention_groups() -> None:
    m = manager(FULL, MambaSpec(block_size=16))
    a = request("a", list(range(40)))
    m.allocate_slots(a, 40)
    clipped = m.get_block_ids_for_computed_tokens("a", 17)
    assert len(clipped[0]) == 2 and clipped[1] == m.get_block_ids("a")[1]


# -- bad calls: typed error, nothing changes -----------------------------------------------

def running(m):
    a = request("a", list(range(40)))
    run_prefill(m, a)
    a.status = RequestStatus.RUNNING
    return a


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
@pytest.mark.parametrize("call", [
    lambda m, a: m.allocate_slots(a, 0),
    lambda m, a: m.allocate_slots(a, -1),
    lambda m, a: m.allocate_slots(a, 1, num_lookahead_tokens=-2),
    lambda m, a: m.allocate_slots(a, 1, 16, m.get_computed_blocks(request("z", [1] * 40))[0]),
    lambda m, a: m.allocate_slots(a, 1, 16, KVCacheBlocks(([1],))),
    lambda m, a: m.allocate_slots(a, 1, new_computed_blocks=KVCacheBlocks(([], []))),
    lambda m, a: m.allocate_slots(request("n", list(range(40))), 8, 16, KVCacheBlocks(([999],))),
    lambda m, a: m.allocate_slots(request("n", list(range(40))), 8, 32, KVCacheBlocks(([1],))),
    lambda m, a: m.allocate_slots(request("n", list(range(40))), 8, 16, KVCacheBlocks(([],))),
])
def test_bad_call_raises_typed_error_and_changes_nothing(backend, call) -> None:
    m = manager(FULL, backend=backend)
    a = running(m)
    before = snapshot(m, "a", "n")
    with pytest.raises(KvPoolError):
        call(m, a)
    assert snapshot(m, "a", "n") == before


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_freeing_a_request_that_holds_nothing_is_a_no_op(backend) -> None:
    """vLLM's rule (BEHAVIOUR.md §8): its scheduler frees requests aborted while still
    waiting, and a request freed twice; both change nothing (this raised UnknownRequest)."""
    m = manager(FULL, backend=backend)
    a = running(m)
    m.free(a)
    before = snapshot(m, "a")
    assert m.free(a) is None
    assert m.pop_blocks_for_free(a) == []
    waiting = request("never-allocated", list(range(40)))
    assert m.free(waiting) is None and m.pop_blocks_for_free(waiting) == []
    assert snapshot(m, "a") == before


def test_tokens_that_shrink_are_rejected() -> None:
    m = manager(FULL)
    a = running(m)
    a.num_computed_tokens = 40
    assert m.allocate_slots(a, 1) is not None
    a.num_computed_tokens = 30
    before = snapshot(m, "a")
    with pytest.raises(InvalidArgument, match="shrank"):
        m.allocate_slots(a, 1)
    assert snapshot(m, "a") == before


def test_zero_tokens_message_is_vllms() -> None:
    m = manager(FULL)
    with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
        m.allocate_slots(request("a", [1] * 20), 0)


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_an_empty_hit_list_cannot_cover_computed_tokens(backend) -> None:
    """Hits for a hybrid model whose full-attention list is empty while the sliding-window
    list covers 32 tokens: accepted before, and fresh blocks were then keyed for tokens
    nobody computed. Every prefix-cached group must cover the tokens; nothing changes."""
    m = manager(FULL, SlidingWindowSpec(block_size=16, sliding_window=32), num_blocks=40,
                backend=backend)
    a = request("a", list(range(48)))
    run_prefill(m, a)
    m.free(a)
    b = request("b", list(range(48)))
    hits, n = m.get_computed_blocks(b)
    assert n == 32 and [len(g) for g in hits.blocks] == [2, 2]
    before = snapshot(m, "b")
    bad = KVCacheBlocks(((), hits.blocks[1]))
    with pytest.raises(InvalidArgument, match="do not cover"):
        m.allocate_slots(b, 16, num_new_computed_tokens=32, new_computed_blocks=bad)
    assert snapshot(m, "b") == before
    assert m.allocate_slots(b, 16, num_new_computed_tokens=32, new_computed_blocks=hits)


@pytest.mark.parametrize("bad", [0, 32, -1, 2.0, "3", True])
def test_a_lookups_hits_changed_before_the_admission_are_checked_again(bad) -> None:
    """A lookup's hit list changed before the admission (a null, an id beyond the pool, not
    an int): the fast policy answers exactly as the generic one — the same error or the same
    blocks — and a refusal changes nothing. (A fast path that trusted its own lookup's hits
    when they compared equal took 2.0 for block 2: equality is not identity.)"""
    from kvpool.policy import make_kv_cache_manager

    def admit_changed(policy: str) -> tuple[object, object, object]:
        config = KVCacheConfig(32, (KVCacheGroupSpec(FULL),))
        m = make_kv_cache_manager(config, 4096, 16, 16, backend="fast", policy=policy)
        assert m.policy_name == policy
        a = request("a", list(range(48)))
        run_prefill(m, a)
        m.free(a)
        b = request("b", list(range(48)))
        hits, n = m.get_computed_blocks(b)
        assert n == 32 and len(hits.blocks[0]) == 2
        hits.blocks[0][1] = bad
        before = snapshot(m, "b")
        try:
            out = m.allocate_slots(b, 16, num_new_computed_tokens=32, new_computed_blocks=hits)
        except KvPoolError as error:
            assert snapshot(m, "b") == before
            return type(error), str(error), None
        return out.get_block_ids(), m.get_block_ids("b"), snapshot(m, "b")

    assert admit_changed("fast") == admit_changed("generic")


@pytest.mark.parametrize("policy", ["generic", "fast"])
def test_a_lookups_own_hits_are_admitted(policy) -> None:
    from kvpool.policy import make_kv_cache_manager

    config = KVCacheConfig(32, (KVCacheGroupSpec(FULL),))
    m = make_kv_cache_manager(config, 4096, 16, 16, backend="fast", policy=policy)
    a = request("a", list(range(48)))
    first = run_prefill(m, a)
    m.free(a)
    b = request("b", list(range(48)))
    hits, n = m.get_computed_blocks(b)
    assert m.allocate_slots(b, 16, num_new_computed_tokens=32, new_computed_blocks=hits)
    assert m.get_block_ids("b")[0][:2] == first[0][:2]


def test_a_table_holding_numpy_ids_is_freed_as_the_generic_policy_frees_it() -> None:
    """Hits may be any integral ids (numpy's included); the generic code keeps them in the
    table as given, and the fast policy frees a table as one int64 array: the free queue
    and the hash table end up exactly as the generic policy leaves them."""
    import numpy as np

    from kvpool.policy import make_kv_cache_manager

    def run(policy: str) -> object:
        config = KVCacheConfig(32, (KVCacheGroupSpec(FULL),))
        m = make_kv_cache_manager(config, 4096, 16, 16, backend="fast", policy=policy)
        a = request("a", list(range(64)))
        run_prefill(m, a)
        m.free(a)
        b = request("b", list(range(64)) + [7] * 20)
        hits, n = m.get_computed_blocks(b)
        numpy_hits = KVCacheBlocks(tuple([np.int64(x) for x in g] for g in hits.blocks))
        assert m.allocate_slots(b, b.num_tokens - n, num_new_computed_tokens=n,
                                new_computed_blocks=numpy_hits)
        m.free(b)
        return m.block_pool.abstract()

    assert run("fast") == run("generic")


@pytest.mark.parametrize("zeroed", [True, False])
def test_the_blocks_to_zero_follow_a_setting_changed_after_the_manager_is_built(zeroed) -> None:
    """The drop-ins say which groups are zeroed once the manager exists (vLLM 0.25 zeroes
    none: recorded, every allocated id would pile up for a call that never comes). The fast
    policy's own allocations follow the setting as the generic code's do."""
    from kvpool.policy import make_kv_cache_manager

    def run(policy: str) -> list[list[int]]:
        config = KVCacheConfig(64, (KVCacheGroupSpec(FULL),))
        m = make_kv_cache_manager(config, 4096, 16, 16, backend="fast", policy=policy)
        assert m.policy_name == policy
        if not zeroed:
            m.record_no_blocks_to_zero()
        taken = []
        for i in range(3):
            r = request(f"r{i}", list(range(100 * i, 100 * i + 40)))
            run_prefill(m, r)  # an admission: new blocks
            r.append_output_token_ids([1] * 9)
            assert m.allocate_slots(r, 9) is not None  # a step that takes a block
            r.num_computed_tokens += 9
            taken.append(m.take_new_block_ids())
        return taken

    taken = run("fast")
    assert taken == run("generic")
    assert all(taken) if zeroed else not any(taken)
