"""``BlockHashList``: a request's ``block_hashes``, with its digests also packed back to back.

A batch kernel reads hashes as one uint8 buffer plus lengths. Building that buffer from a
list of ``bytes`` costs three passes over the list per call (type check, join, length
check), and an admission reads ~100 hashes. :class:`BlockHashList` keeps the buffer beside
the list instead: :meth:`~BlockHashList.pack` writes the digests not yet packed (whoever
computes hashes calls it then, off the pool's clock: :class:`kvpool.request.Request` does
after hashing a prompt), and a reader takes a zero-copy view with
:meth:`~BlockHashList.packed` in O(1).

**Why the companion can be trusted.** The companion covers a *prefix*: its buffer holds
the first ``_count`` entries, each exactly ``bytes`` of the common width (that of the first
digest packed), back to back. What can change a list's prefix?

* ``append`` / ``extend`` / ``+=`` only add entries at the end, so they leave every covered
  entry where it was. They are not overridden: they stay list-speed (a decode step's
  digest costs what it costs on a plain list), and what they add is packed later.
* Everything else that can change an existing entry or shorten the list is overridden and
  drops the companion before the list changes and again after (:func:`_dropping` says
  why): ``__setitem__``, ``__delitem__``, ``insert``, ``pop``, ``remove``, ``sort``,
  ``reverse``, ``*=`` (``*= 0`` empties), ``clear`` and ``__init__``. The next ``pack``
  starts over from the entries as they are then.

So ``count <= _count`` proves that ``packed(count)`` equals ``b"".join(self[:count])``.
``pack`` stops at the first entry it cannot pack (not exactly ``bytes``, or another width)
and remembers where (appends cannot change that entry either), so asking again costs O(1).
Bytes once written at a position of a buffer are never rewritten: growing copies into a new
buffer and dropping the companion drops its buffer, so a view handed out earlier keeps
describing exactly the entries it covered.

Not seen, by design of Python rather than of this class: list methods called on the object
explicitly (``list.sort(hashes)``) and C code that writes list slots directly (``heapq``).
Nothing in kvpool or vLLM does that to block hashes, which are append-only (BEHAVIOUR.md §2).

Costs: appending is a plain list append; ``pack`` is one Python call plus ~50 ns per new
digest (type and length checks, one copy). Memory: the digests a second time, in a buffer
that doubles as it grows (up to 2x the packed size).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, SupportsIndex

import numpy as np

_BYTES_ONLY = {bytes}
_NO_BYTES = np.empty(0, np.uint8)
_NO_BYTES.flags.writeable = False
_MIN_CAPACITY = 64  # digests a grown buffer holds at least (the first is the exact join)


def _dropping(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of ``list``, dropping the companion before (an error half way cannot leave
    it trusted) and after (Python code the change runs — an entry's ``__eq__`` or
    ``__del__``, a sort key — cannot have packed entries that then moved)."""

    def mutator(self: BlockHashList, /, *args: Any, **kwargs: Any) -> Any:
        self._drop()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._drop()

    mutator.__name__ = mutator.__qualname__ = method.__name__
    mutator.__doc__ = method.__doc__
    return mutator


class BlockHashList(list):  # type: ignore[type-arg]
    """A list of block hashes whose ``bytes`` digests are also kept packed (see the module).

    >>> hashes = BlockHashList([b"ab", b"cd"])
    >>> hashes.append(b"ef")
    >>> bytes(hashes.packed(3)), hashes.width
    (b'abcdef', 2)
    >>> hashes.append("not bytes")
    >>> hashes.packed(4) is None, bytes(hashes.packed(2))
    (True, b'abcd')
    >>> hashes[0] = b"zz"  # not an append: packed again from the entries as they are
    >>> bytes(hashes.packed(3))
    b'zzcdef'
    """

    # Class-level defaults, not slots: an instance made without __init__ (``__new__``
    # alone) is then an empty companion, never one with missing fields.
    _buf: np.ndarray | None = None  # the packed digests; capacity beyond the used part
    _view: memoryview | None = None  # _buf as a memoryview to write through (None: read-only)
    _count = 0  # entries [0, _count) are packed
    _width = -1  # the common digest width, -1 before the first digest
    _blocked = -1  # the first entry pack() could not pack (-1: none found)

    def __init__(self, iterable: Iterable[Any] = (), /) -> None:
        self._drop()  # __init__ again (a list then starts over): back to the defaults
        list.__init__(self, iterable)

    def _drop(self) -> None:
        """Forget the companion (an entry may change): the next pack starts over."""
        vars(self).clear()

    # -- the companion -----------------------------------------------------------------------

    @property
    def width(self) -> int:
        """The common digest width, or ``-1`` when no digest is packed."""
        return self._width

    @property
    def buffer(self) -> np.ndarray | None:
        """The buffer the packed digests live in (``None`` when none are). Readers compare
        it by identity: while it is the same object, the packed prefix did not change."""
        return self._buf

    @property
    def packed_count(self) -> int:
        """How many leading entries are packed now. O(1)."""
        return self._count

    def packed(self, count: int) -> np.ndarray | None:
        """The first ``count`` digests back to back, as a read-only uint8 view (no copy), or
        ``None`` when one of them cannot be packed (not exactly ``bytes``, or not of the
        common width) or ``count`` is outside ``[0, len(self)]``.

        O(1) when they are packed already, else it packs the rest first (:meth:`pack`).
        The view never changes afterwards, whatever happens to the list.
        """
        if count > self._count:
            if not count <= len(self) or 0 <= self._blocked < count:
                return None
            self.pack()
            if count > self._count:
                return None
        elif count <= 0:
            return _NO_BYTES if count == 0 else None
        return self._buf[: count * self._width]  # type: ignore[index]

    def tail_words(self, start: int, stop: int) -> list[int] | None:
        """The last 8 bytes of entries ``[start, stop)`` read big-endian — what events
        report of integer hashes (:func:`kvpool.keys.external_block_hash`) — from the
        packed companion in one pass; ``None`` when those entries are not packed (see
        :meth:`packed`), or their width is not a multiple of 8. O(stop - start)."""
        view = self.packed(stop) if 0 <= start <= stop else None
        width = self._width
        if view is None or width <= 0 or width % 8:
            return None
        words = view[start * width :].view(">u8").reshape(stop - start, width // 8)
        return words[:, -1].tolist()  # type: ignore[no-any-return]

    def pack(self) -> int:
        """Pack the entries not packed yet, up to the first that cannot be; the number of
        entries packed now. O(new entries)."""
        at, n = self._count, len(self)
        if at == n or self._blocked >= 0:
            return at
        new = self[at:] if at else self
        if set(map(type, new)) == _BYTES_ONLY:
            widths = set(map(len, new))
            width = widths.pop() if len(widths) == 1 else -2
        else:
            width = -2
        if width < 0 or (self._width >= 0 and width != self._width):  # find the first bad one
            width = self._width
            for i, h in enumerate(new):
                if type(h) is not bytes or width >= 0 and len(h) != width:
                    new = new[:i]
                    self._blocked = at + i
                    break
                width = len(h)
            if not new:
                return at
        self._width = width
        start = at * width
        end = start + len(new) * width
        if self._buf is None:  # the first digests (a prompt's): their join is the buffer
            self._buf = np.frombuffer(b"".join(new), np.uint8)
        else:
            if self._view is None or end > len(self._view):
                self._grow(start, end)
            self._view[start:end] = b"".join(new)  # type: ignore[index]
        self._count = at + len(new)
        return self._count

    def _grow(self, used: int, needed: int) -> None:
        """A new buffer of at least ``needed`` bytes (doubling), holding the ``used`` ones.
        The old one is left as it is: views of it stay what they were."""
        old = self._buf
        capacity = max(needed, 2 * (0 if old is None else old.shape[0]),
                       _MIN_CAPACITY * self._width)
        buf = np.empty(capacity, np.uint8)
        if old is not None and used:
            buf[:used] = old[:used]
        view = memoryview(buf)  # type: ignore[arg-type]  # numpy's stubs: no __buffer__ (<3.12)
        buf.flags.writeable = False  # readers' views are read-only; this class writes via view
        self._buf, self._view = buf, view

    # -- every mutator that can change an entry or shorten the list: drop around it -----

    __setitem__ = _dropping(list.__setitem__)
    __delitem__ = _dropping(list.__delitem__)
    __imul__ = _dropping(list.__imul__)  # type: ignore[assignment]
    insert = _dropping(list.insert)
    pop = _dropping(list.pop)
    remove = _dropping(list.remove)
    sort = _dropping(list.sort)
    reverse = _dropping(list.reverse)
    clear = _dropping(list.clear)

    # -- copying: a new list of the same entries, packed afresh -------------------------------

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        return (_rebuild, (list(self), self._count))

    def __copy__(self) -> BlockHashList:
        return _rebuild(list(self), self._count)


LIST_TYPES = (list, BlockHashList)
"""The exact types of ``block_hashes`` that lean paths index directly (anything else, a
tuple or a vLLM request's own sequence, goes through the generic checks)."""


def _rebuild(entries: list[Any], packed: int) -> BlockHashList:
    """A copy or an unpickled list: the entries, packed as far as the original was."""
    hashes = BlockHashList(entries)
    if packed > 0:
        hashes.pack()
    return hashes


__all__ = ["LIST_TYPES", "BlockHashList"]
