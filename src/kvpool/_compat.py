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

MOVED_MODULES: dict[str, tuple[str, ...]] = {
    # harness/ in rooms (0.2): old flat module -> its room; extra homes of names moved out
    "kvpool.harness.adapter": ("kvpool.harness.foreign.objects",),
    "kvpool.harness.vllm_adapter": ("kvpool.harness.foreign.vllm_pool",),
    "kvpool.harness.vllm_stack": ("kvpool.harness.foreign.vllm_stack",),
    "kvpool.harness.stack_planted": ("kvpool.harness.bugs.stack",),
    "kvpool.harness.planted": ("kvpool.harness.bugs.pool", "kvpool.harness.detection"),
    "kvpool.harness.config": ("kvpool.harness.pool.config",),
    "kvpool.harness.backends": ("kvpool.harness.pool.backends",),
    "kvpool.harness.driver": ("kvpool.harness.pool.driver",),
    "kvpool.harness.machine": ("kvpool.harness.pool.machine",),
    "kvpool.harness.set_order": ("kvpool.harness.pool.set_order",),
    "kvpool.harness.profiles": ("kvpool.harness.pool.profiles",),
    "kvpool.harness.cache_rules": ("kvpool.harness.rules.cache",),
    "kvpool.harness.release_rules": ("kvpool.harness.rules.release",),
    "kvpool.harness.invalid_rules": ("kvpool.harness.rules.invalid",),
    "kvpool.harness.hostile_rules": ("kvpool.harness.rules.hostile",),
    "kvpool.harness.hostile_values": ("kvpool.harness.rules.hostile_values",),
    "kvpool.harness.stack_configs": ("kvpool.harness.stack.configs",),
    "kvpool.harness.stack_invariants": ("kvpool.harness.stack.invariants",),
    "kvpool.harness.stack_machine": ("kvpool.harness.stack.machine",),
}
"""Old module name -> (new module, other modules that received some of its names)."""

MOVED_NAMES: dict[tuple[str, str], str] = {}
"""(old module, name) -> new module, for every :func:`moved_names` registration."""


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path will be removed in kvpool 0.3",
                  DeprecationWarning, stacklevel=3)


class _SplitModule(types.ModuleType):
    """An old module whose names now live in several modules: reads look in each, in order."""

    def __init__(self, name: str, homes: tuple[str, ...]) -> None:
        super().__init__(name)
        self._homes = homes

    def __getattr__(self, name: str) -> Any:
        for home in self._homes:
            module = importlib.import_module(home)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, homes: tuple[str, ...]) -> None:
        self.homes = homes

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        _warn(spec.name, " and ".join(self.homes))
        if len(self.homes) == 1:  # the very module: identity, isinstance, patching all hold
            return importlib.import_module(self.homes[0])
        return _SplitModule(spec.name, self.homes)

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # the new module is already executed

    def get_code(self, fullname: str) -> None:
        """``python -m OLD`` (runpy asks for code): say where the module went."""
        raise ImportError(f"{fullname} moved to {' and '.join(self.homes)}: "
                          f"run python -m {self.homes[-1]}")


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers old module names with their new module (:data:`MOVED_MODULES`)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        homes = MOVED_MODULES.get(fullname)
        if homes is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(homes))


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
