"""Async scheduling: a request's tokens in flight, and a connector's zeroing skips.

With async scheduling a step is scheduled before the previous one is back, so a request's
``num_computed_tokens`` counts tokens whose step is still running (vLLM 0.33 names them
``num_in_flight_tokens``). Those steps still read the blocks behind their tokens: windows
free behind the *processed* tokens. Every policy must agree on it (the generic one, the
fast ones), and a bad count is refused before anything changes.
"""

from __future__ import annotations

import pytest

from kvpool.errors import InvalidArgument, InvalidConfig
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SchedulerRequest,
    SlidingWindowSpec,
    make_kv_cache_manager,
)
from kvpool.policy.mamba import follow_vllm_033_rules

from .helpers import manager, request

HASHER = BlockHasher("sha256", seed="in-flight")
FULL = FullAttentionSpec(block_size=16)
WINDOW = SlidingWindowSpec(block_size=16, sliding_window=32)


def hybrid(policy: str):
    config = KVCacheConfig(200, [KVCacheGroupSpec(FULL), KVCacheGroupSpec(WINDOW)])
    return make_kv_cache_manager(config, 4096, 16, 16, backend="fast", policy=policy)


def decode(m, r: SchedulerRequest, steps: int, in_flight: int) -> list[tuple[list[int], ...]]:
    """``steps`` decode steps, each with ``in_flight`` tokens not processed yet."""
    tables = []
    for t in range(steps):
        r.append_output_token_ids([5000 + t])
        r.num_in_flight_tokens = in_flight
        assert m.allocate_slots(r, 1) is not None
        r.num_computed_tokens += 1
        tables.append(m.get_block_ids(r.request_id))
    return tables


@pytest.mark.parametrize("policy", ["generic", "fast"])
def test_a_window_keeps_the_blocks_its_tokens_in_flight_read(policy) -> None:
    m = hybrid(policy)
    assert type(m).__name__ == ("FastHybridKVCacheManager" if policy == "fast"
                                else "KVCacheManager")
    r = SchedulerRequest("a", list(range(100)), block_hasher=get_request_block_hasher(16, HASHER))
    assert m.allocate_slots(r, 100) is not None
    r.num_computed_tokens = 100
    late = decode(m, r, 40, in_flight=20)
    # Behind 100 + t processed-minus-20 tokens, a 32-token window skips (80 + t - 31) // 16
    # blocks; behind all the computed tokens it would skip more.
    for t, (_, window) in enumerate(late):
        processed = 100 + t - 20
        skipped = (processed - 31) // 16
        assert window[:skipped] == [0] * skipped and 0 not in window[skipped:], t


def test_every_policy_frees_the_same_blocks_with_tokens_in_flight() -> None:
    tables = {}
    for policy in ("generic", "fast"):
        m = hybrid(policy)
        r = SchedulerRequest("a", list(range(70)),
                             block_hasher=get_request_block_hasher(16, HASHER))
        assert m.allocate_slots(r, 70) is not None
        r.num_computed_tokens = 70
        tables[policy] = [decode(m, r, 5, in_flight=k) for k in (0, 3, 17, 0, 40, 1)]
    assert tables["fast"] == tables["generic"]


@pytest.mark.parametrize("policy", ["generic", "fast"])
@pytest.mark.parametrize("bad", [-1, 2.5, "3", True])
def test_a_bad_in_flight_count_is_refused_and_changes_nothing(policy, bad) -> None:
    m = hybrid(policy)
    r = SchedulerRequest("a", list(range(100)), block_hasher=get_request_block_hasher(16, HASHER))
    assert m.allocate_slots(r, 100) is not None
    r.num_computed_tokens = 100
    decode(m, r, 3, in_flight=0)
    before, state = m.get_block_ids("a"), m.block_pool.abstract()
    r.append_output_token_ids([1])
    r.num_in_flight_tokens = bad
    with pytest.raises(InvalidArgument, match="num_in_flight_tokens"):
        m.allocate_slots(r, 1)
    assert m.get_block_ids("a") == before and m.block_pool.abstract() == state


@pytest.mark.parametrize("policy", ["generic", "fast"])
def test_full_attention_reads_no_in_flight_count(policy) -> None:
    """Nothing is freed before the end in full attention: the count changes nothing, and
    neither policy reads it (so they cannot disagree on a bad one)."""
    config = KVCacheConfig(64, [KVCacheGroupSpec(FULL)])
    m = make_kv_cache_manager(config, 1024, 16, 16, backend="fast", policy=policy)
    r = SchedulerRequest("a", list(range(40)), block_hasher=get_request_block_hasher(16, HASHER))
    r.num_in_flight_tokens = "not a count"  # type: ignore[assignment]
    assert m.allocate_slots(r, 40) is not None


@pytest.mark.parametrize("rules", ["0.25", "0.33"])
def test_a_mamba_state_left_behind_by_lagging_removals(rules) -> None:
    """Align mode keeps the previous state until the next step has read it. With a prefill
    chunk in flight, removal lags one chunk: the third chunk's allocation moves the
    previous-state index on before the first chunk's state is freed. vLLM 0.25.1's walk
    stops at the table's first null gap and holds that state until the request ends (the
    facade's default, BEHAVIOUR.md §8); vLLM 0.33's steps over the gaps and frees it
    (``follow_vllm_033_rules``, which the 0.33 drop-in applies)."""
    m = manager(FULL, MambaSpec(block_size=16, mamba_cache_mode="align"), num_blocks=40)
    if rules == "0.33":
        follow_vllm_033_rules(m)
    mamba = m.coordinator.single_type_managers[1]
    r = request("a", list(range(200)))
    assert m.allocate_slots(r, 48) is not None
    r.num_computed_tokens = 48
    first_state = mamba.req_to_blocks["a"][2]
    for chunk, in_flight in ((52, 48), (100, 52)):  # each chunk scheduled before the last
        r.num_in_flight_tokens = in_flight          # one is back
        assert m.allocate_slots(r, chunk) is not None
        r.num_computed_tokens += chunk
    assert mamba.req_to_blocks["a"][2] == first_state  # left behind: its index moved on
    assert mamba.last_state_block_idx["a"] == 6
    r.append_output_token_ids([7])
    r.num_in_flight_tokens = 100  # the third chunk still in flight: 100 processed
    assert m.allocate_slots(r, 1) is not None
    table = mamba.req_to_blocks["a"]
    if rules == "0.25":
        assert table[2] == first_state  # held: the walk stopped at position 5's null
        assert m.block_pool.observe().ref_cnts([first_state]) == [1]
        m.free(r)  # ... until the request ends
        assert m.block_pool.observe().ref_cnts([first_state]) == [0]
    else:
        assert table[2] == 0 and first_state not in table
        assert m.block_pool.observe().ref_cnts([first_state]) == [0]


def test_external_blocks_of_groups_a_connector_loads_are_not_zeroed() -> None:
    m = manager(FULL, FullAttentionSpec(block_size=32), num_blocks=60, sbs=32)
    m.take_new_block_ids()
    a = request("a", list(range(100)))
    assert m.allocate_slots(a, 4, num_external_computed_tokens=96,
                            skip_zeroing_group_ids=(1,)) is not None
    recorded = set(m.take_new_block_ids())
    first, second = m.get_block_ids("a")
    assert set(first) <= recorded  # group 0: external (6) and new blocks alike
    assert set(second[:3]).isdisjoint(recorded)  # group 1: its 3 external blocks skipped
    assert set(second[3:]) <= recorded  # its block for the new tokens is zeroed


@pytest.mark.parametrize("policy", ["generic", "fast"])
@pytest.mark.parametrize("bad", [(2,), (-1,), ("0",), 0, "0", (True,)])
def test_bad_zeroing_skips_are_refused_and_change_nothing(policy, bad) -> None:
    config = KVCacheConfig(64, [KVCacheGroupSpec(FULL)])
    m = make_kv_cache_manager(config, 1024, 16, 16, backend="fast", policy=policy)
    r = SchedulerRequest("a", list(range(40)), block_hasher=get_request_block_hasher(16, HASHER))
    state = m.block_pool.abstract()
    with pytest.raises(InvalidArgument, match="skip_zeroing_group_ids"):
        m.allocate_slots(r, 40, skip_zeroing_group_ids=bad)
    assert m.block_pool.abstract() == state and m.get_block_ids("a") == ([],)


@pytest.mark.parametrize("policy", ["generic", "fast"])
@pytest.mark.parametrize("groups", [[FULL], [FULL, WINDOW]])
@pytest.mark.parametrize("bad", [-1, 33.0, "32", True, None])
def test_a_bad_count_to_key_is_refused_and_changes_nothing(policy, groups, bad) -> None:
    """``cache_blocks`` (async scheduling's call after each output) refuses a count that is
    not a non-negative int on every policy, with the same typed error, before any change."""
    config = KVCacheConfig(64, [KVCacheGroupSpec(g) for g in groups])
    m = make_kv_cache_manager(config, 1024, 16, 16, backend="fast", policy=policy)
    r = SchedulerRequest("a", list(range(40)), block_hasher=get_request_block_hasher(16, HASHER))
    assert m.allocate_slots(r, 20) is not None
    r.num_computed_tokens = 20
    tables, state = m.get_block_ids("a"), m.block_pool.abstract()
    with pytest.raises(InvalidArgument, match="num_computed_tokens"):
        m.cache_blocks(r, bad)
    assert m.get_block_ids("a") == tables and m.block_pool.abstract() == state


def test_the_0_33_rules_take_a_manager() -> None:
    with pytest.raises(InvalidConfig, match="KVCacheManager"):
        follow_vllm_033_rules("not a manager")
