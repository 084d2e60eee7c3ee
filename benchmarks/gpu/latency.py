"""Latency of the CUDA driver calls the lake makes, by size.

    python benchmarks/gpu/latency.py --libcuda PATH --out latency.json \
        [--device 0] [--sizes 2MiB,8MiB,...] [--repeats 10]

For each size (whole granules), `repeats` rounds of: reserve a virtual
range (cuMemAddressReserve), create a physical handle (cuMemCreate), map it
(cuMemMap), grant access (cuMemSetAccess), unmap (cuMemUnmap), release
(cuMemRelease) and free the range (cuMemAddressFree), each call timed on
its own with time.perf_counter_ns (ctypes adds about a microsecond, small
beside calls of tens of microseconds). Writes the median of each call kind
at each size in the driver-latency format that `jaxlake bench --latency
FILE` reads (benchmarks/gpu/README.md, "Driver latency JSON"):

    {"format": "jaxlake-driver-latency", "version": 1, "source": "...",
     "calls": {"reserve": [{"bytes": 2097152, "us": 3.1}, ...], ...}}

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
DEFAULT_SIZES_IN_GRANULES = (1, 4, 16, 64, 256)  # 2 MiB .. 512 MiB

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
            sizes: Sequence[int] = (), repeats: int = 10
            ) -> Dict[str, object]:
    """Times the calls; returns the latency document (see the module)."""
    cu = ctypes.CDLL(libcuda)
    for fn in ("cuMemAddressReserve", "cuMemCreate", "cuMemMap",
               "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
               "cuMemAddressFree", "cuInit", "cuDeviceGet",
               "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
               "cuMemGetAllocationGranularity", "cuDriverGetVersion",
               "cuDeviceGetName", "cuDevicePrimaryCtxRelease_v2"):
        getattr(cu, fn).restype = ctypes.c_int
    _check("cuInit", cu.cuInit(0))
    dev = ctypes.c_int()
    _check("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), device))
    ctx = ctypes.c_void_p()
    _check("cuDevicePrimaryCtxRetain",
           cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    _check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
    prop = _Prop()
    prop.type = _PINNED
    prop.location = _Location(_DEVICE, device)
    access = _Access(_Location(_DEVICE, device), _READWRITE)
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

    times: Dict[str, Dict[int, List[float]]] = {k: {} for k in KINDS}

    def timed(kind: str, size: int, call: Callable[[], int],
              what: str) -> None:
        start = time.perf_counter_ns()
        rc = call()
        elapsed = time.perf_counter_ns() - start
        _check(what, rc)
        times[kind].setdefault(size, []).append(elapsed / 1000.0)

    for size in sizes:
        for _ in range(repeats):
            va = ctypes.c_uint64()
            handle = ctypes.c_uint64()
            n = ctypes.c_size_t(size)
            timed("reserve", size, lambda: cu.cuMemAddressReserve(
                ctypes.byref(va), n, ctypes.c_size_t(0), ctypes.c_uint64(0),
                ctypes.c_ulonglong(0)), "cuMemAddressReserve")
            try:
                timed("create", size, lambda: cu.cuMemCreate(
                    ctypes.byref(handle), n, ctypes.byref(prop),
                    ctypes.c_ulonglong(0)), "cuMemCreate")
                try:
                    timed("map", size, lambda: cu.cuMemMap(
                        va, n, ctypes.c_size_t(0), handle,
                        ctypes.c_ulonglong(0)), "cuMemMap")
                    try:
                        timed("set_access", size, lambda: cu.cuMemSetAccess(
                            va, n, ctypes.byref(access), ctypes.c_size_t(1)),
                            "cuMemSetAccess")
                    finally:
                        timed("unmap", size, lambda: cu.cuMemUnmap(va, n),
                              "cuMemUnmap")
                finally:
                    timed("release", size, lambda: cu.cuMemRelease(handle),
                          "cuMemRelease")
            finally:
                timed("address_free", size,
                      lambda: cu.cuMemAddressFree(va, n), "cuMemAddressFree")
    cu.cuDevicePrimaryCtxRelease_v2(dev)
    calls = {kind: [{"bytes": size, "us": round(statistics.median(v), 3)}
                    for size, v in sorted(times[kind].items())]
             for kind in KINDS}
    source = (f"{name.value.decode(errors='replace')}, driver API "
              f"{version.value}, {libcuda}, "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} "
              f"UTC, {platform.node()}, median of {repeats} calls per size, "
              "benchmarks/gpu/latency.py")
    return {"format": FORMAT, "version": VERSION, "source": source,
            "calls": calls}


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


def dumps(doc: Dict[str, object]) -> str:
    """The document as JSON text, one line per call kind."""
    calls = doc["calls"]
    assert isinstance(calls, dict)
    head = {k: v for k, v in doc.items() if k != "calls"}
    lines = [json.dumps(head)[:-1] + ', "calls": {']
    kinds = list(calls)
    for i, kind in enumerate(kinds):
        comma = "," if i < len(kinds) - 1 else ""
        lines.append(f"  {json.dumps(kind)}: {json.dumps(calls[kind])}{comma}")
    lines.append("}}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libcuda", required=True,
                        help="the driver library to time (absolute path)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--sizes", default="",
                        help="comma-separated sizes (e.g. 2MiB,64MiB); "
                             "default: 1, 4, 16, 64 and 256 granules")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    try:
        doc = measure(args.libcuda, args.device, sizes, args.repeats)
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
