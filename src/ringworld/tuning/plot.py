"""Pictures: a topology with a plan's messages drawn on it, and predicted vs measured times.

matplotlib is optional (``pip install matplotlib``); it is imported only when a picture is
asked for, and its absence raises :class:`PlotUnavailable` with that instruction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringworld.topology.planner import Plan
    from ringworld.tuning.calibrate import Comparison

LEVEL = {"switch": 0, "nic": 1, "host": 2, "cpu": 2, "pcie": 3, "nvswitch": 3, "gpu": 4,
         "core": 4}
COLORS = {"nvlink": "tab:green", "pcie": "tab:blue", "net": "tab:purple", "smp": "tab:orange",
          "mem": "tab:gray"}
MAX_LABELS = 64


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed (or cannot load a non-interactive backend)."""


def _pyplot() -> Any:
    try:
        import importlib

        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        raise PlotUnavailable("drawing needs matplotlib: pip install matplotlib") from exc
    return plt


def plot_plan(pl: Plan, path: str | Path) -> None:
    """Draw the topology (devices by level, links by kind) and the chosen candidate's
    messages as arrows, coloured by start time, into ``path``.

    Raises:
        PlotUnavailable: no matplotlib. Cost: O(devices + links + distinct message pairs).
    """
    plt = _pyplot()
    topo = pl.topology
    rows: dict[int, list[str]] = {}
    for d in topo.devices:
        rows.setdefault(LEVEL.get(d.kind, 2), []).append(d.id)
    pos: dict[str, tuple[float, float]] = {}
    for level, ids in rows.items():
        for i, ident in enumerate(ids):
            pos[ident] = ((i + 0.5) / len(ids), -float(level))
    fig, ax = plt.subplots(figsize=(12, 7))
    for ln in topo.links:
        (x0, y0), (x1, y1) = pos[ln.a], pos[ln.b]
        ax.plot([x0, x1], [y0, y1], color=COLORS.get(ln.kind, "black"), alpha=0.5,
                linewidth=0.5 + math.log10(max(ln.bandwidth, 1e9) / 1e9) * 1.5, zorder=1)
    xs = [pos[d.id][0] for d in topo.devices]
    ys = [pos[d.id][1] for d in topo.devices]
    ax.scatter(xs, ys, s=30 if len(xs) > MAX_LABELS else 200, c="white", edgecolors="black",
               zorder=2)
    if len(xs) <= MAX_LABELS:
        for d in topo.devices:
            ax.annotate(d.id, pos[d.id], ha="center", va="center", fontsize=7, zorder=3)
    chosen = pl.chosen
    transfers = chosen.result.transfers if chosen.result is not None else None
    if transfers:
        first: dict[tuple[int, int], float] = {}
        for src, dst, _, start, _ in transfers:
            if src != dst:
                first[(src, dst)] = min(start, first.get((src, dst), math.inf))
        span = max(first.values(), default=0.0) or 1.0
        cmap = plt.get_cmap("autumn")
        for (src, dst), t in sorted(first.items(), key=lambda kv: kv[1])[:2000]:
            a, b = pos[topo.ranks[src]], pos[topo.ranks[dst]]
            ax.annotate("", xy=(b[0], b[1] + 0.15), xytext=(a[0], a[1] + 0.15),
                        arrowprops={"arrowstyle": "->", "color": cmap(t / span),
                                    "connectionstyle": "arc3,rad=0.3", "alpha": 0.8},
                        zorder=4)
    ax.set_title(f"{pl.collective} {pl.nbytes} B on {topo.name}: {chosen.name} "
                 f"({chosen.time * 1e3:.3f} ms predicted); arrows: messages, red first")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)


def plot_comparison(rows: Sequence[Comparison], path: str | Path) -> None:
    """Predicted against measured seconds, one point per row, with the y = x line.

    Raises:
        PlotUnavailable: no matplotlib.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 6))
    for r in rows:
        ax.scatter(r.measured * 1e3, r.predicted * 1e3, label=f"{r.collective}/{r.algorithm}"
                   f" {r.nbytes >> 20} MiB")
    hi = max([max(r.measured, r.predicted) * 1e3 for r in rows] or [1.0])
    ax.plot([0, hi], [0, hi], color="gray")
    ax.plot([0, hi], [0, hi * 1.25], color="gray", linestyle=":")
    ax.plot([0, hi], [0, hi * 0.75], color="gray", linestyle=":")
    ax.set_xlabel("measured ms")
    ax.set_ylabel("predicted ms")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
