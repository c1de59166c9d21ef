"""``kvpool simulate --plot``: one PNG of a replay, step by step (matplotlib, headless).

Three panels over scheduler steps: pool usage (with its mean and the running requests),
the cumulative prefix-hit rate, and evictions per step (with a moving average, since single
steps are spiky). Needs the ``plot`` extra (``pip install kvpool[plot]``).
"""

from __future__ import annotations

import os
from typing import Any

from kvpool.errors import BackendUnavailable


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise BackendUnavailable(
            "--plot needs matplotlib: pip install 'kvpool[plot]'") from None
    matplotlib.use("Agg")  # headless: no display needed, nothing opens a window
    import matplotlib.pyplot as plt

    return plt


def _moving_average(values: list[int], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_report(report: Any, path: str | os.PathLike[str], title: str | None = None) -> None:
    """Write the three-panel picture of ``report`` (a
    :class:`~kvpool.workload.serving.ServingReport`) to ``path`` as PNG."""
    plt = _pyplot()
    series = report.series
    steps = list(range(len(series.usage)))
    fig, (ax_usage, ax_hits, ax_evict) = plt.subplots(3, 1, figsize=(10, 7.5), sharex=True,
                                                      constrained_layout=True)
    fig.suptitle(title or f"kvpool simulate: {report.workload or 'trace'} workload, "
                 f"{report.model} model, {report.backend} backend "
                 f"({report.num_blocks} blocks of {report.block_size} tokens)", fontsize=12)

    ax_usage.plot(steps, [100 * u for u in series.usage], color="tab:blue", lw=1,
                  label="pool usage")
    ax_usage.axhline(100 * report.mean_usage, color="tab:blue", ls="--", lw=1,
                     label=f"mean {report.mean_usage:.0%}")
    ax_usage.set_ylabel("blocks in use (%)")
    ax_usage.set_ylim(0, 105)
    running = ax_usage.twinx()
    running.plot(steps, series.running, color="tab:gray", lw=0.8, alpha=0.6,
                 label="running requests")
    running.set_ylabel("running requests", color="tab:gray")
    running.set_ylim(0, max(series.running, default=1) * 1.1 + 1)
    lines = ax_usage.get_legend_handles_labels()
    more = running.get_legend_handles_labels()
    ax_usage.legend(lines[0] + more[0], lines[1] + more[1], loc="upper right", fontsize=9)
    ax_usage.set_title(f"peak usage {report.peak_usage:.1%}, {report.preemptions} "
                       "preemptions", fontsize=10, loc="left")

    ax_hits.plot(steps, [100 * h for h in series.hit_rate], color="tab:green", lw=1.5)
    ax_hits.set_ylabel("prefix-hit rate (%)")
    ax_hits.set_ylim(0, 100)
    ax_hits.set_title(f"cumulative: {report.hit_tokens:,} of {report.prompt_tokens:,} prompt "
                      f"tokens = {report.hit_rate:.1%}", fontsize=10, loc="left")

    window = max(1, len(steps) // 100)
    ax_evict.bar(steps, series.evictions, width=1.0, color="tab:red", alpha=0.35,
                 label="per step")
    ax_evict.plot(steps, _moving_average(series.evictions, window), color="tab:red", lw=1.2,
                  label=f"mean over {window} steps")
    ax_evict.set_ylabel("evictions per step")
    ax_evict.set_xlabel("scheduler step")
    ax_evict.legend(loc="upper right", fontsize=9)
    ax_evict.set_title(f"{report.evictions:,} cached blocks evicted", fontsize=10, loc="left")
    for ax in (ax_usage, ax_hits, ax_evict):
        ax.grid(True, alpha=0.3)
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["plot_report"]
