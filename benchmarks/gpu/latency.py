"""Latency of the CUDA driver calls the lake makes, by size.

    python benchmarks/gpu/latency.py --libcuda PATH --out latency.json \
        [--device 0] [--sizes 2MiB,1GiB,...] [--repeats 10] [--fill 0.9]

For each size (whole granules), `repeats` rounds of: reserve a virtual
range (cuMemAddressReserve), create a physical handle (cuMemCreate), map it
(cuMemMap), grant access to this device (cuMemSetAccess), grant access to
up to 8 devices at once where the machine has more than one, unmap
(cuMemUnmap), release (cuMemRelease) and free the range
(cuMemAddressFree), each call timed on its own with time.perf_counter_ns
(ctypes adds about a microsecond, small beside calls of tens of
microseconds). The very first cuMemSetAccess of the process is timed
apart (it is slower: PyTorch issue 122057). The rounds run twice: on a
mostly free device, then with `fill` of its free memory held by other
handles (a mostly used device; --fill 0 skips it).

Writes the medians in the driver-latency format that `jaxlake bench
--driver-model FILE` reads (benchmarks/gpu/README.md, "Driver latency
JSON"): `calls` (the mostly free device) and `terms` feed the model
directly; `measured` keeps the rest (the mostly used device's calls,
the access grants by device count, the raw first grant):

    {"format": "jaxlake-driver-latency", "version": 1, "source": "...",
     "calls": {"reserve": [{"bytes": 2097152, "us": 3.1}, ...], ...},
     "terms": {"first_set_access_us": 470.0, "peer_us": 20.0},
     "measured": {"devices": 8, "mostly_used": {...}, ...}}

It loads the given libcuda.so.1 into its own process, so run it as a
program of its own (the GPU check does); over the test suite's fake driver
it runs unchanged (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Sequence

FORMAT = "jaxlake-driver-latency"
VERSION = 1
#: The call kinds measured, named as in cc/vmm/driver.h's call list.
KINDS = ("reserve", "create", "map", "set_access", "unmap", "release",
         "address_free")
DEFAULT_SIZES_IN_GRANULES = (1, 16, 512)  # 2 MiB, 32 MiB, 1 GiB
#: Most devices one access grant names (XLA grants every peer device).
MAX_PEERS = 8
#: The model's scalar terms a document may set (cc/vmm/latency.h).
TERMS = ("devices", "peer_us", "first_set_access_us")

_MIB = 1 << 20


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int),
                ("requestedHandleTypes", ctypes.c_int),
                ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


assert ctypes.sizeof(_Prop) == 32 and ctypes.sizeof(_Access) == 12

_PINNED, _DEVICE, _READWRITE = 1, 1, 3


class DriverError(RuntimeError):
    """A driver call failed."""


def _check(name: str, rc: int) -> None:
    if rc != 0:
        raise DriverError(f"{name} failed with CUDA error {rc}")


def parse_size(text: str) -> int:
    text = text.strip()
    units = {"KiB": 1 << 10, "MiB": _MIB, "GiB": 1 << 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * factor)
    return int(text)


def measure(libcuda: str, device: int = 0,
            sizes: Sequence[int] = (), repeats: int = 10,
            fill: float = 0.9) -> Dict[str, object]:
    """Times the calls; returns the latency document (see the module)."""
    cu = ctypes.CDLL(libcuda)
    for fn in ("cuMemAddressReserve", "cuMemCreate", "cuMemMap",
               "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
               "cuMemAddressFree", "cuInit", "cuDeviceGet",
               "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
               "cuMemGetAllocationGranularity", "cuDriverGetVersion",
               "cuDeviceGetName", "cuDevicePrimaryCtxRelease_v2",
               "cuDeviceGetCount", "cuMemGetInfo_v2"):
        getattr(cu, fn).restype = ctypes.c_int
    _check("cuInit", cu.cuInit(0))
    dev = ctypes.c_int()
    _check("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), device))
    ctx = ctypes.c_void_p()
    _check("cuDevicePrimaryCtxRetain",
           cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    _check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
    count = ctypes.c_int()
    _check("cuDeviceGetCount", cu.cuDeviceGetCount(ctypes.byref(count)))
    peers = min(MAX_PEERS, count.value)
    prop = _Prop()
    prop.type = _PINNED
    prop.location = _Location(_DEVICE, device)
    access = _Access(_Location(_DEVICE, device), _READWRITE)
    # This device first, then the others in order, up to MAX_PEERS.
    others = [d for d in range(count.value) if d != device][:peers - 1]
    many = (_Access * peers)(access, *[
        _Access(_Location(_DEVICE, d), _READWRITE) for d in others])
    gran = ctypes.c_size_t()
    _check("cuMemGetAllocationGranularity", cu.cuMemGetAllocationGranularity(
        ctypes.byref(gran), ctypes.byref(prop), 0))
    granule = gran.value
    if not sizes:
        sizes = [granule * n for n in DEFAULT_SIZES_IN_GRANULES]
    sizes = sorted({max(granule, (s + granule - 1) // granule * granule)
                    for s in sizes})
    version = ctypes.c_int()
    cu.cuDriverGetVersion(ctypes.byref(version))
    name = ctypes.create_string_buffer(256)
    cu.cuDeviceGetName(name, 256, dev)
    first: List[float] = []  # the process's first cuMemSetAccess

    def rounds(tag: str) -> Dict[str, Dict[int, List[float]]]:
        times: Dict[str, Dict[int, List[float]]] = {
            k: {} for k in KINDS + ("set_access_peers",)}

        def timed(kind: str, size: int, call: Callable[[], int],
                  what: str) -> None:
            start = time.perf_counter_ns()
            rc = call()
            elapsed = time.perf_counter_ns() - start
            _check(f"{what} ({tag}, {size} bytes)", rc)
            if kind == "set_access" and not first:
                first.append(elapsed / 1000.0)
                return
            times[kind].setdefault(size, []).append(elapsed / 1000.0)

        for size in sizes:
            for _ in range(repeats):
                va = ctypes.c_uint64()
                handle = ctypes.c_uint64()
                n = ctypes.c_size_t(size)
                timed("reserve", size, lambda: cu.cuMemAddressReserve(
                    ctypes.byref(va), n, ctypes.c_size_t(0),
                    ctypes.c_uint64(0), ctypes.c_ulonglong(0)),
                    "cuMemAddressReserve")
                try:
                    timed("create", size, lambda: cu.cuMemCreate(
                        ctypes.byref(handle), n, ctypes.byref(prop),
                        ctypes.c_ulonglong(0)), "cuMemCreate")
                    try:
                        timed("map", size, lambda: cu.cuMemMap(
                            va, n, ctypes.c_size_t(0), handle,
                            ctypes.c_ulonglong(0)), "cuMemMap")
                        try:
                            timed("set_access", size,
                                  lambda: cu.cuMemSetAccess(
                                      va, n, ctypes.byref(access),
                                      ctypes.c_size_t(1)), "cuMemSetAccess")
                            if peers > 1:
                                timed("set_access_peers", size,
                                      lambda: cu.cuMemSetAccess(
                                          va, n, many,
                                          ctypes.c_size_t(peers)),
                                      f"cuMemSetAccess ({peers} devices)")
                        finally:
                            timed("unmap", size,
                                  lambda: cu.cuMemUnmap(va, n), "cuMemUnmap")
                    finally:
                        timed("release", size,
                              lambda: cu.cuMemRelease(handle), "cuMemRelease")
                finally:
                    timed("address_free", size,
                          lambda: cu.cuMemAddressFree(va, n),
                          "cuMemAddressFree")
        return times

    def medians(times: Dict[str, Dict[int, List[float]]],
                kinds: Sequence[str]) -> Dict[str, List[Dict[str, float]]]:
        return {kind: [{"bytes": size, "us": round(statistics.median(v), 3)}
                       for size, v in sorted(times[kind].items())]
                for kind in kinds if times[kind]}

    free_times = rounds("mostly free")
    # A mostly used device: other handles hold `fill` of the free memory,
    # leaving room for the largest size measured twice over.
    held: List[ctypes.c_uint64] = []
    used_fraction = None
    if fill > 0:
        free_b, total_b = ctypes.c_size_t(), ctypes.c_size_t()
        _check("cuMemGetInfo", cu.cuMemGetInfo_v2(ctypes.byref(free_b),
                                                  ctypes.byref(total_b)))
        room = free_b.value - 2 * max(sizes) - 64 * _MIB
        target = min(int(free_b.value * fill), room)
        step = max(granule, (1 << 30) // granule * granule)
        try:
            while target >= granule:
                chunk = min(step, target // granule * granule)
                h = ctypes.c_uint64()
                if cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(chunk),
                                  ctypes.byref(prop),
                                  ctypes.c_ulonglong(0)) != 0:
                    break
                held.append(h)
                target -= chunk
            _check("cuMemGetInfo", cu.cuMemGetInfo_v2(
                ctypes.byref(free_b), ctypes.byref(total_b)))
            used_fraction = round(1 - free_b.value / total_b.value, 3)
            used_times = rounds("mostly used")
        finally:
            for h in held:
                cu.cuMemRelease(h)
    cu.cuDevicePrimaryCtxRelease_v2(dev)
    calls = medians(free_times, KINDS)
    terms: Dict[str, float] = {}
    measured: Dict[str, object] = {"devices": count.value,
                                   "first_set_access_us": round(first[0], 3)}
    # The first grant's extra time over a later grant of the same size.
    terms["first_set_access_us"] = round(
        max(0.0, first[0] - calls["set_access"][0]["us"]), 3)
    if peers > 1:
        grants = medians(free_times, ("set_access_peers",))
        measured["set_access_devices"] = peers
        measured["set_access_peers"] = grants["set_access_peers"]
        extra = [(p["us"] - one["us"]) / (peers - 1) for p, one in
                 zip(grants["set_access_peers"], calls["set_access"])]
        terms["peer_us"] = round(max(0.0, statistics.median(extra)), 3)
    if used_fraction is not None:
        measured["mostly_used"] = {"used_fraction": used_fraction,
                                   "calls": medians(used_times, KINDS)}
    source = (f"{name.value.decode(errors='replace')}, driver API "
              f"{version.value}, {libcuda}, "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} "
              f"UTC, {platform.node()}, median of {repeats} calls per size "
              "on a mostly free device, benchmarks/gpu/latency.py")
    return {"format": FORMAT, "version": VERSION, "source": source,
            "calls": calls, "terms": terms, "measured": measured}


def validate(doc: object) -> None:
    """Raises ValueError naming what is wrong with a latency document."""
    if not isinstance(doc, dict):
        raise ValueError("a latency document is a JSON object")
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"format/version must be {FORMAT!r}/{VERSION}")
    if not isinstance(doc.get("source"), str):
        raise ValueError("source must be a string")
    calls = doc.get("calls")
    if not isinstance(calls, dict):
        raise ValueError("calls must be an object")
    for kind, points in calls.items():
        if kind not in KINDS:
            raise ValueError(f"unknown call kind {kind!r}")
        if not isinstance(points, list) or not points:
            raise ValueError(f"{kind}: a non-empty list of points")
        sizes = [p.get("bytes") for p in points]
        if any(not isinstance(b, int) or b <= 0 for b in sizes) or \
                sizes != sorted(sizes):
            raise ValueError(f"{kind}: bytes must be > 0 and sorted")
        if any(not isinstance(p.get("us"), (int, float)) or p["us"] < 0
               for p in points):
            raise ValueError(f"{kind}: us must be a number >= 0")
    for kind in ("create", "map", "set_access", "unmap", "release"):
        if kind not in calls:
            raise ValueError(f"calls lacks {kind!r}")
    terms = doc.get("terms", {})
    if not isinstance(terms, dict):
        raise ValueError("terms must be an object")
    for name, value in terms.items():
        if name not in TERMS:
            raise ValueError(f"unknown term {name!r}; expected one of "
                             + ", ".join(TERMS))
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or value < 0:
            raise ValueError(f"terms.{name} must be a number >= 0")


def dumps(doc: Dict[str, object]) -> str:
    """The document as JSON text, one line per call kind."""
    calls = doc["calls"]
    assert isinstance(calls, dict)
    head = {k: v for k, v in doc.items()
            if k not in ("calls", "terms", "measured")}
    lines = [json.dumps(head)[:-1] + ', "calls": {']
    kinds = list(calls)
    for i, kind in enumerate(kinds):
        comma = "," if i < len(kinds) - 1 else ""
        lines.append(f"  {json.dumps(kind)}: {json.dumps(calls[kind])}{comma}")
    tail = {k: doc[k] for k in ("terms", "measured") if k in doc}
    lines.append("}" + "".join(f",\n{json.dumps(k)}: {json.dumps(v)}"
                               for k, v in tail.items()) + "}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libcuda", required=True,
                        help="the driver library to time (absolute path)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--sizes", default="",
                        help="comma-separated sizes (e.g. 2MiB,1GiB); "
                             "default: 1, 16 and 512 granules (2 MiB, "
                             "32 MiB and 1 GiB)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--fill", type=float, default=0.9,
                        help="share of the free memory other handles hold "
                             "for the mostly-used pass (0 skips it; "
                             "default 0.9)")
    args = parser.parse_args(argv)
    if not 0 <= args.fill < 1:
        parser.error(f"--fill {args.fill}: expected a share in [0, 1)")
    if args.repeats < 2:
        parser.error(f"--repeats {args.repeats}: expected 2 or more (the "
                     "first access grant is timed apart)")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    try:
        doc = measure(args.libcuda, args.device, sizes, args.repeats,
                      args.fill)
    except (OSError, DriverError) as error:
        print(f"latency: {error}", file=sys.stderr)
        return 1
    validate(doc)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(dumps(doc))
    os.replace(tmp, args.out)
    print(json.dumps(doc["calls"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
