"""Old import paths, kept working with a ``DeprecationWarning`` while users move.

Two kinds of move, each a table:

* a module moved (:data:`MOVED_MODULES`): importing the old dotted name gives the new module
  (the same object, so ``isinstance`` and monkeypatching keep working), after one warning;
* a name moved to another module (:func:`moved_names`): the old module's ``__getattr__``
  finds it in its new home, after one warning.

The new homes are named by strings and imported only when an old path is used, so the shims
add no import edge: the layering test (``tests/test_layering.py``) reads real imports only,
and checks that every new home in these tables exists.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

MOVED_MODULES: dict[str, str] = {}
"""Old module name -> new module name (filled in as modules move; see docs/architecture.md)."""

MOVED_NAMES: dict[tuple[str, str], str] = {}
"""(old module, name) -> new module, for every :func:`moved_names` registration."""


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path will be removed in kvpool 0.3",
                  DeprecationWarning, stacklevel=3)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        _warn(spec.name, self.new)
        return importlib.import_module(self.new)

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # the new module is already executed


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers old module names with their new module (:data:`MOVED_MODULES`)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install_finder() -> None:
    """Put the finder on ``sys.meta_path`` once (``kvpool/__init__`` calls it)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())


def moved_names(old_module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for names that moved out of ``old_module``:
    ``names`` maps each name to the module it lives in now."""
    for name, new in names.items():
        MOVED_NAMES[(old_module, name)] = new

    def __getattr__(name: str) -> Any:
        new = names.get(name)
        if new is None:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        _warn(f"{old_module}.{name}", f"{new}.{name}")
        return getattr(importlib.import_module(new), name)

    return __getattr__
