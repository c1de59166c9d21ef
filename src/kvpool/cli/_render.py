"""Terminal output of the subcommands, through ``rich``: tables on stdout, progress on stderr.

Consoles are made per call (``sys.stdout`` may be replaced, e.g. by a test's capture). When
stdout is not a terminal, rich writes no colour codes and a fixed width of
:data:`PIPE_WIDTH` columns, so piped output stays plain and its tables unwrapped. The
progress bar goes to stderr, only when stderr is a terminal and the command is not printing
``--json``; it disappears when the work is done.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

PIPE_WIDTH = 120
"""Columns rich lays tables out in when stdout is not a terminal."""


def stdout_console() -> Console:
    """A console on the current ``sys.stdout``."""
    tty = sys.stdout.isatty()
    return Console(file=sys.stdout, width=None if tty else PIPE_WIDTH, highlight=False,
                   soft_wrap=False)


def print_renderable(*renderables: Any) -> None:
    """Print rich renderables (tables, text with markup) to stdout."""
    console = stdout_console()
    for renderable in renderables:
        console.print(renderable)


def key_value_table(rows: Sequence[tuple[str, str]], title: str | None = None) -> Table:
    """A two-column table: what, value."""
    table = Table(title=title, show_header=False, title_justify="left", box=None,
                  pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in rows:
        table.add_row(name, value)
    return table


def grid_table(header: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None,
               right_from: int = 1, left: Sequence[int] = ()) -> Table:
    """A table with a header row; columns from ``right_from`` on are right-aligned (numbers),
    except those in ``left``."""
    table = Table(title=title, title_justify="left", header_style="bold")
    for i, name in enumerate(header):
        right = i >= right_from and i not in left
        # fold, not ellipsis: a long figure name (alloc64_free64_arrays) stays readable
        table.add_column(name, justify="right" if right else "left", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def progress_enabled(json_output: bool) -> bool:
    """Whether a progress bar should be drawn: stderr is a terminal and no ``--json``."""
    return not json_output and sys.stderr.isatty()


class ProgressUpdate:
    """What :func:`progress_bar` gives: ``update(done, total)``; ``describe(text)`` relabels
    the bar, ``note(line)`` prints a line that stays above it. All do nothing when the bar
    is not drawn."""

    def __init__(self, progress: Progress | None = None, task: Any = None) -> None:
        self._progress = progress
        self._task = task
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if self._progress is None:
            return
        now = time.monotonic()
        if now - self._last >= 0.1 or done >= total:
            self._last = now
            self._progress.update(self._task, completed=min(done, total), total=total)

    def describe(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=text)

    def note(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, highlight=False)


@contextlib.contextmanager
def progress_bar(description: str, enabled: bool, unit: str = "steps"
                 ) -> Iterator[ProgressUpdate]:
    """A context giving ``update(done, total)`` (:class:`ProgressUpdate`): a transient bar on
    stderr when ``enabled`` (redrawn at most ten times a second), else an update that does
    nothing."""
    if not enabled:
        yield ProgressUpdate()
        return
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn(unit), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as progress:
        yield ProgressUpdate(progress, progress.add_task(description, total=None))


@contextlib.contextmanager
def phase_status(description: str, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A context giving ``log(line)``: when ``enabled`` a transient spinner on stderr showing
    the latest phase and the time elapsed, else each line printed to stderr as it comes."""
    if not enabled:
        yield lambda line: print(line, file=sys.stderr, flush=True)
        return
    columns = (SpinnerColumn(), TextColumn("[bold]{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as progress:
        task = progress.add_task(description, total=None)
        yield lambda line: progress.update(task, description=f"{description}: {line}")


__all__ = ["PIPE_WIDTH", "ProgressUpdate", "phase_status", "grid_table", "key_value_table",
           "print_renderable", "progress_bar", "progress_enabled", "stdout_console"]
