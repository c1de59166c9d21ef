"""kvpool's imports: no circles, every import down the layers, every module in a layer.

The layering is declared once (:mod:`kvpool.verify.layering`) and pictured in
docs/architecture.md; these tests read every import of ``src/kvpool`` and fail on a circle or
an import up the layers — and show that they would, by planting each kind of fault.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from kvpool import _compat
from kvpool.verify import layering
from kvpool.verify.layering import (
    HARNESS_ROOMS,
    LAYERS,
    Module,
    circles,
    import_graph,
    layer_violations,
    problems,
    read_modules,
)

ROOT = Path(__file__).resolve().parents[1]
MODULES = read_modules(ROOT / "src" / "kvpool")


def planted(module: str, code: str) -> dict[str, Module]:
    """The modules with ``code`` appended to one of them."""
    out = dict(MODULES)
    out[module] = replace(out[module], source=out[module].source + "\n" + code + "\n")
    return out


def test_kvpool_has_no_import_circle():
    assert circles(import_graph(MODULES)) == []


def test_every_import_goes_down_the_layers_and_every_module_has_one():
    assert problems(MODULES) == []


def test_the_checker_reads_the_whole_package():
    assert len(MODULES) > 150
    graph = import_graph(MODULES)
    assert "kvpool.shell" in graph["kvpool.reference.pool"]
    assert "kvpool.shell.arguments" in graph["kvpool.batch.checks"]
    assert "kvpool.shell" in graph["kvpool.batch.checks"]  # its __init__ runs first


@pytest.mark.parametrize("module, code", [
    # the four circles issue 23 found, put back (each in the form it had)
    ("kvpool.shell.pool", "def f():\n    from kvpool.batch.checks import write_rejection"),
    ("kvpool.policy.coordinator", "def f():\n    from kvpool.policy.hybrid import SpecGroup"),
    ("kvpool.reference.invariants",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from kvpool.reference.pool import ReferenceBlockPool"),
    ("kvpool.harness.bugs.pool", "def f():\n    from kvpool.harness.check import run_check"),
    # a package whose __init__ re-exports a module that imports back
    ("kvpool.hashing.extra_keys", "from kvpool.request import Request"),
])
def test_a_planted_circle_is_found(module, code):
    assert circles(import_graph(MODULES)) == []
    found = circles(import_graph(planted(module, code)))
    assert any(module in circle for circle in found), found
    assert problems(planted(module, code))


@pytest.mark.parametrize("module, code, layers", [
    ("kvpool.spec.ops", "def f():\n    import kvpool.policy.facade", LAYERS),
    ("kvpool.errors", "import kvpool.keys", LAYERS),  # same layer, another unit
    ("kvpool.harness.pool.machine", "from kvpool.harness.rules import cache", HARNESS_ROOMS),
    ("kvpool.harness.stack.configs", "import kvpool.harness.foreign.vllm_stack", HARNESS_ROOMS),
])
def test_an_import_up_the_layers_is_found(module, code, layers):
    graph = import_graph(planted(module, code))
    scope = "kvpool.harness" if layers is HARNESS_ROOMS else ""
    found = layer_violations(graph, layers, scope)
    assert any(v.startswith(module + " ") for v in found), found


def test_a_module_without_a_layer_is_found():
    modules = dict(MODULES)
    modules["kvpool.newthing"] = Module("kvpool.newthing", "import kvpool.errors\n", False)
    assert "no layer for kvpool.newthing (add it to kvpool.verify.layering.LAYERS)" in \
        problems(modules)


def test_relative_imports_are_read():
    module = Module("kvpool.shell.arguments", "from . import pool\nfrom .. import spec\n", False)
    modules = {**MODULES, module.name: module}
    assert {"kvpool.shell.pool", "kvpool.spec"} <= import_graph(modules)[module.name]


def test_architecture_page_shows_the_layers():
    """docs/architecture.md's table is the declaration, line for line."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    for name, layers in (("kvpool", LAYERS), ("kvpool.harness", HARNESS_ROOMS)):
        for level, units in enumerate(layers):
            row = f"| {name} | {level} | " + ", ".join(f"`{u}`" for u in units) + " |"
            assert row in page, row


def test_the_checker_runs_as_a_program(capsys):
    assert layering.main() == 0
    assert "kvpool.harness, bottom layer first:" in capsys.readouterr().out


@pytest.mark.parametrize("old", sorted(_compat.MOVED_MODULES))
def test_an_old_module_path_still_imports_with_a_warning(old):
    homes = _compat.MOVED_MODULES[old]
    for home in homes:
        assert home in MODULES, home
    sys.modules.pop(old, None)  # imported before: import it again, through the finder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert any(issubclass(w.category, DeprecationWarning) and old in str(w.message)
               for w in caught)
    if len(homes) == 1:
        assert module is importlib.import_module(homes[0])
    seen: set[str] = set()
    for home in homes:  # every public name, from the first home that has it
        new = importlib.import_module(home)
        for name in set(getattr(new, "__all__", ())) - seen:
            assert getattr(module, name) is getattr(new, name)
            seen.add(name)


def test_an_old_module_split_in_two_finds_both_halves():
    sys.modules.pop("kvpool.harness.planted", None)
    with pytest.warns(DeprecationWarning, match="kvpool.harness.planted moved"):
        old = importlib.import_module("kvpool.harness.planted")
    from kvpool.harness.bugs.pool import PLANTED
    from kvpool.harness.detection import steps_to_detection

    assert old.PLANTED is PLANTED and old.steps_to_detection is steps_to_detection
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        old.nothing  # noqa: B018


def test_a_moved_name_is_found_with_a_warning():
    import kvpool.policy.coordinator as coordinator
    from kvpool.policy.coordinator_factory import get_kv_cache_coordinator

    with pytest.warns(DeprecationWarning, match="coordinator_factory"):
        assert coordinator.get_kv_cache_coordinator is get_kv_cache_coordinator
    with pytest.raises(AttributeError):
        coordinator.nothing_here  # noqa: B018
    for (_, _), home in _compat.MOVED_NAMES.items():
        assert home in MODULES
