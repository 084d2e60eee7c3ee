"""Plots of memory over a replay: live bytes and each policy's reserved bytes.

matplotlib is imported only when a plot is drawn, and only its object API
is used (no pyplot, no global backend), so drawing is safe in any process.
"""

from __future__ import annotations

import math
import os
from typing import Any, List, Sequence, Tuple

from jaxlake._src.errors import JaxlakeError
from jaxlake._src.bench.replay import ReplayResult

#: One colour per policy, the same in every figure.
COLOURS = {
    "jaxlake": "#1b7837",
    "bfc": "#b2182b",
    "torch": "#2166ac",
    "torch-expandable": "#67a9cf",
    "gmlake": "#e08214",
}
GIB = float(1 << 30)


class PlotError(JaxlakeError, RuntimeError):
    """A plot cannot be drawn (matplotlib is missing)."""


def _matplotlib() -> Tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotError(
            f"drawing plots needs matplotlib ({e}); install it with "
            "`pip install matplotlib`") from None
    return Figure, FigureCanvasAgg


def _draw(ax: Any, name: str, results: Sequence[ReplayResult],
          legend: bool) -> None:
    if not results:
        ax.set_title(f"{name}: no results")
        return
    first = results[0]
    ax.fill_between(first.timeline_event,
                    [v / GIB for v in first.timeline_live], step="post",
                    color="0.85", label="live (requested)")
    ax.plot(first.timeline_event, [v / GIB for v in first.timeline_live],
            drawstyle="steps-post", color="0.3", linewidth=0.8)
    for r in results:
        ax.plot(r.timeline_event, [v / GIB for v in r.timeline_reserved],
                drawstyle="steps-post", linewidth=1.2,
                color=COLOURS.get(r.policy),
                label=f"{r.policy} (U {r.utilisation:.2f})")
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("event", fontsize=8)
    ax.set_ylabel("GiB", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_ylim(bottom=0)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    if legend:
        ax.legend(fontsize=7, loc="upper left", framealpha=0.8)


def plot_trace(name: str, results: Sequence[ReplayResult],
               path: str) -> str:
    """One trace: live bytes and every policy's reserved bytes over the
    events. Writes a PNG at `path` and returns the path."""
    Figure, Canvas = _matplotlib()
    fig = Figure(figsize=(8, 4.5), dpi=110)
    Canvas(fig)
    ax = fig.add_subplot(1, 1, 1)
    _draw(ax, name, results, legend=True)
    fig.suptitle("memory over the replay: live vs reserved", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return path


def plot_suite(suite: Sequence[Tuple[str, Sequence[ReplayResult]]],
               path: str) -> str:
    """A grid with one panel per trace (as plot_trace). Returns the path."""
    Figure, Canvas = _matplotlib()
    n = max(1, len(suite))
    cols = min(3, n)
    rows = int(math.ceil(n / cols))
    fig = Figure(figsize=(5.2 * cols, 3.6 * rows), dpi=100)
    Canvas(fig)
    for i, (name, results) in enumerate(suite):
        ax = fig.add_subplot(rows, cols, i + 1)
        _draw(ax, name, results, legend=True)
    fig.suptitle("jaxlake bench: live vs reserved memory per policy",
                 fontsize=11)
    fig.tight_layout()
    _save(fig, path)
    return path


def _save(fig: Any, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, format="png")


def safe_name(name: str) -> str:
    """A trace name usable in a file name."""
    out: List[str] = []
    for ch in name:
        out.append(ch if ch.isalnum() or ch in "-_." else "_")
    return "".join(out) or "trace"
