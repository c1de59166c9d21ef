"""``kvpool bench`` and ``kvpool contracts`` draw their progress on a terminal's stderr only:
never into a pipe, never with ``--json`` (the same rule as ``simulate`` and ``check``)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

BENCH = ["bench", "--quick", "--suite", "construct", "--backends", "reference"]
CONTRACTS = ["contracts", "--only", "is_block_writable", "--per-condition", "1"]


def _run(args, terminal):
    """Run ``kvpool ARGS``; with ``terminal`` stderr is a pseudo-terminal. (rc, stdout, err)."""
    if not terminal:
        done = subprocess.run([sys.executable, "-m", "kvpool", *args], capture_output=True,
                              text=True, check=False, timeout=300)
        return done.returncode, done.stdout, done.stderr
    master, slave = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "kvpool", *args], stdout=subprocess.PIPE,
                              stderr=slave, check=False, timeout=300)
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


@pytest.mark.parametrize(("args", "label", "unit"), [(BENCH, "kvpool bench", "suites"),
                                                     (CONTRACTS, "CrossHair", "contracts")])
def test_progress_is_drawn_on_a_terminal_only(args, label, unit):
    rc, _, drawn = _run(args, terminal=True)
    assert rc == 0 and label in drawn and unit in drawn
    rc, out, err = _run(args, terminal=False)
    assert rc == 0 and err == "" and "\x1b[" not in out
    rc, out, drawn = _run([*args, "--json"], terminal=True)
    assert rc == 0 and drawn == "" and out.lstrip().startswith("{")
