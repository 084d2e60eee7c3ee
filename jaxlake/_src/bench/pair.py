"""Two processes on one device: the replay of a pair of traces.

A pair is two traces of two programs that share one GPU: the first job,
started alone, and the second, run beside it (docs/traces.md, "Pairs": the
second's header meta names the first's file under "beside"). Each process
has its own allocator, so each trace is replayed through its own fresh
policy; what joins them is the device:

- the first job holds what its policy holds for it: a growing policy its
  peak reserved bytes, replayed alone on the device (every caching
  allocator keeps what it grew to; the lake gives memory back only under
  its own process's pressure, and nothing in the first process asks);
  a preallocating one (bench --preallocate: jaxlake, bfc and bfc-growth as
  JAX runs them by default) its fraction of the device, XLA's 0.75,
  which the first job must then fit in;
- the second job must fit in what is left. Its policy may take all of
  it; XLA's BFC keeps its own limit, its share of the whole device (the
  device growing, the bench's convention; 0.75 of it preallocating),
  sizes its regions under that limit, and backs a region the device
  refuses off to 90% of its size while that still holds the request
  (tsl's BFCAllocator::Extend; the model's `bfc_limit`). Preallocating,
  it so asks for its 0.75 of the device first: on the fake GPU the
  second of two JAX defaults on a 256 MiB device got 62 MiB, 192 MiB x
  0.9^11 in whole 2 MiB granules (docs/results/workloads.md). The lake
  and bfc-growth preallocate what is left.

The pair's fit capacity is the smallest device, in whole 2 MiB granules,
on which both fit, and its U_fit the two jobs' peak live bytes (summed:
the first keeps running its steps, so its peak comes again while the
second runs) over that device.

Left out: the first job's hold over time (it is taken at its peak from the
start), and pressure between processes (a second job's out-of-memory asks
nothing of the first's allocator; the real lake behaves so too).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from typing import Any, Callable, Dict, Optional, Tuple

from jaxlake._src.bench.replay import (GRANULARITY, Capacity, Latency,
                                       OutOfMemory, ReplayResult, replay)
from jaxlake._src.trace import tracefile

#: The header meta key of a pair's second trace: the first's file name,
#: in the same folder.
BESIDE = "beside"
#: XLA's default share of the device (XLA_CLIENT_MEM_FRACTION), which a
#: preallocating first process takes.
FRACTION = 0.75
#: Granules below a bisected boundary that are also tried (as fit.cc does:
#: success need not be monotone in the capacity).
BELOW = 4


class PairError(tracefile.TraceError):
    """A pair whose first trace is missing or malformed."""


def beside_name(path: str) -> Optional[str]:
    """The first job's file a trace's header names under "beside" (None
    when it names none, or the file is not JSON lines), read from the
    header line alone."""
    low = path.lower()
    if not (low.endswith(".jsonl") or low.endswith(".jsonl.gz")):
        return None
    try:
        opener: Callable[..., Any] = gzip.open if low.endswith(".gz") \
            else open
        with opener(path, "rt", encoding="utf-8") as f:
            header = json.loads(f.readline())
    except (OSError, ValueError, EOFError):
        return None
    meta = header.get("meta") if isinstance(header, dict) else None
    value = meta.get(BESIDE) if isinstance(meta, dict) else None
    return value if isinstance(value, str) and value else None


def first_path(second: str, name: str) -> str:
    """The path of the first job's trace that `second` names."""
    if os.path.isabs(name) or os.sep in name or name in (".", ".."):
        raise PairError(f"meta.{BESIDE} {name!r}: give the first job's file "
                        "name, in the second's folder", second)
    path = os.path.join(os.path.dirname(os.path.abspath(second)), name)
    if not os.path.isfile(path):
        raise PairError(f"meta.{BESIDE}: the first job's trace {name!r} is "
                        "not in the second's folder", second)
    return path


def read_pair(second: str, lenient: bool = False
              ) -> Tuple[tracefile.Trace, tracefile.Trace]:
    """(first, second) traces of the pair whose second is `second`."""
    trace = tracefile.read_trace(second, lenient=lenient)
    name = trace.meta.get(BESIDE)
    if not isinstance(name, str) or not name:
        raise PairError(f"its header's meta names no first job "
                        f"(\"{BESIDE}\")", second)
    first = tracefile.read_trace(first_path(second, name), lenient=lenient)
    for t in (first, trace):
        if t.devices != 1:
            raise PairError(f"a pair's traces are of one device each; "
                            f"this one has {t.devices}", t.path)
    return first, trace


def up(nbytes: int) -> int:
    """Up to whole granules."""
    return -(-nbytes // GRANULARITY) * GRANULARITY


def down(nbytes: int) -> int:
    """Down to whole granules."""
    return nbytes // GRANULARITY * GRANULARITY


def preallocating(policy: str, options: Optional[Dict[str, Any]]) -> bool:
    """Whether `options` make `policy` preallocate (bench --preallocate's
    overrides, fit's bfc-prealloc)."""
    o = options or {}
    return ((policy == "jaxlake" and bool(o.get("lake_preallocate")))
            or (policy == "bfc" and "bfc_initial_region" in o)
            or (policy == "bfc-growth" and "bfc_growth_increment" in o))


def second_options(policy: str, options: Optional[Dict[str, Any]],
                   limit: int) -> Optional[Dict[str, Any]]:
    """The second job's policy options, its capacity being the room the
    first leaves: XLA's BFC keeps its own memory `limit` (its share of the
    whole device) and backs off from it when the device refuses
    (`bfc_limit`); the other policies keep theirs, the capacity cutting a
    preallocation to what is left."""
    if policy == "bfc":
        out = dict(options or {})
        out["bfc_limit"] = limit
        return out
    return options


@dataclasses.dataclass
class PairCheck:
    """Whether a pair fits on one device, and how."""

    device: int
    fits: bool
    first_hold: int            # what the first job holds
    room: int                  # what is left for the second
    first: Optional[ReplayResult] = None
    second: Optional[ReplayResult] = None
    #: Where it failed: the first alone (its own capacity), or the second.
    failed: str = ""

    @property
    def oom(self) -> Optional[OutOfMemory]:
        for r in (self.first, self.second):
            if r is not None and r.oom is not None:
                return r.oom
        return None


def check(first: tracefile.Trace, second: tracefile.Trace, policy: str,
          device: int, options: Optional[Dict[str, Any]] = None,
          latency: Optional[Latency] = None, figures: bool = False,
          fraction: float = FRACTION) -> PairCheck:
    """Replays the pair on a device of `device` bytes (whole granules).
    `figures`: keep each replay's figures under its capacity (calls,
    driver time) in the results' `capped`."""
    device = down(device)
    pre = preallocating(policy, options)
    share = up(int(device * fraction)) if pre else device
    if share <= 0 or share > device:
        return PairCheck(device, False, 0, 0, failed="first")
    a = replay(first, policy, share, timeline_points=0, timing=False,
               options=options, latency=latency, capped_figures=figures)
    if a.oom is not None:
        return PairCheck(device, False, 0, 0, first=a, failed="first")
    held = a.capped_peak_reserved if a.capped_peak_reserved is not None \
        else a.peak_reserved
    hold = share if pre else up(held)
    room = device - hold
    if room < GRANULARITY:
        return PairCheck(device, False, hold, room, first=a,
                         failed="second")
    b = replay(second, policy, room, timeline_points=0, timing=False,
               options=second_options(policy, options, share),
               latency=latency, capped_figures=figures)
    return PairCheck(device, b.oom is None, hold, room, first=a, second=b,
                     failed="" if b.oom is None else "second")


def fit_device(first: tracefile.Trace, second: tracefile.Trace, policy: str,
               options: Optional[Dict[str, Any]] = None,
               latency: Optional[Latency] = None,
               limit: Optional[int] = None) -> Tuple[Optional[int], bool]:
    """The smallest device, in whole granules, on which the pair fits (None
    when none up to `limit` does, by default 80 GiB or four times the
    pair's peak live bytes), and whether success was non-monotone (a
    device below a failing one fitted). The search: from the pair's peak
    live bytes in whole granules, doubling steps up until the pair fits,
    bisection, then the BELOW granules under the boundary."""
    live = up(int(first.core.peak_live(0))) + up(int(second.core.peak_live(0)))
    top = limit or max(80 << 30, 4 * live)
    memo: Dict[int, bool] = {}

    def fits(d: int) -> bool:
        if d not in memo:
            memo[d] = check(first, second, policy, d, options,
                            latency).fits
        return memo[d]

    lo = max(GRANULARITY, live - GRANULARITY)  # fails or fits: tried
    if fits(lo):
        hi = lo
        lo = lo - GRANULARITY
    else:
        step = GRANULARITY
        hi = lo + step
        while not fits(hi):
            if hi >= top:
                return None, False
            lo = hi
            step *= 2
            hi = min(top, hi + step)
    while hi - lo > GRANULARITY:  # lo fails (or is below any), hi fits
        mid = down((lo + hi) // 2)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    nonmonotone = False
    below = hi - GRANULARITY
    tried = 0
    while below >= GRANULARITY and tried < BELOW:
        if fits(below):
            hi, nonmonotone, tried = below, True, 0
        else:
            tried += 1
        below -= GRANULARITY
    return hi, nonmonotone


def _sum(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def replay_pair(first: tracefile.Trace, second: tracefile.Trace,
                policy: str, capacity: Optional[Capacity] = None,
                options: Optional[Dict[str, Any]] = None,
                latency: Optional[Latency] = None,
                timeline_points: int = 1000,
                name: Optional[str] = None) -> ReplayResult:
    """The pair as one row of the bench's table (docs/benchmarks.md,
    "Workloads that fragment"): each job replayed through its own fresh
    `policy` on the uncapped device, then together. Live bytes are the
    two jobs' peaks summed; reserved bytes what the first holds plus the
    second's; calls, counters and driver time both jobs'; the times of one
    call are the second job's; the timeline is the first job's, then the
    second's on top of the first's peak live and hold. fit_capacity and
    u_fit are the pair's (fit_device()); under `capacity` (a multiple of
    the summed peak live bytes, or bytes) `oom` says where the pair ran
    out."""
    a = replay(first, policy, None, timeline_points=timeline_points,
               options=options, latency=latency)
    b = replay(second, policy, None, timeline_points=timeline_points,
               options=options, latency=latency)
    pre = preallocating(policy, options)
    live_a, live_b = a.peak_live, b.peak_live
    hold_a = up(a.peak_reserved)
    r = dataclasses.replace(
        b, trace=name or second.name,
        events=a.events + b.events, allocs=a.allocs + b.allocs,
        frees=a.frees + b.frees, peak_live=live_a + live_b,
        peak_reserved=hold_a + b.peak_reserved,
        calls=_sum(a.calls, b.calls), counters=_sum(a.counters, b.counters),
        calls_second_half=_sum(a.calls_second_half, b.calls_second_half),
        driver_us=_sum(a.driver_us, b.driver_us),
        driver_us_second_half=_sum(a.driver_us_second_half,
                                   b.driver_us_second_half),
        timeline_event=a.timeline_event + [a.events + e
                                           for e in b.timeline_event],
        timeline_live=a.timeline_live + [live_a + x
                                         for x in b.timeline_live],
        timeline_reserved=a.timeline_reserved + [
            hold_a + x for x in b.timeline_reserved],
        device_memory=max(a.device_memory, b.device_memory),
        min_reserved=up(live_a) + up(live_b),
        capacity=None, oom=None, capped_peak_reserved=None,
        capped_peak_reserved_by_device=None, capped=None,
        fit_capacity=None, u_fit=None, fit_calls={},
        fit_calls_second_half={}, fit_driver_us={}, fit_nonmonotone=False)
    r.waste = r.peak_reserved - r.peak_live
    r.utilisation = r.peak_live / r.peak_reserved if r.peak_reserved else 0.0
    if pre:
        r.device_memory = max(r.device_memory, r.peak_reserved)
    device, odd = fit_device(first, second, policy, options, latency)
    if device is not None:
        at = check(first, second, policy, device, options, latency,
                   figures=True)
        parts = [x.capped or x for x in (at.first, at.second)
                 if x is not None]
        for part in parts:
            r.fit_calls = _sum(r.fit_calls, part.calls)
            r.fit_calls_second_half = _sum(r.fit_calls_second_half,
                                           part.calls_second_half)
            r.fit_driver_us = _sum(r.fit_driver_us, part.driver_us)
        r.fit_capacity = device
        r.fit_nonmonotone = odd
        r.u_fit = r.peak_live / device
    if capacity is not None:
        cap = capacity.bytes_for(r.peak_live)
        at = check(first, second, policy, cap, options, latency)
        r.capacity = cap
        r.oom = at.oom if not at.fits else None
        if at.fits and at.second is not None:
            second_held = at.second.capped_peak_reserved \
                if at.second.capped_peak_reserved is not None \
                else at.second.peak_reserved
            r.capped_peak_reserved = at.first_hold + second_held
        if not at.fits and r.oom is None:
            # Nothing left for the second: its first request fails.
            r.oom = OutOfMemory(device=0, event=a.events, line=0,
                                size=second.events()[0].size
                                if len(second) else 0, stream=0, live=0,
                                reserved=at.first_hold)
    return r
