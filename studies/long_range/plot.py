"""The long-range suite's plot: retrieval accuracy against distance, one panel per task."""

from __future__ import annotations

import numpy as np

from txl.analysis.plots import pyplot, save_figure


def plot_long_range(series: dict, path) -> dict:
    """Retrieval accuracy against distance (``txl bench --long-range``): one panel per task, one line per
    row (the mean over seeds, a band from the lowest to the highest seed), each row's direct reach
    marked on its line.

    Args:
        series: ``{task: {row name: (distances, means, lows, highs, reach)}}``.

    Returns ``{task: {row name: (distances, means)}}``, what was drawn.

    Raises:
        TxlError: matplotlib is not installed, or the path cannot be written.
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, len(series), figsize=(5.2 * len(series), 3.8), sharey=True)
    axes = np.atleast_1d(axes)
    drawn: dict = {}
    for ax, (task, rows) in zip(axes, series.items()):
        drawn[task] = {}
        for name, (xs, ys, lows, highs, reach) in rows.items():
            (line,) = ax.plot(xs, ys, marker="o", markersize=3, label=name)
            ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.15)
            if reach in xs:
                ax.plot([reach], [ys[xs.index(reach)]], marker="|", markersize=14, color=line.get_color())
            drawn[task][name] = (list(xs), list(ys))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("distance from the fact to its question (tokens)")
        ax.set_title(task)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("exact-match accuracy")
    axes[-1].legend(fontsize=7)
    save_figure(fig, path)
    return drawn
