"""A reader that leaves early (``kvpool ... | head``) gets no traceback."""

from __future__ import annotations

import subprocess
import sys

from kvpool.cli import EXIT_BROKEN_PIPE


def test_a_closed_stdout_ends_the_command_quietly():
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvpool", "simulate", "--backend", "reference",
         "--requests", "5", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # before the command has written anything
    stderr = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE
    assert "Traceback" not in stderr
