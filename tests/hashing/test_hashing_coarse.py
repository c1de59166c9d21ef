"""The coarse view: block hashes at a group's block size, read off the fine list."""

from __future__ import annotations

import pytest

from kvpool.errors import InvalidArgument
from kvpool.hashing import CoarseBlockHashes, resolve_block_hashes

FINE = [b"f0", b"f1", b"f2", b"f3", b"f4"]


def test_coarse_hash_is_the_last_fine_hash_inside_the_coarse_block() -> None:
    coarse = CoarseBlockHashes(FINE, hash_block_size=16, block_size=32)

    assert len(coarse) == 2  # f4 alone is half a coarse block
    assert (coarse[0], coarse[1]) == (b"f1", b"f3")
    assert list(coarse) == [b"f1", b"f3"]


def test_negative_indices_count_from_the_end_and_out_of_range_raises() -> None:
    coarse = CoarseBlockHashes(FINE, 16, 32)

    assert (coarse[-1], coarse[-2]) == (b"f3", b"f1")
    for index in (2, -3):
        with pytest.raises(IndexError):
            coarse[index]


def test_slices_return_lists() -> None:
    coarse = CoarseBlockHashes(FINE, 16, 32)

    assert coarse[:] == [b"f1", b"f3"]
    assert coarse[::-1] == [b"f3", b"f1"]
    assert coarse[1:5] == [b"f3"]


@pytest.mark.parametrize("index", [1.0, "0", None, (0,)])
def test_other_index_types_raise_type_error(index: object) -> None:
    with pytest.raises(TypeError, match="int or slice"):
        CoarseBlockHashes(FINE, 16, 32)[index]  # type: ignore[index]


def test_the_view_follows_the_fine_list_as_it_grows() -> None:
    fine = list(FINE)
    coarse = CoarseBlockHashes(fine, 16, 48)
    assert list(coarse) == [b"f2"]

    fine.append(b"f5")

    assert list(coarse) == [b"f2", b"f5"]


def test_resolve_returns_the_fine_list_itself_when_sizes_match() -> None:
    assert resolve_block_hashes(FINE, 16, 16) is FINE
    view = resolve_block_hashes(FINE, 16, 32)
    assert isinstance(view, CoarseBlockHashes)
    assert list(view) == [b"f1", b"f3"]


@pytest.mark.parametrize(("hbs", "bs"), [(16, 40), (16, 8), (0, 16), (16, 0), (16, -32)])
def test_block_size_must_be_a_positive_multiple_of_the_hash_block_size(hbs: int, bs: int) -> None:
    with pytest.raises(InvalidArgument):
        resolve_block_hashes(FINE, hbs, bs)
    with pytest.raises(InvalidArgument):
        CoarseBlockHashes(FINE, hbs, bs)
