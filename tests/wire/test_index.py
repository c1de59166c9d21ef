"""The router's index: the semantics of kvpool.events.replay, and the router's two queries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("msgspec")

from kvpool.errors import InvalidEvent  # noqa: E402
from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored, replay  # noqa: E402
from kvpool.wire.encoding import decode_batch, encode_batch  # noqa: E402
from kvpool.wire.index import FleetIndex, RankIndex  # noqa: E402

# Few distinct hashes, so streams store the same key twice and remove keys they hold.
HASHES = st.integers(0, 5) | st.sampled_from([b"\x00\x01", b"\x01\x00", b"\x00\x00"])
GROUPS = st.sampled_from([0, 1, None])


def _stored(hashes, parent=None, group=0):
    return BlockStored(block_hashes=list(hashes), parent_block_hash=parent,
                       token_ids=[0] * 16 * len(hashes), block_size=16, lora_id=None,
                       medium="GPU", group_idx=group)


EVENTS = st.one_of(
    st.builds(_stored, st.lists(HASHES, max_size=4), st.none() | HASHES, GROUPS),
    st.builds(lambda h, g: BlockRemoved(block_hashes=[h], medium="GPU", group_idx=g),
              HASHES, GROUPS),
    st.just(AllBlocksCleared()),
)


def _numbered(events):
    return [type(e)(**{**vars(e), "seq": i}) for i, e in enumerate(events)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(EVENTS, max_size=6), max_size=6))
def test_the_index_after_each_batch_equals_replay_of_the_stream_so_far(batches):
    # replay() refuses the removal of a key a complete stream never stored; the router's
    # index counts such a removal instead and changes nothing. The oracle is replay() of the
    # stream without those removals, and the index must have counted exactly them.
    index = RankIndex()
    valid, unknown = [], 0
    for i, events in enumerate(batches):
        index.apply_batch(decode_batch(encode_batch(events, float(i))))
        for event in events:
            try:
                replay(_numbered([*valid, event]))
            except InvalidEvent:
                unknown += 1
                continue
            valid.append(event)
        assert index.cache_index() == replay(_numbered(valid))
        assert index.unknown_removals == unknown


def test_a_removal_of_an_unknown_key_is_counted_and_changes_nothing():
    index = RankIndex()
    batch = decode_batch(encode_batch([_stored([1]), BlockRemoved(block_hashes=[2],
                                                                  medium="GPU", group_idx=0)],
                                      0.0))
    index.apply_batch(batch)
    assert index.cache_index() == {(1, 0): 1} and index.unknown_removals == 1


def _fleet(*engines):
    fleet = FleetIndex()
    for name, rank, events in engines:
        fleet.apply_batch(name, decode_batch(encode_batch(events, 0.0, rank)))
    return fleet


def test_longest_prefix_scores_each_rank_by_its_leading_cached_blocks():
    fleet = _fleet(("a", 0, [_stored([1, 2, 3])]), ("a", 1, [_stored([1])]),
                   ("b", 0, [_stored([2, 3])]))
    assert fleet.longest_prefix([1, 2, 3, 4]) == {("a", 0): 3, ("a", 1): 1, ("b", 0): 0}
    assert fleet.longest_prefix([1], group_idx=1) == {("a", 0): 0, ("a", 1): 0, ("b", 0): 0}


def test_the_predicted_hit_rate_counts_the_cached_parent_chain_of_each_new_request():
    fleet = _fleet(("a", 0, [
        _stored([1, 2, 3]),  # a fresh prompt: 0 hits of 3 blocks
        _stored([4], parent=3),  # decode extends the newest block: not a new request
        _stored([5, 6], parent=2),  # a new prompt that hit blocks 1, 2: 2 of 4
        _stored([7], parent=99),  # parent never seen: the router predicts no hit, 0 of 1
    ]))
    rank = fleet.ranks[("a", 0)]
    assert (rank.predicted_hit_blocks, rank.predicted_blocks) == (2, 8)
    assert fleet.predicted_hit_rate() == pytest.approx(2 / 8)


def test_a_clear_empties_the_index_and_an_engine_reset_drops_its_ranks():
    fleet = _fleet(("a", 0, [_stored([1])]), ("a", 1, [_stored([1])]), ("b", 0, [_stored([1])]))
    fleet.apply_batch("a", decode_batch(encode_batch([AllBlocksCleared()], 0.0, 0)))
    assert fleet.ranks[("a", 0)].num_keys == 0 and fleet.num_keys() == 2
    fleet.reset_engine("a")
    assert list(fleet.ranks) == [("b", 0)]
