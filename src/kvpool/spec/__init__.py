"""The executable specification of the block pool.

Read in this order: :mod:`~kvpool.spec.state` (what a pool holds),
:mod:`~kvpool.spec.invariants` (what is always true of it), :mod:`~kvpool.spec.free_queue` and
:mod:`~kvpool.spec.hash_map` (the two data structures), :mod:`~kvpool.spec.preconditions` (what
each operation rejects), :mod:`~kvpool.spec.ops` (what each operation does),
:mod:`~kvpool.spec.postconditions` (each operation's exact effect, stated as a predicate) and
:mod:`~kvpool.spec.contracts` (the pre/postconditions CrossHair checks).
"""

from kvpool.spec.invariants import INVARIANTS, all_invariants_hold, violated_invariants
from kvpool.spec.state import NULL_BLOCK_ID, PoolState, initial_state

__all__ = [
    "INVARIANTS",
    "NULL_BLOCK_ID",
    "PoolState",
    "all_invariants_hold",
    "initial_state",
    "violated_invariants",
]
