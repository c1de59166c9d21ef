"""``Request``'s token checks: the fast paths (one plain int appended, a list or tuple of
tokens) accept and reject exactly what the general checks do, with the same messages."""

from __future__ import annotations

import numbers

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvpool.errors import InvalidArgument
from kvpool.request import MAX_TOKEN_ID, Request, as_token_ids

tokens = st.one_of(
    st.integers(-3, 40),
    st.integers(MAX_TOKEN_ID - 2, MAX_TOKEN_ID + 2),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.integers(0, 9).map(np.int64),
    st.integers(0, 9).map(np.uint8),
    st.just(np.bool_(True)),
    st.floats(-2, 2, allow_nan=False),
    st.none(),
    st.text(max_size=2),
)


def _outcome(call):
    try:
        return ("ok", call())
    except InvalidArgument as error:
        return ("error", str(error))


def _general_append(request: Request, token_ids) -> None:
    """``append_output_token_ids`` without its one-int fast path: the general checks."""
    start = request.num_tokens
    if isinstance(token_ids, (numbers.Integral, np.integer)) and not isinstance(
        token_ids, (bool, np.bool_)
    ):
        token_ids = [token_ids]
    request.output_token_ids.extend(as_token_ids(token_ids, "token_ids", start))


@given(value=tokens | st.lists(tokens, max_size=4))
def test_appending_takes_and_refuses_exactly_what_the_general_checks_do(value):
    fast, general = Request("a", [1, 2, 3]), Request("a", [1, 2, 3])

    def appended(request, append):
        append(request, value)
        return list(request.output_token_ids)

    got = _outcome(lambda: appended(fast, Request.append_output_token_ids))
    expected = _outcome(lambda: appended(general, _general_append))
    assert got == expected
    assert all(type(t) is int for t in fast.output_token_ids)


@given(values=st.lists(tokens, max_size=5))
def test_a_list_or_tuple_of_tokens_is_checked_as_any_iterable_is(values):
    expected = _outcome(lambda: as_token_ids(iter(values), "t", 7))
    assert _outcome(lambda: as_token_ids(values, "t", 7)) == expected
    assert _outcome(lambda: as_token_ids(tuple(values), "t", 7)) == expected


def test_one_plain_token_appends_and_still_hashes_the_block_it_fills():
    from kvpool.hashing import BlockHasher, get_request_block_hasher

    hasher = get_request_block_hasher(4, BlockHasher("sha256", seed="t"))
    r = Request("r", [1, 2, 3], block_hasher=hasher)
    assert r.block_hashes == []
    r.append_output_token_ids(4)  # the fourth token fills block 0
    twin = Request("r", [1, 2, 3, 4], block_hasher=hasher)
    assert r.output_token_ids == [4] and r.block_hashes == twin.block_hashes
