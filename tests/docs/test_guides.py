"""The guides: every spec invariant is taught, every page is reachable, every link resolves,
and the README's first screen stays two commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvpool.spec.invariants import INVARIANTS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PYTHON_BLOCK = re.compile(r"```python\n.*?```", re.S)


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## ", text, flags=re.M)
    return {part.splitlines()[0]: part for part in parts[1:]}


@pytest.mark.parametrize("invariant", [i.name for i in INVARIANTS])
def test_every_invariant_has_a_section_with_what_why_which_op_and_an_example(invariant):
    sections = _sections((DOCS / "invariants.md").read_text())
    matching = [body for title, body in sections.items() if f"`{invariant}`" in title]
    assert matching, f"docs/invariants.md has no section for {invariant}"
    body = matching[0]
    for part in ("**What.**", "**Why.**", "**Which operation could break it.**"):
        assert part in body, f"{invariant}: no {part}"
    assert PYTHON_BLOCK.search(body), f"{invariant}: no runnable example"
    assert invariant in body.split("```python", 1)[1], f"{invariant}: the example never checks it"


def test_the_invariants_page_is_run_by_the_doc_tests():
    assert (DOCS / "invariants.md").read_text().startswith("<!-- runnable")


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_docs_page_is_linked_from_the_readme(page):
    assert f"docs/{page}" in README.read_text()


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_pages_with_python_examples_run_them():
    for page in DOCS.glob("*.md"):
        text = page.read_text()
        if PYTHON_BLOCK.search(text):
            assert text.startswith("<!-- runnable"), f"{page.name} has examples no test runs"


def test_the_readme_first_screen_is_two_commands():
    first_screen = README.read_text().split("\n---\n", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", first_screen, re.S)
    assert [b.strip() for b in blocks] == [
        'python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]" '
        "&& .venv/bin/kvpool simulate",
        ".venv/bin/python -m pytest -q -n 2",
    ]


def test_the_readme_pictures_are_small_pngs():
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README.read_text()):
        image = ROOT / target
        assert image.read_bytes()[:4] == b"\x89PNG" and image.stat().st_size < 200_000
