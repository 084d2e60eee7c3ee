"""How finely the CUDA driver's stream-ordered pool hands out memory.

    python benchmarks/gpu/pool_probe.py --libcuda PATH [--out FILE]
        [--device 0] [--edge-x 64MiB,8MiB,1MiB]

On the device's default pool (cuDeviceGetDefaultMemPool), with
cuMemAllocFromPoolAsync and cuMemFreeAsync on the null stream, and the
pool's attributes RESERVED_MEM_CURRENT (what the pool holds of the device)
and USED_MEM_CURRENT (what its live allocations hold), it measures:

  single   the pool's growth for one allocation of 1 B, 4 KiB, 1 MiB,
           2 MiB - 1, 2 MiB + 1, 3 MiB and 33 MiB + 1, each freed and the
           pool trimmed to 0 (cuMemPoolTrimTo) before the next: the growth
           granularity for small and large requests
           (`apparent_granularity`, the largest power of two dividing
           every growth);
  packing  many small allocations live at once (256 x 4 KiB,
           64 x 100 KiB): reserved against used;
  tail     one allocation ending 0.6 MiB into its last 2 MiB page, then
           16 x 64 KiB: do they land in that page's free end (reserved
           does not grow, addresses inside the page) or in new pages;
  edge     with cuMemGetInfo's free F, one allocation of F - x for each x,
           then as many 64 KiB allocations as fit: how many bytes of the
           device the pool hands out in all, against F.

A pool that charges requests to the byte (the fake GPU's) shows reserved
equal to used everywhere; one that maps whole pages shows reserved rounded
up to its page. Prints a table and writes one JSON object
(`"format": "jaxlake-pool-probe"`, default `$OUT/pool_probe.json`). A driver
call that fails is reported with its name and error (exit status 1), and
whatever the probe allocated is freed and the pool trimmed before it exits.
Seconds on a GPU; it loads the given libcuda.so.1 into its own process.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

FORMAT = "jaxlake-pool-probe"
VERSION = 1

KIB, MIB = 1 << 10, 1 << 20
PAGE = 2 * MIB  # the page the tail question is asked about
SINGLE_SIZES = (1, 4 * KIB, MIB, 2 * MIB - 1, 2 * MIB + 1, 3 * MIB,
                33 * MIB + 1)
PACKING = ((256, 4 * KIB), (64, 100 * KIB))
TAIL_BIG = 2 * PAGE + 6 * MIB // 10  # ends 0.6 MiB into its third page
TAIL_SMALL, TAIL_COUNT = 64 * KIB, 16
EDGE_PIECE = 64 * KIB
DEFAULT_EDGE_X = (64 * MIB, 8 * MIB, MIB)

# CUmemPool_attribute (cuda.h)
_RELEASE_THRESHOLD, _RESERVED_CURRENT, _USED_CURRENT = 4, 5, 7
_OUT_OF_MEMORY = 2


class DriverError(RuntimeError):
    """A driver call failed; carries the call's name and its error."""

    def __init__(self, call: str, rc: int, name: str) -> None:
        super().__init__(f"{call} failed with CUDA error {rc} ({name})")
        self.call, self.rc, self.name = call, rc, name


def parse_size(text: str) -> int:
    text = text.strip()
    for unit, factor in (("KiB", KIB), ("MiB", MIB), ("GiB", 1 << 30)):
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * factor)
    return int(text)


def lowest_power_of_two(n: int) -> int:
    """The largest power of two dividing n (> 0)."""
    return n & -n


class Probe:
    """The driver, the device's default pool, and what the probe holds."""

    def __init__(self, libcuda: str, device: int) -> None:
        self.cu = ctypes.CDLL(libcuda)
        for fn in ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
                   "cuCtxSetCurrent", "cuDevicePrimaryCtxRelease_v2",
                   "cuDeviceGetDefaultMemPool", "cuMemAllocFromPoolAsync",
                   "cuMemFreeAsync", "cuStreamSynchronize",
                   "cuMemPoolGetAttribute", "cuMemPoolTrimTo",
                   "cuMemGetInfo_v2", "cuDriverGetVersion",
                   "cuDeviceGetName", "cuGetErrorName"):
            getattr(self.cu, fn).restype = ctypes.c_int
        self.live: List[int] = []
        self.ctx_retained = False
        self.call("cuInit", self.cu.cuInit(0))
        self.dev = ctypes.c_int()
        self.call("cuDeviceGet",
                  self.cu.cuDeviceGet(ctypes.byref(self.dev), device))
        ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", self.cu.cuDevicePrimaryCtxRetain(
            ctypes.byref(ctx), self.dev))
        self.ctx_retained = True
        self.call("cuCtxSetCurrent", self.cu.cuCtxSetCurrent(ctx))
        self.pool = ctypes.c_void_p()
        self.call("cuDeviceGetDefaultMemPool",
                  self.cu.cuDeviceGetDefaultMemPool(ctypes.byref(self.pool),
                                                    self.dev))

    # -- driver calls ------------------------------------------------------

    def error_name(self, rc: int) -> str:
        name = ctypes.c_char_p()
        if self.cu.cuGetErrorName(rc, ctypes.byref(name)) != 0 or \
                not name.value:
            return "unknown"
        return name.value.decode(errors="replace")

    def call(self, what: str, rc: int) -> None:
        if rc != 0:
            raise DriverError(what, rc, self.error_name(rc))

    def alloc(self, size: int, may_fail: bool = False) -> Optional[int]:
        """A pool allocation's address; None where it ran out of memory
        and may_fail."""
        ptr = ctypes.c_uint64()
        rc = self.cu.cuMemAllocFromPoolAsync(
            ctypes.byref(ptr), ctypes.c_size_t(size), self.pool,
            ctypes.c_void_p(0))
        if rc == _OUT_OF_MEMORY and may_fail:
            return None
        self.call(f"cuMemAllocFromPoolAsync({size} bytes)", rc)
        self.live.append(ptr.value)
        return ptr.value

    def free_all(self) -> None:
        """Frees what the probe holds, waits, and trims the pool to 0."""
        while self.live:
            ptr = self.live.pop()
            self.call("cuMemFreeAsync", self.cu.cuMemFreeAsync(
                ctypes.c_uint64(ptr), ctypes.c_void_p(0)))
        self.call("cuStreamSynchronize",
                  self.cu.cuStreamSynchronize(ctypes.c_void_p(0)))
        self.call("cuMemPoolTrimTo",
                  self.cu.cuMemPoolTrimTo(self.pool, ctypes.c_size_t(0)))

    def attribute(self, attr: int, name: str) -> int:
        value = ctypes.c_uint64()
        self.call(f"cuMemPoolGetAttribute({name})",
                  self.cu.cuMemPoolGetAttribute(self.pool, attr,
                                                ctypes.byref(value)))
        return value.value

    def state(self) -> Dict[str, int]:
        """The pool's reserved and used bytes, and the device's free."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.call("cuMemGetInfo", self.cu.cuMemGetInfo_v2(
            ctypes.byref(free), ctypes.byref(total)))
        return {"reserved": self.attribute(_RESERVED_CURRENT,
                                           "RESERVED_MEM_CURRENT"),
                "used": self.attribute(_USED_CURRENT, "USED_MEM_CURRENT"),
                "free": free.value, "total": total.value}

    def close(self) -> None:
        if self.ctx_retained:
            self.cu.cuDevicePrimaryCtxRelease_v2(self.dev)
            self.ctx_retained = False

    def source(self, libcuda: str) -> str:
        version = ctypes.c_int()
        self.cu.cuDriverGetVersion(ctypes.byref(version))
        name = ctypes.create_string_buffer(256)
        self.cu.cuDeviceGetName(name, 256, self.dev)
        return (f"{name.value.decode(errors='replace')}, driver API "
                f"{version.value}, {libcuda}, "
                f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"
                f" UTC, {platform.node()}, benchmarks/gpu/pool_probe.py")


def _delta(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    return {"reserved_growth": after["reserved"] - before["reserved"],
            "used_growth": after["used"] - before["used"],
            "free_drop": before["free"] - after["free"]}


# -- the measurements ----------------------------------------------------------


def single(p: Probe, sizes: Sequence[int]) -> Dict[str, Any]:
    rows = []
    for size in sizes:
        p.free_all()
        before = p.state()
        p.alloc(size)
        row = {"bytes": size, "reserved_before": before["reserved"],
               **_delta(before, p.state())}
        row["overhead"] = row["reserved_growth"] - size
        rows.append(row)
    p.free_all()
    growths = [r["reserved_growth"] for r in rows if r["reserved_growth"] > 0]
    granularity = min((lowest_power_of_two(g) for g in growths), default=0)
    return {"rows": rows, "apparent_granularity": granularity}


def packing(p: Probe, groups: Sequence[Tuple[int, int]]) -> List[Dict[str, Any]]:
    rows = []
    for count, size in groups:
        p.free_all()
        before = p.state()
        for _ in range(count):
            p.alloc(size)
        row: Dict[str, Any] = {"count": count, "bytes": size,
                               "requested": count * size,
                               **_delta(before, p.state())}
        row["reserved_over_requested"] = round(
            row["reserved_growth"] / row["requested"], 4)
        row["lost_per_allocation"] = round(
            (row["reserved_growth"] - row["requested"]) / count, 1)
        rows.append(row)
    p.free_all()
    return rows


def tail(p: Probe, big: int, small: int, count: int) -> Dict[str, Any]:
    p.free_all()
    before = p.state()
    base = p.alloc(big)
    assert base is not None
    after_big = p.state()
    # Pages counted from the allocation's start (`base_page_offset` says
    # whether that start is itself on a 2 MiB boundary).
    end = base + big
    page_end = base + (big + PAGE - 1) // PAGE * PAGE
    smalls = [p.alloc(small) for _ in range(count)]
    after = p.state()
    inside = sum(1 for a in smalls if a is not None and
                 end <= a and a + small <= page_end)
    growth_big = after_big["reserved"] - before["reserved"]
    growth_small = after["reserved"] - after_big["reserved"]
    result = {"big": big, "small": small, "count": count,
              "big_reserved_growth": growth_big,
              "big_used_growth": after_big["used"] - before["used"],
              "page_free_end": page_end - end,
              "base_page_offset": base % PAGE,
              "smalls_reserved_growth": growth_small,
              "smalls_used_growth": after["used"] - after_big["used"],
              "smalls_inside_page_end": inside,
              "small_offsets_from_end": [a - end for a in smalls
                                         if a is not None],
              # The small allocations cost the pool nothing: it had the
              # room (the big one's page end or the rest of its growth).
              "smalls_fit_in_reserved": growth_small == 0}
    p.free_all()
    return result


def edge(p: Probe, xs: Sequence[int], piece: int) -> List[Dict[str, Any]]:
    rows = []
    for x in xs:
        p.free_all()
        start = p.state()
        free = start["free"]
        row: Dict[str, Any] = {"x": x, "free": free,
                               "reserved_before": start["reserved"],
                               "big": max(0, free - x)}
        if free <= x or p.alloc(free - x, may_fail=True) is None:
            # The request of F - x itself ran out of memory (a finding of
            # its own: the pool cannot hand out that much in one piece), or
            # x leaves nothing to request.
            row.update(big_allocated=False, pieces=0, piece=piece,
                       handed_out=None, shortfall=None)
            rows.append(row)
            continue
        limit = x // piece + 4096  # a backstop, never reached on a sane pool
        pieces = 0
        while pieces < limit and p.alloc(piece, may_fail=True) is not None:
            pieces += 1
        full = p.state()
        handed = row["big"] + pieces * piece
        row.update(big_allocated=True, pieces=pieces, piece=piece,
                   backstop_reached=pieces == limit,
                   handed_out=handed, shortfall=free - handed,
                   reserved_full=full["reserved"], used_full=full["used"],
                   free_full=full["free"])
        rows.append(row)
    p.free_all()
    return rows


def measure(libcuda: str, device: int = 0,
            edge_x: Sequence[int] = DEFAULT_EDGE_X) -> Dict[str, Any]:
    """Runs the probe; returns the document. A driver error is recorded in
    `error` (the parts measured before it are kept)."""
    doc: Dict[str, Any] = {"format": FORMAT, "version": VERSION,
                           "source": libcuda, "error": None}
    try:
        p = Probe(libcuda, device)
    except OSError as error:
        doc["error"] = {"call": "dlopen", "message": str(error)}
        return doc
    except DriverError as error:
        doc["error"] = {"call": error.call, "rc": error.rc,
                        "name": error.name, "message": str(error)}
        return doc
    try:
        doc["source"] = p.source(libcuda)
        doc["release_threshold"] = p.attribute(_RELEASE_THRESHOLD,
                                               "RELEASE_THRESHOLD")
        doc["single"] = single(p, SINGLE_SIZES)
        doc["packing"] = packing(p, PACKING)
        doc["tail"] = tail(p, TAIL_BIG, TAIL_SMALL, TAIL_COUNT)
        doc["edge"] = edge(p, edge_x, EDGE_PIECE)
    except DriverError as error:
        doc["error"] = {"call": error.call, "rc": error.rc,
                        "name": error.name, "message": str(error)}
    finally:
        try:
            p.free_all()
            doc["after_cleanup"] = p.state()
        except DriverError as error:
            doc["cleanup_error"] = str(error)
        p.close()
    return doc


def table(doc: Dict[str, Any]) -> str:
    """The document as text."""
    def mib(n: int) -> str:
        return f"{n / MIB:.4f} MiB"
    lines = [f"pool probe: {doc['source']}"]
    if "single" in doc:
        lines.append(f"{'request':>16} {'reserved +':>16} {'used +':>16} "
                     f"{'free -':>16}")
        for r in doc["single"]["rows"]:
            lines.append(f"{r['bytes']:>16} {r['reserved_growth']:>16} "
                         f"{r['used_growth']:>16} {r['free_drop']:>16}")
        lines.append("apparent granularity: "
                     f"{doc['single']['apparent_granularity']} bytes")
    for r in doc.get("packing", []):
        lines.append(f"packing {r['count']} x {r['bytes']}: reserved "
                     f"{r['reserved_growth']} for {r['requested']} "
                     f"({r['reserved_over_requested']}x)")
    if "tail" in doc:
        t = doc["tail"]
        lines.append(f"tail: {t['big']} bytes reserved "
                     f"{t['big_reserved_growth']}; then {t['count']} x "
                     f"{t['small']}: reserved +{t['smalls_reserved_growth']}"
                     f", {t['smalls_inside_page_end']} inside the last "
                     f"page's free {mib(t['page_free_end'])}")
    for r in doc.get("edge", []):
        if not r["big_allocated"]:
            lines.append(f"edge x={mib(r['x'])}: free {mib(r['free'])}, "
                         "no single request of free - x (out of memory, or x >= "
                         "free)")
            continue
        lines.append(f"edge x={mib(r['x'])}: free {mib(r['free'])}, handed "
                     f"out {mib(r['handed_out'])} ({r['pieces']} pieces), "
                     f"short by {r['shortfall']} bytes")
    if "after_cleanup" in doc:
        lines.append("after cleanup: reserved "
                     f"{doc['after_cleanup']['reserved']}, used "
                     f"{doc['after_cleanup']['used']}")
    if doc.get("error"):
        lines.append(f"error: {doc['error']['message']}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libcuda", required=True,
                        help="the driver library to probe (absolute path)")
    parser.add_argument("--out", default=os.path.join(
        os.environ.get("OUT", "."), "pool_probe.json"))
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--edge-x", default="64MiB,8MiB,1MiB",
                        help="comma-separated sizes x: the edge allocates "
                             "free - x, then 64 KiB pieces")
    args = parser.parse_args(argv)
    try:
        xs = [parse_size(s) for s in args.edge_x.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--edge-x {args.edge_x!r}: expected sizes such as "
                     "64MiB,1MiB")
    if any(x < 0 for x in xs):
        parser.error(f"--edge-x {args.edge_x!r}: sizes must be >= 0")
    doc = measure(args.libcuda, args.device, xs)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, args.out)
    print(table(doc))
    if doc.get("error") or doc.get("cleanup_error"):
        message = (doc["error"] or {}).get("message") or doc["cleanup_error"]
        print(f"pool_probe: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
