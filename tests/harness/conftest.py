"""Hypothesis budget of the harness tests, chosen by ``KVPOOL_HYPOTHESIS_PROFILE``.

``ci`` (default: derandomised, a few minutes on 2 cores), ``nightly`` (twenty times the
examples, fresh randomness) or ``dev``/``local`` (a quick loop). The profiles themselves are
defined once, in :mod:`kvpool.harness.pool.profiles`; this is the only place the variable is read.
The chosen profile is registered with Hypothesis as ``kvpool-harness`` (never loaded
globally, so other test directories keep their own settings).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from kvpool.harness.pool.profiles import get_profile

PROFILE = get_profile(os.environ.get("KVPOOL_HYPOTHESIS_PROFILE", "ci"))
settings.register_profile("kvpool-harness", PROFILE.settings(100))


@pytest.fixture(scope="session")
def harness_profile():
    """The :class:`~kvpool.harness.pool.profiles.Profile` this run uses."""
    return PROFILE
