"""Differential testing of block pools: every backend against the spec, one call at a time.

Entry points:

* :func:`make_differential_test` — a pytest-collectable ``TestCase`` for your backends;
* :func:`run_check` — the library function behind ``kvpool check`` (a :class:`CheckReport`);
* :func:`lockstep` — drive several pools by hand (what a pasted reproduction does);
* :class:`ObjectPoolAdapter` — wrap an object-based pool (vLLM-shaped) in the id-based API.

The rooms, bottom up (each imports only from the rooms above it in this list):

* the vocabulary every part shares — :mod:`~kvpool.harness.api` (what a pool under test
  offers, a :class:`Backend`), :mod:`~kvpool.harness.values` (how replies compare),
  :mod:`~kvpool.harness.requests`, :mod:`~kvpool.harness.reproduction`;
* :mod:`kvpool.harness.stack` — the whole-stack machine (configurations, invariants, rules);
* :mod:`kvpool.harness.foreign` — adapters for pools and managers not written for kvpool
  (object pools, vLLM's ``BlockPool`` and ``KVCacheManager``);
* :mod:`kvpool.harness.bugs` — the planted bugs both machines must catch;
* :mod:`kvpool.harness.pool` — the pool machine: backends by name, the lockstep driver, the
  state machine and its settings;
* :mod:`kvpool.harness.rules` — the rule sets the pool machine draws its calls from;
* the entry points that assemble them — :mod:`~kvpool.harness.differential`,
  :mod:`~kvpool.harness.check`, :mod:`~kvpool.harness.detection`,
  :mod:`~kvpool.harness.conformance`.

See ``docs/harness.md``; ``docs/architecture.md`` has the layering the tests enforce.
"""

from kvpool.harness.api import Backend, PoolApi
from kvpool.harness.check import CheckReport, run_check
from kvpool.harness.differential import build_machine, make_differential_test, run_machine
from kvpool.harness.foreign.objects import ObjectPoolAdapter
from kvpool.harness.pool.backends import resolve_backend, resolve_backends
from kvpool.harness.pool.config import HarnessConfig
from kvpool.harness.pool.driver import Divergence, Lockstep, Reply, lockstep
from kvpool.harness.pool.profiles import PROFILES, Profile, get_profile, harness_settings
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
    "PoolApi",
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
