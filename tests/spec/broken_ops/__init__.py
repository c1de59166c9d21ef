"""Deliberately broken copies of spec operations, each carrying the real contract.

Each function is a copy of one :mod:`kvpool.spec.ops` operation with one planted bug (marked
``# BUG:``), decorated with :func:`kvpool.spec.contracts.contract_of` for that operation.
``test_crosshair_finds_bugs.py`` expects CrossHair to find a counterexample for each within a
small budget: evidence that the contracts are strong enough and the search reaches the states
that matter. Never imported by the library.
"""
