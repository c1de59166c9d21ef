"""Run ``python -m kvpool ARGS`` with stderr on a pipe or on a pseudo-terminal, to see what a
user at a terminal would have seen drawn there (progress bars) and what a pipe gets."""

from __future__ import annotations

import os
import pty
import subprocess
import sys


def run_kvpool(args: list[str], terminal: bool) -> tuple[int, str, str]:
    """``(exit status, stdout, stderr)``; with ``terminal`` stderr is a pseudo-terminal and the
    third item is everything drawn on it."""
    command = [sys.executable, "-m", "kvpool", *args]
    if not terminal:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=300)
        return done.returncode, done.stdout, done.stderr
    master, slave = pty.openpty()
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=slave, check=False,
                              timeout=300)
    finally:
        os.close(slave)
    drawn = b""
    try:
        while chunk := os.read(master, 65536):
            drawn += chunk
    except OSError:  # the terminal closed: everything was read
        pass
    os.close(master)
    return done.returncode, done.stdout.decode(), drawn.decode("utf-8", "replace")
