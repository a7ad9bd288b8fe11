"""The figure of bench/sampling.py: per graph and thread count, ms per batch of every arm and
the physical bound (top), and the speedup over PyG with pyg-lib (bottom)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from common import save_figure

_STYLE = {
    "gnnserve": ("o-", "gnnserve"),
    "pyg-lib": ("s--", "PyG + pyg-lib"),
    "torch-sparse": ("^:", "PyG + torch-sparse (deprecated)"),
}


def _errorbar(ax: Any, x: list[int], stats: list[dict[str, float]], fmt: str, **kw: Any) -> None:
    med = [s["median"] for s in stats]
    err = np.array(
        [[s["median"] - s["min"] for s in stats], [s["max"] - s["median"] for s in stats]]
    )
    ax.errorbar(x, med, yerr=err, fmt=fmt, capsize=3, **kw)


def plot(results: dict[str, dict[str, list[dict[str, Any]]]], rounds: int, path: Path) -> None:
    """One column per (graph, threads); medians over rounds, bars min-max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(g, t, rows) for g, by_t in results.items() for t, rows in by_t.items()]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.5 * len(panels), 7), squeeze=False)
    for col, (graph, threads, rows) in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        sizes = [r["batch_size"] for r in rows]
        for arm, (fmt, label) in _STYLE.items():
            _errorbar(top, sizes, [r[f"{arm}_ms"] for r in rows], fmt, label=label)
        top.plot(sizes, [r["stages"]["bound_ms"] for r in rows], "k-", lw=0.8, label="bound")
        top.set(xscale="log", yscale="log", title=f"{graph}, {threads} thread(s)", ylabel="ms")
        top.legend(fontsize=7)
        _errorbar(bottom, sizes, [r["speedup_vs_pyg-lib"] for r in rows], "o-", color="black")
        bottom.axhline(5.0, color="grey", lw=0.8, ls="--")
        bottom.set(xscale="log", xlabel="seeds per batch", ylabel="speedup vs PyG + pyg-lib")
    fig.suptitle(
        f"sample + gather per batch, median of {rounds} interleaved rounds (bars: min-max)",
        fontsize=9,
    )
    save_figure(fig, path)
