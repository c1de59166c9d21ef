"""Run CrossHair over the spec's contracts within a time budget and report what it found.

:func:`run_contracts` starts one ``crosshair check --analysis_kind=icontract`` subprocess per
contracted operation of :mod:`kvpool.spec.contracts` (a few in parallel), with the bounded
``PoolState`` creator of :mod:`kvpool.verify.crosshair_states` as a plugin. Each contract has
one postcondition, searched for ``per_condition_timeout`` CPU seconds. A contract is
*checked* when its search ran to the end: either no counterexample (which proves nothing
beyond the paths explored) or a counterexample, reported verbatim. The CLI is
``kvpool contracts``.

The subprocess CLI is used, not CrossHair's Python internals: the CLI and its output format
(``file:line: error: message``, exit 0/1/2) are CrossHair's stable interface.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

CONTRACTS_MODULE = "kvpool.spec.contracts"
PLUGIN = Path(__file__).with_name("crosshair_plugin.py")

PER_PATH_TIMEOUT_S = 10.0
"""CPU seconds before CrossHair abandons one path. Fixed, not CrossHair's default (the square
root of the per-condition budget): a path near the limit would otherwise be kept or dropped
depending on the budget and the machine's load, and the seeded search would diverge."""

STARTUP_ALLOWANCE_S = 30.0
"""Wall time allowed beyond the CPU budget for imports, solver start-up and the last path."""

_ERROR_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): error: (?P<message>.*)$")
_STATES_LINE = re.compile(r"kvpool-crosshair: states_built=(?P<n>\d+)")


@dataclass(frozen=True)
class ContractResult:
    """What CrossHair did with one contract.

    ``status``: ``"no-counterexample"`` (search ran to its budget, nothing found),
    ``"counterexample"``, ``"error"`` (CrossHair itself failed; ``detail`` says why),
    ``"timeout"`` (killed at the wall-clock limit) or ``"skipped"`` (total budget exhausted
    before it started).
    """

    target: str
    status: str
    seconds: float = 0.0
    states_built: int | None = None
    counterexamples: tuple[str, ...] = ()
    detail: str = ""

    @property
    def checked(self) -> bool:
        return self.status in ("no-counterexample", "counterexample")


@dataclass(frozen=True)
class ContractReport:
    """The outcome of one :func:`run_contracts` call."""

    results: tuple[ContractResult, ...]
    seconds: float
    per_condition_timeout: float
    timeout_s: float
    workers: int = 1

    @property
    def contracts_checked(self) -> list[str]:
        return [r.target for r in self.results if r.checked]

    @property
    def counterexamples(self) -> list[dict[str, str]]:
        return [
            {"contract": r.target, "message": message}
            for r in self.results
            for message in r.counterexamples
        ]

    @property
    def problems(self) -> list[ContractResult]:
        """Contracts not checked to the end (error, timeout, skipped)."""
        return [r for r in self.results if not r.checked]

    @property
    def ok(self) -> bool:
        """No counterexample, and every contract was checked."""
        return not self.counterexamples and not self.problems

    def to_json(self) -> dict:
        return {
            "contracts_checked": self.contracts_checked,
            "counterexamples": self.counterexamples,
            "seconds": round(self.seconds, 1),
            "per_condition_timeout": self.per_condition_timeout,
            "timeout_s": self.timeout_s,
            "workers": self.workers,
            "results": [
                {
                    "contract": r.target,
                    "status": r.status,
                    "seconds": round(r.seconds, 1),
                    "states_built": r.states_built,
                    **({"detail": r.detail} if r.detail else {}),
                }
                for r in self.results
            ],
        }


def contract_names() -> list[str]:
    """The contracted operations, in the order of :mod:`kvpool.spec.ops`."""
    from kvpool.spec.contracts import CONTRACTS

    return list(CONTRACTS)


def _qualify(target: str) -> str:
    # A bare operation name means the contract in kvpool.spec.contracts; anything with a dot
    # or a path separator is passed to CrossHair as is (module.function or file.py).
    if "." in target or os.sep in target:
        return target
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
    wall_limit_s: float,
    *,
    pythonpath: Sequence[str | os.PathLike] = (),
) -> ContractResult:
    """Run CrossHair on one contracted function (``module.function`` or an op name)."""
    qualified = _qualify(target)
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
        return ContractResult(target, "timeout", time.monotonic() - start,
                              detail=f"killed after {wall_limit_s:.0f} s wall clock")
    seconds = time.monotonic() - start
    found = tuple(
        m["message"] for line in done.stdout.splitlines() if (m := _ERROR_LINE.match(line))
    )
    states = _STATES_LINE.search(done.stderr)
    states_built = int(states["n"]) if states else None
    if done.returncode == 0 and not found and states_built == 0:
        # Nothing was explored (no contract on the target?): that is not a clean check.
        return ContractResult(target, "error", seconds, 0,
                              detail="crosshair explored no path (no contract found?)")
    if done.returncode == 0 and not found:
        return ContractResult(target, "no-counterexample", seconds, states_built)
    if done.returncode == 1 and found:
        return ContractResult(target, "counterexample", seconds, states_built, found)
    tail = (done.stderr.strip() or done.stdout.strip())[-2000:]
    return ContractResult(target, "error", seconds, states_built, found,
                          detail=f"crosshair exited {done.returncode}: {tail}")


def run_contracts(
    timeout_s: float,
    per_condition_timeout: float,
    targets: Iterable[str] | None = None,
    *,
    workers: int = 2,
    pythonpath: Sequence[str | os.PathLike] = (),
) -> ContractReport:
    """Check each contract for ``per_condition_timeout`` CPU seconds, all within ``timeout_s``.

    ``targets``: operation names of :mod:`kvpool.spec.contracts` (default: all twelve) or
    fully qualified ``module.function`` names of other contracted functions (importable via
    ``pythonpath``). Contracts run ``workers`` at a time; one not started before the total
    budget would run out is reported as skipped, one still running at the deadline is
    killed and reported as a timeout.
    """
    names = list(targets) if targets is not None else contract_names()
    start = time.monotonic()
    deadline = start + timeout_s

    def run(target: str) -> ContractResult:
        remaining = deadline - time.monotonic()
        if remaining < per_condition_timeout:
            return ContractResult(target, "skipped",
                                  detail=f"{remaining:.0f} s of the total budget left")
        wall = min(remaining, per_condition_timeout * 3 + STARTUP_ALLOWANCE_S)
        return check_one(target, per_condition_timeout, wall, pythonpath=pythonpath)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = tuple(pool.map(run, names))
    return ContractReport(
        results=results,
        seconds=time.monotonic() - start,
        per_condition_timeout=per_condition_timeout,
        timeout_s=timeout_s,
        workers=workers,
    )
