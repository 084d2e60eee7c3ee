"""The fake GPU's memory (cc/fakegpu/state.cc): bytes stay exact while host
memory is committed only where meaningful bytes were written.

Each case drives libjaxlake_fakegpu.so's driver API through ctypes in a
fresh interpreter (the fake's state and options are per process) and reads
bytes back through the driver's copies. Page residency is read with
mincore(): for a memfd mapping it tells whether the file holds the page,
whichever address it was written through.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import textwrap
from typing import Dict, Optional

import pytest

from fakegpu_util import (DRIVER_PRELUDE, NEEDS_FAKE_GPU, held_stream,
                          library_run, result)


pytestmark = NEEDS_FAKE_GPU


def _swap() -> bool:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("SwapTotal:"):
                return int(line.split()[1]) != 0
    return False


# Helpers of every case: the driver through ctypes, a checked call, the
# device's bytes read back, and the resident pages of a range.
PRELUDE = DRIVER_PRELUDE + """
libc = ctypes.CDLL(None, use_errno=True)
PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 1 << 20

class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int),
                ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]

class Access(ctypes.Structure):
    _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                ("flags", ctypes.c_int)]

def reserve(size):
    va = U64()
    ck(lib.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size),
                               ctypes.c_size_t(0), U64(0), U64(0)), "reserve")
    return va.value

def create(size):
    prop = Prop(type=1, loc_type=1, loc_id=0)
    h = U64()
    ck(lib.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size),
                       ctypes.byref(prop), U64(0)), "create")
    return h.value

def map_at(va, size, handle, access=True):
    ck(lib.cuMemMap(U64(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                    U64(handle), U64(0)), "map")
    if access:
        desc = Access(loc_type=1, loc_id=0, flags=3)
        ck(lib.cuMemSetAccess(U64(va), ctypes.c_size_t(size),
                              ctypes.byref(desc), ctypes.c_size_t(1)),
           "access")

def alloc(size):
    p = U64()
    ck(lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)), "alloc")
    return p.value

def put(dst, data):
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    ck(lib.cuMemcpyHtoD_v2(U64(dst), buf, ctypes.c_size_t(len(data))), "h2d")

def get(src, n):
    buf = ctypes.create_string_buffer(n)
    ck(lib.cuMemcpyDtoH_v2(buf, U64(src), ctypes.c_size_t(n)), "d2h")
    return buf.raw

def memset8(dst, value, n):
    ck(lib.cuMemsetD8_v2(U64(dst), ctypes.c_ubyte(value),
                         ctypes.c_size_t(n)), "memset8")

def memset32(dst, value, count):
    ck(lib.cuMemsetD32_v2(U64(dst), ctypes.c_uint(value),
                          ctypes.c_size_t(count)), "memset32")

def d2d(dst, src, n):
    ck(lib.cuMemcpyDtoD_v2(U64(dst), U64(src), ctypes.c_size_t(n)), "d2d")

def resident(addr, n):
    first = addr & ~(PAGE - 1)
    pages = (addr + n - first + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    r = libc.mincore(ctypes.c_void_p(first), ctypes.c_size_t(pages * PAGE),
                     vec)
    assert r == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec)

def pattern(n, seed):
    return bytes((i * 7 + seed) % 251 + 1 for i in range(n))

def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


def run_case(script: str, env: Optional[Dict[str, str]] = None
             ) -> "subprocess.CompletedProcess[str]":
    return library_run(script, prelude=PRELUDE, env=env)


def test_memset_zero_drops_whole_pages_seen_through_both_mappings(
        tmp_path: pathlib.Path) -> None:
    stats = tmp_path / "stats.json"
    out = result(run_case("""
    G = 2 * MiB
    va = reserve(4 * G)
    h = create(G)
    map_at(va, G, h)                 # the primary mapping
    map_at(va + 3 * G, G, h)         # the same pages at a second address
    data = pattern(G, 3)
    put(va, data)
    before = resident(va, G)
    head, tail = 100, 300            # the memset starts and ends mid-page
    memset8(va + head, 0, G - head - tail)
    want = data[:head] + bytes(G - head - tail) + data[G - tail:]
    same_primary = get(va, G) == want
    same_stitched = get(va + 3 * G, G) == want
    after = resident(va, G)
    after_stitched = resident(va + 3 * G, G)
    # A nonzero memset is real: every byte is written and kept.
    memset32(va + PAGE, 0x01020304, 1000)
    got = get(va + PAGE, 4000)
    nonzero_ok = got == bytes([4, 3, 2, 1]) * 1000
    nonzero_resident = resident(va + PAGE, 4000)
    # A 32-bit zero memset over the written range drops it as well.
    memset32(va + PAGE, 0, 1000)
    zero32_ok = get(va + PAGE, 4000) == bytes(4000)
    report(before=before, after=after, after_stitched=after_stitched,
           same_primary=same_primary, same_stitched=same_stitched,
           nonzero_ok=nonzero_ok, nonzero_resident=nonzero_resident,
           zero32_ok=zero32_ok, pages=G // PAGE)
    """, env={"JAXLAKE_FAKEGPU_STATS": str(stats)}))
    assert out["before"] == out["pages"]
    assert out["same_primary"] and out["same_stitched"]
    # Only the two partial pages at the ends still hold memory, for both
    # addresses (they are one memfd's pages).
    assert out["after"] == 2 and out["after_stitched"] == 2
    assert out["nonzero_ok"] and out["nonzero_resident"] == 1
    assert out["zero32_ok"]
    counts = json.loads(stats.read_text())["bytes"]
    page = os.sysconf("SC_PAGE_SIZE")
    g = 2 << 20
    # The first memset drops all but its two partial pages; the zero
    # memset32 of 4000 bytes inside one page has no whole page to drop.
    assert counts["memset_dropped"] == g - 2 * page
    assert counts["memset_written"] == (2 * page - 400) + 4000 + 4000


def test_stats_count_the_page_locked_host_bytes_held(
        tmp_path: pathlib.Path) -> None:
    """The stats file's `host` gives the bytes and regions of page-locked
    host memory (cuMemHostAlloc, cuMemAllocHost) held at exit and at their
    peak: what XLA's host allocator takes for pinned_host arrays."""
    stats = tmp_path / "stats.json"
    result(run_case("""
    def host_alloc(size):
        p = ctypes.c_void_p()
        ck(lib.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), 0),
           "host alloc")
        return p
    a = host_alloc(3 * MiB)
    b = host_alloc(5000)
    c = ctypes.c_void_p()
    ck(lib.cuMemAllocHost_v2(ctypes.byref(c), ctypes.c_size_t(MiB)), "host")
    ck(lib.cuMemFreeHost(a), "free a")
    ck(lib.cuMemFreeHost(c), "free c")
    host_alloc(2 * MiB)
    # A pointer the driver did not allocate is refused and counts nothing.
    assert lib.cuMemFreeHost(ctypes.c_void_p(PAGE)) != 0
    report()
    """, env={"JAXLAKE_FAKEGPU_STATS": str(stats)}))
    host = json.loads(stats.read_text())["host"]
    mib = 1 << 20
    assert host == {"bytes": 5000 + 2 * mib, "bytes_peak": 4 * mib + 5000,
                    "regions": 2, "regions_peak": 3}, host


def test_copy_from_never_written_memory_writes_no_page() -> None:
    out = result(run_case("""
    G = 2 * MiB
    va = reserve(4 * G)
    src, dst = va, va + G
    map_at(src, G, create(G))
    map_at(dst, G, create(G))
    put(dst, pattern(G, 5))
    # Half a page and more of data at the source's start, then holes; the
    # copy starts and ends mid-page on both sides, at different offsets.
    put(src, pattern(PAGE + 2048, 9))
    s_off, d_off, n = 1000, 3000, G - 8192
    d2d(dst + d_off, src + s_off, n)
    src_pages = resident(src, G)
    whole = get(dst, G)
    want = (pattern(G, 5)[:d_off] + pattern(PAGE + 2048, 9)[s_off:]
            + bytes(n - (PAGE + 2048 - s_off))
            + pattern(G, 5)[d_off + n:])
    # A never-written buffer read back to the host: zeros, and the source
    # gains no page.
    fresh = va + 2 * G
    map_at(fresh, G, create(G))
    zeros_back = get(fresh, G) == bytes(G)
    # Anonymous (cuMemAlloc) memory: the same rule.
    a, b = alloc(G), alloc(G)
    put(b, pattern(G, 7))
    d2d(b, a, G)
    anon_ok = get(b, G) == bytes(G)
    report(same=whole == want, src_pages=src_pages,
           dst_pages=resident(dst, G), fresh_pages=resident(fresh, G),
           zeros_back=zeros_back, anon_pages=resident(b, G),
           anon_src_pages=resident(a, G), anon_ok=anon_ok,
           pages=G // PAGE)
    """))
    assert out["same"] and out["zeros_back"] and out["anon_ok"]
    if _swap():
        pytest.skip("this machine has swap: the fake then copies every byte "
                    "(a swapped-out page is not resident either), so the "
                    "pages a copy leaves are not the hole rule's")
    # The source holds only what put() wrote: nothing was read into it.
    assert out["src_pages"] == 2
    # The destination keeps the pages the copy's data and its partial ends
    # touch; the whole pages the source's holes cover are dropped.
    page = os.sysconf("SC_PAGE_SIZE")
    g, s_off, d_off = 2 << 20, 1000, 3000
    n = g - 8192
    # The source's data pages are its first two (the second partly
    # written, but resident whole): the copy's holes start after them.
    holes_from = d_off + 2 * page - s_off
    dropped = ((d_off + n) // page
               - (holes_from + page - 1) // page)
    assert dropped > 0
    assert out["dst_pages"] == out["pages"] - dropped, out
    assert out["fresh_pages"] == 0
    assert out["anon_pages"] == 0 and out["anon_src_pages"] == 0


def test_zeroing_inaccessible_memory_still_faults() -> None:
    # Pages mapped without access fault on the device; the fake must not
    # drop them silently instead.
    proc = run_case("""
    G = 2 * MiB
    va = reserve(G)
    map_at(va, G, create(G), access=False)
    print("ZEROING", flush=True)
    memset8(va, 0, G)
    report(survived=True)
    """)
    assert "ZEROING" in proc.stdout, proc.stderr[-2000:]
    assert proc.returncode == -11, (proc.returncode, proc.stdout)


def test_address_queries_report_the_mapping_not_the_reservation() -> None:
    # The driver answers range queries on VMM memory with the one mapping
    # an address lies in: a buffer mapped from two handles is two ranges
    # (the behaviour behind torchcomms#3078). An address of the reservation
    # that no mapping covers is no allocation.
    out = result(run_case("""
    G = 2 * MiB
    va = reserve(4 * G)
    map_at(va, G, create(G))
    map_at(va + G, 2 * G, create(2 * G))
    def address_range(p):
        base, size = U64(), ctypes.c_size_t()
        r = lib.cuMemGetAddressRange_v2(ctypes.byref(base),
                                        ctypes.byref(size), U64(p))
        return [r, base.value, size.value]
    def attributes(p):
        start, size = U64(), ctypes.c_size_t()
        r1 = lib.cuPointerGetAttribute(ctypes.byref(start), 11, U64(p))
        r2 = lib.cuPointerGetAttribute(ctypes.byref(size), 12, U64(p))
        attrs = (ctypes.c_int * 2)(11, 12)
        s2, n2 = U64(), ctypes.c_size_t()
        data = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(s2),
                                                 ctypes.c_void_p),
                                     ctypes.cast(ctypes.byref(n2),
                                                 ctypes.c_void_p))
        r3 = lib.cuPointerGetAttributes(2, attrs, data, U64(p))
        return [r1, r2, r3, start.value, size.value, s2.value, n2.value]
    report(va=va, first=address_range(va + 100),
           second=address_range(va + G + 5),
           unmapped=address_range(va + 3 * G + 1)[0],
           attrs=attributes(va + 2 * G))
    """))
    va, g = out["va"], 2 << 20
    assert out["first"] == [0, va, g]
    assert out["second"] == [0, va + g, 2 * g]
    assert out["unmapped"] != 0
    assert out["attrs"] == [0, 0, 0, va + g, 2 * g, va + g, 2 * g]


def test_a_peer_copy_needs_an_access_grant_for_that_device() -> None:
    # cuMemMap memory is reachable from a device only through
    # cuMemSetAccess for that device; peer access between contexts does not
    # cover it (pytorch/FBGEMM#1875). A copy run by device 1 that touches
    # device 0's mapping without a grant faults.
    out = result(run_case("""
    G = 2 * MiB
    va = reserve(2 * G)
    map_at(va, G, create(G))                  # device 0's access only
    map_at(va + G, G, create(G))
    both = (Access * 2)(Access(loc_type=1, loc_id=0, flags=3),
                        Access(loc_type=1, loc_id=1, flags=3))
    ck(lib.cuMemSetAccess(U64(va + G), ctypes.c_size_t(G), both,
                          ctypes.c_size_t(2)), "access")
    put(va, pattern(G, 1))
    ctx1 = ctypes.c_void_p()
    ck(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx1), 1))
    ck(lib.cuCtxSetCurrent(ctx1))
    ck(lib.cuCtxEnablePeerAccess(_ctx, 0), "peer access")
    dst = alloc(G)                            # device 1's memory
    def copy(src):
        return lib.cuMemcpyDtoD_v2(U64(dst), U64(src), ctypes.c_size_t(G))
    ungranted = copy(va)
    straddling = lib.cuMemcpyDtoD_v2(U64(dst), U64(va + G // 2),
                                     ctypes.c_size_t(G))
    granted = copy(va + G)
    ck(lib.cuMemSetAccess(U64(va), ctypes.c_size_t(G), both,
                          ctypes.c_size_t(2)), "grant")
    after_grant = copy(va)
    same = get(dst, G) == pattern(G, 1)
    report(ungranted=ungranted, straddling=straddling, granted=granted,
           after_grant=after_grant, same=same)
    """, env={"JAXLAKE_FAKEGPU_COUNT": "2"}))
    assert out == {"ungranted": 700, "straddling": 700, "granted": 0,
                   "after_grant": 0, "same": True}


# A stream held by a wait on a host flag (cuStreamWaitValue32, GEQ): work
# enqueued after the wait stays in flight until `release()` writes the flag.
HELD = textwrap.indent(held_stream("lib"), "    ")


@pytest.mark.parametrize("unmap_first", [True, False],
                         ids=["unmap_in_flight", "unmap_after_sync"])
def test_unmapping_memory_that_queued_work_uses_faults(
        unmap_first: bool) -> None:
    # vllm#45552: an allocator unmapped memory that queued kernels still
    # used, and the work failed with CUDA_ERROR_ILLEGAL_ADDRESS. cuMemUnmap
    # does not wait for the GPU: a memset and a copy held on a stream, then
    # the unmap of their memory, and the stream's synchronisation reports
    # the fault (a sticky error: the context's later synchronisations too).
    # Unmapped once the work ran, nothing faults.
    proc = run_case(HELD + """
    G = 2 * MiB
    va = reserve(2 * G)
    h = create(2 * G)
    map_at(va, 2 * G, h)
    ck(lib.cuMemsetD8Async(U64(va), ctypes.c_ubyte(7), ctypes.c_size_t(G),
                           stream), "memset")
    ck(lib.cuMemcpyDtoDAsync_v2(U64(va + G), U64(va), ctypes.c_size_t(G),
                                stream), "copy")
    query = lib.cuStreamQuery(stream)
    if UNMAP_FIRST:
        ck(lib.cuMemUnmap(U64(va), ctypes.c_size_t(2 * G)), "unmap")
        release()
        sync = lib.cuStreamSynchronize(stream)
        bytes_ok = None
    else:
        release()
        sync = lib.cuStreamSynchronize(stream)
        bytes_ok = get(va + G, 4096) == bytes([7]) * 4096
        ck(lib.cuMemUnmap(U64(va), ctypes.c_size_t(2 * G)), "unmap")
    report(query=query, sync=sync, bytes_ok=bytes_ok,
           ctx=lib.cuCtxSynchronize(), again=lib.cuStreamSynchronize(stream),
           release=lib.cuMemRelease(U64(h)))
    """.replace("UNMAP_FIRST", str(unmap_first)))
    out = result(proc)
    assert out["query"] == 600  # CUDA_ERROR_NOT_READY: the stream is held
    assert out["release"] == 0
    if unmap_first:
        assert out["sync"] == out["ctx"] == out["again"] == 700, out
        assert "CUDA_ERROR_ILLEGAL_ADDRESS" in proc.stderr, proc.stderr
    else:
        assert out == {"query": 600, "sync": 0, "bytes_ok": True, "ctx": 0,
                       "again": 0, "release": 0}
        assert "ILLEGAL_ADDRESS" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", ["same", "unmapped", "remapped",
                                  "updated"])
def test_a_graph_launch_over_memory_unmapped_since_instantiation_faults(
        case: str) -> None:
    # pytorch#128068: memory unmapped under a captured graph broke its
    # replay. An executable graph's copies and memsets keep the device
    # ranges they touch; launched after their memory was unmapped, or
    # mapped to other physical memory, since the graph was instantiated or
    # its parameters were last set, the graph faults (the stream's sync
    # reports CUDA_ERROR_ILLEGAL_ADDRESS). Setting the node's parameters
    # again (as XLA updates its command buffers) makes the new memory the
    # graph's.
    out = result(run_case("""
    class MemsetParams(ctypes.Structure):
        _fields_ = [("dst", U64), ("pitch", ctypes.c_size_t),
                    ("value", ctypes.c_uint), ("elementSize", ctypes.c_uint),
                    ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]
    G = 2 * MiB
    va = reserve(G)
    first = create(G)
    map_at(va, G, first)
    params = MemsetParams(dst=va, pitch=0, value=5, elementSize=1, width=G,
                          height=1)
    graph, node, exe = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    ck(lib.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    ck(lib.cuGraphAddMemsetNode(ctypes.byref(node), graph, None,
                                ctypes.c_size_t(0), ctypes.byref(params),
                                _ctx), "memset node")
    ck(lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, U64(0)),
       "instantiate")
    stream = ctypes.c_void_p()
    ck(lib.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    ck(lib.cuGraphLaunch(exe, stream), "launch")
    ck(lib.cuStreamSynchronize(stream), "sync")
    ok_first = get(va, 16) == bytes([5]) * 16
    if CASE != "same":
        ck(lib.cuMemUnmap(U64(va), ctypes.c_size_t(G)), "unmap")
    if CASE in ("remapped", "updated"):
        map_at(va, G, create(G))
    if CASE == "updated":
        params.value = 6
        ck(lib.cuGraphExecMemsetNodeSetParams(exe, node,
                                              ctypes.byref(params), _ctx),
           "update")
    launch = lib.cuGraphLaunch(exe, stream)
    sync = lib.cuStreamSynchronize(stream)
    value = get(va, 1)[0] if sync == 0 and CASE != "unmapped" else None
    report(ok_first=ok_first, launch=launch, sync=sync, value=value)
    """.replace("CASE", repr(case))))
    assert out["ok_first"] and out["launch"] == 0, out
    want = {"same": (0, 5), "unmapped": (700, None), "remapped": (700, None),
            "updated": (0, 6)}[case]
    assert (out["sync"], out["value"]) == want, out
