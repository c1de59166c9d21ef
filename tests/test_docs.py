"""The docs teach with runnable examples: every python block of an opted-in page must run.

A page opts in with a first line ``<!-- runnable ... -->``; its blocks run in order in one
namespace, like a notebook.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    p for p in sorted((ROOT / "docs").glob("*.md")) if p.read_text().startswith("<!-- runnable")
]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def test_some_pages_are_runnable():
    assert PAGES, "no docs page opted in to running its examples"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_of_the_page_runs(page: Path):
    namespace: dict = {}
    blocks = BLOCK.findall(page.read_text())
    assert blocks
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{page.name}[block {i}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message is the point
            raise AssertionError(f"{page.name} block {i} failed: {exc!r}\n{code}") from exc
