"""Hypothesis settings profiles for the harness: the one place budgets are defined.

A profile scales a caller's base example count and fixes the run length of one state-machine
example. ``ci`` is derandomised, so a green build stays green and a planted bug is caught at
the same step on every machine; ``nightly`` searches twenty times longer with fresh
randomness; ``local`` (alias ``dev``) is a quick loop that keeps Hypothesis's example
database, so a failure found once is replayed first next time.

Nothing here reads the environment: test configuration (``tests/harness/conftest.py``) picks
the profile name, the CLI passes ``--seed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, settings

DEFAULT_PROFILE = "ci"


@dataclass(frozen=True)
class Profile:
    """How hard to search: example scale, steps per example, randomness, example database."""

    name: str
    example_scale: float
    stateful_step_count: int
    derandomize: bool
    use_database: bool

    def settings(self, max_examples: int = 100, *, shrink: bool = True, **overrides) -> settings:
        """Hypothesis settings for ``max_examples`` base examples, scaled by this profile."""
        phases = [Phase.explicit, Phase.reuse, Phase.generate]
        if shrink:
            phases.append(Phase.shrink)
        values: dict[str, Any] = dict(
            max_examples=max(1, round(max_examples * self.example_scale)),
            stateful_step_count=self.stateful_step_count,
            derandomize=self.derandomize,
            deadline=None,
            phases=phases,
            report_multiple_bugs=False,
            # Stateful runs are long by design; the harness measures its own speed.
            suppress_health_check=list(HealthCheck),
            print_blob=False,
        )
        if not self.use_database:
            values["database"] = None
        values.update(overrides)
        return settings(**values)


PROFILES: dict[str, Profile] = {
    "ci": Profile("ci", 1.0, 50, derandomize=True, use_database=False),
    "nightly": Profile("nightly", 20.0, 100, derandomize=False, use_database=False),
    "local": Profile("local", 0.25, 30, derandomize=False, use_database=True),
}
PROFILES["dev"] = PROFILES["local"]


def get_profile(name: str = DEFAULT_PROFILE) -> Profile:
    """The profile called ``name`` (``ci``, ``nightly``, ``local``/``dev``)."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown harness profile {name!r}; known: {known}") from None


def harness_settings(
    profile: str = DEFAULT_PROFILE, max_examples: int = 100, **overrides
) -> settings:
    """Shorthand: ``get_profile(profile).settings(max_examples, **overrides)``."""
    return get_profile(profile).settings(max_examples, **overrides)


__all__ = ["DEFAULT_PROFILE", "PROFILES", "Profile", "get_profile", "harness_settings"]
