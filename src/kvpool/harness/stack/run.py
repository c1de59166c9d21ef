"""One whole-stack check: a configuration, its stacks, a seed and a step budget, run until
the first divergence (:func:`run_stack_check`), and what it found (:class:`StackReport`)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.harness.stack.configs import CONFIGURATIONS, StackConfiguration
from kvpool.harness.stack.machine import StackDivergence, StackMachine


@dataclass
class StackReport:
    """What one configuration's run found."""

    configuration: str
    backends: tuple[str, ...]
    seed: int
    steps: int
    divergences: int
    elapsed_s: float
    failure: str | None = None
    coverage: dict[str, int] = field(default_factory=dict)
    error: StackDivergence | None = field(default=None, repr=False, compare=False)
    #: Stacks named but not built (the fast policy where it does not serve the model).
    skipped: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.divergences == 0

    def to_json(self) -> dict[str, Any]:
        return dict(configuration=self.configuration, backends=list(self.backends),
                    seed=self.seed, steps=self.steps, divergences=self.divergences,
                    elapsed_s=round(self.elapsed_s, 3), failure=self.failure,
                    coverage=self.coverage, skipped=list(self.skipped))


def run_stack_check(configuration: str | StackConfiguration, backends: Sequence[str],
                    steps: int, seed: int | None = None,
                    extra: Sequence[Callable[[StackConfiguration], tuple[str, Any]]] = (),
                    progress: Callable[[int], None] | None = None,
                    foreign: Callable[[StackConfiguration], Any] | None = None) -> StackReport:
    """Run ``steps`` stack steps of one configuration; stop at the first divergence.

    ``foreign`` builds a non-kvpool facade (vLLM's) that becomes the oracle."""
    config = CONFIGURATIONS[configuration] if isinstance(configuration, str) else configuration
    if seed is None:
        seed = random.randrange(2**32)
    machine = StackMachine(config, backends, seed, extra, foreign)
    start = time.perf_counter()
    failure = None
    error: StackDivergence | None = None
    log = logging.getLogger("kvpool")
    level = log.level
    log.setLevel(logging.ERROR)  # failed resets warn by design; thousands of lines otherwise
    try:
        machine.run(steps, progress)
    except StackDivergence as found:
        failure, error = str(found), found
    finally:
        log.setLevel(level)
    report = StackReport(config.name, tuple(s.name for s in machine.stacks), seed,
                         machine.steps, 0 if failure is None else 1,
                         time.perf_counter() - start, failure, dict(machine.coverage),
                         skipped=tuple(machine.skipped))
    report.error = error
    return report


__all__ = ["StackReport", "run_stack_check"]
