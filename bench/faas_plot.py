"""The figure of bench/faas.py: per config, mean and p99 latency and GB·s per arm (median bars
with min-max whiskers over rounds), and the latency of every request over the replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common import save_figure

PLOTTED = ("mean_ms", "p99_ms", "gb_seconds")
LABELS = ("mean latency (ms)", "p99 latency (ms)", "instance memory (GB*s)")


def _bars(ax: Any, cfg: dict[str, Any], key: str) -> None:
    names = [n for n in cfg["summary"] if key in cfg["summary"][n]]
    stats = [cfg["summary"][n][key] for n in names]
    med = [x["median"] for x in stats]
    low = [m - x["min"] for m, x in zip(med, stats, strict=True)]
    high = [x["max"] - m for m, x in zip(med, stats, strict=True)]
    colors = ["#2a7" if n.startswith("gnnserve/") else "#999" for n in names]
    ax.bar(range(len(names)), med, yerr=[low, high], color=colors)
    ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=6)


def _timeline(ax: Any, cfg: dict[str, Any]) -> None:
    for arm, rows in cfg["rounds"].items():
        recs = [r for r in rows[0]["records"] if "latency_ms" in r and "error" not in r]
        ax.plot([r["t_s"] for r in recs], [r["latency_ms"] for r in recs], ".", ms=2, label=arm)
    ax.set_yscale("log")
    ax.set_xlabel("replay time (s)", fontsize=8)
    ax.set_title("per-request latency (ms), round 0", fontsize=9)
    ax.legend(fontsize=5, markerscale=3)


def plot(results: dict[str, Any], path: Path) -> None:
    """Write the PNG for every config with at least one finished arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = [c for c in results["configs"] if c.get("summary")]
    if not configs:
        return
    fig, axes = plt.subplots(len(configs), 4, figsize=(19, 3.8 * len(configs)), squeeze=False)
    for row, cfg in zip(axes, configs, strict=True):
        tag = f"{cfg['graph']} {cfg['model']} trace-{cfg['trace_index']}"
        for ax, key, label in zip(row, PLOTTED, LABELS, strict=False):
            _bars(ax, cfg, key)
            ax.set_title(f"{tag}: {label}", fontsize=9)
            if key != "gb_seconds":
                ax.set_yscale("log")
        _timeline(row[3], cfg)
    save_figure(fig, path)
