"""The lean paths read a request's packed companion (``BlockHashList``), not its list.

Counted, not timed: ``admit``, ``cache_full_blocks`` and ``step`` must take the view of the
companion when it covers what they read (no pass over the hashes: ``_packed`` and
``hash_buffer`` are not called), must keep today's path for a plain list, and must agree
with the spec either way (the lockstep of :mod:`test_fast_batch_verbs` drives five pools).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from fast_twin import block_hash, fast_pool
from test_fast_batch_verbs import HBS, Lockstep, request

from kvpool.fast import convert, verbs
from kvpool.fast import pool as pool_module
from kvpool.hash_list import BlockHashList
from kvpool.request import Request


@pytest.fixture
def calls(monkeypatch) -> Counter:
    """Counts of companion views (``companion``) and list packings (``list``)."""
    counts: Counter = Counter()

    def counting(name, fn):
        def counted(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return counted

    monkeypatch.setattr(BlockHashList, "packed", counting("companion", BlockHashList.packed))
    monkeypatch.setattr(verbs, "_packed", counting("list", verbs._packed))
    monkeypatch.setattr(verbs, "hash_buffer", counting("list", convert.hash_buffer))
    monkeypatch.setattr(pool_module, "hash_buffer", counting("list", convert.hash_buffer))
    return counts


def plain(labels: list[str]) -> Request:
    """A request whose ``block_hashes`` is a plain list (as a vLLM request's is)."""
    r = request("plain", labels)
    r.block_hashes = list(r.block_hashes)  # type: ignore[assignment]
    return r


def test_admit_reads_the_companion_and_a_plain_list_still_packs(calls):
    pool = fast_pool(16, jit=True, hash_block_size=HBS)
    r = request("r", ["p0", "p1", "p2", "r3"])
    hits, new = pool.admit(r, 3, 4, 4, 0, HBS, 0)
    assert hits == [] and len(new) == 4
    assert calls == {"companion": 1}
    pool.free_blocks(new[::-1])
    hits2, new2 = pool.admit(plain(["p0", "p1", "p2", "q3"]), 3, 4, 4, 0, HBS, 0)
    assert hits2 == new[:3] and len(new2) == 1  # the companion's keys are the list's keys
    assert calls == {"companion": 1, "list": 1}


def test_admit_reads_a_packed_companion_buffer_as_it_is(calls):
    pool = fast_pool(16, jit=True, hash_block_size=HBS)
    r = request("r", ["p0", "p1", "p2", "r3"])
    r.block_hashes.pack()  # as a Request does when it hashes its prompt
    hits, new = pool.admit(r, 3, 4, 4, 0, HBS, 0)
    assert hits == [] and calls == {}  # no view, no pass over the hashes
    pool.free_blocks(new[::-1])
    r.block_hashes.append(block_hash("r4"))  # not packed yet, and not read: still as it is
    hits, _ = pool.admit(r, 3, 4, 4, 0, HBS, 0)
    assert hits == new[:3] and calls == {}


def test_a_refused_admission_leaves_a_memo_the_next_attempt_uses():
    pool = fast_pool(8, jit=True, hash_block_size=HBS)
    a = request("a", ["p0", "p1", "p2"])
    a.block_hashes.pack()
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(a, blocks, 0, 3, HBS, 0)
    pool.free_blocks(blocks[::-1])
    held = pool.get_new_blocks(3)  # 4 free left, 3 of them cached hits
    b = request("b", ["p0", "p1", "p2", "b3", "b4"])
    b.block_hashes.pack()
    assert pool.admit(b, 4, 5, 5, 0, HBS, 0) is None  # 3 evictable + 2 new > 4 free
    _, known = pool._scan_memo(b.block_hashes.buffer, 0, 5)
    assert known == 3  # the same buffer, the same group: the three hits are remembered
    assert pool._scan_memo(b.block_hashes.buffer, 1, 5)[1] == 0  # another group: none
    pool.free_blocks(held[:1])
    hits, new = pool.admit(b, 4, 5, 5, 0, HBS, 0)
    assert hits == blocks and len(new) == 2


def test_a_waiting_request_gets_the_same_packed_hashes_until_they_change(calls):
    pool = fast_pool(8, jit=True, hash_block_size=HBS)
    r = request("r", ["a0", "a1", "a2"])
    packed = pool._packed_prefix(r.block_hashes, 3)
    assert pool._packed_prefix(r.block_hashes, 3) is packed  # the scan memo applies
    r.block_hashes.append(block_hash("a3"))  # appending leaves the prefix as it was
    assert pool._packed_prefix(r.block_hashes, 3) is packed
    r.block_hashes[1] = block_hash("a1")  # an equal hash: packed afresh all the same
    again = pool._packed_prefix(r.block_hashes, 3)
    assert again is not packed and bytes(again[0]) == bytes(packed[0])
    assert calls["list"] == 0


def test_cache_full_blocks_reads_the_companion_for_a_batch_of_blocks(calls):
    pool = fast_pool(16, jit=True, hash_block_size=HBS)
    r = request("r", ["c0", "c1", "c2", "c3"])
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(r, blocks, 0, 3, HBS, 0)
    assert calls == {"companion": 1}
    pool.cache_full_blocks(r, blocks, 3, 4, HBS, 0)  # one block: the hash itself, no view
    assert calls == {"companion": 1}
    assert pool.get_cached_block(block_hash("c2"), [0]) == [blocks[2]]
    other = plain(["d0", "d1"])
    more = pool.get_new_blocks(2)
    pool.cache_full_blocks(other, more, 0, 2, HBS, 0)
    assert calls == {"companion": 1, "list": 1}


def test_the_lean_paths_agree_with_the_spec_on_a_companion_and_on_a_plain_list():
    for make in (lambda labels: request("r", labels), plain):
        pools = Lockstep(12, enable_kv_cache_events=True)
        r = make(["e0", "e1", "e2", "e3"])
        blocks = pools.get_new_blocks(4)
        pools.cache_full_blocks(r, blocks, 0, 4, HBS, 0)
        pools.free_blocks(blocks[::-1])
        s = make(["e0", "e1", "f2", "f3"])
        hits, new = pools.admit(s, 3, 4, 4, 0, HBS, 0)
        assert hits == blocks[:2]
        s.block_hashes.append(block_hash("f4"))  # a decode step fills a fifth block
        table = hits + new + pools.step([], 1, [], HBS, 0)
        pools.step([(s, table, 4, 5)], 0, [table], HBS, 0)
        assert pools.spec.get_cached_block(block_hash("f4"), [0]) == [table[4]]


MUTATIONS = {
    "setitem": lambda h: h.__setitem__(1, block_hash("x1")),
    "delitem": lambda h: h.__delitem__(1),
    "insert": lambda h: h.insert(1, block_hash("x1")),
    "pop": lambda h: (h.pop(), h.append(block_hash("x3"))),
    "remove": lambda h: h.remove(block_hash("g1")),
    "reverse": lambda h: h.reverse(),
    "sort": lambda h: h.sort(),
    "imul": lambda h: h.__imul__(2),
    "clear": lambda h: (h.clear(), h.extend([block_hash("g0"), block_hash("x1")] * 2)),
}


@pytest.mark.parametrize("how", sorted(MUTATIONS))
def test_a_mutated_list_is_read_as_it_is_now(how):
    pools = Lockstep(16)
    r = request("r", ["g0", "g1", "g2", "g3"])
    hits, new = pools.admit(r, 3, 4, 4, 0, HBS, 0)  # packs and caches g0..g3
    pools.free_tables([hits + new])
    MUTATIONS[how](r.block_hashes)
    num = min(len(r.block_hashes), 4)
    hits, new = pools.admit(r, num - 1, num, num, 0, HBS, 0)  # the spec reads the list
    cached = {block_hash(label) for label in ("g0", "g1", "g2", "g3")}
    leading = next((i for i, h in enumerate(r.block_hashes[: num - 1]) if h not in cached),
                   num - 1)
    assert len(hits) == leading  # the list as it is now, whatever the companion held


def test_a_decode_step_joins_its_hashes_without_hash_buffers_passes(calls):
    pool = fast_pool(16, jit=True, hash_block_size=HBS)
    a, b = request("a", ["a0", "a1"]), request("b", ["b0", "b1"])
    ta, tb = pool.get_new_blocks(2), np.array(pool.get_new_blocks(2), np.int64)
    pool.step([(a, ta, 1, 2), (b, tb, 1, 2)], 1, [], HBS, 0)
    assert calls["list"] == 0
    assert pool.get_cached_block(block_hash("b1"), [0]) == [int(tb[1])]


def test_a_step_over_hashes_of_two_widths_agrees_with_the_spec(calls):
    pools = Lockstep(12)
    a = request("a", ["a0", "a1"])
    b = request("b", ["b0", "b1"], size=16)
    ta, tb = pools.get_new_blocks(2), pools.get_new_blocks(2)
    pools.step([(a, ta, 1, 2), (b, tb, 1, 2)], 0, [], HBS, 0)
    assert calls["list"] >= 1  # mixed widths: hash_buffer builds the lengths
    assert pools.spec.get_cached_block(block_hash("b1", 16), [0]) == [tb[1]]
