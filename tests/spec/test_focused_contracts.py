"""The focused contracts (``kvpool.spec.focused_contracts``) at runtime: the same operation and
the same precondition as the large contracts, their domain enforced by icontract."""

from __future__ import annotations

from dataclasses import replace

import icontract
import pytest
from spec_builders import key, make_state

from kvpool.errors import HashStateError, InvalidArgument
from kvpool.spec import focused_contracts as focused
from kvpool.spec import ops
from kvpool.spec import preconditions as pre

HELD = make_state(5, ref={1: 1, 2: 1, 3: 2}, keys={2: (key(1), 1), 3: (key(2), 1)},
                  events=True)


def test_a_released_batch_frees_like_the_operation():
    assert focused.free_blocks_releasing(HELD, (2, 1)) == ops.free_blocks(HELD, (2, 1))
    assert focused.unpin_blocks_releasing(HELD, (1, 2)) == ops.unpin_blocks(HELD, (1, 2))


@pytest.mark.parametrize("batch", [(1, 3), (1, 1), (0, 1), (1, 4)])
def test_a_batch_outside_the_released_domain_is_not_in_the_contract(batch):
    # block 3 holds two references; a repeat, the null block and a free block are outside
    with pytest.raises(icontract.ViolationError):
        focused.free_blocks_releasing(HELD, batch)


def test_the_keyed_and_evicting_domains():
    assert focused.evict_blocks_keyed(HELD, (3, 2)) == ops.evict_blocks(HELD, (3, 2))
    with pytest.raises(icontract.ViolationError):
        focused.evict_blocks_keyed(HELD, (1, 2))  # block 1 has no key
    idle = make_state(4, keys={1: (key(1), 1), 2: (key(2), 1)}, events=True)
    assert focused.get_new_blocks_evicting(idle, 2) == ops.get_new_blocks(idle, 2)
    with pytest.raises(icontract.ViolationError):
        focused.get_new_blocks_evicting(replace(idle, enable_events=False), 2)


def test_hits_in_two_groups():
    state = make_state(4, ref={1: 1, 2: 1}, keys={1: (key(1, 0), 1), 2: (key(1, 1), 1)})
    result = focused.get_cached_block_hits(state, b"\x01", (1, 0))
    assert result == ops.get_cached_block(state, b"\x01", (1, 0))
    assert result.result == (2, 1)


def test_a_cache_full_call_and_its_probes():
    call = ((b"\x01", b"\x02"), (1, 2), 0, 2, 1, 0, None)
    assert focused.cache_full_blocks_call(HELD, call) == ops.cache_full_blocks(HELD, *call)
    with pytest.raises(icontract.ViolationError):  # one block at two positions: not valid
        focused.cache_full_blocks_call(HELD, ((b"\x01", b"\x02"), (1, 1), 0, 2, 1, 0, None))
    repeated = ((b"\x01", b"\x02"), (1, 1), 0, 2, 1, 0, None)
    assert isinstance(focused.cache_full_blocks_rejection_probe(HELD, repeated), InvalidArgument)
    free = ((b"\x01",), (4,), 0, 1, 1, 0, None)
    assert isinstance(focused.cache_full_blocks_rejection_probe(HELD, free), HashStateError)
    assert focused.move_block_hashes_rejection_drawn(HELD, 3, 1) == (
        pre.move_block_hashes_rejection(HELD, 3, 1))


def test_every_focused_contract_names_the_contract_it_focuses():
    from kvpool.spec.contracts import CONTRACTS
    from kvpool.spec.precondition_contracts import INVALID_ROWS

    for name in focused.FOCUSED_OPERATION_CONTRACTS:
        assert getattr(focused, name).kvpool_focuses in CONTRACTS
    for name in focused.FOCUSED_PRECONDITION_CONTRACTS:
        assert getattr(focused, name).kvpool_precondition_of in INVALID_ROWS
