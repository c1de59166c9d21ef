"""The call log of one lockstep run, rendered as a pytest function you can paste.

Every pool call the harness makes is recorded here *before* it runs, so when a check fails
the last recorded call is the one that diverged. Rendering turns the log into plain Python::

    def test_reproduction():
        pool = lockstep(["spec", "reference"], num_blocks=8, hash_block_size=2)
        r0 = pool.make_request([1, 1, 2, 2])
        pool.get_new_blocks(2)
        pool.free_blocks([2, 1])  # <- diverged here

``pool`` is a :class:`~kvpool.harness.pool.driver.Lockstep`: running the function replays the
calls on every backend and raises the same :class:`~kvpool.harness.pool.driver.Divergence`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

IMPORTS = (
    "from kvpool.harness import RAISE, RECORD, Foreign, lockstep\n"
    "from kvpool.harness.rules.hostile_values import (COLLECT, COLLECT_RAISING, COLLECT_REENTRANT, "
    "REENTER_ALLOCATE, REENTER_FREE, REENTER_UNPIN, with_hash, without_tokens)"
)


def hash_seed() -> str:
    """This process's ``PYTHONHASHSEED`` (``"random"`` when unset): set iteration order, and
    with it vLLM's secondary-key order, depends on it, so a reproduction names it."""
    if not sys.flags.hash_randomization:
        return "0"
    return os.environ.get("PYTHONHASHSEED") or "random"


@dataclass
class Reproduction:
    """Setup line, request definitions and calls of one run, in order."""

    setup: str
    lines: list[str] = field(default_factory=list)
    _names: dict[int, str] = field(default_factory=dict)
    _bytes: dict[bytes, str] = field(default_factory=dict)
    _keep_alive: list[Any] = field(default_factory=list)
    num_calls: int = 0

    def define(self, name: str, value: Any, expression: str,
               aliases: dict[bytes, str] | None = None) -> None:
        """Record ``name = expression``; ``value`` itself then prints as ``name``.

        ``aliases`` name byte strings derived from it (``r0.block_hashes[2]``), so hashes print
        as where they come from rather than as 32 raw bytes.
        """
        self._names[id(value)] = name
        self._keep_alive.append(value)  # ids must stay unique while the log lives
        for raw, alias in (aliases or {}).items():
            self._bytes.setdefault(raw, alias)
        self.lines.append(f"{name} = {expression}")

    def call(self, target: str, method: str, args: tuple, kwargs: dict) -> None:
        """Record ``target.method(*args, **kwargs)``."""
        parts = [self.render(a) for a in args]
        parts += [f"{k}={self.render(v)}" for k, v in kwargs.items()]
        self.lines.append(f"{target}.{method}({', '.join(parts)})")
        self.num_calls += 1

    def render(self, value: Any) -> str:
        """Valid Python for one argument value."""
        name = self._names.get(id(value))
        if name is not None:
            return name
        if isinstance(value, bytes) and value in self._bytes:
            return self._bytes[value]
        if isinstance(value, list):
            return "[" + ", ".join(self.render(v) for v in value) + "]"
        if isinstance(value, tuple):
            inner = ", ".join(self.render(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        return repr(value)

    def render_calls(self, *, mark_last: bool = True) -> str:
        """The setup line, definitions and calls, one per line."""
        lines = [self.setup, *self.lines]
        if mark_last and self.num_calls:
            lines[-1] += "  # <- diverged here"
        return "\n".join(lines)

    def render_test(self, name: str = "test_reproduction", *, mark_last: bool = True) -> str:
        """A pytest function replaying the log (imports included)."""
        body = self.render_calls(mark_last=mark_last)
        seed_note = (f"# recorded with PYTHONHASHSEED={hash_seed()} (set order of bytes depends "
                     "on it; rerun with the same value)")
        lines = [seed_note, *IMPORTS.splitlines(), "", *body.splitlines()]
        indented = "\n".join("    " + line if line else "" for line in lines)
        return f"def {name}():\n{indented}\n"


__all__ = ["IMPORTS", "Reproduction", "hash_seed"]
