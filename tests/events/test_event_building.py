"""How events are built: one builder per pool, the token slicer requests share, and the
extra keys of requests that carry none."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random

import pytest

from kvpool import make_pool
from kvpool.errors import InvalidArgument
from kvpool.events import BlockRemoved, BlockStored, EventContext, materialize
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.hashing.extra_keys import event_extra_keys
from kvpool.hashing.request_view import token_slice
from kvpool.request import LoRARequest, MultiModalFeature, Request
from kvpool.spec.records import RemovedRecord, StoredRecord

HASHER = get_request_block_hasher(4, BlockHasher("sha256", seed="events"))
BACKENDS = ("spec", "reference", "fast")


def request(rid: str, tokens: list[int], **extras) -> Request:
    return Request(rid, tokens, block_hasher=HASHER, **extras)


def evicting_pool(backend: str):
    pool = make_pool(4, backend=backend, hash_block_size=4, enable_kv_cache_events=True)
    r = request("a", list(range(12)))
    ids = pool.get_new_blocks(3)
    pool.cache_full_blocks(r, ids, 0, 3, 4, 0)
    pool.free_blocks(ids[::-1])
    return pool, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pool_builds_its_events_with_the_builder_it_is_given(backend):
    pool, _ = evicting_pool(backend)
    assert [type(e) for e in pool.take_events()] == [BlockStored]
    seen = []

    def build(record, req, ctx):
        seen.append(record)
        return ("mine", materialize(record, req, ctx))

    pool.use_event_builder(build)
    pool.get_new_blocks(3)  # evicts the three cached blocks
    events = pool.take_events()
    assert [e[0] for e in events] == ["mine"] * 3
    assert [type(e[1]) for e in events] == [BlockRemoved] * 3
    assert all(isinstance(r, RemovedRecord) for r in seen)
    pool.use_event_builder(None)  # kvpool's own again
    pool.reset_prefix_cache()  # refused (blocks held): no event
    assert pool.take_events() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_builder_that_is_not_callable_is_refused_and_changes_nothing(backend):
    pool, _ = evicting_pool(backend)
    before = pool.abstract()
    with pytest.raises(InvalidArgument, match="callable"):
        pool.use_event_builder("materialize")
    assert pool.abstract() == before


def test_other_constructors_get_the_same_fields():
    ctx = EventContext(hash_block_size=4)
    key = b"\x01" * 32 + (3).to_bytes(4, "big")
    fields = materialize(RemovedRecord(7, key), None, ctx, removed=lambda **kw: kw)
    assert fields == {"block_hashes": [int.from_bytes(b"\x01" * 8, "big")], "medium": "GPU",
                      "group_idx": 3, "seq": 7}


@pytest.mark.parametrize("cls", [BlockStored, BlockRemoved])
def test_the_hand_written_event_constructors_take_exactly_the_fields(cls):
    # Their __init__ is written out (one dict update, not one object.__setattr__ per field):
    # it must take the fields in order, with the fields' defaults, and stay frozen.
    params = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        for f in fields]
    values = {f.name: (i if f.name != "block_hashes" else [i]) for i, f in enumerate(fields)}
    event = cls(**values)
    assert dataclasses.asdict(event) == values
    assert event == cls(*values.values()) and event != cls(**{**values, "seq": -7})
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.seq = 3
    assert repr(event).startswith(f"{cls.__name__}(block_hashes=[0]")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["partial", "function"])
def test_evictions_reach_a_partial_of_materialize_and_any_other_builder_alike(backend, kind):
    # A partial of materialize gets the removals without records (its removed
    # constructor, in bulk); another builder gets a RemovedRecord each: same events.
    made = []

    def removed(**fields):
        made.append(fields)
        return ("removed", fields)

    pool, _ = evicting_pool(backend)
    pool.take_events()
    if kind == "partial":
        pool.use_event_builder(functools.partial(materialize, removed=removed))
    else:
        pool.use_event_builder(lambda record, req, ctx: materialize(record, req, ctx,
                                                                   removed=removed))
    pool.get_new_blocks(3)  # evicts the three cached blocks, oldest first
    events = pool.take_events()
    assert [e[0] for e in events] == ["removed"] * 3 and len(made) == 3
    assert [e[1]["seq"] for e in events] == [1, 2, 3]
    reference, _ = evicting_pool("spec")
    reference.take_events()
    reference.get_new_blocks(3)
    assert [dataclasses.asdict(e) for e in reference.take_events()] == [
        {**fields, "locality": None, "ownership": None} for _, fields in events]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_one_block_write_reports_the_event_its_builder_makes_once(backend):
    # The fast pool builds a write's BlockStored once, before the write, with the sequence
    # number the write takes; every backend reports the same event, built one time.
    calls = []

    def build(record, req, ctx):
        calls.append(record)
        return materialize(record, req, ctx)

    pools = []
    for name in ("spec", backend):
        pool = make_pool(8, backend=name, hash_block_size=4, enable_kv_cache_events=True)
        r = request("w", list(range(16)))
        ids = pool.get_new_blocks(3)
        pool.cache_full_blocks(r, ids, 0, 1, 4, 0)
        pool.take_events()
        pool.use_event_builder(build)
        calls.clear()
        pool.cache_full_blocks(r, ids, 1, 2, 4, 0)
        pool.cache_full_blocks(r, ids, 2, 3, 4, 0)
        # The fast pool builds each write's event once, numbered; the others build a trial
        # (seq -1: can the event be built?) before the write and the event after it.
        assert [c.seq for c in calls] == ([1, 2] if name == "fast" else [-1, 1, -1, 2])
        pools.append(pool.take_events())
    assert pools[0] == pools[1]
    assert [(e.seq, e.parent_block_hash is not None, e.token_ids) for e in pools[1]] == [
        (1, True, [4, 5, 6, 7]), (2, True, [8, 9, 10, 11])]


@pytest.mark.parametrize("seed", range(5))
def test_request_token_slice_is_all_token_ids_sliced(seed):
    rng = random.Random(seed)
    r = request("r", [rng.randrange(100) for _ in range(rng.randrange(1, 30))])
    r.append_output_token_ids([rng.randrange(100) for _ in range(rng.randrange(0, 20))])
    n = r.num_tokens
    for _ in range(50):
        start = rng.randrange(0, n + 3)
        end = rng.randrange(start, n + 5)
        assert r.token_slice(start, end) == r.all_token_ids[start:end]
        assert token_slice(r, start, end) == r.all_token_ids[start:end]


def test_a_request_that_defines_its_own_tokens_is_sliced_through_them():
    class Shifted(Request):
        @property
        def all_token_ids(self) -> list[int]:
            return [t + 1 for t in self.prompt_token_ids + self.output_token_ids]

    r = Shifted("s", [1, 2, 3, 4, 5])
    assert r.token_slice(1, 3) == token_slice(r, 1, 3) == [3, 4]


def test_a_proxy_without_all_token_ids_is_not_sliced_through_the_request_it_wraps():
    class Proxy:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            if name == "all_token_ids":
                raise AttributeError(name)
            return getattr(self._inner, name)

    with pytest.raises(AttributeError):
        token_slice(Proxy(request("p", [1, 2, 3, 4])), 0, 2)


@pytest.mark.parametrize("extras", [
    {},
    {"lora_request": LoRARequest("adapter", 1, "/a")},
    {"cache_salt": "salt"},
    {"mm_features": [MultiModalFeature("img", 2, 5)]},
])
def test_stored_events_report_the_extra_keys_of_every_block(extras):
    r = request("x", list(range(16)), **extras)
    ctx = EventContext(hash_block_size=4)
    record = StoredRecord(seq=0, group_id=0, num_cached=0, num_full=4, block_size=4,
                          positions=(0, 1, 2, 3), hashes=tuple(r.block_hashes))
    event = materialize(record, r, ctx)
    assert event.extra_keys == [event_extra_keys(r, 4 * k, 4 * k + 4) for k in range(4)]
    assert (event.extra_keys == [None] * 4) == (not extras)


@pytest.mark.parametrize("start, end", [(-1, 2), (3, 1), ("0", 2), (0, 2.0), (True, 2),
                                        (0, None)])
def test_a_token_range_that_is_not_one_is_invalid_argument(start, end):
    """Request.token_slice and hashing's token_slice (a request without one) refuse alike,
    and the request is unchanged."""
    r = request("t", list(range(10)))
    before = (list(r.prompt_token_ids), list(r.output_token_ids), list(r.block_hashes))

    class Plain:  # a request that only has all_token_ids (vLLM's shape)
        all_token_ids = list(range(10))

    for call in (lambda: r.token_slice(start, end), lambda: token_slice(r, start, end),
                 lambda: token_slice(Plain(), start, end)):
        with pytest.raises(InvalidArgument, match="token range"):
            call()
    assert (r.prompt_token_ids, r.output_token_ids, list(r.block_hashes)) == before


def _burst(backend: str, use_int: bool, hash_len: int, build=None):
    """Twelve cached blocks of group 3 evicted by one allocation: the events it reports."""
    pool = make_pool(16, backend=backend, hash_block_size=4, enable_kv_cache_events=True,
                     use_int_block_hashes=use_int)
    r = request("burst", list(range(48)))
    if hash_len == 0:  # widths that differ within the burst (16 and 32 bytes)
        r.block_hashes = [h[: 16 << (i % 2)] for i, h in enumerate(r.block_hashes)]
    elif hash_len != 32:  # a hasher of another width: the request's hashes cut short
        r.block_hashes = [h[:hash_len] for h in r.block_hashes]
    ids = pool.get_new_blocks(12)
    pool.cache_full_blocks(r, ids, 0, 12, 4, 3)
    pool.free_blocks(ids[::-1])
    pool.take_events()
    if build is not None:
        pool.use_event_builder(build)
    pool.get_new_blocks(15)  # the three never used, then the twelve cached: evicted
    return pool.take_events()


@pytest.mark.parametrize("backend", ["reference", "fast"])
@pytest.mark.parametrize("use_int", [True, False])
@pytest.mark.parametrize("hash_len", [32, 6, 0])
def test_an_eviction_burst_reports_what_the_spec_reports(backend, use_int, hash_len,
                                                        monkeypatch):
    # The fast pool's allocation reports a burst's integer hashes and groups itself (any
    # width: kernels.get_new_blocks_reported), reads its bytes hashes from the key rows in
    # bulk (hashes of at least 8 bytes), and key by key otherwise: the same events always.
    from kvpool.events import EventLog
    from kvpool.fast.state import FastState

    bulk, kernel = [], []
    drain, rows = FastState.drain_removals, EventLog.record_removal_rows
    monkeypatch.setattr(FastState, "drain_removals",
                        lambda st: bulk.append(drain(st)) or bulk[-1])
    monkeypatch.setattr(EventLog, "record_removal_rows",
                        lambda log, r: kernel.append(r) or rows(log, r))
    expected = _burst("spec", use_int, hash_len)
    assert len(expected) == 12 and {e.group_idx for e in expected} == {3}
    assert _burst(backend, use_int, hash_len) == expected
    fields = _burst(backend, use_int, hash_len,
                    functools.partial(materialize, removed=lambda **kw: kw))
    assert fields == [{k: v for k, v in dataclasses.asdict(e).items()
                       if k not in ("locality", "ownership")} for e in expected]
    if backend == "fast" and use_int:  # the kernel read every burst
        assert [len(rows) for rows in kernel] == [12, 12] and not bulk
    elif backend == "fast":  # the bulk read ran, and answered for one width of 8+ bytes
        assert [b is not None for b in bulk] == [hash_len >= 8] * 2 and not kernel


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_a_write_that_rekeys_its_block_reports_the_removal_first(backend):
    # A table naming one block twice, under equal hashes: writing position 1 re-keys the
    # block position 0 keyed, so the write records a removal before its BlockStored. The
    # fast pool's event built before the write has the wrong number then and is rebuilt.
    reports = []
    for name in ("spec", backend):
        pool = make_pool(4, backend=name, hash_block_size=2, enable_kv_cache_events=True)
        r = request("twice", [0, 1, 0, 1, 5])
        r.block_hashes = [r.block_hashes[0]] * 2
        (b,) = pool.get_new_blocks(1)
        pool.cache_full_blocks(r, [b, b], 0, 1, 2, 0)
        pool.cache_full_blocks(r, [b, b], 1, 2, 2, 0)
        reports.append(pool.take_events())
    assert reports[1] == reports[0]
    assert [type(e) for e in reports[0]] == [BlockStored, BlockRemoved, BlockStored]
    assert [e.seq for e in reports[0]] == [0, 1, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_builder_that_raises_refuses_the_write_before_the_pool_moves(backend):
    # The builder runs before the write on every backend (the fast pool's one build, the
    # others' trial), so its failure refuses the write: no key, no sequence number taken.
    from kvpool import batch

    def build(record, req, ctx):
        if isinstance(record, StoredRecord):
            raise ValueError("this sink takes no BlockStored")
        return materialize(record, req, ctx)

    pool = make_pool(8, backend=backend, hash_block_size=4, enable_kv_cache_events=True)
    r = request("b", list(range(16)))
    ids = pool.get_new_blocks(3)
    pool.take_events()
    pool.use_event_builder(build)
    before = pool.abstract()
    for call in (lambda: pool.cache_full_blocks(r, ids, 0, 2, 4, 0),
                 lambda: pool.cache_full_blocks(r, ids, 1, 2, 4, 0),
                 lambda: batch.step(pool, [(r, ids, 0, 2)], 0, [], 4, 0),
                 lambda: getattr(pool, "step", lambda *a: batch.step(pool, *a))(
                     [(r, ids, 0, 3)], 1, [], 4, 0)):
        with pytest.raises(InvalidArgument, match="ValueError"):
            call()
        assert pool.abstract() == before
    pool.use_event_builder(None)
    pool.cache_full_blocks(r, ids, 0, 3, 4, 0)
    assert [e.seq for e in pool.take_events()] == [0]  # no number was taken before


@pytest.mark.parametrize("use_int", [True, False])
@pytest.mark.parametrize("num_cached, num_full", [(0, 20), (3, 20), (5, 6), (0, 7), (0, 8)])
def test_a_long_write_reads_its_hashes_from_the_packed_companion_alike(use_int, num_cached,
                                                                        num_full):
    # kvpool's requests keep their digests packed (BlockHashList): a write of 8 blocks or
    # more reads its integer hashes from there. The event equals the one built from a plain
    # list of the same digests, and the one materialize builds from the record.
    packed = request("p", list(range(80)))
    plain = request("p", list(range(80)))
    plain.block_hashes = list(packed.block_hashes)
    ctx = EventContext(hash_block_size=4, use_int_block_hashes=use_int)
    record = StoredRecord(seq=9, group_id=2, block_size=4, num_cached=num_cached,
                          num_full=num_full, positions=tuple(range(num_cached, num_full)),
                          hashes=tuple(plain.block_hashes[num_cached:num_full]))
    events = [materialize(record, r, ctx) for r in (packed, plain)]
    assert events[0] == events[1]
    assert events[0].block_hashes == [ctx.external(h) for h in record.hashes]


def test_with_spec_is_replace_of_the_two_spec_fields():
    # The manager annotates each BlockStored with its group's kind and window on the way
    # out; a copy, the original untouched, equal to what dataclasses.replace gives.
    event = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[1, 2],
                        block_size=2, lora_id=None, medium="GPU", group_idx=1, seq=4)
    annotated = event.with_spec("sliding_window", 128)
    assert annotated == dataclasses.replace(event, kv_cache_spec_kind="sliding_window",
                                            kv_cache_spec_sliding_window=128)
    assert event.kv_cache_spec_kind is None and type(annotated) is BlockStored
    with pytest.raises(dataclasses.FrozenInstanceError):
        annotated.seq = 5  # type: ignore[misc]
