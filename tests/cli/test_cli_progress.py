"""``kvpool bench`` and ``kvpool contracts`` draw their progress on a terminal's stderr only:
never into a pipe, never with ``--json`` (the same rule as ``simulate`` and ``check``)."""

from __future__ import annotations

import pytest

from cli.terminal import run_kvpool

BENCH = ["bench", "--quick", "--suite", "construct", "--backends", "reference"]
CONTRACTS = ["contracts", "--only", "is_block_writable", "--per-condition", "1"]


@pytest.mark.parametrize(("args", "label", "unit"), [
    (BENCH, "kvpool bench", "suites"),
    pytest.param(CONTRACTS, "CrossHair", "contracts", marks=pytest.mark.long),
])
def test_progress_is_drawn_on_a_terminal_only(args, label, unit):
    rc, _, drawn = run_kvpool(args, terminal=True)
    assert rc == 0 and label in drawn and unit in drawn
    rc, out, err = run_kvpool(args, terminal=False)
    assert rc == 0 and err == "" and "\x1b[" not in out
    rc, out, drawn = run_kvpool([*args, "--json"], terminal=True)
    assert rc == 0 and drawn == "" and out.lstrip().startswith("{")
