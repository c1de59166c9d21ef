"""Run CrossHair over the spec's contracts, each for a CPU-time budget, and report per contract.

:func:`run_contracts` starts one ``crosshair check --analysis_kind=icontract`` subprocess per
contract (a few in parallel), with the bounded ``PoolState`` creator of
:mod:`kvpool.verify.crosshair_states` as a plugin. Two families of contracts:

* the operation contracts of :mod:`kvpool.spec.contracts` (``free_blocks``, …): from every
  valid state and valid arguments, every invariant and the exact postcondition hold;
* the precondition contracts of :mod:`kvpool.spec.precondition_contracts`
  (``free_blocks_rejection``, …): over *any* arguments, the precondition rejects exactly
  BEHAVIOUR.md §12's invalid set.

**Budgets are CPU seconds per contract** (CrossHair's ``--per_condition_timeout`` and
``--per_path_timeout`` are measured with ``time.process_time``) and the search is seeded, so a
loaded machine explores the same paths as an idle one, only more slowly: the verdict does not
depend on load. Wall clock is only a safety net (:data:`WALL_FACTOR` times the budget plus
:data:`STARTUP_ALLOWANCE_S`); a contract stopped by it, or never started before an optional
overall deadline, is reported ``not-finished`` — no verdict, distinct from a counterexample.

Per contract the report says ``checked`` (searched to its CPU budget, or exhaustively; no
counterexample), ``counterexample`` (with CrossHair's message and, from
:mod:`kvpool.verify.explain`, the broken invariant or postcondition clause), ``not-finished``
or ``error`` (CrossHair itself failed). The CLI is ``kvpool contracts``.

The subprocess CLI is used, not CrossHair's Python internals: the CLI and its output format
(``file:line: error: message``, exit 0/1/2) are CrossHair's stable interface.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

CONTRACTS_MODULE = "kvpool.spec.contracts"
PRECONDITION_MODULE = "kvpool.spec.precondition_contracts"
FOCUSED_MODULE = "kvpool.spec.focused_contracts"
PLUGIN = Path(__file__).with_name("crosshair_plugin.py")

PER_PATH_TIMEOUT_S = 10.0
"""CPU seconds before CrossHair abandons one path. Fixed, not CrossHair's default (the square
root of the per-condition budget): a path near the limit would otherwise be kept or dropped
depending on the budget and the machine's load, and the seeded search would diverge."""

STARTUP_ALLOWANCE_S = 120.0
"""Wall seconds allowed beyond ``WALL_FACTOR`` × the CPU budget (imports, solver start-up)."""

WALL_FACTOR = 8.0
"""A contract may take this many wall seconds per CPU second of budget before it is stopped
as ``not-finished``: room for a machine shared by several busy processes."""

STATUSES = ("checked", "counterexample", "not-finished", "error")

EXIT_OK, EXIT_COUNTEREXAMPLE, EXIT_NOT_FINISHED, EXIT_ERROR = 0, 1, 3, 4
"""``kvpool contracts`` exit statuses (2 is bad usage): a counterexample outranks the rest."""

_ERROR_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): error: (?P<message>.*)$")
_STATES_LINE = re.compile(r"kvpool-crosshair: states_built=(?P<n>\d+)")


@dataclass(frozen=True)
class ContractResult:
    """What CrossHair did with one contract (``status``: one of :data:`STATUSES`)."""

    target: str
    status: str
    seconds: float = 0.0
    states_built: int | None = None
    counterexamples: tuple[str, ...] = ()
    detail: str = ""
    budget_s: float = 0.0
    explanations: tuple[str | None, ...] = ()
    """Per counterexample: the broken invariant / postcondition clause (None if unreadable)."""

    @property
    def checked(self) -> bool:
        """Searched to the end of its budget (with or without a counterexample)."""
        return self.status in ("checked", "counterexample")


@dataclass(frozen=True)
class ContractReport:
    """The outcome of one :func:`run_contracts` call."""

    results: tuple[ContractResult, ...]
    seconds: float
    per_condition_timeout: float
    timeout_s: float | None
    workers: int = 1
    precondition_timeout: float | None = None

    @property
    def contracts_checked(self) -> list[str]:
        return [r.target for r in self.results if r.checked]

    @property
    def counterexamples(self) -> list[dict[str, str]]:
        return [
            {"contract": r.target, "message": message,
             "broken": (r.explanations[i] if i < len(r.explanations) else None) or ""}
            for r in self.results
            for i, message in enumerate(r.counterexamples)
        ]

    @property
    def problems(self) -> list[ContractResult]:
        """Contracts without a verdict (not finished, CrossHair error)."""
        return [r for r in self.results if not r.checked]

    @property
    def ok(self) -> bool:
        """No counterexample, and every contract was searched to its budget."""
        return not self.counterexamples and not self.problems

    @property
    def exit_status(self) -> int:
        """1 counterexample; else 4 a CrossHair error; else 3 a budget not reached; else 0."""
        if self.counterexamples:
            return EXIT_COUNTEREXAMPLE
        if any(r.status == "error" for r in self.results):
            return EXIT_ERROR
        if self.problems:
            return EXIT_NOT_FINISHED
        return EXIT_OK

    def to_json(self) -> dict:
        return {
            "contracts_checked": self.contracts_checked,
            "counterexamples": self.counterexamples,
            "not_finished": [r.target for r in self.results if r.status == "not-finished"],
            "errors": [r.target for r in self.results if r.status == "error"],
            "exit_status": self.exit_status,
            "seconds": round(self.seconds, 1),
            "per_condition_timeout": self.per_condition_timeout,
            "precondition_timeout": self.precondition_timeout,
            "timeout_s": self.timeout_s,
            "workers": self.workers,
            "results": [
                {
                    "contract": r.target,
                    "status": r.status,
                    "cpu_budget_s": r.budget_s,
                    "seconds": round(r.seconds, 1),
                    "states_built": r.states_built,
                    **({"detail": r.detail} if r.detail else {}),
                    **({"broken": [e or "" for e in r.explanations]} if r.explanations else {}),
                }
                for r in self.results
            ],
        }


def operation_contract_names() -> list[str]:
    """The contracted operations, in the order of :mod:`kvpool.spec.ops`."""
    from kvpool.spec.contracts import CONTRACTS

    return list(CONTRACTS)


def precondition_contract_names() -> list[str]:
    """The contracted preconditions (``<op>_rejection``), in the same order."""
    from kvpool.spec.precondition_contracts import PRECONDITION_CONTRACTS

    return list(PRECONDITION_CONTRACTS)


def focused_contract_names() -> list[str]:
    """The focused contracts (:mod:`kvpool.spec.focused_contracts`): operations first."""
    from kvpool.spec.focused_contracts import (
        FOCUSED_OPERATION_CONTRACTS,
        FOCUSED_PRECONDITION_CONTRACTS,
    )

    return list(FOCUSED_OPERATION_CONTRACTS + FOCUSED_PRECONDITION_CONTRACTS)


def _precondition_budgeted() -> set[str]:
    """Contracts searched for the precondition budget: every ``<op>_rejection*``."""
    from kvpool.spec.focused_contracts import FOCUSED_PRECONDITION_CONTRACTS

    return set(precondition_contract_names()) | set(FOCUSED_PRECONDITION_CONTRACTS)


def contract_names() -> list[str]:
    """Every contract ``kvpool contracts`` checks: operations, preconditions, then the
    focused contracts."""
    return operation_contract_names() + precondition_contract_names() + focused_contract_names()


def _qualify(target: str) -> str:
    # A bare name means a contract of kvpool.spec; anything with a dot or a path separator
    # is passed to CrossHair as is (module.function or file.py).
    if "." in target or os.sep in target:
        return target
    if target in precondition_contract_names():
        return f"{PRECONDITION_MODULE}.{target}"
    if target in focused_contract_names():
        return f"{FOCUSED_MODULE}.{target}"
    return f"{CONTRACTS_MODULE}.{target}"


def _environment(pythonpath: Sequence[str | os.PathLike]) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(p) for p in pythonpath]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def check_one(
    target: str,
    per_condition_timeout: float,
    wall_limit_s: float | None = None,
    *,
    pythonpath: Sequence[str | os.PathLike] = (),
) -> ContractResult:
    """Run CrossHair on one contracted function (``module.function`` or a contract name).

    ``per_condition_timeout`` is CPU seconds; ``wall_limit_s`` (default: the safety net
    ``WALL_FACTOR × budget + STARTUP_ALLOWANCE_S``) only stops a search that cannot finish.
    """
    qualified = _qualify(target)
    if wall_limit_s is None:
        wall_limit_s = WALL_FACTOR * per_condition_timeout + STARTUP_ALLOWANCE_S
    command = [
        sys.executable,
        "-m",
        "crosshair",
        "check",
        "--analysis_kind=icontract",
        f"--extra_plugin={PLUGIN}",
        f"--per_condition_timeout={per_condition_timeout}",
        f"--per_path_timeout={min(PER_PATH_TIMEOUT_S, per_condition_timeout)}",
        qualified,
    ]
    start = time.monotonic()
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=wall_limit_s,
            env=_environment(pythonpath),
        )
    except subprocess.TimeoutExpired:
        return ContractResult(target, "not-finished", time.monotonic() - start,
                              budget_s=per_condition_timeout,
                              detail=f"stopped after {wall_limit_s:.0f} s wall clock before "
                              f"its {per_condition_timeout:g} s CPU budget was spent")
    seconds = time.monotonic() - start
    found = tuple(
        m["message"] for line in done.stdout.splitlines() if (m := _ERROR_LINE.match(line))
    )
    states = _STATES_LINE.search(done.stderr)
    states_built = int(states["n"]) if states else None
    if done.returncode == 0 and not found and states_built == 0:
        # Nothing was explored (no contract on the target?): that is not a clean check.
        return ContractResult(target, "error", seconds, 0, budget_s=per_condition_timeout,
                              detail="crosshair explored no path (no contract found?)")
    if done.returncode == 0 and not found:
        return ContractResult(target, "checked", seconds, states_built,
                              budget_s=per_condition_timeout)
    if done.returncode == 1 and found:
        from kvpool.verify.explain import explain

        return ContractResult(target, "counterexample", seconds, states_built, found,
                              budget_s=per_condition_timeout,
                              explanations=tuple(explain(qualified, m, pythonpath)
                                                 for m in found))
    tail = (done.stderr.strip() or done.stdout.strip())[-2000:]
    return ContractResult(target, "error", seconds, states_built, found,
                          budget_s=per_condition_timeout,
                          detail=f"crosshair exited {done.returncode}: {tail}")


def run_contracts(
    timeout_s: float | None,
    per_condition_timeout: float,
    targets: Iterable[str] | None = None,
    *,
    workers: int = 2,
    precondition_timeout: float | None = None,
    pythonpath: Sequence[str | os.PathLike] = (),
    on_progress: Callable[[int, int], None] | None = None,
) -> ContractReport:
    """Search each contract for its CPU budget; report a verdict per contract.

    ``targets``: contract names (default: :func:`contract_names`, all of them) or fully
    qualified ``module.function`` names (importable via ``pythonpath``). Operation contracts
    get ``per_condition_timeout`` CPU seconds, precondition contracts
    ``precondition_timeout`` (default: the same). ``timeout_s`` is an optional overall wall
    deadline: a contract not started before it is ``not-finished``. Contracts run
    ``workers`` at a time. ``on_progress(done, total)`` is called as each contract finishes.
    """
    names = list(targets) if targets is not None else contract_names()
    preconditions = _precondition_budgeted()
    pre_budget = precondition_timeout or per_condition_timeout
    start = time.monotonic()
    deadline = None if timeout_s is None else start + timeout_s

    finished = [0]
    lock = threading.Lock()

    def run(target: str) -> ContractResult:
        budget = pre_budget if target in preconditions else per_condition_timeout
        if deadline is not None and time.monotonic() >= deadline:
            result = ContractResult(target, "not-finished", budget_s=budget,
                                    detail=f"not started: the {timeout_s:g} s deadline passed")
        else:
            result = check_one(target, budget, pythonpath=pythonpath)
        if on_progress is not None:
            with lock:
                finished[0] += 1
                on_progress(finished[0], len(names))
        return result

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = tuple(pool.map(run, names))
    return ContractReport(
        results=results,
        seconds=time.monotonic() - start,
        per_condition_timeout=per_condition_timeout,
        timeout_s=timeout_s,
        workers=workers,
        precondition_timeout=pre_budget,
    )
