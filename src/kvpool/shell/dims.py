"""A pool's shape as the spec's state-free checks read it (ids in range, block sizes).

Those checks take a state-like view; the shell and the batch checks pass a :class:`Dims`
instead of building a state, one per pool shape, kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Dims:
    """What the spec's id and block-size checks read from a state."""

    num_blocks: int
    hash_block_size: int


_DIMS: dict[tuple[int, int], Dims] = {}


def dims(pool: Any) -> Any:
    """The pool's ``Dims`` (kept: built once per shape, as checks run on every call).

    Typed ``Any``: it stands in for the ``PoolView`` the spec's checks are annotated with."""
    return shape_dims(pool.num_gpu_blocks, pool.hash_block_size)


def shape_dims(num_blocks: int, hash_block_size: int) -> Any:
    """The ``Dims`` of one pool shape (see :func:`dims`)."""
    key = (num_blocks, hash_block_size)
    found = _DIMS.get(key)
    if found is None:
        found = Dims(num_blocks, hash_block_size)
        if len(_DIMS) < 256:
            _DIMS[key] = found
    return found


def hbs_dims(hash_block_size: int) -> Any:
    """A ``Dims`` for checks that read only ``hash_block_size``."""
    return shape_dims(0, hash_block_size)
