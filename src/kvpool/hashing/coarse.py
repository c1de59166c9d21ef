"""Block hashes at a group's block size, read off the fine hash list (BEHAVIOUR.md §1).

``request.block_hashes`` has one hash per ``hash_block_size`` (hbs) tokens. A KV cache group
whose blocks hold ``block_size`` (bs) tokens, a multiple of hbs, needs one hash per bs tokens.
Hashes are chained over the whole prefix, so the last fine hash inside a coarse block already
identifies everything up to that block's end: ``coarse[i] = fine[(i + 1) * (bs / hbs) - 1]``.
No new hashing is needed, and the view stays valid as the fine list grows.

>>> fine = [b"f0", b"f1", b"f2", b"f3", b"f4"]
>>> coarse = CoarseBlockHashes(fine, hash_block_size=16, block_size=32)
>>> list(coarse), len(coarse)
([b'f1', b'f3'], 2)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from kvpool.errors import InvalidArgument


def _check_sizes(hash_block_size: int, block_size: int) -> int:
    """The ratio ``block_size // hash_block_size``; InvalidArgument unless it is exact."""
    for name, value in (("hash_block_size", hash_block_size), ("block_size", block_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InvalidArgument(f"{name} must be a positive int, got {value!r}")
    if block_size % hash_block_size != 0:
        raise InvalidArgument(
            f"block_size {block_size} is not a multiple of hash_block_size {hash_block_size}"
        )
    return block_size // hash_block_size


class CoarseBlockHashes(Sequence[bytes]):
    """A read-only, live view of fine block hashes at ``block_size`` granularity.

    vLLM calls this ``BlockHashListWithBlockSize``. ``len`` is ``len(fine) // (bs / hbs)``:
    a coarse block whose fine hashes are not all there yet does not exist. Integer indices
    (negative ones count from the end) return one hash in O(1), slices return a list, any
    other index type raises :class:`TypeError`.
    """

    __slots__ = ("_fine", "_ratio", "block_size", "hash_block_size")

    def __init__(self, fine: Sequence[bytes], hash_block_size: int, block_size: int) -> None:
        self._ratio = _check_sizes(hash_block_size, block_size)
        self._fine = fine
        self.hash_block_size = hash_block_size
        self.block_size = block_size

    def __len__(self) -> int:
        return len(self._fine) // self._ratio

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, int):
            length = len(self)
            position = index + length if index < 0 else index
            if not 0 <= position < length:
                raise IndexError(f"coarse block index {index} out of range for length {length}")
            return self._fine[(position + 1) * self._ratio - 1]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        raise TypeError(
            f"coarse block hash indices must be int or slice, not {type(index).__name__}"
        )

    def __iter__(self) -> Iterator[bytes]:
        ratio = self._ratio
        fine = self._fine
        for position in range(len(self)):
            yield fine[(position + 1) * ratio - 1]

    def __repr__(self) -> str:
        return (
            f"CoarseBlockHashes(len={len(self)}, hash_block_size={self.hash_block_size}, "
            f"block_size={self.block_size})"
        )


def resolve_block_hashes(
    fine: Sequence[bytes], hash_block_size: int, block_size: int
) -> Sequence[bytes]:
    """``fine`` itself when ``block_size == hash_block_size``, else its coarse view.

    Raises :class:`InvalidArgument` when ``block_size`` is not a positive multiple of
    ``hash_block_size``.
    """
    if _check_sizes(hash_block_size, block_size) == 1:
        return fine
    return CoarseBlockHashes(fine, hash_block_size, block_size)


__all__ = ["CoarseBlockHashes", "resolve_block_hashes"]
