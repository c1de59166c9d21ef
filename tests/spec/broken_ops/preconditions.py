"""Preconditions with one planted bug each, carrying the real precondition contract.

``precondition_contract_of(op)`` says the precondition rejects exactly §12's invalid set, so
CrossHair must find an input each of these accepts (or rejects) wrongly.
"""

from __future__ import annotations

from kvpool.errors import KvPoolError
from kvpool.spec import preconditions as pre
from kvpool.spec.precondition_contracts import precondition_contract_of
from kvpool.spec.state import BlockIds, PoolState


@precondition_contract_of("unpin_blocks")
def unpin_blocks_accepts_the_null_block(
    state: PoolState, block_ids: BlockIds
) -> KvPoolError | None:
    # BUG: the null-block check is missing (vLLM asserts mid-batch; kvpool must reject).
    return pre.bad_block_id(state, block_ids) or pre.over_release(state, block_ids)


@precondition_contract_of("free_blocks")
def free_blocks_counts_each_block_once(
    state: PoolState, block_ids: BlockIds
) -> KvPoolError | None:
    # BUG: repeats in one batch are not counted, so [b, b] on a block with ref 1 passes.
    return pre.bad_block_id(state, block_ids) or pre.over_release(state, tuple(set(block_ids)))
