"""Which part of kvpool may import which, read from the source: no circles, layers respected.

kvpool is a stack (docs/architecture.md, "Layering"): a module may import a module of its own
unit or of a unit in a lower layer, never one above. This module reads every ``import`` of
``src/kvpool`` with :mod:`ast` — at the top of a module, inside functions, under
``if TYPE_CHECKING`` alike, since each is a dependency a reader has to follow — and reports

* every import **circle** between modules. Importing ``a.b.c`` from outside ``a.b`` runs
  ``a/b/__init__.py`` first, so that counts as importing ``a.b`` too: a package whose
  ``__init__`` re-exports a module that imports back into the importer is a circle as well;
* every import that goes **up** the layers (:data:`LAYERS` for kvpool's packages,
  :data:`HARNESS_ROOMS` inside ``kvpool.harness``);
* every module that belongs to **no unit** (a new package must be given its place).

Old paths kept by :mod:`kvpool._compat` are resolved by name when used, so they add no edge.
``python -m kvpool.verify.layering`` prints the problems (exit 1) or the layers (exit 0).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

LAYERS: tuple[tuple[str, ...], ...] = (
    ("kvpool.errors", "kvpool.keys", "kvpool._compat"),
    ("kvpool.memory", "kvpool.hash_list", "kvpool.hashing", "kvpool.spec"),
    ("kvpool.request",),
    ("kvpool.events",),
    ("kvpool.protocol",),
    ("kvpool.shell",),
    ("kvpool.batch",),
    ("kvpool.spec.pool", "kvpool.reference", "kvpool.fast"),
    ("kvpool.backends",),
    ("kvpool", "kvpool.policy"),
    ("kvpool.gpu", "kvpool.workload"),
    ("kvpool.explain", "kvpool.wire", "kvpool.harness", "kvpool.bench"),
    ("kvpool.verify", "kvpool.vllm"),
    ("kvpool.cli",),
    ("kvpool.__main__",),
)
"""kvpool's units, bottom layer first. A unit is a module or a package (with everything in
it, except a longer unit named here: ``kvpool.spec.pool``, the spec run as a backend, sits
above the shell while the rest of ``kvpool.spec`` sits below it). ``kvpool`` is the front
door (``kvpool/__init__.py``)."""

HARNESS_ROOMS: tuple[tuple[str, ...], ...] = (
    ("kvpool.harness.api", "kvpool.harness.values", "kvpool.harness.requests",
     "kvpool.harness.reproduction"),
    ("kvpool.harness.stack",),
    ("kvpool.harness.foreign", "kvpool.harness.bugs"),
    ("kvpool.harness.pool",),
    ("kvpool.harness.rules",),
    ("kvpool.harness",),
)
"""The rooms of ``kvpool.harness``, bottom first: the shared vocabulary; the stack machine;
the foreign adapters and the planted bugs (what the machines drive); the pool machine (which
resolves backend names to them); its rule sets; and the rest of ``kvpool.harness`` — the entry
points that assemble them (``differential``, ``check``, ``detection``, ``conformance``)."""


@dataclass(frozen=True)
class Module:
    name: str
    source: str
    is_package: bool


def read_modules(root: Path) -> dict[str, Module]:
    """Every module under the package directory ``root`` (``.../src/kvpool``), by name."""
    modules: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = Module(".".join(parts), path.read_text(), is_package)
    return modules


def _imported_names(module: Module, node: ast.Import | ast.ImportFrom,
                    known: Mapping[str, Module]) -> list[str]:
    """The modules of ``known`` one import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in known]
    if node.level:  # relative: from the module's package, up level-1 more
        package = module.name.split(".")
        if not module.is_package:
            package.pop()
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            out.append(sub)  # ``from pkg import submodule``
        elif base in known:
            out.append(base)  # ``from module import name``
    return out


def import_graph(modules: Mapping[str, Module]) -> dict[str, set[str]]:
    """Module -> the modules it imports (every import statement anywhere in its source)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module in modules.values():
        for node in ast.walk(ast.parse(module.source)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported_names(module, node, modules):
                if target == module.name:
                    continue
                graph[module.name].add(target)
                parts = target.split(".")
                for k in range(2, len(parts)):  # packages whose __init__ runs first
                    package = ".".join(parts[:k])
                    inside = module.name == package or module.name.startswith(package + ".")
                    if package in modules and not inside:
                        graph[module.name].add(package)
    return graph


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import circles: each strongly connected set of two or more modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        # Tarjan's algorithm, iterative (a recursion per module would be fine today, but a
        # checker should not depend on the recursion limit).
        work: list[tuple[str, list[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, sorted(graph[start])))
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def unit_of(module: str, layers: tuple[tuple[str, ...], ...]) -> tuple[str, int] | None:
    """The longest unit of ``layers`` that contains ``module``, and its layer. The top-level
    package (``kvpool``) is a unit of its own ``__init__`` only: a new module beside it must
    be given a layer."""
    best: tuple[str, int] | None = None
    for level, units in enumerate(layers):
        for unit in units:
            contains = module == unit or ("." in unit and module.startswith(unit + "."))
            if contains and (
                    best is None or len(unit) > len(best[0])):
                best = (unit, level)
    return best


def layer_violations(graph: Mapping[str, Iterable[str]],
                     layers: tuple[tuple[str, ...], ...], scope: str = "") -> list[str]:
    """Imports that go up ``layers`` (both ends within ``scope``, a package name or ``""``)."""
    problems = []
    for importer in sorted(graph):
        if scope and not (importer == scope or importer.startswith(scope + ".")):
            continue
        mine = unit_of(importer, layers)
        for target in sorted(graph[importer]):
            theirs = unit_of(target, layers)
            if mine is None or theirs is None or mine[0] == theirs[0]:
                continue
            if scope and not (target == scope or target.startswith(scope + ".")):
                continue
            if theirs[1] >= mine[1]:
                problems.append(f"{importer} (layer {mine[1]}, {mine[0]}) imports {target} "
                                f"(layer {theirs[1]}, {theirs[0]})")
    return problems


def homeless(modules: Iterable[str], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Modules no unit of ``layers`` contains."""
    return [m for m in sorted(modules) if unit_of(m, layers) is None]


def problems(modules: Mapping[str, Module]) -> list[str]:
    """Everything wrong with kvpool's imports; empty when the layering holds."""
    graph = import_graph(modules)
    out = [f"import circle: {' <-> '.join(c)}" for c in circles(graph)]
    out += [f"no layer for {m} (add it to kvpool.verify.layering.LAYERS)"
            for m in homeless(modules, LAYERS)]
    out += [f"up the layers: {p}" for p in layer_violations(graph, LAYERS)]
    out += [f"up the harness rooms: {p}"
            for p in layer_violations(graph, HARNESS_ROOMS, scope="kvpool.harness")]
    return out


def package_root() -> Path:
    """``src/kvpool`` of this installation."""
    return Path(__file__).resolve().parents[1]


def main() -> int:
    found = problems(read_modules(package_root()))
    for problem in found:
        print(problem)
    if found:
        return 1
    for name, layers in (("kvpool", LAYERS), ("kvpool.harness", HARNESS_ROOMS)):
        print(f"{name}, bottom layer first:")
        for level, units in enumerate(layers):
            print(f"  {level:2}  {', '.join(units)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
