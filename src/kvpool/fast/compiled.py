"""The kernels of :mod:`kvpool.fast.kernels`, compiled once each with Numba (or left plain).

Contract: :func:`kernel_set` returns an object whose attributes are the kernels by name —
compiled entry points (``jit=True``) or the plain Python functions (``jit=False``); both take
the same arguments and return the same values. Importing this module needs numba; without it
the import fails and :func:`kvpool.make_pool` reports ``BackendUnavailable``.

Compile choices:

* ``cache=True``: the first compile of all kernels costs tens of seconds; the on-disk cache
  (next to ``kernels.py``) brings a fresh process down to loading machine code. Numba
  invalidates it when ``kernels.py`` changes, which is why every compiled line lives there.
* Explicit signatures, compiled lazily on first use: one specialisation per kernel, so a
  caller passing a wrong dtype fails loudly (``TypeError``) instead of silently compiling a
  second version, and so the compiled entry point can be called directly.
* Entry points, not dispatchers: a dispatcher call resolves the type of every argument
  (about 40-70 ns per array here); the entry point of the single specialisation skips that,
  which is what makes a one-block allocate + free fit in a microsecond. The price is that the
  entry point trusts its arguments' dtypes: :mod:`kvpool.fast.state` and
  :mod:`kvpool.fast.pool` create or convert every array they pass (``np.int64`` ids,
  C-contiguous). Plain ints and bools are converted by the entry point itself.
* No ``parallel=True`` and no ``fastmath``: every kernel is a short sequential walk over
  linked lists whose steps depend on each other; threads would only add start-up cost, and
  integer code has nothing for fastmath to relax.
* ``nogil`` is left off: the pool is single-threaded by contract (BEHAVIOUR.md §6).
* Helpers (``_``-prefixed functions of ``kernels``) are registered with ``register_jitable``:
  they stay plain functions for the uncompiled run, and compiled kernels that call them
  compile them inline — no second copy of any helper exists. The hash probe's helpers and
  the per-block / per-key helpers (``_INLINED``) are inlined by Numba itself before LLVM
  sees them (a lookup hit measured ~230 ns as separate functions, ~140 ns inlined). The
  price is compile time: all kernels ~50-65 s instead of ~35 s (once; the disk cache keeps
  them), the one-op ``h_*`` kernels ~12 s instead of ~6 s per process (``h_pop`` inlines
  the eviction path).
* ``kernels._raw`` is overloaded here with :func:`_borrowed_view` (arrays that Numba does
  not reference-count; the reason is in ``_raw``'s docstring), and ``kernels._prefetch``
  with :func:`_prefetch_row` (a software prefetch; the plain run does nothing);
  ``kernels._word`` / ``_word_be`` / ``_put_word`` with one unaligned 8-byte load (and
  byte swap) / store.
* The one-op kernels ``h_*`` and the batch kernels over the hash index take one
  ``kernels.PoolArrays`` first, made a structref here (:class:`PoolArraysType`): one
  argument to convert instead of up to nine arrays, and cached on disk like the rest.
* This module's own compile choices (``_INLINED``, the overloads, the intrinsics, the
  boxing of :class:`PoolArraysRef`) are not seen by the on-disk cache, which keys on the
  kernels' own code and signatures: change one, and clear the cache (the ``kernels.*``
  files in ``__pycache__`` next to ``kernels.py``, and any ``NUMBA_CACHE_DIR``). Touching
  ``kernels.py`` is not enough: Numba 0.68 kept loading the old code after it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numba
from llvmlite import ir
from numba import types as nt
from numba.core import cgutils, ir_utils
from numba.core.datamodel import models, register_default
from numba.core.errors import NumbaIRAssumptionWarning
from numba.experimental import structref
from numba.extending import (
    NativeValue,
    box,
    intrinsic,
    overload,
    register_jitable,
    typeof_impl,
    unbox,
)

from kvpool.fast import kernels

_INLINED = frozenset((
    "_hash_key", "_key_equals", "_find_key", "_hit_in_every_group",  # the probe
    "_prefetch_eviction", "_remove_all_keys", "_unlink_from_key",  # eviction, per block
    "_table_delete", "_free_key_row", "_emit",
    "_new_key", "_table_insert", "_slot", "_add_entry", "_link_at_key_tail",  # insertion
    "_unlink", "_link_after", "_append", "_release", "_take_ref",  # the queue
))
"""Helpers Numba inlines into their callers before LLVM sees them: the ones called per block
or per key. A call to a helper costs its array arguments' structs (nine words each for a 2-d
array) and, more, ends every optimisation across it; inlined, the loop of ``_pop_front`` or
``_cache_candidates`` is one function. ``_pop_front`` and ``_cache_candidates`` themselves
stay calls (one per kernel call; inlining them into every kernel tripled the compile time),
and so do ``_key_block`` and ``_candidate_refusal``, which the batch write shares with
``cache_one``: inlined, they took ``cache_full_blocks``' compile from 8 to 19 s, for no
measured gain."""
_CALLED_BY_HANDLE_KERNELS = ("lookup_one", "touch_one", "free_one", "get_new_blocks_unkeyed",
                             "get_new_blocks_quiet")


class BorrowedArray(nt.Array):
    """The type of :func:`_borrowed_view`'s result: a numpy array type whose data model has
    no reference-counted member, so that Numba emits no reference counting for it at all.

    The view points into an array that its caller keeps alive (see ``kernels._raw``). Slices
    of it are borrowed too (:meth:`copy`); it boxes to nothing (kernels never return one).
    """

    def __init__(self, dtype: Any, ndim: int, layout: str, readonly: bool = False,
                 aligned: bool = True) -> None:
        # (numba's annotations: layout a Literal, no ``dtype: Any``)
        super().__init__(  # type: ignore[call-overload]
            dtype, ndim, layout, readonly=readonly, aligned=aligned,
            name=f"borrowed({dtype}, {ndim}d, {layout}{', readonly' * readonly})")

    # numba annotates Array.copy with overloads on a Literal layout; this one takes any
    def copy(  # type: ignore[override]
            self, dtype: Any = None, ndim: int | None = None, layout: str | None = None,
            readonly: bool | None = None) -> BorrowedArray:
        return BorrowedArray(self.dtype if dtype is None else dtype,
                             self.ndim if ndim is None else ndim,
                             self.layout if layout is None else layout,
                             not self.mutable if readonly is None else readonly, self.aligned)

    @property
    def key(self) -> tuple:
        return ("borrowed", *super().key)

    # Never converted to or unified with a plain array type: the two data models differ, and
    # Numba would reinterpret one struct as the other (measured: an inlined helper's stores
    # were lost that way), so a mix must fail to type instead.
    def can_convert_to(self, typingctx: Any, other: Any) -> Any:
        if isinstance(other, BorrowedArray):
            return super().can_convert_to(typingctx, other)
        return None

    def unify(self, typingctx: Any, other: Any) -> Any:
        if isinstance(other, BorrowedArray):
            # numba annotates Type.unify as returning a Type (it is an Array here)
            unified: Any = super().unify(typingctx, other)
            if unified is not None:
                return BorrowedArray(unified.dtype, unified.ndim, unified.layout,
                                     not unified.mutable, unified.aligned)
        return None


@register_default(BorrowedArray)
class _BorrowedArrayModel(models.StructModel):
    """The members of Numba's array model, with ``meminfo`` a plain pointer: the reference
    counting passes look for a meminfo member and find none."""

    def __init__(self, dmm: Any, fe_type: BorrowedArray) -> None:
        ndim = fe_type.ndim
        super().__init__(dmm, fe_type, [
            ("meminfo", nt.voidptr), ("parent", nt.voidptr), ("nitems", nt.intp),
            ("itemsize", nt.intp), ("data", nt.CPointer(fe_type.dtype)),
            ("shape", nt.UniTuple(nt.intp, ndim)), ("strides", nt.UniTuple(nt.intp, ndim))])


@intrinsic
def _borrowed_view(typingctx, arr):
    """The array with the same data, shape and strides, typed :class:`BorrowedArray` (no
    owner, null meminfo and parent): Numba counts no references to it (see
    :func:`kvpool.fast.kernels._raw`)."""
    result = arr if isinstance(arr, BorrowedArray) else BorrowedArray(
        arr.dtype, arr.ndim, arr.layout, not arr.mutable, arr.aligned)

    def codegen(context, builder, sig, args):
        if sig.args[0] == sig.return_type:
            return args[0]
        src = context.make_array(sig.args[0])(context, builder, args[0])
        dst = cgutils.create_struct_proxy(sig.return_type)(context, builder)
        dst.data = src.data
        dst.shape = src.shape
        dst.strides = src.strides
        dst.itemsize = src.itemsize
        dst.nitems = src.nitems
        dst.meminfo = cgutils.get_null_value(dst.meminfo.type)
        dst.parent = cgutils.get_null_value(dst.parent.type)
        return dst._getvalue()

    return result(arr), codegen


def _raw_aliases_its_argument(lhs: str, args: list, alias_map: dict, arg_aliases: set) -> None:
    ir_utils._add_alias(lhs, args[0].name, alias_map, arg_aliases)


# Numba's dead-code elimination after inlining drops a store into an array unless the array
# may alias an argument; a call's result is assumed not to, so the stores of an inlined helper
# into a ``_raw`` view vanished (tests/fast/test_fast_compiled.py). Declared here: it does.
ir_utils.alias_func_extensions[("_raw", kernels.__name__)] = _raw_aliases_its_argument


@overload(kernels._raw)
def _raw_compiled(a):
    if isinstance(a, nt.Array):
        return lambda a: _borrowed_view(a)
    return lambda a: a


_PTR = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)


@intrinsic
def _prefetch_row(typingctx, arr, i):
    """``llvm.prefetch`` (read, keep in all cache levels) of the first byte of row ``i`` of
    ``arr``: address ``data + i * strides[0]``, computed without a bounds check because a
    prefetch never faults and has no effect but on timing."""
    if not isinstance(arr, nt.Array) or not isinstance(i, nt.Integer):
        return None

    def codegen(context, builder, sig, args):
        aty = sig.args[0]
        a = context.make_array(aty)(context, builder, args[0])
        row = context.cast(builder, args[1], sig.args[1], nt.intp)
        stride = cgutils.unpack_tuple(builder, a.strides, aty.ndim)[0]
        addr = builder.add(builder.ptrtoint(a.data, ir.IntType(64)), builder.mul(row, stride))
        fnty = ir.FunctionType(ir.VoidType(), [_PTR, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.inttoptr(addr, _PTR), ir.Constant(_I32, 0),
                          ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()

    return nt.void(arr, i), codegen


@overload(kernels._prefetch)
def _prefetch_compiled(a, i):
    return lambda a, i: _prefetch_row(a, i)


def _byte_address(context, builder, aty, value, offset, offset_type):
    a = context.make_array(aty)(context, builder, value)
    at = context.cast(builder, offset, offset_type, nt.intp)
    return builder.inttoptr(builder.add(builder.ptrtoint(a.data, ir.IntType(64)), at), _PTR)


def _is_byte_buffer(t: Any) -> bool:
    return isinstance(t, nt.Buffer) and t.ndim == 1 and t.dtype == nt.uint8


@intrinsic
def _load_word(typingctx, buf, i):
    """The 8 bytes at ``buf[i : i + 8]`` (a 1-d uint8 array or bytes; the caller keeps
    them in range) as one int64: one unaligned load."""
    if not _is_byte_buffer(buf) or not isinstance(i, nt.Integer):
        return None

    def codegen(context, builder, sig, args):
        ptr = _byte_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        return builder.load(builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)

    return nt.int64(buf, i), codegen


@intrinsic
def _load_word_be(typingctx, buf, i):
    """The 8 bytes at ``buf[i : i + 8]`` read big-endian, as int64: a load and a byte swap."""
    if not _is_byte_buffer(buf) or not isinstance(i, nt.Integer):
        return None

    def codegen(context, builder, sig, args):
        ptr = _byte_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        word = builder.load(builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)
        return builder.bswap(word)

    return nt.int64(buf, i), codegen


@intrinsic
def _store_word(typingctx, buf, i, w):
    """``buf[i : i + 8]`` = the 8 bytes of ``w`` as :func:`_load_word` read them."""
    if not _is_byte_buffer(buf) or not isinstance(i, nt.Integer) or not isinstance(
            w, nt.Integer):
        return None

    def codegen(context, builder, sig, args):
        ptr = _byte_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        word = context.cast(builder, args[2], sig.args[2], nt.int64)
        builder.store(word, builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)
        return context.get_dummy_value()

    return nt.void(buf, i, w), codegen


@overload(kernels._word)
def _word_compiled(a, i):
    return lambda a, i: _load_word(a, i)


@overload(kernels._word_be)
def _word_be_compiled(a, i):
    return lambda a, i: _load_word_be(a, i)


@overload(kernels._put_word)
def _put_word_compiled(a, i, w):
    return lambda a, i, w: _store_word(a, i, w)


_OVERLOADED = ("_raw", "_prefetch", "_word", "_word_be", "_put_word")

for _name, _fn in inspect.getmembers(kernels, inspect.isfunction):
    if _name in _OVERLOADED:
        continue  # overloaded above
    if _fn.__module__ == kernels.__name__ and (
            _name.startswith("_") or _name in _CALLED_BY_HANDLE_KERNELS):
        if _name in _INLINED:
            register_jitable(inline="always")(_fn)
        else:
            register_jitable(_fn)

_blk = nt.Array(nt.int32, 2, "C")  # blk, ent rows
_i64_2d = nt.Array(nt.int64, 2, "C")  # blk64, keys, events, lookup output
_u8_2d = nt.Array(nt.uint8, 2, "C")  # key_bytes
_table = nt.Array(nt.int64, 1, "C")  # the hash table (fingerprint << 32 | key row)
_i64 = nt.Array(nt.int64, 1, "C")  # meta, ids, outputs, lengths
_u8 = nt.Array(nt.uint8, 1, "C")  # hash bytes, masks
_bytes = nt.Bytes(nt.uint8, 1, "C", readonly=True)  # a Python bytes object, read in place
_int = nt.int64
_bool = nt.boolean

_ENT = _blk

POOL_ARRAYS_FIELDS = (("blk", _blk), ("blk64", _i64_2d), ("ent", _ENT), ("keys", _i64_2d),
                      ("key_bytes", _u8_2d), ("table", _table), ("meta", _i64),
                      ("events", _i64_2d), ("out", _i64), ("caching", _bool), ("events_on", _bool))
"""The fields of :class:`kvpool.fast.kernels.PoolArrays`, in its constructor's order."""


@structref.register
class PoolArraysType(nt.StructRef):
    """The Numba type of :class:`kvpool.fast.kernels.PoolArrays`: a structref. A jitclass
    converts as one pointer too, but Numba cannot cache code typed on one (its type's name
    changes per process); code typed on a structref is cached like any kernel."""

    def preprocess_fields(self, fields: Any) -> tuple:
        return tuple((name, nt.unliteral(typ)) for name, typ in fields)


class PoolArraysRef(int):
    """What Python holds of a compiled :class:`~kvpool.fast.kernels.PoolArrays`: the address
    of its NRT memory info, as an int, and (``_meminfo``) the object that keeps it alive.

    Numba's own structref proxy converts through ``getattr(obj, "_meminfo")`` on every
    call, 150-250 ns more than a jitclass measured here; an int converts in one C call. Only
    the boxing below makes these (from a struct Numba built), and only kvpool's state holds
    them: an int of any other origin must never reach a kernel."""

    _meminfo: Any


def _pool_arrays_ref(address: int, meminfo: Any) -> PoolArraysRef:
    ref = PoolArraysRef(address)
    ref._meminfo = meminfo
    return ref


@box(PoolArraysType)
def _box_pool_arrays(typ: Any, val: Any, c: Any) -> Any:
    meminfo = cgutils.create_struct_proxy(typ)(c.context, c.builder, value=val).meminfo
    owner = c.pyapi.nrt_meminfo_as_pyobject(meminfo)  # holds a reference to the struct
    address = c.pyapi.long_from_ulonglong(c.builder.ptrtoint(meminfo, c.pyapi.ulonglong))
    make = c.pyapi.unserialize(c.pyapi.serialize_object(_pool_arrays_ref))
    ref = c.pyapi.call_function_objargs(make, [address, owner])
    for obj in (make, address, owner):
        c.pyapi.decref(obj)
    return ref


@unbox(PoolArraysType)
def _unbox_pool_arrays(typ: Any, obj: Any, c: Any) -> Any:
    struct = cgutils.create_struct_proxy(typ)(c.context, c.builder)
    struct.meminfo = c.pyapi.long_as_voidptr(obj)
    # Not an int (a plain PoolArrays, say): TypeError from the call, no kernel runs.
    failed = cgutils.is_not_null(c.builder, c.pyapi.err_occurred())
    value = struct._getvalue()
    c.context.nrt.incref(c.builder, typ, value)  # released after the call, as an array's
    return NativeValue(value, is_error=failed)


POOL_ARRAYS = PoolArraysType(list(POOL_ARRAYS_FIELDS))
"""The kernels' type of their first argument ``s``."""


@typeof_impl.register(PoolArraysRef)
def _typeof_pool_arrays(val: Any, c: Any) -> Any:
    return POOL_ARRAYS


SIGNATURES: dict[str, tuple] = {
    "init_state": (_int, (_blk, _i64)),
    "get_new_blocks_unkeyed": (_int, (_blk, _i64, _i64, _int)),
    "get_new_blocks": (
        _int,
        (_blk, _i64_2d, _ENT, _i64_2d, _table, _i64, _i64_2d, _i64, _i64, _int, _bool, _bool),
    ),
    "get_new_blocks_quiet": (_int, (_blk, _i64_2d, _ENT, _i64_2d, _table, _i64, _i64, _bool, _int)),
    "get_new_blocks_reported": (
        _int,
        (_blk, _i64_2d, _ENT, _i64_2d, _u8_2d, _table, _i64, _i64_2d, _i64, _i64_2d, _bool, _int),
    ),
    "touch": (_int, (_blk, _i64, _i64)),
    "touch_one": (_int, (_blk, _i64, _int)),
    "free_blocks": (_int, (_blk, _i64, _bool, _bool, _i64)),
    "free_one": (_int, (_blk, _i64, _bool, _int)),
    "unpin_blocks": (_int, (_blk, _i64_2d, _i64, _i64)),
    "lookup_one": (_int, (_i64_2d, _u8_2d, _table, _bytes, _int)),
    "lookup_blocks": (_int, (_ENT, _i64_2d, _u8_2d, _table, _i64, _u8, _i64, _i64, _i64_2d)),
    "lookup_each": (_int, (_i64_2d, _u8_2d, _table, _i64, _u8, _i64, _i64, _i64_2d)),
    "lookup_run_from_end": (
        _int, (_i64_2d, _u8_2d, _table, _i64, _u8, _i64, _i64, _i64_2d, _int, _int, _int)),
    "cache_full_blocks": (
        _int,
        (POOL_ARRAYS, _i64, _u8, _u8, _i64, _int, _int, _int, _bool, _bool),
    ),
    "allocate_and_cache": (
        _int,
        (POOL_ARRAYS, _i64, _int, _int, _u8, _u8, _i64, _int, _int, _int, _int, _bool, _bool,
         _bool),
    ),
    "admit_request": (
        _int,
        (POOL_ARRAYS, _i64_2d, _u8, _i64, _int, _int, _int, _int, _int, _int, _int, _bool,
         _bool),
    ),
    "run_step": (
        _int,
        (POOL_ARRAYS, _i64, _i64, _u8, _i64, _int, _int, _bool, _bool),
    ),
    "cache_one": (_int, (POOL_ARRAYS, _int, _bytes, _int, _int, _bool)),
    "take_and_key": (_int, (POOL_ARRAYS, _int, _int, _bytes, _int, _int)),
    "group_step": (_int, (POOL_ARRAYS, _bool, _i64, _u8, _int, _int)),
    "cache_partial_block": (_int, (POOL_ARRAYS, _int, _u8, _int, _int, _bool, _bool)),
    "move_block_hashes": (_int, (_blk, _i64_2d, _ENT, _i64_2d, _i64, _int, _int)),
    "evict_blocks": (_int, (_blk, _i64_2d, _ENT, _i64_2d, _table, _i64, _i64_2d, _i64, _bool)),
    "reset_prefix_cache": (
        _int,
        (_blk, _i64_2d, _ENT, _i64_2d, _table, _i64, _i64_2d, _i64, _bool),
    ),
    "block_is_writable": (_bool, (_blk, _int)),
    "max_key_tokens": (_int, (_blk, _i64_2d, _i64)),
    "queue_order": (_int, (_blk, _i64)),
    "release_removed_keys": (_int, (_i64_2d, _i64, _i64_2d)),
    "report_removals": (_int, (_i64_2d, _u8_2d, _i64, _i64_2d, _i64_2d)),
    "rehash": (_int, (_i64_2d, _table, _i64)),
}
"""Every public kernel with its one signature ``(return type, argument types)``."""


def _new_pool_arrays(blk, blk64, ent, keys, key_bytes, table, meta, events, out, caching,
                     events_on):  # type: ignore[no-untyped-def]
    s = structref.new(POOL_ARRAYS)
    s.blk = blk
    s.blk64 = blk64
    s.ent = ent
    s.keys = keys
    s.key_bytes = key_bytes
    s.table = table
    s.meta = meta
    s.events = events
    s.out = out
    s.caching = caching
    s.events_on = events_on
    return s


def _set_index_arrays(s, ent, keys, key_bytes, table, events):  # type: ignore[no-untyped-def]
    s.ent = ent
    s.keys = keys
    s.key_bytes = key_bytes
    s.table = table
    s.events = events
    return 0


_ARRAYS_HELPERS: dict[str, Callable[..., Any]] = {}


def _arrays_helper(fn: Callable[..., Any], signature: Any) -> Callable[..., Any]:
    """``fn`` compiled once for ``signature`` and cached on disk (its entry point)."""
    entry = _ARRAYS_HELPERS.get(fn.__name__)
    if entry is None:
        dispatcher = numba.njit(cache=True)(fn)
        with _compile_lock(dispatcher, fn.__name__):
            entry = dispatcher.compile(signature)
        dispatcher.disable_compile()
        _ARRAYS_HELPERS[fn.__name__] = entry
    return entry


def pool_arrays_maker(jit: bool) -> Callable[..., Any]:
    """The constructor of the kernels' :class:`~kvpool.fast.kernels.PoolArrays` (arguments
    in :data:`POOL_ARRAYS_FIELDS`' order): compiled and cached on disk when ``jit`` (and
    Numba compiles), else the plain class."""
    if not jit or not _NUMBA_COMPILES:
        return kernels.PoolArrays
    return _arrays_helper(_new_pool_arrays, POOL_ARRAYS(*(t for _, t in POOL_ARRAYS_FIELDS)))


def pool_arrays_setter(jit: bool) -> Callable[..., int]:
    """``set(s, ent, keys, key_bytes, table, events)``: point a :class:`~kvpool.fast.kernels.
    PoolArrays` at the hash index's and the event log's current arrays (after one grows), in
    place, so that every kernel call bound to it stays valid."""
    if not jit or not _NUMBA_COMPILES:
        return _set_index_arrays  # plain Python sets the plain object's attributes alike
    # ent, keys, key_bytes, table, events: their types in POOL_ARRAYS_FIELDS
    return _arrays_helper(_set_index_arrays,
                          _int(POOL_ARRAYS, _ENT, _i64_2d, _u8_2d, _table, _i64_2d))


_NUMBA_COMPILES = hasattr(numba.njit(lambda: 0), "compile")  # False under NUMBA_DISABLE_JIT=1

HANDLE_KERNELS = ("h_lookup_one", "h_touch_one", "h_free_one", "h_pop")
"""The one-op kernels: each over one :class:`~kvpool.fast.kernels.PoolArrays` and its own
operands (their signatures are in :data:`SIGNATURES`)."""

SIGNATURES.update({
    "h_lookup_one": (_int, (POOL_ARRAYS, _bytes, _int)),
    "h_touch_one": (_int, (POOL_ARRAYS, _int)),
    "h_free_one": (_int, (POOL_ARRAYS, _int)),
    "h_pop": (_int, (POOL_ARRAYS, _int)),
})


class KernelSet:
    """The kernels by attribute name: compiled entry points, or the plain functions."""

    def __init__(self, jit: bool) -> None:
        self.jit = jit

    def __getattr__(self, name: str) -> Callable[..., Any]:
        # Only called for names not yet cached on the instance: resolve once, then keep.
        if name not in SIGNATURES:
            raise AttributeError(name)
        fn = _compiled(name) if self.jit else getattr(kernels, name)
        setattr(self, name, fn)
        return fn


_ENTRY_POINTS: dict[str, Callable[..., Any]] = {}

CompileHook = Callable[[str, "float | None"], None]
"""``hook(name, None)`` before a kernel that is not in the on-disk cache compiles,
``hook(name, seconds)`` after any kernel compiled (rather than loaded from the cache)."""

_COMPILE_HOOKS: list[CompileHook] = []


@contextlib.contextmanager
def compile_hook(hook: CompileHook) -> Iterator[None]:
    """Call ``hook`` (:data:`CompileHook`) around every kernel compiled inside the block: a
    command line shows what a first run on a cold cache is waiting for."""
    _COMPILE_HOOKS.append(hook)
    try:
        yield
    finally:
        _COMPILE_HOOKS.remove(hook)


def _on_disk(dispatcher: Any) -> bool:
    """Whether Numba's disk cache holds an index for this kernel (its code is then loaded,
    not compiled, unless the source changed since). Numba's own attributes; ``False`` if
    they move."""
    try:
        return os.path.exists(dispatcher._cache._cache_file._index_path)
    except AttributeError:
        return False


@contextlib.contextmanager
def _compile_lock(dispatcher: Any, name: str) -> Iterator[None]:
    """Held while a disk-cached kernel is compiled or loaded: processes sharing Numba's cache
    (test workers, engine processes starting together) compile each kernel once; the others
    wait, then load it from the cache. A file lock in the cache directory (released by the
    operating system if its holder dies); nothing where there is none (not POSIX, no cache
    directory, Numba's attributes moved)."""
    try:
        import fcntl

        fd = os.open(os.path.join(dispatcher._cache._cache_path, f"{name}.lock"),
                     os.O_CREAT | os.O_RDWR, 0o666)
    except (ImportError, AttributeError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _compiled(name: str) -> Callable[..., Any]:
    entry = _ENTRY_POINTS.get(name)
    if entry is None:
        fn = getattr(kernels, name)
        dispatcher = numba.njit(cache=True)(fn)
        if not hasattr(dispatcher, "compile"):  # NUMBA_DISABLE_JIT=1: njit returned fn itself
            entry = fn
        else:
            ret, args = SIGNATURES[name]
            hooks = tuple(_COMPILE_HOOKS)
            if hooks and not _on_disk(dispatcher):
                for hook in hooks:
                    hook(name, None)
            began = time.perf_counter()
            with _compile_lock(dispatcher, name), warnings.catch_warnings():
                # Inlining a helper's loop (_INLINED) trips a check that Numba itself calls
                # "internal pedantic"; the compiled code is right (the twin tests compare it).
                warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
                entry = dispatcher.compile(ret(*args))
            dispatcher.disable_compile()
            if hooks and not dispatcher.stats.cache_hits:
                seconds = time.perf_counter() - began
                for hook in hooks:
                    hook(name, seconds)
        _ENTRY_POINTS[name] = entry
    return entry


_SETS: dict[bool, KernelSet] = {}


def kernel_set(jit: bool = True) -> KernelSet:
    """The shared kernel set for ``jit`` (compiled) or plain Python (``jit=False``)."""
    ks = _SETS.get(jit)
    if ks is None:
        ks = _SETS[jit] = KernelSet(jit)
    return ks


def compile_all() -> float:
    """Compile (or load from the cache) every kernel now; returns the seconds it took."""
    start = time.perf_counter()
    ks = kernel_set(True)
    for name in SIGNATURES:
        getattr(ks, name)
    return time.perf_counter() - start
