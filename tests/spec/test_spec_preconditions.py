"""Every rejection in ``preconditions.py`` raises its documented typed error, which is also the
builtin vLLM raises (BEHAVIOUR.md §12); the first failing check wins."""

from __future__ import annotations

import copy

import pytest
from spec_builders import key, make_state

from kvpool.errors import (
    CachingDisabled,
    DoubleFree,
    HashStateError,
    InvalidArgument,
    InvalidBlockId,
    InvalidGroupId,
    KvPoolError,
    NoFreeBlocks,
    NullBlockMisuse,
)
from kvpool.spec import ops

H = tuple(bytes([h]) for h in range(1, 9))

POOL = make_state(5, ref={1: 1, 2: 2, 3: 1}, keys={3: (key(2), 2)}, queue=(4,), hbs=1)
"""Blocks 1-3 held (3 keyed at position 1 of H), block 4 free."""
UNCACHED = make_state(3, ref={1: 1}, caching=False)

CASES = [
    # (operation, args after the state, error, builtin base, state)
    ("get_new_blocks", (-1,), InvalidArgument, ValueError, POOL),
    ("get_new_blocks", (True,), InvalidArgument, ValueError, POOL),
    ("get_new_blocks", (1.0,), InvalidArgument, ValueError, POOL),
    ("get_new_blocks", (2,), NoFreeBlocks, ValueError, POOL),
    ("touch", ((1, 5),), InvalidBlockId, ValueError, POOL),
    ("touch", ((-1,),), InvalidBlockId, ValueError, POOL),
    ("free_blocks", ((4,),), DoubleFree, ValueError, POOL),
    ("free_blocks", ((1, 1),), DoubleFree, ValueError, POOL),
    ("free_blocks", ((4, 7),), InvalidBlockId, ValueError, POOL),  # range before state
    ("unpin_blocks", ((1, 0),), NullBlockMisuse, ValueError, POOL),
    ("unpin_blocks", ((4,),), DoubleFree, ValueError, POOL),
    ("unpin_blocks", ((0, 9),), InvalidBlockId, ValueError, POOL),
    ("get_cached_block", ("ab", (0,)), InvalidArgument, ValueError, POOL),
    ("get_cached_block", (H[0], ()), InvalidArgument, ValueError, POOL),
    ("get_cached_block", (H[0], (0, -1)), InvalidGroupId, ValueError, POOL),
    ("get_cached_block", (H[0], (2**32,)), InvalidGroupId, ValueError, POOL),
    ("get_cached_block", (H[0], (True,)), InvalidGroupId, ValueError, POOL),
    ("cache_full_blocks", (H, (1,), 0, 1, 1, 0), CachingDisabled, RuntimeError, UNCACHED),
    ("cache_full_blocks", (H, (1,), 0, 1, 1, -1), InvalidGroupId, ValueError, POOL),
    ("cache_full_blocks", (H, (1,), -1, 1, 1, 0), InvalidArgument, ValueError, POOL),
    ("cache_full_blocks", (H, (1,), 0, 1, 0, 0), InvalidArgument, ValueError, POOL),
    ("cache_full_blocks", (H, (1, 2), 0, 3, 1, 0), InvalidArgument, ValueError, POOL),
    ("cache_full_blocks", (H, (1, 2), 0, 2, 1, 0, (True,)), InvalidArgument, ValueError, POOL),
    ("cache_full_blocks", (H[:1], (1, 2), 0, 2, 1, 0), InvalidArgument, ValueError, POOL),
    ("cache_full_blocks", (H, (1, 6), 0, 2, 1, 0), InvalidBlockId, ValueError, POOL),
    ("cache_full_blocks", (H, (1, 1), 0, 2, 1, 0), InvalidArgument, ValueError, POOL),
    ("cache_full_blocks", (H, (4,), 0, 1, 1, 0), HashStateError, AssertionError, POOL),
    ("cache_full_blocks", (H, (3,), 0, 1, 1, 0), HashStateError, AssertionError, POOL),
    ("cache_partial_block", (H, 1, 1, 0, 1), CachingDisabled, RuntimeError, UNCACHED),
    ("cache_partial_block", (H, 5, 1, 0, 1), InvalidBlockId, ValueError, POOL),
    ("cache_partial_block", (H, 1, 1, 2**32, 1), InvalidGroupId, ValueError, POOL),
    ("cache_partial_block", (H, 1, 1, 0, 0), InvalidArgument, ValueError, POOL),
    ("cache_partial_block", (H, 1, 0, 0, 1), InvalidArgument, ValueError, POOL),
    ("cache_partial_block", (H, 1, 9, 0, 1), InvalidArgument, ValueError, POOL),
    ("cache_partial_block", (H, 4, 1, 0, 1), HashStateError, AssertionError, POOL),
    ("move_block_hashes", (1, 2), CachingDisabled, RuntimeError, UNCACHED),
    ("move_block_hashes", (1, 5), InvalidBlockId, ValueError, POOL),
    ("move_block_hashes", (0, 1), NullBlockMisuse, ValueError, POOL),
    ("move_block_hashes", (1, 1), InvalidArgument, ValueError, POOL),
    ("move_block_hashes", (1, 3), HashStateError, AssertionError, POOL),
    ("move_block_hashes", (4, 1), HashStateError, AssertionError, POOL),
    ("evict_blocks", ((1, -1),), InvalidBlockId, ValueError, POOL),
    ("is_block_writable", (5,), InvalidBlockId, ValueError, POOL),
    ("emit_cached_block_events", (H, 1, 1, -1), InvalidGroupId, ValueError, POOL),
    ("emit_cached_block_events", (H, 1, 3, 0), InvalidArgument, ValueError,
     make_state(3, hbs=2)),
    ("emit_cached_block_events", (H, -1, 1, 0), InvalidArgument, ValueError, POOL),
    ("emit_cached_block_events", (H, 9, 1, 0), InvalidArgument, ValueError, POOL),
]


def _case_id(case):
    op, args, error = case[:3]
    return f"{op}-{error.__name__}-{args!r}"[:60]


@pytest.mark.parametrize("op, args, error, builtin, state", CASES, ids=map(_case_id, CASES))
def test_an_invalid_call_raises_its_typed_error_which_is_also_the_builtin(
    op, args, error, builtin, state
):
    snapshot = copy.deepcopy(state)
    with pytest.raises(error) as caught:
        getattr(ops, op)(state, *args)
    assert isinstance(caught.value, KvPoolError) and isinstance(caught.value, builtin)
    assert type(caught.value) is error  # not a sibling subclass
    assert state == snapshot  # nothing, not even a dict inside the state, was touched


def test_the_cannot_get_message_matches_vllm():
    with pytest.raises(NoFreeBlocks, match=r"^Cannot get 2 free blocks from the pool$"):
        ops.get_new_blocks(POOL, 2)


def test_a_double_free_names_the_block_and_its_count():
    with pytest.raises(DoubleFree, match="block 1 is released 2 time"):
        ops.free_blocks(POOL, (1, 1))


@pytest.mark.parametrize(
    "op, args",
    [
        ("get_new_blocks", (0,)),
        ("free_blocks", ((0, 0),)),  # the null block is skipped, never over-released
        ("free_blocks", ((2, 2),)),
        ("cache_full_blocks", (H, (1,), 2, 1, 7, 0)),  # num_cached >= num_full: nothing read
        ("cache_full_blocks", (H, (0, 1), 0, 2, 1, 0, (True, False))),  # null and masked out
        ("cache_partial_block", ((), 0, 5, -3, 0)),  # the null block: a no-op, unchecked
        ("evict_blocks", ((0, 4, 4),)),
        ("emit_cached_block_events", ((), 0, 2, 0)),
    ],
)
def test_documented_non_errors_are_accepted(op, args):
    getattr(ops, op)(POOL, *args)

