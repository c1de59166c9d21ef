"""The whole suite: ``long`` tests are deselected unless asked for.

The default run (the README's ``pytest -q -n 2``) stays within three minutes on two cores and
still touches every layer; tests marked ``long`` (full step budgets, CrossHair searches that
take ten seconds and more, benchmark replays) run with ``-m long`` — ``.ci/run`` runs them
as a step of their own — or with ``KVPOOL_RUN_LONG=1`` added to any run.
"""

from __future__ import annotations

import os

import pytest


def _long_wanted(config: pytest.Config) -> bool:
    return "long" in (config.getoption("markexpr") or "") or bool(
        os.environ.get("KVPOOL_RUN_LONG"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _long_wanted(config):
        return
    kept = [item for item in items if item.get_closest_marker("long") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("long")])
        items[:] = kept
