"""Packing ints for the raw encoding: ``struct`` packs first, ``array`` defines the result.

:func:`kvpool.hashing.raw._pack_ints` packs with ``struct`` (about twice as fast on a prompt
list) and falls back to ``array`` only to raise its typed error. The two must accept exactly
the same values and give the same bytes; a value neither packs must raise what ``array``
raises (``OverflowError`` or ``TypeError``, never ``struct.error``), because callers catch
those two to take their slower paths.
"""

from __future__ import annotations

import struct
import sys
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.hashing.raw import _INT32, _INT64, _pack_ints, pack_int32


class _Index:
    """An object that is not an int but converts like one (``__index__``)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


class _IntSubclass(int):
    pass


def _by_array(typecode: str, values: list) -> tuple:
    """What ``array`` makes of ``values``: ("ok", little-endian bytes) or the error type."""
    try:
        packed = array(typecode, values)
    except Exception as error:  # noqa: BLE001 - the error's type is what is compared
        return (type(error),)
    if sys.byteorder == "big":
        packed.byteswap()
    return ("ok", packed.tobytes())


def _by_pack(typecode: str, values: list) -> tuple:
    try:
        return ("ok", _pack_ints(typecode, values))
    except Exception as error:  # noqa: BLE001
        return (type(error),)


_EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 2**63,
          -(2**63) - 1]

values = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from(_EDGES),
    st.booleans(),
    st.sampled_from(_EDGES[:7]).map(np.int64),
    st.integers(min_value=0, max_value=2**64 - 1).map(np.uint64),
    st.integers(min_value=-(2**31), max_value=2**31 - 1).map(np.int32),
    st.sampled_from(_EDGES).map(_Index),
    st.sampled_from(_EDGES).map(_IntSubclass),
    st.floats(allow_nan=False, width=64),
    st.sampled_from([None, "3", b"3", 2.0, np.float64(1.0), np.bool_(True), 1 + 0j]),
)


@pytest.mark.parametrize("typecode", [_INT32, _INT64])
@settings(max_examples=300, deadline=None)
@given(st.lists(values, max_size=6))
def test_packing_accepts_and_refuses_exactly_what_array_does(typecode, items):
    assert _by_pack(typecode, items) == _by_array(typecode, items)


@pytest.mark.parametrize("shape", [list, tuple, np.array])
def test_every_sequence_shape_packs_alike(shape):
    tokens = [0, 7, 2**31 - 1, 5, 123456]
    assert pack_int32(shape(tokens)) == struct.pack("<5i", *tokens)


def test_an_empty_sequence_packs_to_nothing():
    assert pack_int32([]) == b""


@pytest.mark.parametrize("bad, error", [(2**31, OverflowError), (-(2**31) - 1, OverflowError),
                                        (1.0, TypeError), (None, TypeError), ("1", TypeError)])
def test_a_value_that_does_not_pack_raises_the_typed_error(bad, error):
    with pytest.raises(error):
        pack_int32([1, 2, bad, 3])
