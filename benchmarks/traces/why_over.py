"""Where jaxlake's memory goes beyond the live bytes at a trace's fit
capacity (docs/benchmarks.md, "Hold-out").

    python benchmarks/traces/why_over.py TRACE [TRACE ...] [--device N]
        [--markdown]

For each device of each trace: the stitching limit (the peak live bytes in
whole 2 MiB granules), jaxlake's fit capacity, and two breakdowns of the
memory the lake holds (`HeldBreakdown`, cc/lake/lake.h), from the lake's
own snapshot in a replay of the real lake over the simulated driver:

- at the fit capacity, after the event of the peak live bytes: what the
  reserved bytes hold besides the live ones;
- uncapped (a device of the bench's size, whose replay gives U), at the
  first event after which the lake holds the most it ever holds: what
  those bytes hold besides the live ones. Wholly free chunks there are
  memory a stitch could have used had it been needed (a growth share
  taken on the way to a peak, or chunks freed before it): what keeps
  the uncapped U below U_fit;
- one granule below the fit capacity, at the request that fails there
  (when the fit is above the limit): the request, the capacity not held,
  and the free bytes by where they lie. A stitch maps whole chunks, so
  wholly free chunks can go anywhere in a stitched range, free bytes in a
  partly used chunk only at a range's ends (a free tail as its first
  piece, a free head as its last), and inner ones (touching neither end
  of their chunk) nowhere. `any stitch` says whether the whole free
  chunks, the largest tail, the largest head and the capacity not held
  cover the request: "no" means no stitch of any policy serves it from
  this layout (placement decided earlier, the granule limit of stitching
  itself); "yes" means a stitch could and the lake's rules did not.

Runs on the installed jaxlake (run it from outside the source tree, or
with the project's virtual environment active).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from jaxlake._src.bench.replay import _core, _options, device_bytes
from jaxlake._src.trace.tracefile import read_trace

GRANULE = 2 << 20
MIB = 1 << 20


def _mib(n: int) -> str:
    return f"{n / MIB:.2f}"


def _device_events(trace: Any, dev: int) -> Dict[str, np.ndarray]:
    raw = trace.core.columns()
    size = np.frombuffer(raw["size"], dtype="<u8").astype(np.int64)
    alloc = np.frombuffer(raw["alloc"], dtype="u1").astype(bool)
    devs = np.frombuffer(raw["dev"], dtype="<u4")
    mask = devs == dev
    signed = np.where(mask, np.where(alloc, size, -size), 0)
    return {"size": size, "alloc": alloc, "mask": mask,
            "live": np.cumsum(signed)}


def _view(trace: Any, dev: int, capacity: int,
          events: Sequence[int]) -> Dict[str, Any]:
    return dict(_core().lake_view(trace.core, _options(capacity, None), dev,
                                  list(events), 0))


def _most_held(trace: Any, dev: int, peak: int) -> Dict[str, Any]:
    """The uncapped replay (the bench's U: a device of device_bytes(peak)):
    the most bytes the lake holds and its breakdown at the first event
    after which it holds them."""
    size = device_bytes(peak)
    most = int(_core().replay_trace(
        trace.core, "jaxlake", [dev], [_options(size, None)], None, 0, False,
        0, [1], False, False).uncapped.peak_reserved)
    n = len(_device_events(trace, dev)["size"])
    lo, hi, step = 0, n, max(1, n // 1000)
    while True:
        # Snapshots every `step` events of [lo, hi); the first that holds
        # the most narrows the search to the step before it.
        snaps = _view(trace, dev, size, list(range(lo, hi, step)))["snapshots"]
        first = next((x for x in snaps if x["held"]["held"] >= most), None)
        if first is None:  # held that much only between two samples
            if step == 1:
                raise SystemExit(f"device {dev}: no snapshot holds {most} bytes")
            step = max(1, step // 10)
            continue
        if step == 1:
            return {"event": int(first["event"]), "held": dict(first["held"]),
                    "u": peak / most if most else 0.0}
        hi = int(first["event"]) + 1
        lo = max(0, hi - step)
        step = max(1, step // 50)


def explain(path: str, dev: int) -> Optional[Dict[str, Any]]:
    """The breakdowns of one device of a trace; None when it has no
    allocation."""
    trace = read_trace(path)
    peak = int(trace.core.peak_live(dev))
    if peak == 0:
        return None
    run = _core().replay_trace(
        trace.core, "jaxlake", [dev], [_options(device_bytes(peak), None)],
        None, 0, False, 0, [1], True, False)
    if not run.fit_found:
        raise SystemExit(f"{path}: device {dev}: no fit capacity found")
    cap = int(run.fit_capacity)
    ev = _device_events(trace, dev)
    peak_event = int(np.argmax(ev["live"]))
    out: Dict[str, Any] = {
        "trace": os.path.basename(path).split(".")[0], "device": dev,
        "peak_live": peak, "limit": math.ceil(peak / GRANULE),
        "fit": cap // GRANULE, "u_fit": peak / cap,
    }
    at_fit = _view(trace, dev, cap, [peak_event])
    snaps = [s for s in at_fit["snapshots"] if s["event"] == peak_event]
    out["at_peak"] = snaps[0]["held"] if snaps else None
    out["uncapped"] = _most_held(trace, dev, peak)
    if cap // GRANULE > out["limit"]:
        below = _view(trace, dev, cap - GRANULE, [])
        oom = [s for s in below["snapshots"] if s["oom"]]
        if below["oom_event"] is not None and oom:
            e = int(below["oom_event"])
            h = dict(oom[0]["held"])
            h["event"] = e
            h["request"] = int(ev["size"][e])
            h["capacity"] = cap - GRANULE
            h["unheld"] = cap - GRANULE - h["held"]
            h["live_now"] = int(ev["live"][e - 1]) if e > 0 else 0
            reach = (h["free_chunks"] + h["largest_tail"] +
                     h["largest_head"] + h["unheld"])
            h["any_stitch"] = reach >= h["request"]
            h["short"] = max(0, h["request"] - reach)
            out["failure"] = h
    return out


def lines(r: Dict[str, Any]) -> List[str]:
    name = f"{r['trace']} (device {r['device']})"
    out = [f"{name}: peak live {_mib(r['peak_live'])} MiB, limit "
           f"{r['limit']} granules, fit {r['fit']} granules "
           f"({r['fit'] - r['limit']} over), U_fit {r['u_fit']:.3f}"]
    p = r["at_peak"]
    if p:
        out.append(
            f"  at the peak, fit capacity: held {_mib(p['held'])} MiB = live "
            f"{_mib(p['live'])} + rounding {_mib(p['rounding'])} + free "
            f"chunks {_mib(p['free_chunks'])} + tails "
            f"{_mib(p['free_tails'])} + heads {_mib(p['free_heads'])} + "
            f"inner {_mib(p['free_inner'])} + slabs {_mib(p['slab_free'])}")
    f = r.get("failure")
    u = r.get("uncapped")
    if u:
        h = u["held"]
        out.append(
            f"  uncapped, most held at event {u['event']}: "
            f"{_mib(h['held'])} MiB ({-(-h['held'] // GRANULE)} granules, "
            f"U {u['u']:.3f}) = live {_mib(h['live'])} + rounding "
            f"{_mib(h['rounding'])} + free chunks {_mib(h['free_chunks'])} "
            f"+ tails {_mib(h['free_tails'])} + heads "
            f"{_mib(h['free_heads'])} + inner {_mib(h['free_inner'])} + "
            f"slabs {_mib(h['slab_free'])}")
    if f:
        out.append(
            f"  one granule below, event {f['event']} fails: request "
            f"{_mib(f['request'])} MiB, live {_mib(f['live_now'])}, "
            f"capacity not held {_mib(f['unheld'])}; free chunks "
            f"{_mib(f['free_chunks'])}, tails {_mib(f['free_tails'])} "
            f"(largest {_mib(f['largest_tail'])}), heads "
            f"{_mib(f['free_heads'])} (largest {_mib(f['largest_head'])}), "
            f"inner {_mib(f['free_inner'])}, rounding "
            f"{_mib(f['rounding'])}; any stitch: "
            f"{'yes' if f['any_stitch'] else 'no'}"
            + ("" if f["any_stitch"] else
               f" (short by {f['short'] / 1024:.1f} KiB)"))
    return out


def row(r: Dict[str, Any]) -> str:
    """One markdown row: the trace, the free bytes of partly used chunks
    at the peak (tails + heads + inner, MiB), one granule below the fit
    the failing request against what any stitch could reach (whole free
    chunks + largest tail + largest head + capacity not held), and,
    uncapped, the most granules held and the wholly free chunks then
    (MiB)."""
    p = r["at_peak"]
    peak = (f"{p['free_tails'] / MIB:.1f} + {p['free_heads'] / MIB:.1f} + "
            f"{p['free_inner'] / MIB:.1f}") if p else "-"
    f = r.get("failure")
    below = "-"
    if f:
        below = (f"{_mib(f['request'])}; {f['free_chunks'] // MIB} + "
                 f"{_mib(f['largest_tail'])} + {_mib(f['largest_head'])} + "
                 f"{f['unheld'] // MIB}: " +
                 ("a stitch could" if f["any_stitch"] else
                  f"short by {f['short'] / 1024:.1f} KiB"))
    u = r.get("uncapped")
    most = (f"{-(-u['held']['held'] // GRANULE)}; "
            f"{u['held']['free_chunks'] / MIB:.0f}") if u else "-"
    name = r["trace"] + (f" (device {r['device']})" if r["device"] else "")
    return f"| `{name}` | {peak} | {below} | {most} |"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--device", type=int, default=None,
                        help="one device (default: every device)")
    parser.add_argument("--markdown", action="store_true",
                        help="one markdown row per device: the trace, "
                             "tails + heads + inner at the peak (MiB), and "
                             "the request one granule below against what "
                             "any stitch could reach, and the most granules "
                             "held uncapped with the free chunks then")
    args = parser.parse_args(argv)
    for path in args.traces:
        trace = read_trace(path)
        devs = [args.device] if args.device is not None \
            else range(int(trace.core.devices))
        for dev in devs:
            r = explain(path, dev)
            if r is not None:
                print(row(r) if args.markdown else "\n".join(lines(r)),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
