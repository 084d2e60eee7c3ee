"""The data behind `jaxlake view`: replays, timelines, bands, snapshots.

Everything the page shows is computed here, once, and embedded in the page
as JSON (see page.py); the page's script only draws it. Per device:

- the timeline: live bytes after every event and each policy's reserved
  bytes (the replay engine's timeline, one point per event, or the maximum
  of each bucket of events when the trace is long), with U so far;
- the allocation bands: each allocation a band over its lifetime, stacked
  in allocation order (an allocation freed lets the ones above it move
  down), so the top of the stack is the live bytes; the largest
  allocations only when there are too many to draw;
- the lake's layout (Lake::snapshot()) after a bounded number of events:
  evenly spread ones, the peak of live bytes, allocations served by a
  stitch, and an allocation that ran out of memory under a capacity;
- how the lake served each allocation (fit, split, stitch, ...).

And for the whole trace, the table `jaxlake replay` prints.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from jaxlake._src.bench import suite as bench
from jaxlake._src.bench.replay import (Capacity, ReplayResult, _options,
                                       check_policies, device_bytes,
                                       out_of_memory, policy_names, replay)
from jaxlake._src.options import format_size
from jaxlake._src.trace.tracefile import KINDS, Trace

#: Timeline points per series; longer traces show the maximum of each
#: bucket of events.
MAX_POINTS = 20_000
#: Allocations drawn as bands, and the most bars (pieces of bands between
#: two moves) the page holds.
MAX_BANDS = 4_000
MAX_PIECES = 12_000
#: Snapshots of the lake's layout: evenly spread, and after stitches.
SNAPSHOTS = 200
STITCH_SNAPSHOTS = 100
#: Bytes of embedded data the page may hold (plotly.js is about 5 MB more).
DATA_BUDGET = 13_000_000
#: Stitch markers drawn on the timeline.
MAX_STITCH_MARKS = 2_000

#: How the lake served an allocation (AllocState order, cc/lake/lake.h).
SERVED = ("small", "fit", "split", "stitch-reuse", "stitch", "stitch-grow",
          "grow")
NOT_SERVED = 255
#: Event kinds: 0 is "not given" (cc/replay/trace.h).
KIND_NAMES = ("unknown",) + KINDS
#: Chunk states of a snapshot (ChunkState, cc/lake/lake.h), plus 4 for a
#: free block only its freeing stream may use yet.
FREE, LIVE, LENT, SLAB, FREE_PENDING = 0, 1, 2, 3, 4


class ViewError(ValueError):
    """A view cannot be made from these inputs."""


def _core() -> Any:
    from jaxlake import _core
    return _core


def _round(values: Any, digits: int = 4) -> List[float]:
    """Values with `digits` significant digits (smaller JSON)."""
    out = []
    for v in np.asarray(values, dtype=np.float64).tolist():
        if v == 0 or not math.isfinite(v):
            out.append(0.0)
        else:
            out.append(float(f"{v:.{digits}g}"))
    return out


@dataclasses.dataclass
class Columns:
    """The trace's events as numpy arrays (one entry per event)."""

    t: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    dev: np.ndarray
    slot: np.ndarray
    line: np.ndarray
    alloc: np.ndarray
    kind: np.ndarray

    @classmethod
    def of(cls, trace: Trace) -> "Columns":
        raw = trace.core.columns()
        return cls(t=np.frombuffer(raw["t"], dtype="<u8"),
                   size=np.frombuffer(raw["size"], dtype="<u8"),
                   stream=np.frombuffer(raw["stream"], dtype="<u8"),
                   dev=np.frombuffer(raw["dev"], dtype="<u4"),
                   slot=np.frombuffer(raw["slot"], dtype="<u4"),
                   line=np.frombuffer(raw["line"], dtype="<u4"),
                   alloc=np.frombuffer(raw["alloc"], dtype="u1").astype(bool),
                   kind=np.frombuffer(raw["kind"], dtype="u1"))

    def __len__(self) -> int:
        return int(self.t.shape[0])


@dataclasses.dataclass
class Unit:
    """The byte unit of the page's axes."""

    name: str
    bytes: int

    @classmethod
    def for_peak(cls, peak: int) -> "Unit":
        if peak >= 2 << 30:
            return cls("GiB", 1 << 30)
        if peak >= 2 << 20:
            return cls("MiB", 1 << 20)
        return cls("KiB", 1 << 10)


@dataclasses.dataclass
class Settings:
    """What to show and how much of it."""

    policies: List[str]
    capacity: Optional[Capacity]
    devices: Optional[List[int]] = None     # None: every device with events
    snapshots: int = SNAPSHOTS
    stitch_snapshots: int = STITCH_SNAPSHOTS
    max_points: int = MAX_POINTS
    max_bands: int = MAX_BANDS
    max_pieces: int = MAX_PIECES
    data_budget: int = DATA_BUDGET
    options: Optional[Dict[str, Any]] = None


def _describe(cols: Columns, i: int, pair: np.ndarray) -> str:
    """One event in words."""
    size = format_size(int(cols.size[i]))
    where = f"line {int(cols.line[i])}, stream {int(cols.stream[i])}"
    if cols.alloc[i]:
        kind = KIND_NAMES[int(cols.kind[i])]
        return f"event {i}: alloc {size} {kind} ({where})"
    return (f"event {i}: free {size} allocated at event {int(pair[i])} "
            f"({where})")


def _pairs(cols: Columns) -> np.ndarray:
    """For each allocation the index of its free, for each free the index
    of its allocation; -1 for an allocation never freed."""
    n = len(cols)
    out = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return out
    idx = np.arange(n, dtype=np.int64)
    # Slots are per trace, not per device: key on both.
    order = np.lexsort((idx, cols.slot, cols.dev))
    a = order[:-1]
    b = order[1:]
    match = (cols.alloc[a] & ~cols.alloc[b] & (cols.slot[a] == cols.slot[b])
             & (cols.dev[a] == cols.dev[b]))
    out[a[match]] = b[match]
    out[b[match]] = a[match]
    return out


# -- timeline ----------------------------------------------------------------


def _points(n_events: int, max_points: int) -> Tuple[int, int]:
    """(points, bucket): the timeline points asked of the replay engine and
    the events per point it then makes (engine.cc's rule)."""
    points = max(1, min(n_events, max_points))
    return points, max(1, -(-n_events // points))


def _timeline(cols: Columns, dev: int, pair: np.ndarray,
              runs: Dict[str, Any], unit: Unit, bucket: int,
              served: np.ndarray) -> Dict[str, Any]:
    mask = cols.dev == dev
    signed = np.where(mask, np.where(cols.alloc, cols.size.astype(np.int64),
                                     -cols.size.astype(np.int64)), 0)
    live = np.cumsum(signed)
    idx = np.nonzero(mask)[0]
    buckets = idx // bucket
    first = np.concatenate(([0], np.nonzero(np.diff(buckets))[0] + 1)) \
        if len(idx) else np.zeros(0, dtype=np.int64)
    live_dev = live[idx]
    live_max = np.maximum.reduceat(live_dev, first) if len(idx) else live_dev
    x = (buckets[first] * bucket).astype(np.int64)
    peak_live_so_far = np.maximum.accumulate(live_max) if len(x) else live_max
    if bucket == 1:
        hover = [_describe(cols, int(i), pair) for i in idx]
    else:
        last = np.concatenate((first[1:], [len(idx)])) - 1
        hover = [f"events {int(idx[a])}-{int(idx[b])}: the most of "
                 f"{int(b - a + 1)} events" for a, b in zip(first, last)]
    series = []
    for name, run in runs.items():
        tx = np.asarray(run.timeline_event, dtype=np.int64)
        reserved = np.asarray(run.timeline_reserved, dtype=np.float64)
        k = len(tx)
        # The policy's points are the first k of the live line's (a run
        # that ran out of memory stops early); anything else keeps its own.
        own_x = not np.array_equal(tx, x[:k])
        if own_x:
            k = min(k, len(x))
            tx, reserved = tx[:k], reserved[:k]
        peak_res = np.maximum.accumulate(reserved) if k else reserved
        u = np.where(peak_res > 0, peak_live_so_far[:k] /
                     np.maximum(peak_res, 1), 0.0)
        oom = out_of_memory(run)
        entry: Dict[str, Any] = {
            "name": name, "y": _round(reserved / unit.bytes),
            "u": _round(u, 3), "oom": None,
            "x": tx.tolist() if own_x else None}
        if oom is not None:
            entry["oom"] = {
                "event": oom.event,
                "y": _round([oom.reserved / unit.bytes])[0],
                "text": (f"{name}: out of memory at event {oom.event} "
                         f"(line {oom.line}): {format_size(oom.size)} "
                         f"requested with {format_size(oom.live)} live and "
                         f"{format_size(oom.reserved)} reserved")}
        series.append(entry)
    # Stitch markers on the lake's line (or on live when it is not shown).
    lake = runs.get("jaxlake")
    if lake is not None and len(lake.timeline_event):
        lx = np.asarray(lake.timeline_event, dtype=np.int64)
        ly = np.asarray(lake.timeline_reserved, dtype=np.float64)
    else:
        lx, ly = x, live_max.astype(np.float64)

    def marks(states: Tuple[int, ...]) -> Dict[str, Any]:
        out: Dict[str, Any] = {"x": [], "y": [], "text": [], "total": 0}
        chosen = idx[np.isin(served[idx], states)]
        out["total"] = int(len(chosen))
        if len(chosen) > MAX_STITCH_MARKS:
            chosen = chosen[np.linspace(0, len(chosen) - 1,
                                        MAX_STITCH_MARKS).astype(int)]
        if len(ly) == 0:
            return out
        for i in chosen.tolist():
            j = min(int(np.searchsorted(lx, (i // bucket) * bucket)),
                    len(ly) - 1)
            out["x"].append(i)
            out["y"].append(_round([ly[j] / unit.bytes])[0])
            out["text"].append(
                f"event {i}: {SERVED[int(served[i])]} served "
                f"{format_size(int(cols.size[i]))} "
                f"{KIND_NAMES[int(cols.kind[i])]}")
        return out

    return {"x": x.tolist(), "live": _round(live_max / unit.bytes),
            "hover": hover, "policies": series, "stitches": marks((4, 5)),
            "reuses": marks((3,)), "bucket": bucket}


# -- bands -------------------------------------------------------------------


def _bands(cols: Columns, dev: int, pair: np.ndarray, served: np.ndarray,
           unit: Unit, end_x: int, max_bands: int,
           max_pieces: int) -> Dict[str, Any]:
    allocs = np.nonzero((cols.dev == dev) & cols.alloc)[0]
    total = len(allocs)
    keep = max_bands
    while True:
        if total > keep:
            sizes = cols.size[allocs]
            chosen = np.argpartition(-sizes.astype(np.int64), keep - 1)[:keep]
            kept = np.sort(allocs[chosen])
        else:
            kept = allocs
        pieces = _stack(cols, pair, kept, end_x, max_pieces)
        if pieces is not None or keep <= 1:
            break
        keep = max(1, keep // 2)
    if pieces is None:
        pieces = []
    by_kind: Dict[int, Dict[str, List[Any]]] = {}
    texts: Dict[int, str] = {}
    for (a, start, stop, bottom) in pieces:
        k = int(cols.kind[a])
        d = by_kind.setdefault(k, {"base": [], "len": [], "y": [], "w": [],
                                   "text": [], "id": []})
        size = int(cols.size[a])
        d["base"].append(int(start))
        d["len"].append(int(stop - start))
        d["y"].append((bottom + size / 2) / unit.bytes)
        d["w"].append(size / unit.bytes)
        if a not in texts:
            free = int(pair[a])
            life = (f"events {a}-{free} ({free - a} events)" if free >= 0
                    else f"event {a} to the end (never freed)")
            how = SERVED[served[a]] if served[a] != NOT_SERVED else \
                "not replayed (after an out-of-memory stop)"
            texts[a] = (f"<b>{format_size(size)}</b> {KIND_NAMES[k]}<br>"
                        f"{life}<br>stream {int(cols.stream[a])}, line "
                        f"{int(cols.line[a])}<br>jaxlake served it: {how}")
        d["text"].append(texts[a])
        d["id"].append(int(a))
    kinds = []
    for k in sorted(by_kind):
        d = by_kind[k]
        d["y"] = _round(d["y"], 6)
        d["w"] = _round(d["w"], 6)
        kinds.append({"kind": KIND_NAMES[k], **d})
    drawn = len({p[0] for p in pieces})
    note = ""
    if drawn < total:
        note = (f"bands: the {drawn:,} largest of {total:,} allocations "
                "(smaller ones are left out of the stack)")
    return {"kinds": kinds, "drawn": drawn, "total": total, "note": note,
            "end": end_x}


def _stack(cols: Columns, pair: np.ndarray, kept: np.ndarray, end_x: int,
           max_pieces: int) -> Optional[List[Tuple[int, int, int, int]]]:
    """Pieces (alloc, start, stop, bottom in bytes) of the kept
    allocations stacked in allocation order; None past max_pieces."""
    frees = pair[kept]
    ev = np.concatenate((kept, frees[frees >= 0]))
    ev.sort()
    kept_set = set(kept.tolist())
    live: List[List[int]] = []  # [alloc, size, bottom, piece start]
    top = 0
    pieces: List[Tuple[int, int, int, int]] = []
    for i in ev.tolist():
        if i in kept_set:
            size = int(cols.size[i])
            live.append([i, size, top, i])
            top += size
            continue
        a = int(pair[i])
        p = next(k for k, e in enumerate(live) if e[0] == a)
        gone = live.pop(p)
        if i > gone[3]:
            pieces.append((gone[0], gone[3], i, gone[2]))
        top -= gone[1]
        for e in live[p:]:
            if i > e[3]:
                pieces.append((e[0], e[3], i, e[2]))
            e[2] -= gone[1]
            e[3] = i
        if len(pieces) > max_pieces:
            return None
    for e in live:
        pieces.append((e[0], e[3], max(end_x, e[3] + 1), e[2]))
    if len(pieces) > max_pieces:
        return None
    return pieces


# -- snapshots ---------------------------------------------------------------


def _snapshot_events(cols: Columns, dev: int, count: int,
                     live_peak_event: int) -> List[int]:
    idx = np.nonzero(cols.dev == dev)[0]
    if len(idx) == 0 or count <= 0:
        return []
    picks = np.unique(np.linspace(0, len(idx) - 1, min(count, len(idx)))
                      .round().astype(np.int64))
    events = set(idx[picks].tolist())
    if live_peak_event >= 0:
        events.add(live_peak_event)
    return sorted(events)


def _snapshots(cols: Columns, pair: np.ndarray, served: np.ndarray,
               raw: List[Dict[str, Any]], live_after: np.ndarray,
               streams: int) -> List[Dict[str, Any]]:
    """The core's snapshots in the page's compact form: runs of chunks as
    [start, end, state, ref] where ref is the allocation's event (live),
    the stitched range's id (lent) or the slab's id (slab), else -1.
    A free block that only its freeing stream may use yet is marked so
    only when the device has more than one stream (with one, every free
    block is usable at once)."""
    def ref(event: Optional[int]) -> int:
        return int(event) if event is not None else -1

    out = []
    for s in raw:
        by_addr = {addr: ev for addr, ev in s["live"]}
        gran = int(s["granularity"])
        segs = []
        reserved = 0
        for (sid, _va, nchunks, runs) in s["segments"]:
            reserved += nchunks * gran
            rows = []
            for (start, end, state, owner, address, pending) in runs:
                if state == FREE:
                    rows.append([start, end, FREE_PENDING
                                 if pending and streams > 1 else FREE, -1])
                elif state == LIVE:
                    ev = by_addr.get(address)
                    rows.append([start, end, LIVE, ref(ev)])
                else:
                    rows.append([start, end, state, int(owner)])
            segs.append([int(sid), int(nchunks), rows])
        stitched = []
        for (rid, _va, nchunks, used, cached, _busy, pieces,
             address) in s["stitched"]:
            # The allocation starts at the range's address, or past the
            # free tail that leads it.
            ev = by_addr.get(address) if address else None
            stitched.append([int(rid), int(nchunks), int(used), bool(cached),
                             [[int(a), int(b), int(c)] for a, b, c in pieces],
                             ref(ev)])
        slabs = [[int(i), int(seg), int(st), int(n), int(b), int(u),
                  int(stream)]
                 for (i, seg, st, n, _base, b, u, stream) in s["slabs"]]
        e = int(s["event"])
        why = []
        if s["oom"]:
            why.append("oom")
        if s["stitch"] and served[e] != NOT_SERVED:
            why.append(SERVED[served[e]])  # stitch, stitch-grow, -reuse
        out.append({
            "event": e, "why": why, "gran": gran, "reserved": reserved,
            "live": int(live_after[e]),
            "free": int(s["free_chunks"]) * gran,
            "largest": int(s["largest_free"]) * gran,
            "small": sum(sl[4] for sl in slabs),
            "small_used": sum(sl[5] for sl in slabs),
            "what": _describe(cols, e, pair) + (
                f" - jaxlake: {SERVED[served[e]]}"
                if served[e] != NOT_SERVED else
                (" - jaxlake: out of memory" if s["oom"] else "")),
            "segs": segs, "stitched": stitched, "slabs": slabs})
    return out


def _alloc_table(cols: Columns, pair: np.ndarray, served: np.ndarray,
                 snaps: Sequence[Dict[str, Any]]) -> Dict[str, List[Any]]:
    """The allocations the snapshots name: alloc event -> [free event,
    size, kind, stream, served, line]."""
    events = set()
    for s in snaps:
        for seg in s["segs"]:
            for r in seg[2]:
                if r[2] == LIVE and r[3] >= 0:
                    events.add(r[3])
        for st in s["stitched"]:
            if st[5] >= 0:
                events.add(st[5])
    return {str(ev): [int(pair[ev]), int(cols.size[ev]),
                      KIND_NAMES[int(cols.kind[ev])], int(cols.stream[ev]),
                      SERVED[served[ev]] if served[ev] != NOT_SERVED
                      else "-", int(cols.line[ev])]
            for ev in sorted(events)}


# -- the whole view ----------------------------------------------------------


def _policy_options(settings: Settings, nbytes: int) -> Any:
    return _options(nbytes, settings.options)


def _device_sizes(trace: Trace, dev: int,
                  capacity: Optional[Capacity]) -> Tuple[int, Optional[int]]:
    """(simulated device bytes, capacity bytes) as replay() sizes them."""
    live = int(trace.core.peak_live(dev))
    cap = capacity.bytes_for(live) if capacity else None
    return device_bytes(live, cap), cap


def _table(trace: Trace, results: Sequence[ReplayResult]) -> Dict[str, Any]:
    tr = bench.TraceResults(name=trace.name, path="", events=0, devices=1,
                            peak_live=0, load_s=0.0, results=list(results))
    rows = bench.table_rows([tr])
    notes = []
    for r in results:
        if r.oom is not None:
            notes.append(f"{r.policy}: {r.oom.describe()}")
        elif r.capacity is not None:
            peak = r.capped_peak_reserved or r.peak_reserved
            notes.append(f"{r.policy}: fits the capacity (peak reserved "
                         f"{format_size(peak)})")
    return {"columns": list(bench.COLUMNS), "rows": rows, "notes": notes,
            "text": bench.format_table(rows)}


def build(trace: Trace, settings: Settings) -> Dict[str, Any]:
    """The page's data for `trace` (a dict ready for JSON)."""
    policies = check_policies(settings.policies) if settings.policies \
        else list(policy_names())
    cols = Columns.of(trace)
    n = len(cols)
    counts = list(trace.core.device_events())
    present = [d for d, c in enumerate(counts) if c]
    if settings.devices is not None:
        for d in settings.devices:
            if d < 0 or d >= trace.devices:
                raise ViewError(
                    f"device {d} is not in the trace: it has "
                    f"{trace.devices} device(s) (0 to {trace.devices - 1})")
        devices = list(settings.devices)
    else:
        devices = present or [0]
    data: Dict[str, Any] = {
        "format": "jaxlake-view", "version": 1,
        "trace": {"name": trace.name, "path": trace.path, "events": n,
                  "devices": trace.devices, "source": trace.source,
                  "skipped": int(trace.core.skipped_count)},
        "policies": policies,
        "capacity": str(settings.capacity) if settings.capacity else None,
        "served_names": list(SERVED), "kinds": list(KIND_NAMES),
        "notes": [], "devices": []}
    if trace.skipped:
        data["notes"].append(
            f"{int(trace.core.skipped_count)} malformed line(s) were skipped "
            f"(--lenient); the first at line {trace.skipped[0].line}: "
            f"{trace.skipped[0].reason}")
    if n == 0:
        data["empty"] = "This trace has no events: nothing to show."
        data["table"] = {"columns": list(bench.COLUMNS), "rows": [],
                         "notes": [], "text": ""}
        return data
    data["empty"] = None
    results = [replay(trace, p, settings.capacity, timeline_points=0)
               for p in policies]
    data["table"] = _table(trace, results)
    pair = _pairs(cols)
    points, bucket = _points(n, settings.max_points)
    if bucket > 1:
        data["notes"].append(
            f"{n:,} events: the timeline shows the most of every {bucket:,} "
            f"events (about {points:,} points); zooming in shows the same "
            "points")
    for dev in devices:
        data["devices"].append(_device(trace, cols, pair, dev, policies,
                                       settings, points, bucket))
    return data


def _device(trace: Trace, cols: Columns, pair: np.ndarray, dev: int,
            policies: Sequence[str], settings: Settings, points: int,
            bucket: int) -> Dict[str, Any]:
    n = len(cols)
    core = _core()
    size, cap = _device_sizes(trace, dev, settings.capacity)
    nbytes = cap if cap is not None else size
    runs: Dict[str, Any] = {}
    for p in policies:
        runs[p] = core.replay(trace.core, p,
                              _policy_options(settings, nbytes), dev,
                              points, False, 0)
    mask = cols.dev == dev
    signed = np.where(mask, np.where(cols.alloc, cols.size.astype(np.int64),
                                     -cols.size.astype(np.int64)), 0)
    live_after = np.cumsum(signed)
    dev_events = int(mask.sum())
    peak_live = int(live_after.max()) if dev_events else 0
    peak_event = int(np.argmax(live_after)) if dev_events else -1
    peak_reserved = max([peak_live] + [int(r.peak_reserved)
                                       for r in runs.values()])
    unit = Unit.for_peak(max(peak_reserved, nbytes if cap else 0))
    asked = _snapshot_events(cols, dev, settings.snapshots, peak_event)
    lake = core.lake_view(trace.core, _policy_options(settings, nbytes), dev,
                          asked, settings.stitch_snapshots)
    served = np.frombuffer(lake["served"], dtype="u1")
    timeline = _timeline(cols, dev, pair, runs, unit, bucket, served)
    bands = _bands(cols, dev, pair, served, unit, n, settings.max_bands,
                   settings.max_pieces)
    streams = len(np.unique(cols.stream[mask])) if dev_events else 0
    snaps = _snapshots(cols, pair, served, lake["snapshots"], live_after,
                       streams)
    notes = []
    if dev_events == 0:
        notes.append(f"device {dev} has no events in this trace")
    if bands["note"]:
        notes.append(bands["note"])
    # The size guard: drop evenly spread snapshots (keeping stitches, the
    # peak and an out-of-memory stop) while the snapshots are too big.
    budget = settings.data_budget // 2
    size_now = len(json.dumps(snaps, separators=(",", ":")))
    dropped = 0
    while size_now > budget and len(snaps) > 2:
        keep = [s for k, s in enumerate(snaps)
                if k % 2 == 0 or s["why"] or s["event"] == peak_event]
        if len(keep) == len(snaps):
            keep = snaps[::2]
        dropped += len(snaps) - len(keep)
        snaps = keep
        size_now = len(json.dumps(snaps, separators=(",", ":")))
    if dropped:
        notes.append(f"memory map: {len(snaps)} snapshots kept of "
                     f"{len(snaps) + dropped} to keep the page small")
    served_counts = {SERVED[k]: int(v) for k, v in enumerate(
        np.bincount(served[served != NOT_SERVED], minlength=len(SERVED)))}
    lake_oom = lake["oom_event"]
    if lake_oom is not None:
        notes.append(f"jaxlake ran out of memory at event {lake_oom} under "
                     f"the capacity; the memory map's last snapshot is the "
                     "lake at that moment")
    if lake["error"]:
        notes.append(f"jaxlake replay stopped: {lake['error']}")
    return {
        "device": dev, "events": dev_events, "streams": streams,
        "unit": unit.name,
        "unit_bytes": unit.bytes,
        "capacity": (cap / unit.bytes) if cap is not None else None,
        "device_memory": size,
        "peak_live": peak_live, "peak_live_event": peak_event,
        "timeline": timeline, "bands": bands, "snapshots": snaps,
        "allocs": _alloc_table(cols, pair, served, snaps),
        "served": served_counts, "stitches": int(lake["stitches"]),
        "lake_oom": lake_oom, "notes": notes}
