"""The fast backend: Numba-compiled array kernels behind the shared public pool API.

Layers, one concern each: :mod:`~kvpool.fast.kernels` (plain functions over arrays, the only
compiled code), :mod:`~kvpool.fast.compiled` (compiles them once), :mod:`~kvpool.fast.state`
(owns the arrays), :mod:`~kvpool.fast.readback` (the arrays read back as the spec's state),
:mod:`~kvpool.fast.core` (the generic shell's core operations on the arrays: argument
conversion, typed errors, event records), :mod:`~kvpool.fast.pool` (:class:`FastBlockPool`:
the lean public paths), :mod:`~kvpool.fast.verbs` (the batch verbs of :mod:`kvpool.batch`,
one kernel call each) and :mod:`~kvpool.fast.integrity` (structural self-check, a testing
aid).
Importing this package without numba raises ``ImportError``, which
:func:`kvpool.make_pool` reports as ``BackendUnavailable``.
"""

from kvpool.fast.pool import FastBlockPool

__all__ = ["FastBlockPool"]
