"""Spec tests: ``slow`` tests (long CrossHair budgets) run only when asked for.

Select them with ``-m slow`` (or any marker expression naming ``slow``) or set
``KVPOOL_RUN_SLOW=1``; the default run stays within a few minutes on two cores.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr") or "") or os.environ.get("KVPOOL_RUN_SLOW"):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or KVPOOL_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords and str(item.path).startswith(str(os.path.dirname(__file__))):
            item.add_marker(skip)
