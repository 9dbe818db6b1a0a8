"""PNG plots of a benchmark run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .burst import BurstResult
from .failover import FailoverResult
from .precision import Run
from .scale import ScaleResult


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    n = len(ordered)
    return ordered, [(i + 1) / n for i in range(n)]


def precision(runs: list[Run], path: Path) -> None:
    kinds = sorted({r.deployment for r in runs}, key=lambda k: k != "single")
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.2), squeeze=False)
    styles = {
        ("hrwcron", True): ("tab:blue", "-"),
        ("hrwcron", False): ("tab:blue", "--"),
        ("native", True): ("tab:orange", "-"),
        ("native", False): ("tab:orange", "--"),
    }
    for ax, kind in zip(axes[0], kinds, strict=True):
        for run in (r for r in runs if r.deployment == kind and r.lateness_ms):
            xs, ys = _cdf([max(v, 0.1) for v in run.lateness_ms])
            color, line = styles[(run.scheduler, run.spread)]
            label = f"{run.scheduler}, {'spread' if run.spread else 'aligned'}"
            ax.plot(xs, ys, color=color, linestyle=line, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("lateness (ms, log scale; stored time − intended instant)")
        ax.set_ylabel("fraction of triggers")
        ax.set_title(f"Precision, {kind} nats-server")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def burst(result: BurstResult, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if result.herd_ms:
        xs, ys = _cdf([v / 1000 for v in result.herd_ms])
        ax.plot(xs, [y * len(xs) for y in ys], label=f"hrwcron: {result.jobs} jobs due at once")
    if result.floor_curve_ms:
        xs, ys = _cdf([v / 1000 for v in result.floor_curve_ms])
        ax.plot(
            xs,
            [y * len(xs) for y in ys],
            label=(
                f"floor: one publisher, {result.floor.method}, {result.floor.in_flight} in flight"
            ),
        )
    ax.set_xlabel("seconds since the due instant (floor: since its first publish)")
    ax.set_ylabel("triggers stored")
    ax.set_title("Burst: a herd due on the same second")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def failover(result: FailoverResult, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, stop in enumerate(result.stops):
        color = "tab:green" if stop.graceful else "tab:red"
        if not math.isnan(stop.worst_ms):
            ax.bar(i, stop.worst_ms / 1000, color=color)
    ax.axhline(1.5, color="gray", linestyle=":", label="goal: 1.5 s")
    ax.set_xticks(range(len(result.stops)))
    ax.set_xticklabels(
        [("stop " if s.graceful else "kill ") + s.node.split("-")[-1] for s in result.stops],
        rotation=45,
        fontsize=8,
    )
    ax.set_ylabel("worst lateness of the stopped replica's ticks (s)")
    ax.set_title(f"Failover: {result.jobs} every-second jobs (red: kill -9, green: SIGTERM)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scale(result: ScaleResult, path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    nodes = [f.node for f in result.replicas]
    panels = (
        ("ready after spawn (s)", [f.ready_s for f in result.replicas], 10),
        ("resident memory (MB)", [f.rss_mb for f in result.replicas], 200),
        ("idle CPU (% of a core)", [f.idle_cpu_pct for f in result.replicas], 5),
    )
    for ax, (title, values, goal) in zip(axes, panels, strict=True):
        ax.bar(nodes, values, color="tab:blue")
        ax.axhline(goal, color="gray", linestyle=":", label=f"goal at 100,000 jobs: {goal}")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=7)
    fig.suptitle(f"Scale: {result.jobs:,} hourly jobs with jitter, 3 replicas", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
