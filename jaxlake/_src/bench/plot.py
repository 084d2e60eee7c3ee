"""Plots of memory over a replay: live bytes and each policy's reserved bytes,
and live bytes by kind (params, optimizer state, activations, ...) under one
policy's reserved bytes.

matplotlib is imported only when a plot is drawn, and only its object API
is used (no pyplot, no global backend), so drawing is safe in any process.
The file's suffix picks the format (.png, .pdf, .svg, ...).

How the lines stay readable: jaxlake is drawn first as a thick solid line
and every baseline on top of it, thinner and dashed, so a baseline equal to
jaxlake shows as dashes over jaxlake's line instead of hiding it; legends sit
outside the axes; the y axis is in the binary unit the largest value calls
for (B, KiB, MiB, GiB).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from jaxlake._src.errors import JaxlakeError
from jaxlake._src.options import byte_unit
from jaxlake._src.bench.replay import ReplayResult

#: One colour per policy, the same in every figure.
COLOURS = {
    "jaxlake": "#1b7837",
    "bfc": "#b2182b",
    "torch": "#2166ac",
    "torch-expandable": "#67a9cf",
    "gmlake": "#e08214",
    "xla-vmm": "#762a83",
    "bfc-growth": "#f4a582",
}
#: Line style per policy: jaxlake solid and under the others; the
#: baselines dashed, each with its own pattern.
STYLES: Dict[str, Dict[str, Any]] = {
    "jaxlake": {"linestyle": "-", "linewidth": 2.6, "zorder": 3},
    "bfc": {"linestyle": (0, (5, 2)), "linewidth": 1.2, "zorder": 4},
    "torch": {"linestyle": (0, (1, 1.5)), "linewidth": 1.4, "zorder": 4},
    "torch-expandable": {"linestyle": (0, (6, 2, 1, 2)), "linewidth": 1.2,
                         "zorder": 4},
    "gmlake": {"linestyle": (0, (3, 2)), "linewidth": 1.2, "zorder": 5},
    "xla-vmm": {"linestyle": (0, (2, 1, 2, 3)), "linewidth": 1.2,
                "zorder": 4},
    "bfc-growth": {"linestyle": (0, (8, 3)), "linewidth": 1.2, "zorder": 4},
}
#: Colours of the kinds in the breakdown (docs/traces.md's kinds).
KIND_COLOURS = {
    "param": "#8da0cb", "opt_state": "#66c2a5", "grad": "#fc8d62",
    "activation": "#e78ac3", "temp": "#a6d854", "input": "#ffd92f",
    "output": "#e5c494", "other": "#b3b3b3", "unspecified": "#d9d9d9",
}


class PlotError(JaxlakeError, RuntimeError):
    """A plot cannot be drawn: matplotlib is missing, the file's suffix is
    not an image format, or the file cannot be written."""


def _matplotlib() -> Tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotError(
            f"drawing plots needs matplotlib ({e}); install it with "
            "`pip install matplotlib`") from None
    return Figure, FigureCanvasAgg


def image_formats() -> Dict[str, str]:
    """Suffix (no dot) -> description of the formats matplotlib writes."""
    Figure, Canvas = _matplotlib()
    return dict(Canvas(Figure()).get_supported_filetypes())


def image_format(path: str) -> str:
    """The format of the image at `path`, from its suffix (any case).
    Raises PlotError when the suffix is missing or not an image format."""
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    formats = image_formats()
    if suffix not in formats:
        known = ", ".join("." + s for s in ("png", "pdf", "svg")
                          if s in formats)
        what = f"its suffix .{suffix} is not an image format" if suffix \
            else "it has no suffix"
        raise PlotError(f"cannot draw {path!r}: {what}; use {known} (or "
                        f"any of: {', '.join(sorted(formats))})")
    return suffix


def _scale(values: Sequence[float]) -> Tuple[str, float]:
    unit, scale = byte_unit(max(values, default=0))
    return unit, float(scale)


def _draw(ax: Any, name: str, results: Sequence[ReplayResult],
          legend: str) -> None:
    """One panel. `legend`: "right" (beside the axes), "below" or ""."""
    if not results:
        ax.set_title(f"{name}: no results")
        return
    first = results[0]
    unit, scale = _scale([v for r in results for v in r.timeline_reserved] +
                         list(first.timeline_live))
    ax.fill_between(first.timeline_event,
                    [v / scale for v in first.timeline_live], step="post",
                    color="0.87", zorder=1, label="live (requested)")
    ax.plot(first.timeline_event, [v / scale for v in first.timeline_live],
            drawstyle="steps-post", color="0.45", linewidth=0.7, zorder=2)
    for r in results:
        style = STYLES.get(r.policy, {"linestyle": "--", "linewidth": 1.2,
                                      "zorder": 4})
        ax.plot(r.timeline_event, [v / scale for v in r.timeline_reserved],
                drawstyle="steps-post", color=COLOURS.get(r.policy),
                label=f"{r.policy} (U {r.utilisation:.3f})", **style)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("event", fontsize=8)
    ax.set_ylabel(f"reserved / live, {unit}", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_ylim(bottom=0)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    if legend == "right":
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0, frameon=False)
    elif legend == "below":
        ax.legend(fontsize=6.5, loc="upper center",
                  bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False,
                  columnspacing=1.0, handlelength=2.6)


def kind_timeline(trace: Any, events: Sequence[int]
                  ) -> Tuple[List[str], List[List[int]]]:
    """Live bytes by kind after each event index in `events` (sorted), over
    every device of `trace` (a tracefile.Trace). Returns the kinds (in
    docs/traces.md's order, "unspecified" for allocations without one)
    and one list of bytes per kind."""
    from jaxlake._src.trace.tracefile import KINDS
    wanted = sorted(set(int(e) for e in events))
    live: Dict[str, int] = {}
    owner: Dict[Tuple[int, int], Tuple[str, int]] = {}
    samples: List[Dict[str, int]] = []
    k = 0
    for index, (_, alloc, ident, dev, size, _, kind) in enumerate(
            trace.core.events()):
        if alloc:
            name = kind or "unspecified"
            owner[(dev, ident)] = (name, size)
            live[name] = live.get(name, 0) + size
        else:
            name, nbytes = owner.pop((dev, ident), ("unspecified", 0))
            live[name] = live.get(name, 0) - nbytes
        while k < len(wanted) and wanted[k] <= index:
            samples.append(dict(live))
            k += 1
    while k < len(wanted):
        samples.append(dict(live))
        k += 1
    seen = {name for s in samples for name, v in s.items() if v}
    kinds = [n for n in KINDS + ("unspecified",) if n in seen]
    return kinds, [[s.get(n, 0) for s in samples] for n in kinds]


def _draw_kinds(ax: Any, trace: Any, result: ReplayResult) -> None:
    events = list(result.timeline_event)
    kinds, series = kind_timeline(trace, events)
    totals = [sum(col) for col in zip(*series)] if series else []
    unit, scale = _scale(list(result.timeline_reserved) + totals)
    if series:
        ax.stackplot(events, [[v / scale for v in s] for s in series],
                     labels=kinds, step="post", zorder=1,
                     colors=[KIND_COLOURS.get(k, "#cccccc") for k in kinds])
    ax.plot(events, [v / scale for v in result.timeline_reserved],
            drawstyle="steps-post", color=COLOURS.get(result.policy, "k"),
            linewidth=1.6, zorder=3,
            label=f"{result.policy} reserved (U {result.utilisation:.3f})")
    ax.set_title(f"{result.trace}: live bytes by kind under "
                 f"{result.policy}", fontsize=9)
    ax.set_xlabel("event", fontsize=8)
    ax.set_ylabel(f"bytes, {unit}", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_ylim(bottom=0)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0.0, frameon=False)


def plot_trace(name: str, results: Sequence[ReplayResult], path: str,
               trace: Any = None, by_kind: Optional[str] = None) -> str:
    """One trace: live bytes and every policy's reserved bytes over the
    events; with `trace` and `by_kind` (a policy among `results`), a second
    panel of live bytes by kind under that policy's reserved bytes. Writes
    `path` in the format of its suffix and returns the path."""
    fmt = image_format(path)
    Figure, Canvas = _matplotlib()
    kind_result = None
    if by_kind is not None:
        found = [r for r in results if r.policy == by_kind]
        if not found or trace is None:
            raise PlotError(f"no replay of policy {by_kind!r} to break down "
                            "by kind")
        kind_result = found[0]
    rows = 2 if kind_result is not None else 1
    fig = Figure(figsize=(9, 4.2 * rows), dpi=110, layout="constrained")
    Canvas(fig)
    ax = fig.add_subplot(rows, 1, 1)
    _draw(ax, name, results, legend="right")
    if kind_result is not None:
        _draw_kinds(fig.add_subplot(rows, 1, 2), trace, kind_result)
    fig.suptitle("memory over the replay: live vs reserved", fontsize=10)
    _save(fig, path, fmt)
    return path


def plot_suite(suite: Sequence[Tuple[str, Sequence[ReplayResult]]],
               path: str) -> str:
    """A grid with one panel per trace (as plot_trace). Returns the path."""
    fmt = image_format(path)
    Figure, Canvas = _matplotlib()
    n = max(1, len(suite))
    cols = min(3, n)
    rows = -(-n // cols)
    fig = Figure(figsize=(5.4 * cols, 4.1 * rows), dpi=100,
                 layout="constrained")
    Canvas(fig)
    for i, (name, results) in enumerate(suite):
        ax = fig.add_subplot(rows, cols, i + 1)
        _draw(ax, name, results, legend="below")
    fig.suptitle("jaxlake bench: live vs reserved memory per policy",
                 fontsize=11)
    _save(fig, path, fmt)
    return path


def _save(fig: Any, path: str, fmt: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fig.savefig(path, format=fmt)
    except OSError as e:
        raise PlotError(f"cannot write {path}: {e.strerror or e}") from None


def safe_name(name: str) -> str:
    """A trace name usable in a file name."""
    out: List[str] = []
    for ch in name:
        out.append(ch if ch.isalnum() or ch in "-_." else "_")
    return "".join(out) or "trace"
