"""A long-lived child process that answers one JSON line per JSON command line.

The benchmarks against vLLM run vLLM in its own venv's python and talk to it this way
(:mod:`kvpool.bench.vs_vllm`, :mod:`kvpool.bench.vllm_scheduler`): one process serves every
round, so vLLM's import (~9 s) is paid once and the rounds can alternate between the sides.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from kvpool.errors import InvalidConfig


class JsonLineProcess:
    """``argv`` started with ``env``; :meth:`ask` writes a command, reads its answer."""

    #: What the error says stopped (``"the vLLM side"``, ...).
    name = "the child process"

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env)

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``command``; lines that are not JSON objects (a library printing to
        stdout) are skipped. :class:`InvalidConfig` with the child's stderr if it stopped."""
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(command) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        while line and not line.startswith("{"):
            line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr is not None else ""
            raise InvalidConfig(f"{self.name} stopped: {err.strip()[-3000:]}")
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=120)


__all__ = ["JsonLineProcess"]
