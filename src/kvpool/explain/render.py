"""A :class:`~kvpool.explain.session.Snapshot` as rich text: one panel per step."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvpool.explain.session import Snapshot


def _free_queue(s: Snapshot) -> Table:
    table = Table(title="free queue, front first", title_justify="left",
                  header_style="bold")
    table.add_column("position", justify="right")
    table.add_column("block", justify="right")
    table.add_column("ref", justify="right")
    table.add_column("hash")
    for position, b in enumerate(s.free_queue):
        view = s.block(b)
        table.add_row(str(position), str(b), str(view.ref_cnt), view.key or "-",
                      style="yellow" if view.key else None)
    return table


def _in_use(s: Snapshot) -> Table:
    table = Table(title="blocks in use", title_justify="left", header_style="bold")
    table.add_column("block", justify="right")
    table.add_column("ref", justify="right")
    table.add_column("hash")
    for view in s.blocks[1:]:
        if view.queue_position is None:
            table.add_row(str(view.block_id), str(view.ref_cnt), view.key or "-",
                          style="cyan")
    return table


def _hash_table(s: Snapshot) -> Table:
    table = Table(title="hash table", title_justify="left", header_style="bold")
    table.add_column("hash")
    table.add_column("blocks")
    for key, blocks in s.hash_table:
        table.add_row(key, ", ".join(map(str, blocks)))
    return table


def _block_tables(s: Snapshot) -> Table:
    table = Table(title="block tables", title_justify="left", header_style="bold")
    table.add_column("request")
    for name in s.group_names:
        table.add_column(f"g{s.group_names.index(name)} {name}")
    for rid, groups in s.tables:
        table.add_row(rid, *(" ".join(map(str, ids)) or "-" for ids in groups))
    return table


def snapshot_renderable(s: Snapshot, total: int) -> Panel:
    """One step: explanation, the pool's tables side by side, the events."""
    side = Table.grid(padding=(0, 3))
    side.add_row(_free_queue(s), Group(_in_use(s), _hash_table(s), _block_tables(s)))
    parts: list = [Text(s.explanation), Text("")]
    for note in s.notes:
        parts.append(Text(note, style="italic"))
    parts.append(side)
    events = "\n".join(s.events) if s.events else "(none)"
    parts.append(Text(f"events: {events}", style="magenta"))
    return Panel(Group(*parts), title=f"step {s.index + 1}/{total}: {s.title}",
                 title_align="left")


def render_text(snapshots: list[Snapshot]) -> list[Panel]:
    """Every step's panel, in order."""
    return [snapshot_renderable(s, len(snapshots)) for s in snapshots]


__all__ = ["render_text", "snapshot_renderable"]
