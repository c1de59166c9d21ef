"""``run_check``: a budget of differential steps over several pool shapes, as one report.

The budget counts *steps*: rule applications of the state machine, summed over many short
Hypothesis runs (each run: ``examples_per_run`` examples of ``stateful_step_count`` steps,
seeded from the check's seed, no example database). Runs cycle through pool shapes
(:data:`DEFAULT_SHAPES`: small and larger pools, coarse and fine block sizes, caching and
events on and off) until the budget is spent or a check fails. A failure is shrunk by
Hypothesis and reported with its minimal reproduction; the check stops there.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvpool.errors import BackendUnavailable
from kvpool.harness.api import Backend, PoolFactory, common_api
from kvpool.harness.differential import build_machine, run_machine
from kvpool.harness.pool.backends import resolve_backends
from kvpool.harness.pool.config import HarnessConfig
from kvpool.harness.pool.driver import Divergence
from kvpool.harness.pool.machine import StepCounter
from kvpool.harness.pool.profiles import get_profile
from kvpool.harness.reproduction import hash_seed

DEFAULT_SHAPES: tuple[HarnessConfig, ...] = (
    HarnessConfig(num_blocks=16, hash_block_size=2, block_size=4),
    HarnessConfig(num_blocks=8, hash_block_size=2, block_size=6),
    HarnessConfig(num_blocks=32, hash_block_size=1, block_size=1, enable_kv_cache_events=False),
    HarnessConfig(num_blocks=12, hash_block_size=2, block_size=4, enable_caching=False),
    HarnessConfig(num_blocks=24, hash_block_size=2, block_size=4, num_groups=3),
    HarnessConfig(num_blocks=16, hash_block_size=2, block_size=4, request_extras=True),
    HarnessConfig(num_blocks=12, hash_block_size=2, block_size=4, request_extras=True,
                  extra_options={"num_hash_lookahead_tokens": 2, "use_int_block_hashes": False}),
)
"""Pool shapes a check cycles through (backends are filled in by :func:`run_check`)."""

Progress = Callable[[int, int, float], None]
"""``progress(steps done, steps budget, elapsed seconds)``."""


@dataclass
class CheckReport:
    """What a check did and found. ``divergences`` excludes invariant violations."""

    backends: list[str]
    steps: int
    divergences: int
    invariant_violations: int
    steps_per_s: float
    seed: int
    elapsed_s: float = 0.0
    examples: int = 0
    steps_to_first_divergence: int | None = None
    failure_kind: str | None = None
    failure: str | None = None
    reproduction: str | None = None
    shapes: list[str] = field(default_factory=list)
    documented_deviations: dict[str, int] = field(default_factory=dict)
    """Deviations tolerated because BEHAVIOUR.md documents them (description → calls)."""
    not_generated: list[str] = field(default_factory=list)
    """Call families left out because a backend's version lacks them (its API scope)."""
    hash_seed: str = field(default_factory=hash_seed)
    failure_rule: str | None = None
    """The rule whose call failed: a §12 invalid-call rule names the documented row."""

    @property
    def ok(self) -> bool:
        return not (self.divergences or self.invariant_violations)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_check(
    backends: Sequence[str | PoolFactory | Backend],
    steps: int,
    seed: int | None = None,
    *,
    num_blocks: int | None = None,
    shapes: Sequence[HarnessConfig] = DEFAULT_SHAPES,
    invalid_calls: bool = True,
    stateful_step_count: int = 50,
    examples_per_run: int = 20,
    shrink: bool = True,
    shrink_seconds: float = 20.0,
    progress: Progress | None = None,
) -> CheckReport:
    """Run about ``steps`` differential steps over ``backends`` (first = oracle).

    ``seed`` makes the check reproducible (a random one is drawn and reported when ``None``).
    ``num_blocks`` overrides every shape's pool size. ``invalid_calls=False`` keeps to valid
    calls and non-raising watchers (for pools that do not validate). Stops at the first
    failure, minimised for at most ``shrink_seconds``.
    """
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    resolved = resolve_backends(backends)
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    counter = StepCounter()
    api = common_api([b.api for b in resolved])
    report = CheckReport([b.label for b in resolved], 0, 0, 0, 0.0, seed,
                         not_generated=api.missing())
    start = time.perf_counter()
    run_index = 0
    shapes = [s for s in shapes if api.lookahead
              or not s.extra_options.get("num_hash_lookahead_tokens")] or list(shapes)
    while counter.steps < steps:
        shape = shapes[run_index % len(shapes)]
        cfg = replace(shape, backends=resolved, invalid_calls=invalid_calls,
                      raising_watchers=invalid_calls, api=api)
        if num_blocks is not None:
            cfg = replace(cfg, num_blocks=num_blocks)
        if cfg.describe() not in report.shapes:
            report.shapes.append(cfg.describe())
        remaining_examples = -(-(steps - counter.steps) // stateful_step_count)
        settings = get_profile("ci").settings(
            min(examples_per_run, remaining_examples),
            shrink=shrink,
            stateful_step_count=stateful_step_count,
        )
        machine = build_machine(cfg, counter)
        try:
            with _quiet_pool_warnings():
                run_machine(machine, settings, seed=rng.getrandbits(64),
                            shrink_seconds=shrink_seconds)
        except Divergence as error:
            _record_failure(report, error.kind, str(error), error.reproduction)
            first = counter.first_divergence
            report.failure_rule = first.rule if first is not None else error.rule
            break
        except BackendUnavailable:
            raise  # a setup problem, not a finding
        except Exception as error:  # noqa: BLE001 - a crash is a finding too, reported as such
            _record_failure(report, "error", f"{type(error).__name__}: {error}", None)
            break
        finally:
            run_index += 1
            if progress is not None:
                progress(counter.steps, steps, time.perf_counter() - start)
    report.elapsed_s = time.perf_counter() - start
    report.steps = counter.steps
    report.examples = counter.examples
    report.steps_per_s = counter.steps / report.elapsed_s if report.elapsed_s else 0.0
    report.steps_to_first_divergence = counter.first_divergence_at
    report.documented_deviations = dict(counter.deviations)
    return report


@contextmanager
def _quiet_pool_warnings() -> Iterator[None]:
    """Mute the pools' warnings (kvpool's and vLLM's): a check refuses thousands of resets on
    purpose, and vLLM logs each one."""
    loggers = [logging.getLogger(name) for name in ("kvpool", "vllm")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _record_failure(report: CheckReport, kind: str, text: str, reproduction: str | None) -> None:
    report.failure_kind = kind
    report.failure = text
    report.reproduction = reproduction
    if kind == "invariant":
        report.invariant_violations += 1
    else:
        report.divergences += 1


__all__ = ["DEFAULT_SHAPES", "CheckReport", "Progress", "run_check"]
