"""The fake GPU's CUDA graphs and stream capture (cc/fakegpu/graph*.cc).

Each case drives libjaxlake_fakegpu.so's driver API through ctypes in a
fresh interpreter (the fake's state is per process): work enqueued on a
capturing stream is recorded, not run; a launch replays copies, memsets and
host functions in stream order; capture prohibits the calls the driver
documents; memory alloc and free nodes count against the device only while
their allocation is live.
"""

from __future__ import annotations

import subprocess
from typing import Dict, Optional

from fakegpu_util import NEEDS_FAKE_GPU, library_run, result


pytestmark = NEEDS_FAKE_GPU

PRELUDE = """
import ctypes, json, sys, threading
lib = ctypes.CDLL(sys.argv[1])
P, U64, SZ = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t
def ck(r, what=""):
    assert r == 0, f"{what}: error {r}"
ck(lib.cuInit(0))
_ctx = P()
ck(lib.cuDevicePrimaryCtxRetain(ctypes.byref(_ctx), 0))
ck(lib.cuCtxSetCurrent(_ctx))
lib.jaxlake_fakegpu_used.restype = ctypes.c_ulonglong
lib.jaxlake_fakegpu_launches.restype = ctypes.c_ulonglong
GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2

def stream():
    s = P()
    ck(lib.cuStreamCreate(ctypes.byref(s), 1), "stream")
    return s

def alloc(n):
    p = U64()
    ck(lib.cuMemAlloc_v2(ctypes.byref(p), SZ(n)), "alloc")
    return p.value

def put(dst, data):
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    ck(lib.cuMemcpyHtoD_v2(U64(dst), buf, SZ(len(data))), "h2d")

def get(src, n):
    buf = ctypes.create_string_buffer(n)
    ck(lib.cuMemcpyDtoH_v2(buf, U64(src), SZ(n)), "d2h")
    return buf.raw

def capturing(s):
    st = ctypes.c_int(-1)
    ck(lib.cuStreamIsCapturing(s, ctypes.byref(st)), "is capturing")
    return st.value

def end(s):
    g = P()
    r = lib.cuStreamEndCapture(s, ctypes.byref(g))
    return r, g

def instantiate(g):
    e = P()
    ck(lib.cuGraphInstantiateWithFlags(ctypes.byref(e), g, U64(0)), "inst")
    return e

def nodes(g):
    n = SZ(0)
    ck(lib.cuGraphGetNodes(g, None, ctypes.byref(n)), "nodes")
    arr = (P * n.value)()
    ck(lib.cuGraphGetNodes(g, arr, ctypes.byref(n)), "nodes")
    types = []
    for x in arr:
        t = ctypes.c_int()
        ck(lib.cuGraphNodeGetType(P(x), ctypes.byref(t)), "type")
        types.append(t.value)
    return list(arr), types

HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
calls = []
host_fn = HOSTFN(lambda data: calls.append(data))

class MemsetParams(ctypes.Structure):
    _fields_ = [("dst", U64), ("pitch", SZ), ("value", ctypes.c_uint),
                ("elementSize", ctypes.c_uint), ("width", SZ),
                ("height", SZ)]

def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


def run_case(script: str, env: Optional[Dict[str, str]] = None
             ) -> "subprocess.CompletedProcess[str]":
    return library_run(script, prelude=PRELUDE, env=env)


def test_captured_work_is_recorded_not_run_and_each_launch_replays_it(
        ) -> None:
    out = result(run_case("""
    s = stream()
    src, dst = alloc(1 << 20), alloc(1 << 20)
    put(src, bytes(range(256)) * 16)
    put(dst, b"\\x07" * 4096)
    before_kernels = lib.jaxlake_fakegpu_launches()
    ck(lib.cuStreamBeginCapture_v2(s, THREAD_LOCAL), "begin")
    status_in = capturing(s)
    ck(lib.cuMemsetD8Async(U64(dst), ctypes.c_ubyte(0xAB), SZ(4096), s))
    ck(lib.cuMemcpyDtoDAsync_v2(U64(dst), U64(src), SZ(1024), s))
    ck(lib.cuLaunchHostFunc(s, host_fn, P(17)), "host")
    ck(lib.cuLaunchKernel(P(0x1234), 1, 1, 1, 1, 1, 1, 0, s, None, None))
    kernels_in_capture = lib.jaxlake_fakegpu_launches() - before_kernels
    r, g = end(s)
    ck(r, "end")
    ck(lib.cuStreamSynchronize(s), "sync after capture")
    untouched = get(dst, 4096) == b"\\x07" * 4096 and not calls
    _, types = nodes(g)
    e = instantiate(g)
    ck(lib.cuGraphLaunch(e, s), "launch")
    ck(lib.cuStreamSynchronize(s), "sync")
    after_one = get(dst, 4096)
    put(dst, b"\\x00" * 4096)
    ck(lib.cuGraphLaunch(e, s), "launch 2")
    ck(lib.cuStreamSynchronize(s), "sync")
    want = bytes(range(256)) * 4 + b"\\xab" * 3072
    report(status_in=status_in, status_after=capturing(s),
           untouched=untouched, types=types,
           first=after_one == want, second=get(dst, 4096) == want,
           calls=calls, kernels_in_capture=kernels_in_capture,
           kernels=lib.jaxlake_fakegpu_launches() - before_kernels)
    """))
    assert out["status_in"] == 1 and out["status_after"] == 0
    assert out["untouched"]
    assert out["kernels_in_capture"] == 0
    # memset, memcpy, host, kernel nodes, in the order they were enqueued
    assert out["types"] == [2, 1, 3, 0]
    assert out["first"] and out["second"]
    assert out["calls"] == [17, 17]
    assert out["kernels"] == 2


def test_capture_rules_by_mode() -> None:
    out = result(run_case("""
    s = stream()
    got = {}
    # Global capture: this thread's unsafe call fails and invalidates it.
    ck(lib.cuStreamBeginCapture_v2(s, GLOBAL), "begin")
    p = U64()
    got["alloc_in_global"] = lib.cuMemAlloc_v2(ctypes.byref(p), SZ(4096))
    st = ctypes.c_int()
    ck(lib.cuStreamIsCapturing(s, ctypes.byref(st)))
    got["status_after_unsafe"] = st.value
    got["end_invalidated"] = end(s)[0]
    # Global capture on this thread prohibits another thread in global
    # mode, not one that switched to relaxed.
    ck(lib.cuStreamBeginCapture_v2(s, GLOBAL), "begin 2")
    def other(mode, key):
        ck(lib.cuCtxSetCurrent(_ctx))
        m = ctypes.c_int(mode)
        ck(lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(m)))
        q = U64()
        got[key] = lib.cuMemAlloc_v2(ctypes.byref(q), SZ(4096))
    for mode, key in ((GLOBAL, "other_global"), (RELAXED, "other_relaxed")):
        t = threading.Thread(target=other, args=(mode, key))
        t.start(); t.join()
    got["end_after_other"] = end(s)[0]
    # Thread-local capture leaves other threads alone.
    ck(lib.cuStreamBeginCapture_v2(s, THREAD_LOCAL), "begin 3")
    t = threading.Thread(target=other, args=(GLOBAL, "other_vs_local"))
    t.start(); t.join()
    # Synchronising a capturing stream fails and invalidates its capture.
    got["sync_capturing"] = lib.cuStreamSynchronize(s)
    got["end_after_sync"] = end(s)[0]
    # The default streams cannot be captured; ending what never began.
    got["begin_null"] = lib.cuStreamBeginCapture_v2(P(0), THREAD_LOCAL)
    got["end_none"] = end(s)[0]
    # Querying an event recorded in a capture invalidates that capture.
    ev = P()
    ck(lib.cuEventCreate(ctypes.byref(ev), 0))
    ck(lib.cuStreamBeginCapture_v2(s, THREAD_LOCAL), "begin 5")
    ck(lib.cuEventRecord(ev, s), "record in capture")
    got["query_captured_event"] = lib.cuEventQuery(ev)
    got["end_after_query"] = end(s)[0]
    got["query_after_end"] = lib.cuEventQuery(ev)
    # Relaxed capture prohibits nothing.
    ck(lib.cuStreamBeginCapture_v2(s, RELAXED), "begin 4")
    got["alloc_in_relaxed"] = lib.cuMemAlloc_v2(ctypes.byref(p), SZ(4096))
    got["end_relaxed"] = end(s)[0]
    report(**got)
    """))
    assert out == {
        "alloc_in_global": 900, "status_after_unsafe": 2,
        "end_invalidated": 901,
        "other_global": 900, "other_relaxed": 0, "end_after_other": 0,
        "other_vs_local": 0, "sync_capturing": 900, "end_after_sync": 901,
        "begin_null": 900, "end_none": 401,
        "alloc_in_relaxed": 0, "end_relaxed": 0,
        "query_captured_event": 900, "end_after_query": 901,
        "query_after_end": 0,
    }


def test_capture_info_and_a_second_stream_joined_by_an_event() -> None:
    out = result(run_case("""
    a, b = stream(), stream()
    dst = alloc(1 << 20)
    ev = P()
    ck(lib.cuEventCreate(ctypes.byref(ev), 0))
    ck(lib.cuStreamBeginCapture_v2(a, THREAD_LOCAL), "begin")
    ck(lib.cuMemsetD8Async(U64(dst), ctypes.c_ubyte(1), SZ(64), a))
    ck(lib.cuEventRecord(ev, a), "record")
    ck(lib.cuStreamWaitEvent(b, ev, 0), "fork")      # b joins the capture
    b_status = capturing(b)
    ck(lib.cuMemsetD8Async(U64(dst + 64), ctypes.c_ubyte(2), SZ(64), b))
    ck(lib.cuEventRecord(ev, b), "record b")
    ck(lib.cuStreamWaitEvent(a, ev, 0), "join")
    st, cid, g = ctypes.c_int(), U64(), P()
    deps, n = ctypes.POINTER(P)(), SZ()
    ck(lib.cuStreamGetCaptureInfo_v2(a, ctypes.byref(st), ctypes.byref(cid),
                                     ctypes.byref(g), ctypes.byref(deps),
                                     ctypes.byref(n)), "info")
    r, graph = end(a)
    ck(r, "end")
    _, types = nodes(graph)
    e = instantiate(graph)
    ck(lib.cuGraphLaunch(e, a))
    ck(lib.cuStreamSynchronize(a))
    report(b_status=b_status, status=st.value, id=cid.value,
           same_graph=g.value == graph.value, deps=n.value, types=types,
           b_after=capturing(b),
           bytes=list(get(dst, 128)) == [1] * 64 + [2] * 64)
    """))
    assert out["b_status"] == 1 and out["b_after"] == 0
    assert out["status"] == 1 and out["id"] >= 1 and out["same_graph"]
    # a's dependencies after the join: its memset and b's memset
    assert out["deps"] == 2
    assert out["types"] == [2, 2]
    assert out["bytes"]


def test_memory_nodes_count_against_the_device_while_live() -> None:
    out = result(run_case("""
    s = stream()
    pool = P()
    ck(lib.cuDeviceGetDefaultMemPool(ctypes.byref(pool), 0))
    N = 64 << 20
    def used_graph(attr):
        v = U64()
        ck(lib.cuDeviceGetGraphMemAttribute(0, attr, ctypes.byref(v)))
        return v.value
    base = lib.jaxlake_fakegpu_used(0)
    # Alloc and free in one graph: live only during the launch.
    ck(lib.cuStreamBeginCapture_v2(s, THREAD_LOCAL), "begin")
    p = U64()
    ck(lib.cuMemAllocFromPoolAsync(ctypes.byref(p), SZ(N), pool, s), "a")
    ck(lib.cuMemsetD8Async(p, ctypes.c_ubyte(5), SZ(N), s), "memset")
    ck(lib.cuMemFreeAsync(p, s), "free")
    r, g = end(s)
    ck(r, "end")
    _, types = nodes(g)
    charged_at_capture = lib.jaxlake_fakegpu_used(0) - base
    e = instantiate(g)
    ck(lib.cuGraphLaunch(e, s), "launch")
    ck(lib.cuStreamSynchronize(s))
    after_pair = lib.jaxlake_fakegpu_used(0) - base
    high, current = used_graph(1), used_graph(0)
    # An alloc node whose allocation outlives the graph.
    ck(lib.cuStreamBeginCapture_v2(s, THREAD_LOCAL), "begin 2")
    q = U64()
    ck(lib.cuMemAllocFromPoolAsync(ctypes.byref(q), SZ(N), pool, s), "a2")
    r, g2 = end(s)
    ck(r, "end 2")
    e2 = instantiate(g2)
    ck(lib.cuGraphLaunch(e2, s), "launch 2")
    ck(lib.cuStreamSynchronize(s))
    live = lib.jaxlake_fakegpu_used(0) - base
    relaunch = lib.cuGraphLaunch(e2, s)      # still live: refused
    ck(lib.cuMemFreeAsync(q, s), "free outside")
    ck(lib.cuStreamSynchronize(s))
    freed = lib.jaxlake_fakegpu_used(0) - base
    ck(lib.cuGraphLaunch(e2, s), "launch 3")
    ck(lib.cuStreamSynchronize(s))
    ck(lib.cuGraphExecDestroy(e2)); ck(lib.cuGraphDestroy(g2))
    destroyed = lib.jaxlake_fakegpu_used(0) - base
    report(types=types, charged_at_capture=charged_at_capture,
           after_pair=after_pair, high=high, current=current, live=live,
           relaunch=relaunch, freed=freed, destroyed=destroyed)
    """))
    n = 64 << 20
    assert out["types"] == [10, 2, 11]
    assert out["charged_at_capture"] == 0
    assert out["after_pair"] == 0
    assert out["high"] == n and out["current"] == 0
    assert out["live"] == n
    assert out["relaunch"] == 1
    assert out["freed"] == 0
    assert out["destroyed"] == 0


def test_built_graph_child_node_and_exec_updates() -> None:
    out = result(run_case("""
    s = stream()
    dst = alloc(1 << 20)
    child = P()
    ck(lib.cuGraphCreate(ctypes.byref(child), 0))
    m = MemsetParams(dst=dst, pitch=0, value=3, elementSize=1, width=16,
                     height=1)
    mn = P()
    ck(lib.cuGraphAddMemsetNode(ctypes.byref(mn), child, None, SZ(0),
                                ctypes.byref(m), _ctx), "memset node")
    g = P()
    ck(lib.cuGraphCreate(ctypes.byref(g), 0))
    root, cn, hn = P(), P(), P()
    ck(lib.cuGraphAddEmptyNode(ctypes.byref(root), g, None, SZ(0)))
    deps = (P * 1)(root)
    ck(lib.cuGraphAddChildGraphNode(ctypes.byref(cn), g, deps, SZ(1), child))
    class Host(ctypes.Structure):
        _fields_ = [("fn", HOSTFN), ("data", P)]
    h = Host(host_fn, P(5))
    deps = (P * 1)(cn)
    ck(lib.cuGraphAddHostNode(ctypes.byref(hn), g, deps, SZ(1),
                              ctypes.byref(h)))
    roots = SZ(0)
    ck(lib.cuGraphGetRootNodes(g, None, ctypes.byref(roots)))
    e = instantiate(g)
    ck(lib.cuGraphLaunch(e, s)); ck(lib.cuStreamSynchronize(s))
    first = list(get(dst, 16))
    # A new value for the child's memset through a graph of the same shape.
    m2 = MemsetParams(dst=dst, pitch=0, value=9, elementSize=1, width=16,
                      height=1)
    child2 = P()
    ck(lib.cuGraphCreate(ctypes.byref(child2), 0))
    ck(lib.cuGraphAddMemsetNode(ctypes.byref(P()), child2, None, SZ(0),
                                ctypes.byref(m2), _ctx))
    ck(lib.cuGraphExecChildGraphNodeSetParams(e, cn, child2), "child set")
    ck(lib.cuGraphLaunch(e, s)); ck(lib.cuStreamSynchronize(s))
    second = list(get(dst, 16))
    # cuGraphExecUpdate: same topology takes the graph's parameters; the
    # exec setters address nodes of the graph it came from.
    class Info(ctypes.Structure):
        _fields_ = [("result", ctypes.c_int), ("node", P), ("from_", P)]
    info = Info()
    ck(lib.cuGraphExecUpdate_v2(e, g, ctypes.byref(info)), "update")
    ck(lib.cuGraphLaunch(e, s)); ck(lib.cuStreamSynchronize(s))
    third = list(get(dst, 16))
    # cuGraphExecNodeSetParams with a child graph's parameters
    # (CUgraphNodeParams, type 4: CU_GRAPH_NODE_TYPE_GRAPH) does what
    # cuGraphExecChildGraphNodeSetParams does.
    class ChildParams(ctypes.Structure):
        _fields_ = [("graph", P), ("ownership", ctypes.c_int)]
    class NodeParams(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("reserved0", ctypes.c_int * 3),
                    ("graph", ChildParams),
                    ("pad", ctypes.c_char * (256 - 16 - 16))]
    assert ctypes.sizeof(NodeParams) == 256
    np_ = NodeParams(type=4, graph=ChildParams(child2, 0))
    ck(lib.cuGraphExecNodeSetParams(e, cn, ctypes.byref(np_)), "node set")
    ck(lib.cuGraphLaunch(e, s)); ck(lib.cuStreamSynchronize(s))
    fourth = list(get(dst, 16))
    np_.graph = ChildParams(g, 0)  # another topology
    bad_set = lib.cuGraphExecNodeSetParams(e, cn, ctypes.byref(np_))
    other = P()
    ck(lib.cuGraphCreate(ctypes.byref(other), 0))
    ck(lib.cuGraphAddEmptyNode(ctypes.byref(P()), other, None, SZ(0)))
    bad = lib.cuGraphExecUpdate_v2(e, other, ctypes.byref(info))
    report(roots=roots.value, first=first, second=second, third=third,
           fourth=fourth, bad_set=bad_set, calls=calls, bad=bad,
           result=info.result)
    """))
    assert out["roots"] == 1
    assert out["first"] == [3] * 16
    assert out["second"] == [9] * 16
    assert out["third"] == [3] * 16
    assert out["fourth"] == [9] * 16
    assert out["bad_set"] == 1  # CUDA_ERROR_INVALID_VALUE
    assert out["calls"] == [5, 5, 5, 5]
    assert out["bad"] == 910 and out["result"] == 2


def test_stream_memory_operations_in_order_and_under_capture() -> None:
    # XLA's own VMM allocator (an update mode other than ALWAYS_UPDATE)
    # signals frees with cuStreamWriteValue64; the device attributes say
    # 64-bit stream memory operations are supported.
    out = result(run_case("""
    s, t = stream(), stream()
    flag = alloc(1 << 20)
    put(flag, bytes(16))
    W64, WAIT64 = lib.cuStreamWriteValue64_v2, lib.cuStreamWaitValue64_v2
    # t waits (GEQ) for the value s writes; t's memset runs only after it.
    ck(WAIT64(t, U64(flag), U64(5), 0), "wait")
    ck(lib.cuMemsetD8Async(U64(flag + 8), ctypes.c_ubyte(7), SZ(8), t))
    import time; time.sleep(0.05)
    waited = lib.cuStreamQuery(t) == 600   # CUDA_ERROR_NOT_READY: waiting
    ck(W64(s, U64(flag), U64(5), 0), "write")
    ck(lib.cuStreamSynchronize(t))
    after = list(get(flag, 16))
    bad = W64(s, U64(flag + 1), U64(1), 0)       # misaligned
    # Under capture a write is a node, run at each launch.
    put(flag, bytes(8))
    ck(lib.cuStreamBeginCapture_v2(s, THREAD_LOCAL), "begin")
    ck(lib.cuStreamWriteValue32_v2(s, U64(flag), ctypes.c_uint32(9), 0))
    r, g = end(s)
    ck(r, "end")
    ck(lib.cuStreamSynchronize(s))
    before_launch = list(get(flag, 4))
    _, types = nodes(g)
    ck(lib.cuGraphLaunch(instantiate(g), s)); ck(lib.cuStreamSynchronize(s))
    report(waited=waited, after=after, bad=bad, types=types,
           before_launch=before_launch, launched=list(get(flag, 4)))
    """))
    assert out["waited"]
    assert out["after"] == [5] + [0] * 7 + [7] * 8
    assert out["bad"] == 1
    assert out["types"] == [12]
    assert out["before_launch"] == [0, 0, 0, 0]
    assert out["launched"] == [9, 0, 0, 0]


def test_runtime_graph_calls_over_the_drivers() -> None:
    out = result(run_case("""
    s = stream()
    dst, src = alloc(1 << 20), alloc(1 << 20)
    put(src, bytes(range(64)))
    put(dst, bytes(64))
    ck(lib.cudaStreamBeginCapture(s, THREAD_LOCAL), "begin")
    st = ctypes.c_int()
    ck(lib.cudaStreamIsCapturing(s, ctypes.byref(st)))
    ck(lib.cudaMemsetAsync(P(dst), 4, SZ(64), s), "memset")
    g = P()
    ck(lib.cudaStreamEndCapture(s, ctypes.byref(g)), "end")
    root = (P * 1)()
    n = SZ(1)
    ck(lib.cudaGraphGetNodes(g, root, ctypes.byref(n)))
    cp = P()
    ck(lib.cudaGraphAddMemcpyNode1D(ctypes.byref(cp), g, root, SZ(1),
                                    P(dst), P(src), SZ(16), 3), "1D")
    e = P()
    ck(lib.cudaGraphInstantiate(ctypes.byref(e), g, U64(0)), "inst")
    ck(lib.cudaGraphLaunch(e, s)); ck(lib.cuStreamSynchronize(s))
    first = list(get(dst, 32))
    ck(lib.cudaGraphExecMemcpyNodeSetParams1D(e, cp, P(dst), P(src + 32),
                                              SZ(16), 3), "set 1D")
    ck(lib.cudaGraphLaunch(e, s)); ck(lib.cuStreamSynchronize(s))
    deps = SZ(0)
    ck(lib.cudaGraphNodeGetDependencies(cp, None, ctypes.byref(deps)))
    report(status=st.value, first=first, second=list(get(dst, 32)),
           deps=deps.value)
    """))
    assert out["status"] == 1
    assert out["first"] == list(range(16)) + [4] * 16
    assert out["second"] == list(range(32, 48)) + [4] * 16
    assert out["deps"] == 1
