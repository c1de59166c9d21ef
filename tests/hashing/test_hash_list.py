"""``BlockHashList``: its packed companion equals the list's digests under every mutation.

The state machine drives a :class:`BlockHashList` and a plain-list model with every list
mutator, entries drawn from digests of two widths and values that cannot be packed, and after
every step checks what is packed against ``b"".join`` of the model, reads the whole list (so
the next mutation meets a packed list), and checks that every view handed out earlier still
shows the bytes it showed then. Reads of any prefix, copies and lazy packing are rules.
"""

from __future__ import annotations

import copy
import doctest
import pickle

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvpool import hash_list
from kvpool.hash_list import BlockHashList
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.request import Request


class Digest(bytes):
    """A bytes subclass: packable by its buffer, but kvpool reads ``bytes(h)``; not packed."""


WIDE = st.sampled_from([bytes([i]) * 4 for i in range(6)])  # the common width, mostly
ENTRIES = st.one_of(
    WIDE, WIDE, WIDE, WIDE,
    st.sampled_from([b"", b"xy", b"123456"]),  # another width
    st.sampled_from([bytearray(b"abcd"), "abcd", 7, None, Digest(b"abcd")]),  # not bytes
)


def expected(entries: list) -> list[bytes | None]:
    """``packed(n)`` for every ``n``: the join while every entry is exactly ``bytes`` of the
    first entry's width, ``None`` from the first one that is not."""
    out: list[bytes | None] = [b""]
    for i, h in enumerate(entries):
        ok = out[-1] is not None and type(h) is bytes and len(h) == len(entries[0])
        out.append(b"".join(entries[: i + 1]) if ok else None)
    return out


class CompanionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.hashes = BlockHashList()
        self.model: list = []
        self.views: list[tuple[np.ndarray, bytes]] = []

    def both(self, name: str, *args, **kwargs) -> None:
        note(f"hashes.{name}(*{args!r}, **{kwargs!r})")
        results = []
        for target in (self.hashes, self.model):
            try:
                results.append(("ok", getattr(target, name)(*args, **kwargs)))
            except Exception as error:  # noqa: BLE001 - both must raise alike
                results.append(("error", type(error)))
        assert results[0] == results[1]

    @rule(h=ENTRIES)
    def append(self, h):
        self.both("append", h)

    @rule(hs=st.lists(ENTRIES, max_size=5), kind=st.sampled_from(["list", "tuple", "iter"]))
    def extend(self, hs, kind):
        values = {"list": hs, "tuple": tuple(hs), "iter": iter(hs)}[kind]
        note(f"hashes.extend({kind}({hs!r}))")
        self.hashes.extend(values)
        self.model.extend(hs)

    @rule(hs=st.lists(ENTRIES, max_size=3))
    def iadd(self, hs):
        note(f"hashes += {hs!r}")
        self.hashes += hs
        self.model += hs

    @rule()
    def extend_by_itself(self):
        note("hashes.extend(hashes)")
        self.hashes.extend(self.hashes)
        self.model.extend(list(self.model))

    @rule(i=st.integers(-8, 8), h=ENTRIES)
    def setitem(self, i, h):
        self.both("__setitem__", i, h)

    @rule(start=st.integers(-8, 8), stop=st.integers(-8, 8), hs=st.lists(ENTRIES, max_size=3))
    def set_slice(self, start, stop, hs):
        self.both("__setitem__", slice(start, stop), hs)

    @rule(i=st.integers(-8, 8))
    def delitem(self, i):
        self.both("__delitem__", i)

    @rule(start=st.integers(-8, 8), stop=st.integers(-8, 8))
    def del_slice(self, start, stop):
        self.both("__delitem__", slice(start, stop))

    @rule(i=st.integers(-8, 8), h=ENTRIES)
    def insert(self, i, h):
        self.both("insert", i, h)

    @rule(i=st.one_of(st.none(), st.integers(-8, 8)))
    def pop(self, i):
        self.both("pop", *(() if i is None else (i,)))

    @rule(h=ENTRIES)
    def remove(self, h):
        self.both("remove", h)

    @precondition(lambda self: all(type(h) is bytes for h in self.model))
    @rule(reverse=st.booleans())
    def sort(self, reverse):
        self.both("sort", reverse=reverse)

    @rule()
    def reverse(self):
        self.both("reverse")

    @rule(times=st.integers(-1, 3))
    def imul(self, times):
        note(f"hashes *= {times}")
        self.hashes *= times
        self.model *= times

    @rule()
    def clear(self):
        self.both("clear")

    @rule(hs=st.lists(ENTRIES, max_size=4))
    def reinit(self, hs):
        note(f"hashes.__init__({hs!r})")
        self.hashes.__init__(hs)
        self.model.__init__(hs)

    @rule()
    def pack(self):
        self.hashes.pack()

    @rule()
    def read_all(self):
        view = self.hashes.packed(len(self.model))
        assert (None if view is None else bytes(view)) == expected(self.model)[-1]
        if view is not None:
            self.views.append((view, bytes(view)))

    @rule(data=st.data())
    def read(self, data):
        count = data.draw(st.integers(-1, len(self.model) + 1))
        view = self.hashes.packed(count)
        want = expected(self.model)[count] if 0 <= count <= len(self.model) else None
        assert (None if view is None else bytes(view)) == want, count
        if view is not None:
            assert not view.flags.writeable
            self.views.append((view, bytes(view)))

    @rule()
    def copies(self):
        for twin in (copy.copy(self.hashes), copy.deepcopy(self.hashes),
                     pickle.loads(pickle.dumps(self.hashes))):
            assert type(twin) is BlockHashList and twin == self.model
            assert bytes(twin.packed(twin.packed_count)) == expected(self.model)[
                twin.packed_count]

    @invariant()
    def companion_covers_a_packed_prefix(self):
        """What is packed is a prefix of the list; then a reader of the whole list (which
        packs the rest) gets the join, so the next step starts from a packed list."""
        assert self.hashes == self.model
        count = self.hashes.packed_count
        assert 0 <= count <= len(self.model)
        if count:
            assert bytes(self.hashes.buffer[: count * self.hashes.width]) == expected(
                self.model)[count]
        view = self.hashes.packed(len(self.model))
        assert (None if view is None else bytes(view)) == expected(self.model)[-1]

    @invariant()
    def views_handed_out_never_change(self):
        for view, seen in self.views:
            assert bytes(view) == seen


TestCompanion = CompanionMachine.TestCase
TestCompanion.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)


def test_the_module_examples_run():
    assert doctest.testmod(hash_list).failed == 0


def test_appends_pack_lazily_and_a_bad_entry_stops_the_packing_for_good():
    hashes = BlockHashList([b"aa", b"bb"])
    assert hashes.packed_count == 0  # not packed until asked
    assert bytes(hashes.packed(2)) == b"aabb" and hashes.packed_count == 2
    hashes.append(b"cc")
    assert hashes.packed_count == 2 and bytes(hashes.packed(3)) == b"aabbcc"
    hashes += [bytearray(b"dd"), b"ee"]
    assert hashes.packed(5) is None and hashes.packed(4) is None
    assert bytes(hashes.packed(3)) == b"aabbcc" and hashes.pack() == 3
    hashes[3] = b"dd"  # the bad entry replaced: everything packs again
    assert bytes(hashes.packed(5)) == b"aabbccddee"


def test_every_mutator_but_appending_drops_the_companion():
    mutations = {
        "setitem": lambda h: h.__setitem__(0, b"zz"),
        "set slice": lambda h: h.__setitem__(slice(0, 1), [b"zz"]),
        "delitem": lambda h: h.__delitem__(0),
        "insert": lambda h: h.insert(0, b"zz"),
        "pop": lambda h: h.pop(),
        "remove": lambda h: h.remove(b"aa"),
        "sort": lambda h: h.sort(reverse=True),
        "reverse": lambda h: h.reverse(),
        "imul": lambda h: h.__imul__(2),
        "clear": lambda h: h.clear(),
        "init": lambda h: h.__init__([b"zz"]),
    }
    for name, mutate in mutations.items():
        hashes = BlockHashList([b"aa", b"bb", b"cc"])
        hashes.pack()
        before = hashes.buffer
        mutate(hashes)
        assert hashes.packed_count == 0 and hashes.buffer is None, name
        assert bytes(hashes.packed(len(hashes))) == b"".join(hashes), name
        assert hashes.buffer is not before, name


def test_a_mutation_that_fails_half_way_still_drops_the_companion():
    hashes = BlockHashList([b"bb", b"aa", b"cc"])
    hashes.pack()
    with pytest.raises(ZeroDivisionError):
        hashes.sort(key=lambda h: 1 // (h != b"cc"))
    assert hashes.packed_count == 0
    assert bytes(hashes.packed(3)) == b"".join(hashes)


def test_growth_keeps_old_views_and_copies_the_packed_bytes():
    hashes = BlockHashList()
    views = []
    for i in range(300):
        hashes.append(i.to_bytes(8, "little"))
        views.append((hashes.packed(i + 1), b"".join(hashes)))
    for view, seen in views:
        assert bytes(view) == seen


def test_a_requests_hashes_are_packed_by_the_request_and_survive_copies():
    hasher = get_request_block_hasher(4, BlockHasher("sha256", seed="test"))
    r = Request("r", list(range(18)), block_hasher=hasher)
    assert type(r.block_hashes) is BlockHashList and r.block_hashes.packed_count == 4
    r.append_output_token_ids([1, 2])  # a fifth block: appended, packed when read
    assert len(r.block_hashes) == 5 and r.block_hashes.packed_count == 4
    assert bytes(r.block_hashes.packed(5)) == b"".join(r.block_hashes)
    twin = copy.deepcopy(r)
    assert type(twin.block_hashes) is BlockHashList and twin.block_hashes == r.block_hashes
    assert twin.block_hashes is not r.block_hashes
    assert bytes(twin.block_hashes.packed(5)) == b"".join(r.block_hashes)
    plain = Request("p", list(range(8)))
    plain.block_hashes.extend(list(r.block_hashes))
    back = pickle.loads(pickle.dumps(plain))
    assert type(back.block_hashes) is BlockHashList and back.block_hashes == r.block_hashes
    assert bytes(back.block_hashes.packed(5)) == b"".join(r.block_hashes)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(min_size=3, max_size=3), max_size=40))
def test_a_list_of_one_width_packs_to_its_join(hashes):
    packed = BlockHashList(hashes)
    assert bytes(packed.packed(len(hashes))) == b"".join(hashes)
    assert packed.width == (3 if hashes else -1)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([8, 16, 32, 12, 3]), st.lists(st.sampled_from(["one", "odd", "sub"]),
                                                    max_size=30), st.data())
def test_tail_words_are_the_integer_hashes_events_report(width, kinds, data):
    """What an event reports of integer hashes (each hash's last 8 bytes, big-endian),
    read from the companion; ``None`` exactly where the companion cannot answer."""
    entries = [bytes(data.draw(st.binary(min_size=width, max_size=width))) if kind == "one"
               else bytes(data.draw(st.binary(min_size=16, max_size=16))) if kind == "odd"
               else Digest(bytes(width)) for kind in kinds]
    start = data.draw(st.integers(-1, len(entries) + 1))
    stop = data.draw(st.integers(-1, len(entries) + 1))
    words = BlockHashList(entries).tail_words(start, stop)
    run = entries[start:stop] if 0 <= start <= stop <= len(entries) else None
    answerable = (run is not None and width % 8 == 0 and all(
        type(h) is bytes and len(h) == width for h in entries[:stop]))
    if words is None:
        assert not answerable or (start == stop)
    else:
        assert run is not None and words == [int.from_bytes(h[-8:], "big") for h in run]
    if answerable and start < stop:
        assert words is not None
