"""Callbacks a pool delivers after an operation: reuse watchers and the metrics collector.

Deviation from vLLM (docs/data-structures.md, "Watchers and events"): callbacks run after the
operation has completed and the pool agrees with its core. Every callback runs whatever the
others do; the first failure is re-raised, typed, after the last, carrying the operation's
result. While callbacks run the pool answers queries but refuses every state-changing call
(:class:`~kvpool.errors.ReentrantCall`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvpool.errors import CallbackError, MetricsCollectorError, ReentrantCall, WatcherError

OnReuse = Callable[[int], None]
"""A reuse watcher: called with the block id when an unpinned block is reallocated.

Deviation from vLLM (docs/data-structures.md, "Watchers and events"): watchers run after the
operation has completed, so a watcher that queries the pool sees the block already
reallocated. The block's *memory* is still intact — nothing has written it before the caller
gets the ids back — which is all an asynchronous reader needs to know to stop reading.

Re-entrancy (docs/api.md, "Callbacks"): while a pool delivers its callbacks (reuse watchers,
metrics collector) it answers queries, but every state-changing method raises
:class:`~kvpool.errors.ReentrantCall` before changing anything.
"""



class CallbackDelivery:
    """The watcher table and the delivery of callbacks (see the module docstring)."""

    _delivering = False  # True while callbacks run: state-changing calls are refused
    _callbacks: dict[int, OnReuse]
    metrics_collector: Any

    def watched_blocks(self) -> tuple[int, ...]:
        """Blocks with a pending reuse watcher, in watcher-table order."""
        return tuple(self._callbacks)

    def _refuse_reentry(self, method: str) -> None:
        """Raise :class:`ReentrantCall` if a callback of this pool is running (see ``OnReuse``)."""
        if self._delivering:
            raise ReentrantCall(
                f"{method} was called from a reuse watcher or metrics collector while the "
                "pool delivers its callbacks; state-changing calls are refused then "
                "(queries are allowed): make the call after the operation returns"
            )

    def _deliver(
        self,
        metrics: Sequence[tuple[str, tuple[object, ...]]],
        fired: Sequence[int],
        result: object = None,
    ) -> None:
        """Run the collector's ``metrics`` calls, then the watchers of ``fired`` blocks.

        Every callback runs, whatever the others do; the first failure is re-raised after
        the last (:class:`MetricsCollectorError` or :class:`WatcherError`) with the
        operation's ``result`` as ``.result``, so nothing (e.g. fresh block ids) is lost.
        The watcher table agrees with the core before any callback runs, and callbacks may
        only query the pool (:class:`ReentrantCall`).
        """
        callbacks = [(int(b), self._callbacks.pop(int(b))) for b in fired]
        first: tuple[type[CallbackError], str, Exception] | None = None
        collector = self.metrics_collector
        self._delivering = True
        try:
            for method, args in metrics:
                try:
                    getattr(collector, method)(*args)
                except Exception as exc:  # noqa: BLE001 - re-raised below, typed
                    if first is None:
                        first = (MetricsCollectorError, f"metrics collector {method}", exc)
            for b, callback in callbacks:
                try:
                    callback(b)
                except Exception as exc:  # noqa: BLE001 - re-raised below, typed
                    if first is None:
                        first = (WatcherError, "a reuse watcher", exc)
        finally:
            self._delivering = False
        if first is not None:
            kind, who, cause = first
            error = kind(f"{who} raised: {cause!r}")
            error.result = result
            raise error from cause

    def _fire_watchers(self, fired: Sequence[int], result: object = None) -> None:
        """Call the watchers of ``fired`` blocks in order (see :meth:`_deliver`)."""
        self._deliver((), fired, result)
