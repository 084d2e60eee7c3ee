"""The bench and replay tables: their columns and policies, each declared
once, and the layouts that fit a terminal.

A column is one row of COLUMN_TABLE (its header, its cell for one replay,
its cell over the suite, what it means, and whether the narrow layout shows
it); a policy's description is one row of POLICY_DOCS. Adding a column or
a policy is one line in one of them.

Layouts: the wide one has a trace column and every figure (188 columns or
so); the narrow one, printed when the wide one does not fit the terminal,
puts each trace's name on a line of its own above its policies and keeps
the columns marked `narrow`, saying which it left out. `--wide` forces the
wide one; results.json always has every figure.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import textwrap
from typing import (Callable, Dict, Iterable, List, Optional, Sequence,
                    Tuple)

from jaxlake._src.bench.replay import ReplayResult
from jaxlake._src.options import format_bytes
from jaxlake._src.table import format_table


@dataclasses.dataclass
class TraceResults:
    """One trace's replays: a row group of the tables."""

    name: str
    path: str
    events: int
    devices: int
    peak_live: int
    load_s: float
    results: List[ReplayResult]

    def by_policy(self) -> Dict[str, ReplayResult]:
        return {r.policy: r for r in self.results}


def geomean(values: Iterable[float]) -> float:
    vals = [v for v in values if v > 0]
    if not vals:
        return 0.0
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def format_ns(ns: float) -> str:
    """A duration in the unit its magnitude calls for: 84 ns, 1.25 us,
    3.10 ms, 2.00 s (three significant digits)."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            value = ns / scale
            return f"{value:.{max(0, 2 - int(math.log10(abs(value))))}f} " \
                   f"{unit}"
    return f"{ns:.0f} ns"


def _oom_cell(r: ReplayResult) -> str:
    if r.capacity is None:
        return "-"
    if r.oom is None:
        return "ok"
    return f"OOM@{r.oom.event}"


def _oom_summary(rs: Sequence[ReplayResult]) -> str:
    capped = [r for r in rs if r.capacity is not None]
    ooms = sum(1 for r in capped if r.oom is not None)
    return f"{ooms}/{len(capped)} OOM" if capped else "-"


def _u_fit(r: ReplayResult) -> str:
    return "-" if r.u_fit is None else f"{r.u_fit:.3f}"


def _u_fit_summary(rs: Sequence[ReplayResult]) -> str:
    fits = [r.u_fit for r in rs if r.u_fit is not None]
    return f"{geomean(fits):.3f}" if fits else "-"


def _fit_driver(r: ReplayResult) -> str:
    return "-" if r.u_fit is None else format_ns(r.fit_driver_ms * 1e6)


Cell = Callable[[ReplayResult], str]
Summary = Callable[[Sequence[ReplayResult]], str]


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of the table."""

    name: str        # the header
    cell: Cell       # its text for one policy on one trace
    summary: Summary  # its text over the suite (the geomean rows)
    meaning: str     # for the legend
    narrow: bool = False  # shown in the narrow layout
    #: After the summary cell: "" a geometric mean, "*" a mean, "+" a total.
    mark: str = ""


#: The figure columns, in table order (trace and policy lead every row).
#: Geometric means over the suite unless the legend's marks say otherwise.
COLUMN_TABLE: Tuple[Column, ...] = (
    Column("U_fit", _u_fit, _u_fit_summary,
           "peak live / fit capacity (the smallest device, in whole "
           "granules, that runs the trace)", narrow=True),
    Column("fit drv", _fit_driver,
           lambda rs: (format_ns(sum(r.fit_driver_ms for r in rs) * 1e6)
                       if any(r.u_fit is not None for r in rs) else "-"),
           "modelled driver time of the replay at the fit capacity",
           narrow=True, mark="+"),
    Column("U", lambda r: f"{r.utilisation:.3f}",
           lambda rs: f"{geomean(r.utilisation for r in rs):.3f}",
           "peak live / peak reserved", narrow=True),
    Column("W", lambda r: format_bytes(r.waste),
           lambda rs: format_bytes(sum(r.waste for r in rs) / len(rs)),
           "peak reserved - peak live", mark="*"),
    Column("peak", lambda r: format_bytes(r.peak_reserved),
           lambda rs: format_bytes(geomean(r.peak_reserved for r in rs)),
           "peak reserved bytes", narrow=True),
    Column("calls", lambda r: str(r.memory_calls),
           lambda rs: f"{geomean(r.memory_calls for r in rs):.0f}",
           "driver memory calls", narrow=True),
    Column("maps", lambda r: str(r.calls.get("map", 0)),
           lambda rs: f"{geomean(r.calls.get('map', 0) for r in rs):.0f}",
           "map calls"),
    Column("stitches", lambda r: str(r.counters.get("stitches", 0)),
           lambda rs: str(sum(r.counters.get("stitches", 0) for r in rs)),
           "new stitched ranges", mark="+"),
    Column("median", lambda r: format_ns(r.median_ns),
           lambda rs: format_ns(geomean(r.median_ns for r in rs)),
           "CPU time of one allocator call, pooled over up to 20 replays of "
           "a short trace (it varies from run to run and machine to "
           "machine)"),
    Column("p99", lambda r: format_ns(r.alloc_p99_ns),
           lambda rs: format_ns(geomean(r.alloc_p99_ns for r in rs)),
           "99th percentile of an allocate's CPU time"),
    Column("Mev/s", lambda r: f"{r.events_per_s / 1e6:.2f}",
           lambda rs: f"{geomean(r.events_per_s for r in rs) / 1e6:.2f}",
           "replay speed"),
    Column("cap", _oom_cell, _oom_summary,
           "out of memory under the capacity, at which event", narrow=True),
    Column("driver", lambda r: format_ns(r.driver_ms * 1e6),
           lambda rs: format_ns(sum(r.driver_ms for r in rs) * 1e6),
           "modelled driver time of the calls", mark="+"),
    Column("2nd calls", lambda r: str(r.steady_calls),
           lambda rs: str(sum(r.steady_calls for r in rs)),
           "memory calls in the second half of each trace", mark="+"),
    Column("2nd driver", lambda r: format_ns(r.steady_driver_ms * 1e6),
           lambda rs: format_ns(sum(r.steady_driver_ms for r in rs) * 1e6),
           "modelled driver time of the second half's calls", mark="+"),
)

#: What each policy is, one line each, in table order.
POLICY_DOCS: Tuple[Tuple[str, str], ...] = (
    ("jaxlake", "this allocator: virtual memory stitching over VMM chunks"),
    ("bfc", "XLA's BFC allocator with preallocation off "
            "(XLA_PYTHON_CLIENT_PREALLOCATE=false), not JAX's default: "
            "regions that double as it grows (with --preallocate, one "
            "region of the device: JAX's default, docs/xla_defaults.md)"),
    ("torch", "PyTorch's CUDA caching allocator"),
    ("torch-expandable", "PyTorch's caching allocator with "
                         "expandable_segments:True"),
    ("gmlake", "GMLake as published (GLake's stitching caching allocator)"),
    ("xla-vmm", "XLA's VMM allocator (XLA_PYTHON_CLIENT_ALLOCATOR=vmm), "
                "not JAX's default: one mapping per buffer, exact-size "
                "reuse"),
    ("bfc-growth", "XLA's growing BFC (XLA_PJRT_GPU_BFC_ALLOW_GROWTH, in no "
                   "supported jaxlib), not JAX's default: one virtual "
                   "range, 64 MiB physical steps (with --preallocate, one "
                   "step of the device)"),
)

#: The header of every layout's first columns.
LEAD = ("trace", "policy")
#: Every column's header, wide layout (results.json keeps these names).
COLUMNS: Tuple[str, ...] = LEAD + tuple(c.name for c in COLUMN_TABLE)
#: The widest the legend and notes are wrapped to.
MAX_TEXT_WIDTH = 100


def policy_doc(name: str) -> str:
    """A policy's one-line description ("" when it has none)."""
    return dict(POLICY_DOCS).get(name, "")


def table_rows(suite: Sequence[TraceResults],
               columns: Sequence[Column] = COLUMN_TABLE) -> List[List[str]]:
    """A row per trace and policy: trace (first row of a trace only),
    policy, then `columns`' cells."""
    return [[tr.name if i == 0 else "", r.policy]
            + [c.cell(r) for c in columns]
            for tr in suite for i, r in enumerate(tr.results)]


def summary_rows(suite: Sequence[TraceResults],
                 columns: Sequence[Column] = COLUMN_TABLE
                 ) -> List[List[str]]:
    """A "geomean" row per policy: its figures over the suite."""
    if not suite:
        return []
    rows: List[List[str]] = []
    for policy in [r.policy for r in suite[0].results]:
        rs = [tr.by_policy()[policy] for tr in suite]
        rows.append(["geomean", policy]
                    + [c.summary(rs) + c.mark for c in columns])
    return rows


def grouped_rows(suite: Sequence[TraceResults],
                 columns: Sequence[Column] = COLUMN_TABLE,
                 summary: bool = True) -> List[Optional[List[str]]]:
    """table_rows with a rule (None) after each trace, then the summary."""
    out: List[Optional[List[str]]] = []
    rows = table_rows(suite, columns)
    start = 0
    for tr in suite:
        out.extend(rows[start:start + len(tr.results)])
        out.append(None)
        start += len(tr.results)
    if summary:
        out.extend(summary_rows(suite, columns))
    return out


def narrow_table(suite: Sequence[TraceResults], columns: Sequence[Column],
                 summary: bool = True) -> str:
    """The narrow layout: a policy column and `columns`, each trace's name
    on a line of its own above its policies (so long names do not widen
    the table), then the geomean rows under a line of their own."""
    groups: List[Tuple[str, List[List[str]]]] = [
        (tr.name, [[r.policy] + [c.cell(r) for c in columns]
                   for r in tr.results]) for tr in suite]
    if summary and suite:
        groups.append((f"geomean over {len(suite)} trace(s)",
                       [row[1:] for row in summary_rows(suite, columns)]))
    rows = [row for _, group in groups for row in group]
    text = format_table(rows, ("policy",) + tuple(c.name for c in columns),
                        left=1)
    lines = text.splitlines()
    head, body = lines[:2], lines[2:]
    if len(body) != len(rows):  # not one line per row: keep it plain
        return text
    out = ["  " + line for line in head]
    start = 0
    for title, group in groups:
        if start:
            out.append("")
        out.append(title)
        out.extend("  " + line for line in body[start:start + len(group)])
        start += len(group)
    return "\n".join(out)


def terminal_width(default: int = MAX_TEXT_WIDTH) -> int:
    """The terminal's width (COLUMNS when set), `default` when standard
    output is not a terminal."""
    return shutil.get_terminal_size((default, 24)).columns


def _width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def legend(columns: Sequence[Column], width: int,
           summary: bool = True) -> str:
    """What the shown columns mean (and the geomean rows', with
    `summary`), wrapped to `width`."""
    text = "; ".join(f"{c.name}: {c.meaning}" for c in columns)
    used = {c.mark for c in columns}
    marks = [f"{m} {what}" for m, what in (("*", "mean"), ("+", "total"))
             if m in used]
    if summary:
        text += "; the geomean rows give geometric means over the suite" + (
            " (" + ", ".join(marks) + ")" if marks else "")
    return textwrap.fill(text, width=max(40, width))


def policy_lines(policies: Sequence[str], width: int) -> str:
    """One line per policy: its name and what it is."""
    if not policies:
        return ""
    pad = max(len(p) for p in policies)
    lines = ["policies:"]
    for p in policies:
        doc = policy_doc(p) or "(no description)"
        lines.extend(textwrap.wrap(f"  {p:<{pad}}  {doc}",
                                   width=max(40, width),
                                   subsequent_indent=" " * (pad + 4),
                                   break_on_hyphens=False))
    return "\n".join(lines)


def wrap_lines(text: str, width: Optional[int] = None,
               hang: int = 4) -> str:
    """Each line of `text` wrapped to `width` (the terminal's, at most
    MAX_TEXT_WIDTH), continuation lines indented `hang` more than the
    line's own indent; short lines stay as they are."""
    width = min(width if width is not None else terminal_width(),
                MAX_TEXT_WIDTH)
    out: List[str] = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        out.extend(textwrap.wrap(line.strip(), width=max(40, width),
                                 initial_indent=indent,
                                 subsequent_indent=indent + " " * hang,
                                 break_on_hyphens=False))
    return "\n".join(out)


def render(suite: Sequence[TraceResults], wide: bool = False,
           width: Optional[int] = None, summary: bool = True) -> str:
    """The table, its legend and the policies, to fit `width` columns (the
    terminal's by default): the wide layout when it fits or when `wide`,
    else the narrow one with a note naming the columns left out."""
    width = width if width is not None else terminal_width()
    text_width = min(width, MAX_TEXT_WIDTH)
    table = format_table(grouped_rows(suite, summary=summary), COLUMNS,
                         left=2)
    shown: Sequence[Column] = COLUMN_TABLE
    note = ""
    if not wide and _width(table) > width:
        shown = [c for c in COLUMN_TABLE if c.narrow]
        table = narrow_table(suite, shown, summary)
        # Still too wide (a very narrow terminal): the rightmost narrow
        # columns go too, down to the first two.
        while _width(table) > width and len(shown) > 2:
            shown = shown[:-1]
            table = narrow_table(suite, shown, summary)
        left_out = [c.name for c in COLUMN_TABLE if c not in shown]
        note = "\n" + textwrap.fill(
            f"Narrow layout for a {width}-column terminal; left out: "
            + ", ".join(left_out) + " (--wide shows every column; "
            + ("results.json has" if summary else "--json has")
            + " every figure).",
            width=max(40, text_width))
    policies = [r.policy for r in suite[0].results] if suite else []
    return (table + "\n\n" + legend(shown, text_width, summary) + note + "\n\n"
            + policy_lines(policies, text_width))
