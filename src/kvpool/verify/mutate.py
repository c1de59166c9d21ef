"""Mutation testing of the spec: does every small change to it get caught? (slow, optional)

mutmut skips decorated functions, so this is a small AST mutator of kvpool's own. A *mutant*
is one module of ``spec/`` (operations, preconditions, postconditions, invariants) with one
change: a comparison flipped (``<`` ↔ ``<=``, ``==`` ↔ ``!=``, ``in`` ↔ ``not in``), an
``and``/``or`` swapped, one operand of a conjunction dropped, ``+ 1``/``- 1`` removed or
flipped, a constant ``0``/``1``/``True``/``False`` changed, a ``not`` dropped. Each mutant runs
in its own process (an import hook serves the mutated source) against the *killers*:

1. the spec's unit tests (ops, preconditions, invariants, runtime contracts, golden events,
   the seeded gaps);
2. the exhaustive checker on the small scopes (spec against reference and fast, with every
   contract at runtime);
3. a differential harness run (spec against reference, invalid calls included).

A mutant is *killed* when any killer fails, *survives* otherwise. CrossHair is not a killer
here (minutes per mutant); ``kvpool contracts`` runs it on the real spec. Run::

    python -m kvpool.verify.mutate --sample 60 --seed 0 [--jobs 2] [--json]

``--sample`` takes an evenly spread, seeded subset; without it every mutant runs (hundreds,
an hour or more). ``--only postconditions.py:12`` runs chosen mutants (the index is the one a
report prints) and says which test killed each: the way to show that a new test kills a
survivor. Survivors are printed with file, line and the change, for a human to judge (an
equivalent mutant, or a real gap to fix with a stronger test).
"""

from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.util
import json
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

SPEC = Path(__file__).resolve().parents[1] / "spec"
TARGETS = ("ops.py", "preconditions.py", "postconditions.py", "invariants.py")
ROOT = Path(__file__).resolve().parents[3]

_FLIP_COMPARE = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}


@dataclass(frozen=True)
class Mutant:
    """One change: module file, the index of the mutation site, and what it does."""

    module: str
    index: int
    line: int
    change: str


def _sites(tree: ast.AST) -> list[tuple[ast.expr, str, int]]:
    """Every (node, kind, variant) this mutator can change, in source order."""
    out: list[tuple[ast.expr, str, int]] = []
    docstrings = {
        id(n.body[0].value) for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Module)) and n.body
        and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in _FLIP_COMPARE:
            out.append((node, "compare", 0))
        elif isinstance(node, ast.BoolOp):
            out.append((node, "boolop", 0))
            if isinstance(node.op, ast.And):
                out += [(node, "drop", i) for i in range(len(node.values))]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and (
                isinstance(node.right, ast.Constant) and node.right.value == 1):
            out += [(node, "plus_one", 0), (node, "plus_one", 1)]
        elif isinstance(node, ast.Constant) and id(node) not in docstrings and (
                node.value in (0, 1) or isinstance(node.value, bool)):
            out.append((node, "constant", 0))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append((node, "not", 0))
    return [s for s in out if getattr(s[0], "lineno", None)]


def _apply(node: ast.AST, kind: str, variant: int) -> str:
    """Mutate ``node`` in place; a description of the change."""
    if kind == "compare":
        old = type(node.ops[0])  # type: ignore[attr-defined]
        node.ops[0] = _FLIP_COMPARE[old]()  # type: ignore[attr-defined]
        return f"{old.__name__} -> {_FLIP_COMPARE[old].__name__}"
    if kind == "boolop":
        was = type(node.op).__name__  # type: ignore[attr-defined]
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()  # type: ignore
        return f"{was} -> {type(node.op).__name__}"  # type: ignore[attr-defined]
    if kind == "drop":
        dropped = node.values.pop(variant)  # type: ignore[attr-defined]
        if len(node.values) == 1:  # type: ignore[attr-defined]
            node.values.append(ast.Constant(True))  # type: ignore[attr-defined]
        return f"conjunct dropped: {ast.unparse(dropped)[:80]}"
    if kind == "plus_one":
        if variant == 0:
            node.right = ast.Constant(0)  # type: ignore[attr-defined]
            return "± 1 removed"
        node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()  # type: ignore
        return "+ 1 <-> - 1"
    if kind == "constant":
        value = node.value  # type: ignore[attr-defined]
        new = (not value) if isinstance(value, bool) else 1 - value
        node.value = new  # type: ignore[attr-defined]
        return f"{value!r} -> {new!r}"
    operand = node.operand  # type: ignore[attr-defined]
    node.__class__ = type(operand)
    node.__dict__.update(operand.__dict__)
    return "not dropped"


def mutants(modules: tuple[str, ...] = TARGETS) -> list[Mutant]:
    """Every mutant of the target modules."""
    out = []
    for module in modules:
        text = (SPEC / module).read_text()
        for i in range(len(_sites(ast.parse(text)))):
            node, kind, variant = _sites(ast.parse(text))[i]  # a fresh tree per mutant
            line = node.lineno
            out.append(Mutant(module, i, line, _apply(node, kind, variant)))
    return out


def mutated_source(mutant: Mutant) -> str:
    tree = ast.parse((SPEC / mutant.module).read_text())
    node, kind, variant = _sites(tree)[mutant.index]
    _apply(node, kind, variant)
    return ast.unparse(ast.fix_missing_locations(tree))


class _MutantFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the mutated source for one module, the real files for everything else."""

    def __init__(self, fullname: str, source: str) -> None:
        self.fullname, self.source = fullname, source

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001
        if fullname != self.fullname:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=str(SPEC))

    def create_module(self, spec):  # noqa: ANN001
        return None

    def exec_module(self, module) -> None:  # noqa: ANN001
        module.__file__ = str(SPEC / (self.fullname.rsplit(".", 1)[1] + ".py"))
        exec(compile(self.source, module.__file__, "exec"), module.__dict__)


KILLER_TESTS = (
    "tests/spec/test_spec_ops.py", "tests/spec/test_spec_preconditions.py",
    "tests/spec/test_spec_invariants.py", "tests/spec/test_spec_contracts_runtime.py",
    "tests/spec/test_event_payloads_golden.py", "tests/spec/test_verification_gaps.py",
)


class _FirstFailure:
    """A pytest plugin that remembers the first failing test (what killed the mutant)."""

    def __init__(self) -> None:
        self.nodeid: str | None = None

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001
        if report.failed and self.nodeid is None:
            self.nodeid = report.nodeid.rsplit("/", 1)[-1]


def _run_killers(module: str, index: int) -> str | None:
    """In this (child) process: install the mutant, run the killers; the first that fails."""
    if module != "none":  # "none": the control run on the real spec, which must pass
        source = mutated_source(Mutant(module, index, 0, ""))
        sys.meta_path.insert(0, _MutantFinder(f"kvpool.spec.{module[:-3]}", source))
        # Starting this module imported kvpool (and the spec with it): forget all of it, so
        # every later import, the target's included, goes through the finder.
        for name in [n for n in sys.modules if n == "kvpool" or n.startswith("kvpool.")]:
            del sys.modules[name]
    import pytest

    first = _FirstFailure()
    code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
                        *[str(ROOT / t) for t in KILLER_TESTS]], plugins=[first])
    if code != 0:
        return f"unit tests | {first.nodeid}" if first.nodeid else "unit tests"
    from kvpool.verify.exhaustive import SMALL_SCOPES, explore

    for scope in SMALL_SCOPES:
        if not explore(scope).ok:
            return f"exhaustive {scope.name}"
    from kvpool.harness import run_check

    if not run_check(["spec", "reference"], 3000, seed=1, shrink=False).ok:
        return "harness"
    return None


@dataclass
class Result:
    mutant: Mutant
    killed_by: str | None
    seconds: float
    detail: str | None = None
    """For ``unit tests``: the first test that failed."""


def run_mutant(mutant: Mutant, timeout_s: float = 600) -> Result:
    start = time.monotonic()
    command = [sys.executable, "-m", "kvpool.verify.mutate", "--child", mutant.module,
               str(mutant.index)]
    killed: str | None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              cwd=ROOT)
        lines = done.stdout.strip().splitlines()
        verdict = lines[-1] if lines else ""
        if done.returncode != 0 or not verdict.startswith("KILLER:"):
            killed = "crash" if done.returncode != 0 else "unparsable"
        else:
            killed = verdict.removeprefix("KILLER:").strip() or None
            killed = None if killed == "none" else killed
    except subprocess.TimeoutExpired:
        killed = "timeout"
    killed, _, detail = (killed or "").partition(" | ")
    return Result(mutant, killed or None, time.monotonic() - start, detail or None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpool.verify.mutate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=None, metavar="N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--module", action="append", default=None, choices=TARGETS)
    parser.add_argument("--only", action="append", default=None, metavar="MODULE:INDEX",
                        help="run these mutants only (repeatable), e.g. postconditions.py:12")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("MODULE", "INDEX"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        killer = _run_killers(args.child[0], int(args.child[1]))
        print(f"KILLER: {killer or 'none'}")
        return 0
    control = run_mutant(Mutant("none", 0, 0, "the real spec"))
    if control.killed_by:
        print(f"the killers fail on the unmutated spec ({control.killed_by}): fix that first")
        return 2
    pool = mutants(tuple(args.module or TARGETS))
    if args.only:
        wanted = {(m, int(i)) for m, _, i in (o.partition(":") for o in args.only)}
        pool = [m for m in pool if (m.module, m.index) in wanted]
    if args.sample is not None and args.sample < len(pool):
        # In the sample's random order: a run stopped early (its progress lines on stderr)
        # is still a uniform sample, not the first modules only.
        pool = random.Random(args.seed).sample(pool, args.sample)
    done = [0]

    def run_and_report(mutant: Mutant) -> Result:
        result = run_mutant(mutant)
        done[0] += 1
        m = result.mutant
        print(f"[{done[0]}/{len(pool)}] {result.killed_by or 'SURVIVED'}  spec/{m.module}:"
              f"{m.line} (#{m.index})  {m.change}", file=sys.stderr, flush=True)
        return result

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        results = list(ex.map(run_and_report, pool))
    killed = [r for r in results if r.killed_by]
    survivors = [r for r in results if not r.killed_by]
    if args.json:
        print(json.dumps({"mutants": len(results), "killed": len(killed),
                          "score": len(killed) / max(1, len(results)),
                          "results": [asdict(r) for r in results]}, indent=2))
    else:
        for r in results if args.only else survivors:
            m = r.mutant
            verdict = f"KILLED by {r.killed_by}" if r.killed_by else "SURVIVED"
            print(f"{verdict}  spec/{m.module}:{m.line} (#{m.index})  {m.change}"
                  + (f"  [{r.detail}]" if r.detail else ""))
        by: dict[str, int] = {}
        for r in killed:
            if r.killed_by:  # every killed result names its killer
                by[r.killed_by] = by.get(r.killed_by, 0) + 1
        print(f"{len(killed)}/{len(results)} mutants killed "
              f"({100 * len(killed) / max(1, len(results)):.0f} %): {by}")
    return 0 if not survivors else 1


if __name__ == "__main__":
    raise SystemExit(main())
