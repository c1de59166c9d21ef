"""``kvpool explain``: short scenarios whose every step shows the whole pool.

* :mod:`~kvpool.explain.session` – a small KV cache manager that records a snapshot per step;
* :mod:`~kvpool.explain.scenarios` – the named scenarios (``lru``, ``sharing``,
  ``eviction``, ``copy-on-write``, ``sliding-window``);
* :mod:`~kvpool.explain.render` – a snapshot as rich text;
* :mod:`~kvpool.explain.picture` – a snapshot as a PNG (matplotlib).
"""

from kvpool.explain.scenarios import DEFAULT_SCENARIO, SCENARIOS
from kvpool.explain.session import Session, Snapshot

__all__ = ["DEFAULT_SCENARIO", "SCENARIOS", "Session", "Snapshot"]
