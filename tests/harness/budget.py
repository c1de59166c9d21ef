"""Example budgets for the harness tests, scaled by the profile ``conftest.py`` registered."""

from __future__ import annotations

from hypothesis import settings

PROFILE_NAME = "kvpool-harness"


def budget(max_examples: int, **overrides) -> settings:
    """The registered profile, with ``max_examples`` scaled like the profile scales 100."""
    base = settings.get_profile(PROFILE_NAME)
    scaled = max(1, max_examples * base.max_examples // 100)
    return settings(base, max_examples=scaled, **overrides)


def step_budget(steps: int) -> int:
    """A step budget for ``run_check`` scaled like example counts."""
    base = settings.get_profile(PROFILE_NAME)
    return max(1, steps * base.max_examples // 100)
