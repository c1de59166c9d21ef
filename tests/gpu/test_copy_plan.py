"""The jitted copy planner: each rule caught by the kernel itself (a batch breaking exactly
that rule), the rules' order, hostile ids, and the interleaved copy kernel (equality with the
old numpy planner on random batches: test_copy_plan_oracle.py)."""

import numpy as np
import pytest
import torch

from kvpool.errors import InvalidArgument, InvalidBlockId, InvalidGroupId, KvPoolError
from kvpool.gpu import BlockCopier, InvalidCopyPair, PagedKVCache
from kvpool.gpu import cpu_kernels as ck
from kvpool.gpu.copy_plan import CopyPlanner, as_pair_array, coalesce, segments
from kvpool.policy import (
    BlockCopy,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

from . import plan_oracle as oracle

BLOCKS = 14
CONFIG = KVCacheConfig(BLOCKS, (
    KVCacheGroupSpec(FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8)),
    KVCacheGroupSpec(SlidingWindowSpec(block_size=2, num_kv_heads=1, head_size=4,
                                       sliding_window=4)),
    KVCacheGroupSpec(MambaSpec(block_size=4, mamba_cache_mode="align")),
))
DEVICE = PagedKVCache(CONFIG, torch.float16, num_layers=2)
HOST = PagedKVCache(CONFIG, torch.float16, num_layers=2, num_blocks=6)
I64 = np.iinfo(np.int64)
EMPTY = np.zeros(0, np.int64)

# (src cache, dst cache, same_space, null_dst): a device copy, a swap out, a swap in
SIDES = {
    "copy": (DEVICE, DEVICE, True, True),
    "swap_out": (DEVICE, HOST, False, False),
    "swap_in": (HOST, DEVICE, False, True),
}


def kernel(rows, side="copy", refs_mode=ck.NO_REFS, refs=EMPTY, retained=()):
    """The kernel alone on ``rows``: ``(info, segments, marks)``."""
    src, dst, same_space, null_dst = SIDES[side]
    planner = CopyPlanner(src, dst, same_space=same_space, null_dst=null_dst)
    m, info = planner.map, np.zeros(4, np.int64)
    seg = ck.plan_copies(np.array(rows, np.int64).reshape(-1, 3), len(CONFIG.kv_cache_groups),
                         src.num_blocks, dst.num_blocks,
                         same_space, null_dst, refs_mode, np.asarray(refs, np.int64),
                         np.array(retained, np.int64), planner._marks, m.src_bases,
                         m.dst_bases, m.start, m.words, ck.RADIX_BITS, info)
    return info.tolist(), seg, planner._marks


# -- each rule, caught by the kernel itself ---------------------------------------------------
# Every case is a valid batch but for one rule; without that rule the kernel would say OK.

@pytest.mark.parametrize(("side", "rows", "code", "index"), [
    ("copy", [(1, 5, 0), (2, 6, 3)], ck.BAD_GROUP, 1),
    ("copy", [(1, 5, 0), (2, 6, -1)], ck.BAD_GROUP, 1),
    ("copy", [(1, 5, 0), (BLOCKS, 6, 1)], ck.BAD_SOURCE, 1),
    ("copy", [(-1, 5, 0)], ck.BAD_SOURCE, 0),
    ("copy", [(1, 5, 0), (2, BLOCKS, 0)], ck.BAD_DESTINATION, 1),
    ("swap_out", [(1, 5, 0), (2, 6, 0)], ck.BAD_DESTINATION, 1),  # the host has 6 blocks
    ("swap_in", [(6, 5, 0)], ck.BAD_SOURCE, 0),
    ("copy", [(1, 5, 0), (0, 6, 0)], ck.NULL_PAIR, 1),
    ("copy", [(1, 5, 0), (2, 0, 0)], ck.NULL_PAIR, 1),
    ("swap_out", [(0, 1, 0)], ck.NULL_PAIR, 0),  # the device's null block holds nothing
    ("swap_in", [(1, 0, 0)], ck.NULL_PAIR, 0),
    ("copy", [(1, 5, 0), (2, 6, 0), (3, 5, 1)], ck.DESTINATION_TWICE, 2),
    ("swap_out", [(1, 5, 0), (2, 5, 1)], ck.DESTINATION_TWICE, 1),
    ("copy", [(1, 5, 0), (2, 6, 0), (6, 7, 1)], ck.DESTINATION_IS_SOURCE, 1),
])
def test_each_rule_is_checked_by_the_kernel(side, rows, code, index) -> None:
    info, seg, marks = kernel(rows, side)
    assert info[:2] == [code, index] and len(seg) == 0
    assert not marks.any()  # the scratch is clean again, whatever failed


def test_the_rules_that_do_not_apply_to_a_side_let_its_batches_through() -> None:
    assert kernel([(0, 1, 0)], "swap_in")[0][0] == ck.OK  # host block 0 is a block
    assert kernel([(1, 0, 0)], "swap_out")[0][0] == ck.OK
    assert kernel([(1, 5, 0), (5, 1, 0)], "swap_out")[0][0] == ck.OK  # two id spaces


def test_a_duplicate_names_the_pair_that_took_the_destination_first() -> None:
    info, _, _ = kernel([(1, 5, 0), (2, 6, 0), (3, 6, 0), (4, 5, 0)])
    assert info[:3] == [ck.DESTINATION_TWICE, 2, 1]


def test_is_source_names_the_first_pair_whose_destination_is_read() -> None:
    # pair 2's destination is read by pair 0, pair 1's by pair 3: pair 1 comes first
    info, _, _ = kernel([(9, 1, 0), (2, 7, 0), (3, 9, 0), (7, 4, 0)])
    assert info[:2] == [ck.DESTINATION_IS_SOURCE, 1]


@pytest.mark.parametrize("mode", [ck.REFS_BY_PAIR, ck.REFS_BY_BLOCK])
def test_a_shared_destination_is_caught_less_the_batchs_retentions(mode) -> None:
    rows = [(1, 5, 0), (2, 6, 0)]
    counts = {5: 2, 6: 3}

    def refs(retained_counts=counts):
        if mode == ck.REFS_BY_PAIR:
            return [retained_counts.get(d, 1) for _, d, _ in rows]
        return [retained_counts.get(b, 1) for b in range(BLOCKS)]

    info, _, marks = kernel(rows, refs_mode=mode, refs=refs(), retained=[5, 6])
    assert info == [ck.DESTINATION_SHARED, 1, 3, 1] and not marks.any()
    # with one more retention of 6 the batch is fine: the subtraction is what lets it pass
    info, seg, marks = kernel(rows, refs_mode=mode, refs=refs(), retained=[5, 6, 6, -3, I64.max])
    assert info[0] == ck.OK and len(seg) and not marks.any()
    # ids only: rule 4 is not looked at
    assert kernel(rows, refs_mode=ck.IDS_ONLY, refs=refs())[0][0] == ck.OK


@pytest.mark.parametrize(("rows", "refs", "code"), [
    ([(1, 5, 0), (0, 6, 0), (2, BLOCKS, 0)], [1, 1, 1], ck.BAD_DESTINATION),  # 1 before 2
    ([(1, 5, 0), (2, 5, 0), (0, 6, 0)], [1, 1, 1], ck.NULL_PAIR),  # 2 before 3
    ([(1, 5, 0), (5, 6, 0), (2, 6, 0)], [1, 1, 1], ck.DESTINATION_TWICE),  # twice first
    ([(1, 5, 0), (5, 6, 0)], [9, 9], ck.DESTINATION_IS_SOURCE),  # 3 before 4
])
def test_the_rules_are_checked_in_order(rows, refs, code) -> None:
    assert kernel(rows, refs_mode=ck.REFS_BY_PAIR, refs=refs)[0][0] == code


def test_the_kernel_refuses_planner_inputs_that_disagree() -> None:
    planner = CopyPlanner(DEVICE, DEVICE, same_space=True)
    m, info = planner.map, np.zeros(4, np.int64)
    rows = np.array([[1, 5, 0]], np.int64)
    for marks, start, refs_mode, refs in (
        (np.zeros(3, np.int64), m.start, ck.NO_REFS, EMPTY),  # scratch too short
        (planner._marks, m.start[:-1], ck.NO_REFS, EMPTY),  # group table too short
        (planner._marks, m.start[::-1].copy(), ck.NO_REFS, EMPTY),  # bases out of order
        (planner._marks, m.start, ck.REFS_BY_PAIR, np.ones(2, np.int64)),  # 2 counts, 1 pair
        (planner._marks, m.start, ck.REFS_BY_BLOCK, np.ones(3, np.int64)),  # short counts
    ):
        seg = ck.plan_copies(rows, 3, BLOCKS, BLOCKS, True, True, refs_mode, refs, EMPTY, marks,
                             m.src_bases, m.dst_bases, start, m.words, ck.RADIX_BITS, info)
        assert info[0] == ck.BAD_PLAN_INPUT and len(seg) == 0
    with pytest.raises(RuntimeError, match="its own inputs"):
        planner._raise(rows, np.array([ck.BAD_PLAN_INPUT, -1, 0, 0]))


def test_the_radix_order_is_the_stable_order_for_wide_keys() -> None:
    rng = np.random.default_rng(3)
    for n, top, radix_bits in ((1, 5, 11), (50, 2**40, 11), (3000, 2**20, 8), (400, 7, 2),
                               (1000, 2**62, 11), (64, 64, 11)):
        src = rng.integers(0, top, n)
        rows = np.stack([src, np.arange(n), rng.integers(0, 1, n)], axis=1)
        runs = ck.coalesce_runs(np.ascontiguousarray(rows), top, radix_bits)
        assert runs.tolist() == oracle.coalesce(rows).tolist(), (n, top, radix_bits)
        assert runs[:, 1].tolist() == sorted(runs[:, 1].tolist()) and runs[:, 3].sum() == n


def test_coalesce_and_segments_stay_usable_on_their_own() -> None:
    arr = as_pair_array([(4, 9, 0), (2, 7, 0), (3, 8, 0), (1, 3, 1)])
    assert coalesce(arr).tolist() == oracle.coalesce(arr).tolist()
    runs = coalesce(arr)
    assert segments(runs, DEVICE, DEVICE).tolist() == \
        oracle.segments(runs, DEVICE, DEVICE).tolist()
    with pytest.raises(InvalidGroupId):
        segments(np.array([[7, 1, 2, 1]]), DEVICE, DEVICE)
    with pytest.raises(InvalidArgument):
        coalesce([(-1, 2, 0)])


def test_blockcopy_rows_take_the_fast_path_and_are_still_checked() -> None:
    good = [BlockCopy(1, 5, 0), BlockCopy(2, 6, 1)]
    assert as_pair_array(good).tolist() == [[1, 5, 0], [2, 6, 1]]
    for bad in ([BlockCopy(True, 5, 0)], [BlockCopy(1, 5.0, 0)], [BlockCopy(1, 5, 0), (1, 2)],
                [(1, 2), BlockCopy(1, 5, 0), (1, 2, 3, 4)], [BlockCopy(1, 5, None)]):
        with pytest.raises(InvalidArgument, match="pairs"):
            as_pair_array(bad)


# -- hostile input ----------------------------------------------------------------------------

@pytest.mark.parametrize(("rows", "error"), [
    ([(I64.min, 5, 0)], InvalidBlockId),
    ([(I64.max, 5, 0)], InvalidBlockId),
    ([(1, I64.min, 0)], InvalidBlockId),
    ([(1, I64.max, 0)], InvalidBlockId),
    ([(1, 5, I64.max)], InvalidGroupId),
    ([(1, 5, I64.min)], InvalidGroupId),
    ([(2**64, 5, 0)], InvalidArgument),
    ([(1, -(2**70), 0)], InvalidArgument),
    (np.array([[2**63, 5, 0]], np.uint64), InvalidArgument),
    (np.array([[1, 5, 0]], np.float64), InvalidArgument),
    (np.zeros((2, 4), np.int64), InvalidArgument),
])
def test_hostile_ids_are_refused_without_touching_memory(rows, error) -> None:
    cache = PagedKVCache(CONFIG, torch.float16, num_layers=2)
    cache.flat.normal_()
    before = cache.flat.clone()
    copier = BlockCopier(cache, ref_cnts=lambda ids: [I64.min] * len(ids))
    with pytest.raises(error):
        copier.copy(rows, retained=[I64.min, I64.max, 2**80, -1])
    assert torch.equal(cache.flat.view(torch.uint8), before.view(torch.uint8))
    assert not copier.planner._marks.any()


def test_hostile_ref_counts_and_retentions_never_crash() -> None:
    cache = PagedKVCache(CONFIG, torch.float16, num_layers=2)
    for counts in ([I64.min, I64.max], [2**70, 1], ["x", 1], [1], [[1, 2], [3, 4]]):
        copier = BlockCopier(cache, ref_cnts=lambda ids, c=counts: c)
        try:
            copier.copy([(1, 5, 0), (2, 6, 0)], retained=[I64.max, I64.min, 5])
        except KvPoolError:
            pass
        assert not copier.planner._marks.any()
    with pytest.raises(InvalidArgument, match="1-D"):
        BlockCopier(cache, ref_cnts=np.ones((2, 2), np.int64)).copy([(1, 5, 0)])
    with pytest.raises(InvalidArgument, match="counts for"):
        BlockCopier(cache, ref_cnts=np.ones(3, np.int64)).copy([(1, 5, 0)])
    with pytest.raises(InvalidCopyPair, match="still shared"):
        BlockCopier(cache, ref_cnts=np.full(BLOCKS, I64.max)).copy([(1, 5, 0)], retained=[5])


@pytest.mark.parametrize("seg", [
    [[2**62, 0, 2**62]], [[0, 2**62, 2**62]], [[I64.max, 0, 1]], [[0, 0, I64.max]],
    [[1, 0, I64.max]], [[I64.min, 0, 1]], [[0, 0, I64.min]], [[8, 0, 1], [0, 2**63 - 8, 16]],
])
@pytest.mark.parametrize("lanes", [1, 2, 8])
def test_the_copy_kernel_refuses_overflowing_segments(seg, lanes) -> None:
    a = np.arange(64, dtype=np.int64)
    before = a.copy()
    assert ck.copy_segments(a, a, np.array(seg, dtype=np.int64), 8, lanes) != ck.OK
    assert (a == before).all()
    assert ck.copy_segments(a, a, np.zeros((2, 2), np.int64), 8) != ck.OK  # not (s, d, n)


# -- the interleaved copy kernel --------------------------------------------------------------

@pytest.mark.parametrize("lanes", [1, 2, 3, 8, 100])
@pytest.mark.parametrize("chunk", [64, 256, 100])
@pytest.mark.parametrize("word", [np.int64, np.int32, np.int16, np.uint8])
def test_interleaved_lanes_copy_every_segment_exactly(lanes, chunk, word) -> None:
    rng = np.random.default_rng(lanes * chunk)
    size = 1 << 16
    raw = np.zeros(size + 64, np.uint8)
    off = -raw.ctypes.data % 64
    src = raw[off:off + size].view(word)
    src[:] = rng.integers(0, 100, src.shape[0]).astype(word)
    w = src.itemsize
    # disjoint destination slots in a second buffer; lengths and offsets mixing whole lines
    # (which take the lanes) with odd ones (which take the narrow loops)
    rows, at = [], 0
    for k in range(40):
        n = int(rng.choice([64, 128, 192, 4096, 3, 17 * w])) // w or 1
        s = int(rng.integers(0, src.shape[0] - n))
        if k % 3 == 0:
            s -= s % (64 // w)
        rows.append((s, at, n))
        at += n + int(rng.choice([0, 64 // w, 1]))
    raw = np.zeros(at * w + 64, np.uint8)
    off = -raw.ctypes.data % 64
    dst = raw[off:off + at * w].view(word)
    want = dst.copy()
    for s, d, n in rows:
        want[d:d + n] = src[s:s + n]
    assert ck.copy_segments(src, dst, np.array(rows, np.int64), w, lanes, chunk) == ck.OK
    assert (dst == want).all()
