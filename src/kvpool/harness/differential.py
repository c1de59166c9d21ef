"""Building the state machine for a configuration, and the pytest entry point.

``make_differential_test(backends=[...])`` returns a ``unittest.TestCase`` class that pytest
collects like any other::

    from kvpool.harness import make_differential_test

    TestMyPool = make_differential_test(["spec", MyPoolFactory], num_blocks=16)

Each example runs a fresh set of pools through ``stateful_step_count`` rules; a failure is
shrunk and reported as a pasteable reproduction (see :mod:`kvpool.harness.reproduction`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import hypothesis.internal.conjecture.engine as _engine
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as Settings
from hypothesis.stateful import get_state_machine_test

from kvpool.harness.api import Backend, PoolFactory
from kvpool.harness.pool.config import HarnessConfig
from kvpool.harness.pool.machine import StepCounter
from kvpool.harness.pool.profiles import harness_settings
from kvpool.harness.rules.cache import CacheRules
from kvpool.harness.rules.hostile import HostileRules, WrongTypeRules
from kvpool.harness.rules.invalid import InvalidCallRules
from kvpool.harness.rules.release import ReleaseRules


def build_machine(config: HarnessConfig, counter: StepCounter | None = None,
                  name: str = "DifferentialPoolMachine") -> type:
    """A state-machine class bound to ``config`` (and to ``counter`` for step counting).

    The rules come from five modules over one model (:class:`~kvpool.harness.pool.machine.
    PoolMachine`): allocation and hits, caching, releases, §12's invalid calls, and
    issue 7's hostile callbacks and argument types, and (with ``invalid_calls``) issue 23's
    wrong Python types.
    """
    attrs = {"config": config, "counter": counter or StepCounter(), "__module__": __name__}
    rules: tuple[type, ...] = (HostileRules, InvalidCallRules, CacheRules, ReleaseRules)
    if config.invalid_calls:
        rules = (WrongTypeRules, *rules)
    return type(name, rules, attrs)


@contextmanager
def shrink_time_limit(seconds: float | None) -> Iterator[None]:
    """Cap Hypothesis's shrinking at ``seconds`` (it then reports the smallest failure so far).

    Hypothesis allows five minutes and has no setting for it; a stateful example with a
    rare precondition can take that long to minimise. The cap is Hypothesis's module
    constant, restored on exit (left alone if a future version drops it).
    """
    if seconds is None or not hasattr(_engine, "MAX_SHRINKING_SECONDS"):
        yield
        return
    saved, saved_report = _engine.MAX_SHRINKING_SECONDS, _engine.report
    # Annotated int by Hypothesis; only ever compared with elapsed (float) seconds.
    _engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]

    def report(text: str) -> None:  # Hypothesis's warning names its own five-minute default
        saved_report(shrink_warning(text, seconds))

    _engine.report = report
    try:
        yield
    finally:
        _engine.MAX_SHRINKING_SECONDS, _engine.report = saved, saved_report


def shrink_warning(text: str, seconds: float) -> str:
    """Hypothesis's slow-shrink warning rewritten for kvpool's cap of ``seconds``.

    Hypothesis hard-codes "five minutes" and asks to be told about slow shrinking; under the
    cap neither is true: shrinking stopped at the cap on purpose and the smallest failure so
    far is reported. Other messages pass unchanged.
    """
    if "spent more than five minutes working to shrink" not in text:
        return text
    return (
        f"kvpool: shrinking stopped at its {seconds:g} s cap (shrink_seconds); the smallest "
        "failure found so far is reported below."
    )


def run_machine(machine: type, settings: Settings, seed: int | None = None,
                shrink_seconds: float | None = None) -> None:
    """Run ``machine`` as a Hypothesis test under ``settings``, seeded when ``seed`` is given.

    Raises the (shrunk) failure, normally a :class:`~kvpool.harness.pool.driver.Divergence`.
    """
    test = get_state_machine_test(machine, settings=settings)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    with shrink_time_limit(shrink_seconds):
        test()


def make_differential_test(
    backends: Sequence[str | PoolFactory | Backend],
    *,
    settings: Settings | None = None,
    name: str | None = None,
    **config: Any,
) -> type:
    """A ``unittest.TestCase`` class running the differential machine over ``backends``.

    ``backends[0]`` is the oracle (normally ``"spec"``). ``config`` sets any
    :class:`HarnessConfig` field (``num_blocks``, ``hash_block_size``, ``block_size``,
    ``enable_caching``, ``enable_kv_cache_events``, ``invalid_calls``, ...). ``settings``
    defaults to the ``ci`` profile.
    """
    cfg = HarnessConfig(backends=tuple(backends), **config)
    machine: Any = build_machine(cfg, name=name or "DifferentialPoolMachine")
    test_case = machine.TestCase  # RuleBasedStateMachine's; build_machine returns a type
    test_case.settings = settings if settings is not None else harness_settings("ci")
    test_case.__name__ = test_case.__qualname__ = f"Test{name or 'DifferentialPool'}"
    return test_case


__all__ = [
    "build_machine",
    "make_differential_test",
    "run_machine",
    "shrink_time_limit",
    "shrink_warning",
]
