"""The compile machinery of kvpool.fast.compiled: borrowed views, inlining, the prefetch hint."""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from numba.extending import register_jitable  # noqa: E402

from kvpool.fast import compiled, kernels  # noqa: E402

pytestmark = pytest.mark.skipif(numba.config.DISABLE_JIT, reason="about compiled code")


def _bump(a, i):
    a[i, 1] += 7
    return 1


register_jitable(inline="always")(_bump)


def test_an_inlined_helper_writes_through_a_borrowed_view():
    # Numba's dead-code elimination after inlining dropped these stores (the view is a call
    # result, assumed not to alias an argument) until compiled.py declared that it does.
    @numba.njit
    def kernel(a, i):
        a = kernels._raw(a)
        return _bump(a, i)

    a = np.zeros((4, 3), np.int32)
    assert kernel(a, 2) == 1
    assert a[2].tolist() == [0, 7, 0]


def test_borrowed_views_are_not_reference_counted_and_slice_as_borrowed():
    @numba.njit
    def kernel(a):
        v = kernels._raw(a)
        tail = v[1:]
        tail[0] = 5
        return tail.shape[0]

    a = np.zeros(4, np.int64)
    assert kernel(a) == 3 and a.tolist() == [0, 5, 0, 0]
    (sig,) = kernel.signatures
    ir = kernel.inspect_llvm(sig)
    body = ir[ir.index("define"):ir.index("define", ir.index("define") + 1)]
    assert "NRT_incref" not in body and "NRT_decref" not in body


def test_borrowed_type_never_mixes_with_a_plain_array_type():
    borrowed = compiled.BorrowedArray(numba.types.int64, 1, "C")
    plain = numba.types.Array(numba.types.int64, 1, "C")
    assert borrowed.can_convert_to(None, plain) is None
    assert borrowed.unify(None, plain) is None
    assert isinstance(borrowed.unify(None, borrowed), compiled.BorrowedArray)
    assert isinstance(borrowed.copy(ndim=1, layout="A"), compiled.BorrowedArray)


def test_prefetch_is_a_hint_for_any_index():
    assert kernels._prefetch(np.zeros(2), 10**12) is None  # plain run: nothing

    @numba.njit
    def kernel(a, i):
        a = kernels._raw(a)
        kernels._prefetch(a, i)
        kernels._prefetch(a, -1)
        return a[0, 0]

    a = np.ones((3, 2), np.int64)
    assert kernel(a, 1) == 1 and kernel(a, 2**40) == 1  # never faults, changes nothing
    (sig,) = kernel.signatures
    assert "prefetch" in kernel.inspect_asm(sig)


def _hash_bytewise(key: bytes, group: int) -> int:
    """The table hash of a key of >= 14 bytes, byte by byte (the definition)."""
    head = int.from_bytes(key[:7], "big")
    tail = int.from_bytes(key[-7:], "big")
    h = ((head ^ (tail << 7) ^ (group << 1) ^ len(key)) * kernels.FNV_PRIME) & kernels.MASK63
    return h ^ (h >> 29)


def test_word_reads_give_the_bytewise_hash_and_key_equality():
    @numba.njit
    def compiled_hash(buf, off, length, group):
        buf = kernels._raw(buf)
        return kernels._hash_key(buf, off, length, group)

    rng = np.random.default_rng(7)
    for length in (13, 14, 15, 20, 32, 36, 64):
        for _ in range(20):
            buf = rng.integers(0, 256, length + 5, dtype=np.uint8)
            buf[1 + rng.integers(0, length)] = 0xFF  # high bytes: signed words
            group = int(rng.integers(0, 2**32))
            plain = kernels._hash_key(buf, 1, length, group)
            assert compiled_hash(buf, 1, length, group) == plain
            if length >= 14:
                assert plain == _hash_bytewise(bytes(buf[1 : 1 + length]), group)
