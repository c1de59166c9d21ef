"""The one stopwatch of a replay: every pool or KV cache manager call goes through
:meth:`TimedCalls._call`, so ``pool_s`` covers exactly those calls (two timer reads each
included) and nothing of the driver around them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class TimedCalls:
    """Mixin: ``pool_calls``, ``pool_s`` (``perf_counter``), ``pool_cpu_s`` (``thread_time``),
    and the same split by verb in ``verb_calls`` / ``verb_s``."""

    def _reset_timing(self) -> None:
        self.pool_calls = 0
        self.pool_s = self.pool_cpu_s = 0.0
        self.verb_calls: dict[str, int] = {}
        self.verb_s: dict[str, float] = {}

    def _call(self, verb: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        cpu = time.thread_time()
        began = time.perf_counter()
        result = method(*args, **kwargs)
        elapsed = time.perf_counter() - began
        self.pool_cpu_s += time.thread_time() - cpu
        self.pool_s += elapsed
        self.pool_calls += 1
        self.verb_calls[verb] = self.verb_calls.get(verb, 0) + 1
        self.verb_s[verb] = self.verb_s.get(verb, 0.0) + elapsed
        return result
