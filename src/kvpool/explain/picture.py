"""A :class:`~kvpool.explain.session.Snapshot` as a PNG: boxes for blocks (matplotlib, Agg).

Top to bottom: the step's title and explanation; every block of the pool by id (null block
dark, in use blue with its ref count, free without identity white, free and cached gold
with its hash); the free queue in order, front first; each request's block table per group;
then the hash table and the step's events.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

from kvpool.explain.session import BlockView, Snapshot
from kvpool.workload.plot import _pyplot

COLOURS = {"null": "#555555", "used": "#6fa8dc", "free": "#ffffff", "cached": "#ffd966"}
BOX = 1.0  # a block's side, in axis units
GAP = 0.15


def _colour(view: BlockView) -> str:
    if view.block_id == 0:
        return COLOURS["null"]
    if view.queue_position is None:
        return COLOURS["used"]
    return COLOURS["cached"] if view.key else COLOURS["free"]


def _box(ax: Any, x: float, y: float, view: BlockView, caption: str | None = None) -> None:
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), BOX, BOX, facecolor=_colour(view), edgecolor="black",
                           lw=1))
    text_colour = "white" if view.block_id == 0 else "black"
    ax.text(x + BOX / 2, y + BOX * 0.62, str(view.block_id), ha="center", va="center",
            fontsize=12, fontweight="bold", color=text_colour)
    low = caption if caption is not None else (view.key or "")
    if low:
        ax.text(x + BOX / 2, y + BOX * 0.22, low, ha="center", va="center", fontsize=6.5,
                color=text_colour)


def _row_label(ax: Any, y: float, text: str) -> None:
    ax.text(-0.3, y + BOX / 2, text, ha="right", va="center", fontsize=9)


def draw_snapshot(s: Snapshot, total: int, path: str | os.PathLike[str]) -> None:
    """Write one step's picture to ``path``."""
    plt = _pyplot()
    n = len(s.blocks)
    table_rows = sum(len(groups) for _, groups in s.tables)
    text_lines = max(len(s.hash_table), 1) + max(len(s.events), 1) + len(s.notes) + 3
    rows_height = 3 * (BOX + 0.9) + table_rows * (BOX + GAP) + 0.6
    width_units = max(n, 8) * (BOX + GAP) + 4
    fig_w = min(max(9.0, width_units * 0.55), 16.0)
    fig_h = 1.6 + rows_height * 0.5 + text_lines * 0.2
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    ax.set_axis_off()
    wrapped = textwrap.fill(s.explanation, width=int(fig_w * 13))
    fig.suptitle(f"step {s.index + 1}/{total}: {s.title}", fontsize=13, fontweight="bold",
                 x=0.01, ha="left")
    fig.text(0.01, 1 - 0.55 / fig_h, wrapped, fontsize=9, va="top", ha="left")

    y = 0.0
    _row_label(ax, y, "pool (by id)")
    for view in s.blocks:
        caption = f"ref {view.ref_cnt}" if view.queue_position is None and view.block_id \
            else view.key
        _box(ax, view.block_id * (BOX + GAP), y, view, caption)
    y -= BOX + 0.9
    _row_label(ax, y, "free queue\n(front first)")
    for i, b in enumerate(s.free_queue):
        _box(ax, i * (BOX + GAP), y, s.block(b))
    if s.free_queue:
        ax.annotate("", xy=(len(s.free_queue) * (BOX + GAP), y - 0.25), xytext=(0, y - 0.25),
                    arrowprops={"arrowstyle": "<-", "color": "gray"})
        ax.text(0, y - 0.5, "next allocation takes from here", fontsize=7, color="gray")
    else:
        ax.text(0, y + BOX / 2, "(empty)", fontsize=9, va="center")
    y -= BOX + 0.9
    if not s.tables:
        _row_label(ax, y, "block tables")
        ax.text(0, y + BOX / 2, "(no running request)", fontsize=9, va="center")
        y -= BOX + GAP
    for rid, groups in s.tables:
        for g, ids in enumerate(groups):
            label = f"{rid}  g{g} {s.group_names[g]}" if len(groups) > 1 else f"{rid}'s table"
            _row_label(ax, y, label)
            for i, b in enumerate(ids):
                _box(ax, i * (BOX + GAP), y, s.block(b), caption=s.block(b).key or "")
            y -= BOX + GAP
    lines = ["hash table: " + ("; ".join(f"{k} -> {', '.join(map(str, v))}"
                                        for k, v in s.hash_table) or "(empty)")]
    lines += [f"note: {note}" for note in s.notes]
    lines += ["events: " + (" | ".join(s.events) if s.events else "(none)")]
    text = "\n".join(textwrap.fill(line, width=int(fig_w * 14)) for line in lines)
    ax.text(-3.5, y + 0.3, text, fontsize=8, va="top", ha="left", family="monospace")
    ax.set_xlim(-4, width_units - 4)
    ax.set_ylim(y - text_lines * 0.3 - 0.4, BOX + 0.2)
    ax.set_aspect("equal")
    legend = [("null block", "null"), ("in use", "used"), ("free", "free"),
              ("free, cached (hash)", "cached")]
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor=COLOURS[c], edgecolor="black", label=t)
                       for t, c in legend], loc="upper right", fontsize=7, ncol=4,
              bbox_to_anchor=(1.0, 1.25), frameon=False)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def draw_all(snapshots: list[Snapshot], folder: str | os.PathLike[str],
             scenario: str) -> list[Path]:
    """One PNG per step into ``folder`` (created if needed): ``<scenario>-<step>.png``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in snapshots:
        path = out / f"{scenario}-{s.index + 1:02d}.png"
        draw_snapshot(s, len(snapshots), path)
        paths.append(path)
    return paths


__all__ = ["draw_all", "draw_snapshot"]
