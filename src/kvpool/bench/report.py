"""Turning samples into figures: medians, ratios to the reference, targets, text tables.

A **ratio** says how many times better a backend is than the reference measured in the same
run (> 1 = better): ``value / reference`` for rates (``*_per_s``), ``reference / value`` for
times (``*_s``, ``*_us``) and memory (``*bytes_per_block``). Counts, hit rates and warm-up
times get no ratio.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

REFERENCE = "reference"

Samples = dict[str, dict[str, list[float]]]
Figures = dict[str, dict[str, float]]


def medians(samples: Samples) -> Figures:
    """``{backend: {figure: median of its samples}}``."""
    return {
        backend: {name: statistics.median(values) for name, values in figures.items()}
        for backend, figures in samples.items()
    }


def direction(figure: str) -> str | None:
    """``"higher"`` or ``"lower"`` is better, or ``None`` for figures without a ratio."""
    if figure == "warmup_s":
        return None
    if figure.endswith("_per_s"):
        return "higher"
    if figure.endswith(("_s", "_us", "bytes_per_block")):
        return "lower"
    return None


def ratios(figures: Figures) -> Figures:
    """``{backend: {figure: times better than the reference}}`` (empty without a reference)."""
    reference = figures.get(REFERENCE)
    if reference is None:
        return {}
    out: Figures = {}
    for backend, values in figures.items():
        if backend == REFERENCE:
            continue
        row = {}
        for name, value in values.items():
            better, ref = direction(name), reference.get(name)
            if better is None or ref is None or ref <= 0 or value <= 0:
                continue
            row[name] = value / ref if better == "higher" else ref / value
        out[backend] = row
    return out


@dataclass(frozen=True)
class Target:
    """A performance goal of the fast backend (benchmarks/README.md)."""

    name: str
    suite: str
    figure: str
    goal: float
    kind: str  # "min_ratio": ratio to the reference >= goal; "max": value <= goal
    backend: str = "fast"

    def evaluate(self, results: dict[str, Any], quick: bool) -> dict[str, Any]:
        """``{name, suite, figure, goal, value, met}``; ``met`` is None when not measured."""
        if self.kind == "min_ratio":
            value = results.get("ratios", {}).get(self.suite, {}).get(self.backend, {})
        else:
            value = results.get(self.suite, {}).get(self.backend, {})
        measured = None if quick else value.get(self.figure)
        met = None
        if measured is not None:
            met = measured >= self.goal if self.kind == "min_ratio" else measured <= self.goal
        return {
            "name": self.name,
            "suite": self.suite,
            "figure": self.figure,
            "goal": self.goal,
            "value": measured,
            "met": met,
        }


TARGETS = (
    Target("trace pool time >= 20x faster than the reference", "trace", "pool_s", 20, "min_ratio"),
    Target("1M-block construction <= 10 ms", "construct", "construct_1M_s", 0.010, "max"),
    Target(
        "1M-block construction <= 64 bytes per block",
        "construct",
        "construct_1M_bytes_per_block",
        64,
        "max",
    ),
    Target(
        "alloc64+free64 >= 30x the reference's blocks/s",
        "micro",
        "alloc_free_64_blocks_per_s",
        30,
        "min_ratio",
    ),
    Target("single-block get_new_blocks+free_blocks pair <= 1 us", "micro",
           "alloc_free_1_pair_us", 1.0, "max"),
)


def format_value(figure: str, value: float) -> str:
    """A figure in readable units."""
    if figure.endswith("_per_s"):
        for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if value >= scale:
                return f"{value / scale:.2f}{unit}/s"
        return f"{value:.1f}/s"
    if figure.endswith("_us"):
        return f"{value:.3f} us"
    if figure.endswith("_s"):
        return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.3f} s"
    if figure.endswith("bytes_per_block"):
        return f"{value:.1f} B"
    if figure == "hit_rate":
        return f"{value:.2%}"
    if float(value).is_integer():
        return f"{int(value)}"
    return f"{value:.4g}"


def headline(results: dict[str, Any]) -> str:
    """The line above the tables: how many runs, and what a ratio compares."""
    meta = results.get("meta", {})
    return (f"kvpool bench: medians of {meta.get('repeat', '?')} runs"
            + (" (quick sizes)" if meta.get("quick") else "")
            + "; ratio = times better than kvpool's reference backend in the same run"
            " (reference ratios, not vLLM's: for those, kvpool bench --vs-vllm PYTHON)")


def suite_tables(results: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per suite ``(suite, header, rows)`` as text, for every renderer (the plain
    :func:`format_results`, the CLI's rich tables): figures × backends, then each backend's
    ratio to the reference."""
    ratio_table = results.get("ratios", {})
    tables = []
    for suite in results.get("meta", {}).get("suites", []):
        figures: Figures = results.get(suite, {})
        if not figures:
            continue
        backends = list(figures)
        ratio_backends = [b for b in backends if b in ratio_table.get(suite, {})]
        names = list(dict.fromkeys(n for b in backends for n in figures[b]))
        header = ["figure", *backends, *(f"{b}/ref" for b in ratio_backends)]
        rows = []
        for name in names:
            row = [name]
            row += [format_value(name, figures[b][name]) if name in figures[b] else "-"
                    for b in backends]
            row += [
                f"{ratio_table[suite][b][name]:.1f}x" if name in ratio_table[suite][b] else "-"
                for b in ratio_backends
            ]
            rows.append(row)
        tables.append((suite, header, rows))
    return tables


def target_rows(results: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    """Per target ``(name, measured value as text or None, verdict)``."""
    quick = results.get("meta", {}).get("quick")
    rows: list[tuple[str, str | None, str]] = []
    for t in results.get("targets", []):
        if t["met"] is None:
            rows.append((t["name"], None, "not measured" + (" (quick sizes)" if quick else "")))
        else:
            rows.append((t["name"], _target_value(t), "met" if t["met"] else "NOT met"))
    return rows


def format_results(results: dict[str, Any]) -> str:
    """Plain-text tables, one per suite, then the targets."""
    lines = [headline(results)]
    for suite, header, rows in suite_tables(results):
        rows = [header, *rows]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines.append("")
        lines.append(f"[{suite}]")
        for row in rows:
            cells = [row[0].ljust(widths[0])]
            cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
            lines.append("  ".join(cells))
    targets = target_rows(results)
    if targets:
        lines.append("")
        lines.append("[targets] (fast backend)")
        for name, value, verdict in targets:
            lines.append(f"  {name}: {verdict}" + (f" ({value})" if value is not None else ""))
    return "\n".join(lines)


def _target_value(target: dict[str, Any]) -> str:
    value = target["value"]
    for t in TARGETS:
        if t.name == target["name"] and t.kind == "min_ratio":
            return f"{value:.1f}x"
    return format_value(target["figure"], value)


__all__ = ["REFERENCE", "TARGETS", "Target", "direction", "format_results", "headline", "medians",
           "ratios", "suite_tables", "target_rows"]
