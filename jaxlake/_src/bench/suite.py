"""`jaxlake bench`: the trace suite through every policy, side by side.

Finds the suite (the traces installed with the package, or a folder),
replays each trace through each policy (uncapped, then under a capacity
for the policies whose peak exceeded it), prints a table of trace x policy
with geometric means and the comparisons the project tracks, and writes
results.json and memory plots. docs/benchmarks.md explains how to read it.

Also here: synthetic traces, for trying the tools without recorded ones.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import random
import sys
import time
from typing import (Any, Callable, Dict, List, Optional, Sequence,
                    TextIO, Tuple)

from jaxlake._src.bench import pair
from jaxlake._src.trace import tracefile
from jaxlake._src.options import MIB, format_bytes
from jaxlake._src.bench.replay import (Capacity, Latency, check_policies,
                                       policy_names, replay)
from jaxlake._src.trace.tracefile import TraceWriter
from jaxlake._src.table import format_table as _format_table
from jaxlake._src.version import version
# The table's columns are declared in columns.py; these names stay here for
# the callers that read them from the suite.
from jaxlake._src.bench.columns import COLUMNS as COLUMNS
from jaxlake._src.bench.columns import TraceResults as TraceResults
from jaxlake._src.bench.columns import format_ns as format_ns
from jaxlake._src.bench.columns import geomean as geomean
from jaxlake._src.bench.columns import grouped_rows as grouped_rows
from jaxlake._src.bench.columns import summary_rows as summary_rows
from jaxlake._src.bench.columns import table_rows as table_rows

GIB = 1 << 30
SUITE_PATTERN = "*.jsonl.gz"
#: The suite folder's subfolder of workload traces (serving, kept outputs,
#: a temp arena), benched apart with `jaxlake bench --workloads` so the
#: suite's own figures stay those of its training traces.
WORKLOADS_GROUP = "workloads"


# -- finding the suite -------------------------------------------------------


def installed_suite_dir() -> Optional[str]:
    """The folder of traces installed with the package, if it has any;
    else the source tree's benchmarks/traces (running from a checkout)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))  # the jaxlake package folder
    candidates = [os.path.join(here, "traces"),
                  os.path.join(os.path.dirname(here), "benchmarks", "traces")]
    for folder in candidates:
        if glob.glob(os.path.join(folder, SUITE_PATTERN)):
            return folder
    return None


def suite_files(folder: str) -> List[str]:
    """The traces of a suite folder (*.jsonl.gz, also *.jsonl and RMM
    *.csv), sorted by name."""
    found: List[str] = []
    for pattern in (SUITE_PATTERN, "*.jsonl", "*.csv", "*.csv.gz"):
        found.extend(glob.glob(os.path.join(folder, pattern)))
    return sorted(set(found))


# -- progress ----------------------------------------------------------------


class Progress:
    """A progress bar (rich) on a terminal: done/total, elapsed time and
    what runs now; silent elsewhere, or when enabled=False."""

    def __init__(self, total: int, stream: Optional[TextIO] = None,
                 enabled: Optional[bool] = None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = (self.stream.isatty() if enabled is None
                        else enabled)
        self._bar: Any = None
        if self.enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn,
                                       TextColumn, TimeElapsedColumn)
            from rich.progress import Progress as Bar
            self._bar = Bar(
                BarColumn(bar_width=28), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("{task.description}"),
                console=Console(file=self.stream, force_terminal=True),
                transient=True)
            self._task = self._bar.add_task("", total=self.total)
            self._bar.start()

    def update(self, what: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done,
                             description=what[:40])
            self._bar.refresh()

    def step(self, what: str) -> None:
        self.done += 1
        self.update(what)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


# -- running -----------------------------------------------------------------


def run_suite(paths: Sequence[str], policies: Optional[Sequence[str]] = None,
              capacity: Optional[Capacity] = None,
              progress: Optional[Progress] = None,
              lenient: bool = False,
              timeline_points: int = 1000,
              latency: Optional[Latency] = None,
              fit: bool = False,
              options: Optional[Dict[str, Any]] = None) -> List[TraceResults]:
    """Replays every trace through every policy (driver time charged by
    `latency`, or the default model); `fit`: with each policy's fit
    capacity (replay(fit=True)); `options`: policy overrides, as
    replay() takes them (lake options as "lake_<name>")."""
    names = check_policies(policies) if policies else list(policy_names())
    out: List[TraceResults] = []
    # A pair's second trace names its first (pair.py); the first is a row
    # only through the pair.
    beside = {os.path.abspath(p): pair.beside_name(p) for p in paths}
    firsts = {os.path.abspath(pair.first_path(p, n))
              for p, n in beside.items() if n is not None}
    for path in paths:
        if os.path.abspath(path) in firsts:
            continue
        start = time.perf_counter()
        first: Optional[tracefile.Trace] = None
        if beside[os.path.abspath(path)] is not None:
            first, trace = pair.read_pair(path, lenient=lenient)
        else:
            trace = tracefile.read_trace(path, lenient=lenient)
        load = time.perf_counter() - start
        results = []
        for name in names:
            if progress:
                progress.update(f"{trace.name} / {name}")
            if first is not None:
                results.append(pair.replay_pair(
                    first, trace, name, capacity, options=options or None,
                    latency=latency, timeline_points=timeline_points))
            else:
                results.append(replay(trace, name, capacity,
                                      timeline_points=timeline_points,
                                      latency=latency, fit=fit,
                                      options=options or None))
            if progress:
                progress.step(f"{trace.name} / {name}")
        lead = results[0]
        out.append(TraceResults(name=trace.name, path=path,
                                events=lead.events, devices=lead.devices,
                                peak_live=lead.peak_live, load_s=load,
                                results=results))
    return out


# -- reporting ---------------------------------------------------------------


def _ms(x: float) -> str:
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def format_table(rows: Sequence[Optional[Sequence[str]]],
                 header: Sequence[str] = COLUMNS, left: int = 2) -> str:
    """The bench's table (jaxlake._src.table.format_table, with the bench's
    columns by default)."""
    return _format_table(rows, header, left)


@dataclasses.dataclass
class Comparison:
    claim: str
    ok: Optional[bool]  # None: not computable in this run
    detail: str


def comparisons(suite: Sequence[TraceResults],
                preallocated: bool = False) -> List[Comparison]:
    """The comparisons the project tracks, from this run's results.
    `preallocated`: jaxlake and some peers took the whole device up front
    (bench --preallocate), so uncapped U and W say nothing and only the
    fit's claims are made."""
    out: List[Comparison] = []
    if not suite:
        return out
    policies = [r.policy for r in suite[0].results]
    if "jaxlake" not in policies:
        return [Comparison("jaxlake comparisons", None,
                           "jaxlake was not among the policies replayed")]
    if preallocated:
        out.append(Comparison(
            "uncapped U and W", None,
            "not compared: a preallocating policy holds the whole device "
            "uncapped, so only the fit capacity compares"))
        out.extend(_fit_comparisons(suite, policies))
        out.append(Comparison(
            "driver memory calls in the second half at the fit capacity, "
            "suite total", None,
            ", ".join(f"{p} {sum(tr.by_policy()[p].fit_steady_calls for tr in suite)}"
                      for p in policies)))
        return out
    lake = [tr.by_policy()["jaxlake"] for tr in suite]
    # Where the granularity alone keeps every policy below 0.95 (peak live
    # bytes rounded up to whole chunks), the bound is the target.
    worst = min(zip(lake, suite), key=lambda x: x[0].utilisation)
    bounded = [(r, tr) for r, tr in zip(lake, suite)
               if r.best_utilisation < 0.95]
    below = [(r, tr) for r, tr in zip(lake, suite)
             if r.utilisation < min(0.95, r.best_utilisation) - 1e-12]
    out.append(Comparison(
        "jaxlake U >= 0.95 on every trace (or the granularity's bound, "
        "where lower)", not below,
        f"lowest U {worst[0].utilisation:.3f} on {worst[1].name}" +
        "".join(f"; {tr.name}: U {r.utilisation:.3f}, bound "
                f"{r.best_utilisation:.3f}" for r, tr in bounded) +
        "".join(f"; below: {tr.name} U {r.utilisation:.3f}"
                for r, tr in below)))
    out.extend(_fit_comparisons(suite, policies))
    out.extend(_limit_comparisons(suite))
    beaten = []
    for tr in suite:
        mine = tr.by_policy()["jaxlake"].utilisation
        for r in tr.results:
            if r.policy != "jaxlake" and r.utilisation > mine + 1e-12:
                beaten.append(f"{tr.name}: {r.policy} {r.utilisation:.3f} > "
                              f"{mine:.3f}")
    out.append(Comparison(
        "jaxlake U >= every other policy's U, per trace", not beaten,
        "; ".join(beaten) if beaten else
        f"held on {len(suite)} trace(s) against "
        f"{', '.join(p for p in policies if p != 'jaxlake') or 'no policy'}"))
    if "bfc" in policies:
        reductions = []
        for tr in suite:
            w_bfc = tr.by_policy()["bfc"].waste
            if w_bfc > 0:
                reductions.append(
                    (tr.name, 1 - tr.by_policy()["jaxlake"].waste / w_bfc))
        if reductions:
            mean = sum(x for _, x in reductions) / len(reductions)
            out.append(Comparison(
                "W reduction vs bfc, mean of 1 - W/W_bfc over the suite",
                None, f"{100 * mean:.1f}% (" +
                ", ".join(f"{name} {100 * x:.0f}%"
                          for name, x in reductions) + ")"))
        ratios = [tr.by_policy()["jaxlake"].median_ns /
                  tr.by_policy()["bfc"].median_ns
                  for tr in suite if tr.by_policy()["bfc"].median_ns > 0]
        if ratios:
            out.append(Comparison(
                "median allocator time per op, jaxlake / bfc", None,
                f"{geomean(ratios):.2f}x (geometric mean of per-trace "
                "ratios of medians; sim driver, no real driver latency)"))
    totals = {p: sum(tr.by_policy()[p].driver_ms for tr in suite)
              for p in policies}
    out.append(Comparison(
        "estimated driver time, suite total (ms)", None,
        ", ".join(f"{p} {_ms(t)}" for p, t in totals.items()) +
        f" (latency model: {lake[0].latency_source or 'defaults'})"))
    steady = [(tr.name, tr.by_policy()["jaxlake"].steady_calls)
              for tr in suite]
    busy = [f"{name} {n}" for name, n in steady if n]
    out.append(Comparison(
        "jaxlake driver memory calls in the second half of each trace", None,
        f"0 on {len(steady) - len(busy)}/{len(steady)} traces" +
        (f"; not 0: {', '.join(busy)}" if busy else "") + "; others: " +
        ", ".join(f"{p} {sum(tr.by_policy()[p].steady_calls for tr in suite)}"
                  for p in policies if p != "jaxlake")))
    if "gmlake" in policies:
        mine = sum(tr.by_policy()["jaxlake"].calls.get("map", 0)
                   for tr in suite)
        theirs = sum(tr.by_policy()["gmlake"].calls.get("map", 0)
                     for tr in suite)
        ratio = f"{mine / theirs:.3f}x" if theirs else "n/a"
        out.append(Comparison(
            "driver map calls, jaxlake vs gmlake (suite total)", None,
            f"{mine} vs {theirs} ({ratio})"))
    return out


def _fit_comparisons(suite: Sequence[TraceResults],
                     policies: Sequence[str]) -> List[Comparison]:
    """jaxlake's U_fit against every peer's, and its driver time at the fit
    capacity against every peer whose U_fit is within 0.01 of it."""
    if any(r.u_fit is None for tr in suite for r in tr.results
           if r.policy == "jaxlake"):
        return []
    beaten: List[str] = []
    slower: List[str] = []
    for tr in suite:
        mine = tr.by_policy()["jaxlake"]
        for r in tr.results:
            if r.policy == "jaxlake" or r.u_fit is None:
                continue
            if r.u_fit > (mine.u_fit or 0) + 1e-12:
                beaten.append(f"{tr.name}: {r.policy} {r.u_fit:.3f} > "
                              f"{mine.u_fit:.3f}")
            if r.u_fit >= (mine.u_fit or 0) - 0.01 and \
                    r.fit_driver_ms <= mine.fit_driver_ms:
                slower.append(f"{tr.name}: {r.policy} "
                              f"{format_ns(r.fit_driver_ms * 1e6)} <= "
                              f"{format_ns(mine.fit_driver_ms * 1e6)}")
    peers = ", ".join(p for p in policies if p != "jaxlake") or "no policy"
    return [
        Comparison("jaxlake U_fit >= every other policy's U_fit, per trace",
                   not beaten, "; ".join(beaten) if beaten else
                   f"held on {len(suite)} trace(s) against {peers}"),
        Comparison("jaxlake driver time at the fit capacity below every "
                   "policy within 0.01 of its U_fit, per trace", not slower,
                   "; ".join(slower) if slower else
                   f"held on {len(suite)} trace(s)")]


#: The granule the replays round capacities to (Capacity, fit.cc).
_GRANULE = 2 << 20


def _limit_comparisons(suite: Sequence[TraceResults]) -> List[Comparison]:
    """jaxlake against the stitching limit: the peak live bytes of each
    device rounded up to whole granules (no allocator that holds whole
    granules needs less; `best_utilisation` is its U). U_fit within one
    granule per device of it, uncapped U at least 0.98 of its U."""
    lake = [(tr, tr.by_policy()["jaxlake"]) for tr in suite]
    if any(r.u_fit is None for _, r in lake):
        return []
    far: List[str] = []
    low: List[str] = []
    for tr, r in lake:
        fit_bytes = r.peak_live / r.u_fit if r.u_fit else float("inf")
        over = (fit_bytes - r.min_reserved) / _GRANULE
        if over > r.devices + 1e-9:
            far.append(f"{tr.name}: U_fit {r.u_fit:.3f}, limit "
                       f"{r.best_utilisation:.3f} ({over:.0f} granules "
                       f"over on {r.devices} device(s))")
        if r.utilisation < 0.98 * r.best_utilisation - 1e-12:
            low.append(f"{tr.name}: U {r.utilisation:.3f} < 0.98 x "
                       f"{r.best_utilisation:.3f}")
    return [
        Comparison("jaxlake U_fit within one granule per device of the "
                   "stitching limit (peak live in whole granules), per "
                   "trace", not far, "; ".join(far) if far else
                   f"held on {len(suite)} trace(s)"),
        Comparison("jaxlake uncapped U >= 0.98 x the stitching limit's U, "
                   "per trace", not low, "; ".join(low) if low else
                   f"held on {len(suite)} trace(s)")]


def format_comparisons(items: Sequence[Comparison]) -> str:
    lines = []
    for c in items:
        mark = {True: "PASS", False: "FAIL", None: "    "}[c.ok]
        lines.append(f"  {mark}  {c.claim}: {c.detail}")
    return "\n".join(lines)


def speed_lines(suite: Sequence[TraceResults]) -> str:
    """Replay speed per policy over the suite (events per second)."""
    if not suite:
        return ""
    parts = []
    for policy in [r.policy for r in suite[0].results]:
        events = sum(tr.by_policy()[policy].events for tr in suite)
        wall = sum(tr.by_policy()[policy].wall_s for tr in suite)
        rate = events / wall / 1e6 if wall > 0 else 0.0
        parts.append(f"{policy} {rate:.2f}M")
    load_events = sum(tr.events for tr in suite)
    load_s = sum(tr.load_s for tr in suite)
    return (f"replay speed over {load_events} events (events/s, with "
            "per-call timing): " + ", ".join(parts) +
            f"; loading {load_events / max(load_s, 1e-9) / 1e6:.2f}M "
            "events/s")


def results_json(suite: Sequence[TraceResults],
                 capacity: Optional[Capacity],
                 extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {
        "format": "jaxlake-bench",
        "version": 1,
        "jaxlake": version(),
        "capacity": str(capacity) if capacity else None,
        "policies": [r.policy for r in suite[0].results] if suite else [],
        "traces": [{
            "name": tr.name, "path": tr.path, "events": tr.events,
            "devices": tr.devices, "peak_live": tr.peak_live,
            "load_s": tr.load_s,
            "results": {r.policy: r.to_json() for r in tr.results},
        } for tr in suite],
        "comparisons": [dataclasses.asdict(c) for c in comparisons(
            suite, preallocated=bool((extra or {}).get("preallocate")))],
        **(extra or {}),
    }


def write_outputs(suite: Sequence[TraceResults], out_dir: str,
                  capacity: Optional[Capacity], plots: bool = True,
                  extra: Optional[Dict[str, Any]] = None) -> List[str]:
    """results.json, memory.png (all traces) and memory-<trace>.png."""
    from jaxlake._src.bench import plot
    os.makedirs(out_dir, exist_ok=True)
    written = []
    path = os.path.join(out_dir, "results.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results_json(suite, capacity, extra), f, indent=1)
        f.write("\n")
    written.append(path)
    if plots and suite:
        written.append(plot.plot_suite(
            [(tr.name, tr.results) for tr in suite],
            os.path.join(out_dir, "memory.png")))
        for tr in suite:
            written.append(plot.plot_trace(
                tr.name, tr.results, os.path.join(
                    out_dir, f"memory-{plot.safe_name(tr.name)}.png")))
    return written


# -- synthetic traces --------------------------------------------------------


def _xla_steps(w: TraceWriter, rng: random.Random, steps: int) -> None:
    """XLA-like: parameters and optimizer state, then per step one temp
    buffer whose size follows the batch shape, new outputs replacing the
    donated inputs, and a small tuple table."""
    ids = iter(range(1, 1 << 62))
    params = []
    for _ in range(24):
        size = rng.choice([64, 256, 1024, 4096]) * rng.choice([1024, 4096])
        for kind in ("param", "opt_state", "opt_state"):
            i = next(ids)
            w.alloc(i, size + rng.randrange(0, 4096, 4), kind=kind)
            params.append((i, size, kind))
    shapes = [int(x * GIB) for x in (0.6, 1.1, 1.7, 2.4)]
    for _ in range(steps):
        temp = next(ids)
        w.alloc(temp, rng.choice(shapes) + rng.randrange(0, 1 << 20, 256),
                kind="temp")
        table = next(ids)
        w.alloc(table, 8 * len(params), kind="other")
        fresh = []
        for (i, size, kind) in params:
            j = next(ids)
            w.alloc(j, size + rng.randrange(0, 4096, 4), kind=kind)
            fresh.append((j, size, kind))
        for (i, _, _) in params:
            w.free(i)
        params = fresh
        w.free(temp)
        w.free(table)


def _layers(w: TraceWriter, rng: random.Random, steps: int) -> None:
    """Per-buffer training steps: activations kept layer by layer in the
    forward pass, freed in reverse in the backward pass while gradients
    are made; the batch size changes between steps."""
    ids = iter(range(1, 1 << 62))
    layers = 32
    widths = [rng.choice([1, 1, 2, 4]) for _ in range(layers)]
    weights = []
    for l in range(layers):
        i = next(ids)
        w.alloc(i, widths[l] * 24 * MIB + rng.randrange(0, 65536, 4),
                kind="param")
        weights.append(i)
    for _ in range(steps):
        batch = rng.choice([3, 4, 6, 8])
        acts = []
        for l in range(layers):
            for part in range(3):
                i = next(ids)
                w.alloc(i, batch * widths[l] * (3 + part) * MIB +
                        rng.randrange(0, 1 << 16, 4), kind="activation")
                acts.append(i)
            t = next(ids)
            w.alloc(t, batch * 7 * MIB, kind="temp")
            w.free(t)
        grads = []
        for l in reversed(range(layers)):
            g = next(ids)
            w.alloc(g, widths[l] * 24 * MIB, kind="grad")
            grads.append(g)
            for _ in range(3):
                w.free(acts.pop())
        for g in grads:
            w.free(g)


def _eager(w: TraceWriter, rng: random.Random, events: int) -> None:
    """Eager-like: many short-lived buffers of mixed sizes on two streams
    over a resident set that churns slowly."""
    live: List[int] = []
    next_id = 1
    while w.events < events:
        if live and (len(live) > 600 or rng.random() < 0.49):
            k = rng.randrange(len(live))
            live[k], live[-1] = live[-1], live[k]
            w.free(live.pop())
            continue
        r = rng.random()
        if r < 0.45:
            size = rng.randrange(1, 1 << 16)
        elif r < 0.75:
            size = rng.randrange(1 << 16, 4 << 20)
        elif r < 0.97:
            size = rng.randrange(4 << 20, 96 << 20)
        else:
            size = rng.randrange(96 << 20, 768 << 20)
        w.alloc(next_id, size, stream=0 if rng.random() < 0.85 else 1,
                kind="temp")
        live.append(next_id)
        next_id += 1


def _kv(w: TraceWriter, rng: random.Random, requests: int) -> None:
    """Serving-like: per request a cache buffer that is regrown as the
    sequence lengthens (allocate the larger one, free the old), requests
    finishing out of order."""
    active: Dict[int, Tuple[int, int]] = {}  # request -> (id, tokens)
    next_id = 1
    per_token = 160 * 1024
    started = 0
    while started < requests or active:
        if started < requests and len(active) < 48 and rng.random() < 0.3:
            tokens = rng.randrange(64, 1024)
            w.alloc(next_id, tokens * per_token, kind="activation")
            active[started] = (next_id, tokens)
            next_id += 1
            started += 1
            continue
        if not active:
            continue
        req = rng.choice(list(active))
        buf, tokens = active[req]
        if rng.random() < 0.12 or tokens > 6000:
            w.free(buf)
            del active[req]
            continue
        tokens += rng.randrange(64, 512)
        w.alloc(next_id, tokens * per_token, kind="activation")
        w.free(buf)
        active[req] = (next_id, tokens)
        next_id += 1


SYNTHETIC: Dict[str, Tuple[Callable[[TraceWriter, random.Random, int],
                                    None], int, str]] = {
    "synthetic-xla-steps": (_xla_steps, 300,
                            "XLA-like steps: temp buffer per step, donated "
                            "outputs"),
    "synthetic-layers": (_layers, 120,
                         "per-buffer forward/backward, batch size varies"),
    "synthetic-eager": (_eager, 300000,
                        "eager-like mixed sizes on two streams"),
    "synthetic-kv": (_kv, 3000, "serving-like growing cache buffers"),
}


def write_synthetic(folder: str, seed: int = 0,
                    scale: float = 1.0) -> List[str]:
    """Writes the synthetic traces into `folder`; returns their paths.
    `scale` multiplies their length (steps, events or requests)."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i, (name, (make, amount, doc)) in enumerate(sorted(SYNTHETIC.items())):
        path = os.path.join(folder, f"{name}.jsonl.gz")
        rng = random.Random(seed * 1000 + i)
        with TraceWriter(path, name, source="synthetic",
                         meta={"generator": "jaxlake bench --synthetic",
                               "about": doc, "seed": seed,
                               "scale": scale}) as w:
            make(w, rng, max(1, int(amount * scale)))
        paths.append(path)
    return paths
