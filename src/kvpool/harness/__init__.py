"""Differential testing of block pools: every backend against the spec, one call at a time.

Entry points:

* :func:`make_differential_test` — a pytest-collectable ``TestCase`` for your backends;
* :func:`run_check` — the library function behind ``kvpool check`` (a :class:`CheckReport`);
* :func:`lockstep` — drive several pools by hand (what a pasted reproduction does);
* :class:`ObjectPoolAdapter` — wrap an object-based pool (vLLM-shaped) in the id-based API.

See ``docs/harness.md``.
"""

from kvpool.harness.adapter import ObjectPoolAdapter
from kvpool.harness.backends import Backend, resolve_backend, resolve_backends
from kvpool.harness.check import CheckReport, run_check
from kvpool.harness.config import HarnessConfig
from kvpool.harness.differential import build_machine, make_differential_test, run_machine
from kvpool.harness.driver import Divergence, Lockstep, Reply, lockstep
from kvpool.harness.profiles import PROFILES, Profile, get_profile, harness_settings
from kvpool.harness.reproduction import Reproduction
from kvpool.harness.requests import make_request
from kvpool.harness.values import RAISE, RECORD, Foreign

__all__ = [
    "PROFILES",
    "RAISE",
    "RECORD",
    "Backend",
    "CheckReport",
    "Divergence",
    "Foreign",
    "HarnessConfig",
    "Lockstep",
    "ObjectPoolAdapter",
    "Profile",
    "Reply",
    "Reproduction",
    "build_machine",
    "get_profile",
    "harness_settings",
    "lockstep",
    "make_differential_test",
    "make_request",
    "resolve_backend",
    "resolve_backends",
    "run_check",
    "run_machine",
]
