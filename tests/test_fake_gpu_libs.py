"""The fake GPU's cuDNN, NCCL and cuBLASLt at their public C APIs.

Each test drives libjaxlake_fakegpu.so through ctypes, by NVIDIA's names,
signatures and enum values (cudnn_graph.h, nccl.h, cublasLt.h), in a
subprocess of its own (the library keeps process-wide state, and a wrong
signature would crash the interpreter). What cudnn-frontend and XLA do with
these calls is tests/test_fake_gpu.py's part.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Dict

import pytest


def _library() -> str:
    from jaxlake._src.xla import fakegpu
    return fakegpu.library_path()


pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine != "x86_64"
    or not os.path.isfile(_library()),
    reason="the fake GPU is built on x86-64 Linux only")

PRELUDE = r"""
import ctypes as C, sys
lib = C.CDLL(LIBRARY)
P, I64, SZ = C.c_void_p, C.c_int64, C.c_size_t

def check(status, what, expected=0):
    if status != expected:
        sys.exit(f"{what}: status {status}, expected {expected}")

# A context on each fake device, and device memory.
check(lib.cuInit(0), "cuInit")
ctx = []
for d in range(DEVICES):
    c = P()
    check(lib.cuDevicePrimaryCtxRetain(C.byref(c), d), "retain")
    ctx.append(c)
check(lib.cuCtxSetCurrent(ctx[0]), "set current")

def device_alloc(n, device=0):
    check(lib.cuCtxSetCurrent(ctx[device]), "set current")
    p = C.c_uint64()
    check(lib.cuMemAlloc_v2(C.byref(p), SZ(n)), "cuMemAlloc")
    return p.value

def to_device(p, data):
    buf = C.create_string_buffer(bytes(data), len(data))
    check(lib.cuMemcpyHtoD_v2(C.c_uint64(p), buf, SZ(len(data))), "HtoD")

def from_device(p, n):
    buf = C.create_string_buffer(n)
    check(lib.cuMemcpyDtoH_v2(buf, C.c_uint64(p), SZ(n)), "DtoH")
    return buf.raw
"""


def run(body: str, *, devices: int = 1) -> str:
    env = dict(os.environ)
    env["JAXLAKE_FAKEGPU_COUNT"] = str(devices)
    env["JAXLAKE_FAKEGPU_LOG"] = "stderr"
    script = (f"LIBRARY = {_library()!r}\nDEVICES = {devices}\n" + PRELUDE +
              textwrap.dedent(body))
    proc = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# cudnn_graph.h
CUDNN = r"""
TENSOR, MATMUL, OP_MATMUL, OPGRAPH = 17, 18, 19, 15
ENGINE, ENGINECFG, ENGINEHEUR, PLAN, VARPACK = 2, 3, 4, 5, 16
T_HANDLE, T_DATA_TYPE, T_BOOLEAN, T_INT64, T_VOID_PTR = 0, 1, 2, 3, 6
T_HEUR_MODE, T_DESC, T_INT32, T_CHAR = 8, 15, 23, 24
A_TENSOR_DATA_TYPE, A_TENSOR_DIMS, A_TENSOR_STRIDES = 901, 902, 903
A_TENSOR_UID, A_TENSOR_VIRTUAL, A_TENSOR_ALIGN = 906, 907, 900
A_MATMUL_COMP_TYPE = 1500
A_OP_A, A_OP_B, A_OP_C, A_OP_DESC = 1520, 1521, 1522, 1523
A_GRAPH_HANDLE, A_GRAPH_OPS, A_GRAPH_COUNT = 800, 801, 802
A_HEUR_MODE, A_HEUR_GRAPH, A_HEUR_RESULTS = 200, 201, 202
A_CFG_ENGINE, A_CFG_WORKSPACE = 300, 303
A_ENGINE_INDEX, A_ENGINE_NOTES = 1301, 1303
A_PLAN_HANDLE, A_PLAN_CFG, A_PLAN_WORKSPACE, A_PLAN_JSON = 400, 401, 402, 405
A_PACK_UIDS, A_PACK_PTRS, A_PACK_WORKSPACE = 1000, 1001, 1003
HALF, FLOAT = 2, 0

lib.cudnnGetErrorString.restype = C.c_char_p
lib.cudnnBackendSetAttribute.argtypes = [P, C.c_int, C.c_int, I64, P]
lib.cudnnBackendGetAttribute.argtypes = [P, C.c_int, C.c_int, I64,
                                         C.POINTER(I64), P]

def create(kind):
    d = P()
    check(lib.cudnnBackendCreateDescriptor(kind, C.byref(d)),
          f"create descriptor {kind}")
    return d

def set_(d, name, type_, values, ctype):
    arr = (ctype * len(values))(*values)
    return lib.cudnnBackendSetAttribute(d, name, type_, len(values), arr)

def get(d, name, type_, ctype, n=16):
    arr = (ctype * n)()
    count = I64()
    status = lib.cudnnBackendGetAttribute(d, name, type_, n, C.byref(count),
                                          arr)
    return status, list(arr[:min(count.value, n)])

handle = P()
check(lib.cudnnCreate(C.byref(handle)), "cudnnCreate")

def tensor(uid, dims, dtype, virtual=False):
    t = create(TENSOR)
    strides, s = [], 1
    for d in reversed(dims):
        strides.insert(0, s)
        s *= d
    check(set_(t, A_TENSOR_DATA_TYPE, T_DATA_TYPE, [dtype], C.c_int), "dt")
    check(set_(t, A_TENSOR_DIMS, T_INT64, dims, C.c_int64), "dims")
    check(set_(t, A_TENSOR_STRIDES, T_INT64, strides, C.c_int64), "strides")
    check(set_(t, A_TENSOR_UID, T_INT64, [uid], C.c_int64), "uid")
    check(set_(t, A_TENSOR_ALIGN, T_INT64, [16], C.c_int64), "align")
    check(set_(t, A_TENSOR_VIRTUAL, T_BOOLEAN, [virtual], C.c_bool), "virt")
    check(lib.cudnnBackendFinalize(t), f"finalize tensor {uid}")
    return t

# C[1,64,48] (float) = A[1,64,32] (half) x B[1,32,48] (half): the largest
# non-virtual tensor is C, 64 * 48 * 4 = 12288 bytes.
A = tensor(1, [1, 64, 32], HALF)
B = tensor(2, [1, 32, 48], HALF)
Cc = tensor(3, [1, 64, 48], FLOAT)
mm = create(MATMUL)
check(set_(mm, A_MATMUL_COMP_TYPE, T_DATA_TYPE, [FLOAT], C.c_int), "comp")
check(lib.cudnnBackendFinalize(mm), "finalize matmul")
op = create(OP_MATMUL)
for name, t in ((A_OP_A, A), (A_OP_B, B), (A_OP_C, Cc), (A_OP_DESC, mm)):
    check(set_(op, name, T_DESC, [t.value], C.c_void_p), f"op {name}")
check(lib.cudnnBackendFinalize(op), "finalize op")
graph = create(OPGRAPH)
check(set_(graph, A_GRAPH_HANDLE, T_HANDLE, [handle.value], C.c_void_p), "h")
check(set_(graph, A_GRAPH_OPS, T_DESC, [op.value], C.c_void_p), "ops")
check(lib.cudnnBackendFinalize(graph), "finalize graph")

def plan_of(graph):
    heur = create(ENGINEHEUR)
    check(set_(heur, A_HEUR_GRAPH, T_DESC, [graph.value], C.c_void_p), "g")
    check(set_(heur, A_HEUR_MODE, T_HEUR_MODE, [3], C.c_int), "mode A")
    check(lib.cudnnBackendFinalize(heur), "finalize heuristics")
    count = I64()
    check(lib.cudnnBackendGetAttribute(heur, A_HEUR_RESULTS, T_DESC, 0,
                                       C.byref(count), None), "count")
    cfg = create(ENGINECFG)
    arr = (C.c_void_p * 1)(cfg.value)
    check(lib.cudnnBackendGetAttribute(heur, A_HEUR_RESULTS, T_DESC, 1,
                                       C.byref(I64()), arr), "results")
    plan = create(PLAN)
    check(set_(plan, A_PLAN_HANDLE, T_HANDLE, [handle.value], C.c_void_p),
          "plan handle")
    check(set_(plan, A_PLAN_CFG, T_DESC, [cfg.value], C.c_void_p), "cfg")
    check(lib.cudnnBackendFinalize(plan), "finalize plan")
    return count.value, cfg, plan
"""


def results(out: str) -> Dict[str, str]:
    """The script's `key: value` lines."""
    return dict(line.split(": ", 1) for line in out.splitlines()
                if ": " in line)


def test_cudnn_descriptors_hold_their_attributes() -> None:
    out = results(run(CUDNN + r"""
print("dims:", get(Cc, A_TENSOR_DIMS, T_INT64, C.c_int64))
print("dtype:", get(A, A_TENSOR_DATA_TYPE, T_DATA_TYPE, C.c_int))
print("virtual:", get(A, A_TENSOR_VIRTUAL, T_BOOLEAN, C.c_bool))
# the wrong type, an attribute never set, a set after finalization
print("wrong type:", get(Cc, A_TENSOR_DIMS, T_INT32, C.c_int32)[0])
print("unset:", get(Cc, 910, T_INT64, C.c_int64)[0])
print("set finalized:", set_(Cc, A_TENSOR_UID, T_INT64, [9], C.c_int64))
print("engines:", get(graph, A_GRAPH_COUNT, T_INT64, C.c_int64))
# a descriptor-valued attribute fills the caller's descriptor with a copy
a2 = create(TENSOR)
arr = (C.c_void_p * 1)(a2.value)
check(lib.cudnnBackendGetAttribute(op, A_OP_A, T_DESC, 1, C.byref(I64()),
                                   arr), "get A")
print("copied uid:", get(a2, A_TENSOR_UID, T_INT64, C.c_int64))
print("copied dims:", get(a2, A_TENSOR_DIMS, T_INT64, C.c_int64))
print("wrong kind:", lib.cudnnBackendGetAttribute(
    op, A_OP_A, T_DESC, 1, C.byref(I64()), (C.c_void_p * 1)(mm.value)))
print("name:", lib.cudnnGetErrorString(2010).decode())
"""))
    assert out["dims"] == "(0, [1, 64, 48])"
    assert out["dtype"] == "(0, [2])"  # CUDNN_DATA_HALF
    assert out["virtual"] == "(0, [False])"
    assert out["wrong type"] == "2010"  # BAD_PARAM_ATTRIBUTE_TYPE
    assert out["unset"] == "2000"
    assert out["set finalized"] == "2000"
    assert out["engines"] == "(0, [2])"
    assert out["copied uid"] == "(0, [1])"
    assert out["copied dims"] == "(0, [1, 64, 32])"
    assert out["wrong kind"] == "2012"  # BAD_PARAM_DESCRIPTOR_TYPE
    assert out["name"] == "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE"


def test_cudnn_sub_library_version_checks_succeed() -> None:
    # XLA calls these when it starts cuDNN 9; the stubs answered
    # NOT_SUPPORTED (3000) and named each call on stderr.
    out = results(run(CUDNN + r"""
for name in ("Graph", "Ops", "Cnn", "Adv"):
    print(name + ":", getattr(lib, f"cudnn{name}VersionCheck")())
"""))
    assert out == {"Graph": "0", "Ops": "0", "Cnn": "0", "Adv": "0"}


def test_cudnn_heuristics_plan_workspace_and_json_round_trip() -> None:
    out = results(run(CUDNN + r"""
count, cfg, plan = plan_of(graph)
print("results:", count)
print("cfg workspace:", get(cfg, A_CFG_WORKSPACE, T_INT64, C.c_int64))
print("plan workspace:", get(plan, A_PLAN_WORKSPACE, T_INT64, C.c_int64))
status, chars = get(plan, A_PLAN_JSON, T_CHAR, C.c_char, 4096)
text = bytes(chars).split(b"\0")[0]
print("json status:", status)
# a plan made from the JSON alone: the same workspace, and an engine config
plan2 = create(PLAN)
check(set_(plan2, A_PLAN_HANDLE, T_HANDLE, [handle.value], C.c_void_p), "h")
check(lib.cudnnBackendSetAttribute(plan2, A_PLAN_JSON, T_CHAR, len(text) + 1,
                                   C.c_char_p(text)), "set json")
check(lib.cudnnBackendFinalize(plan2), "finalize from json")
print("json workspace:", get(plan2, A_PLAN_WORKSPACE, T_INT64, C.c_int64))
cfg2, engine2 = create(ENGINECFG), create(ENGINE)
check(lib.cudnnBackendGetAttribute(plan2, A_PLAN_CFG, T_DESC, 1,
      C.byref(I64()), (C.c_void_p * 1)(cfg2.value)), "json cfg")
check(lib.cudnnBackendGetAttribute(cfg2, A_CFG_ENGINE, T_DESC, 1,
      C.byref(I64()), (C.c_void_p * 1)(engine2.value)), "json engine")
print("engine index:", get(engine2, A_ENGINE_INDEX, T_INT64, C.c_int64))
notes = I64(-1)
check(lib.cudnnBackendGetAttribute(engine2, A_ENGINE_NOTES, 11, 10,
                                   C.byref(notes), None), "notes")
print("notes:", notes.value)
bad = create(PLAN)
check(lib.cudnnBackendSetAttribute(bad, A_PLAN_JSON, T_CHAR, 3,
                                   C.c_char_p(b"{}")), "set bad json")
print("bad json:", lib.cudnnBackendFinalize(bad))
"""))
    assert out["results"] == "1"
    # the rule (cc/fakegpu/README.md): the largest non-virtual tensor, C
    assert out["cfg workspace"] == "(0, [12288])"
    assert out["plan workspace"] == "(0, [12288])"
    assert out["json status"] == "0"
    assert out["json workspace"] == "(0, [12288])"
    assert out["engine index"] == "(0, [1])"  # the heuristics' engine
    assert out["notes"] == "0"
    assert out["bad json"] == "2000"


def test_cudnn_execute_checks_the_variant_pack_and_runs_in_stream_order(
        ) -> None:
    out = results(run(CUDNN + r"""
count, cfg, plan = plan_of(graph)
stream = P()
check(lib.cuStreamCreate(C.byref(stream), 0), "stream")
check(lib.cudnnSetStream(handle, stream), "cudnnSetStream")
got = P()
check(lib.cudnnGetStream(handle, C.byref(got)), "cudnnGetStream")
print("stream kept:", got.value == stream.value)
a, b, c = device_alloc(4096), device_alloc(3072), device_alloc(12288)
ws = device_alloc(12288)
host = C.create_string_buffer(12288)

def pack(pointers, workspace):
    v = create(VARPACK)
    check(set_(v, A_PACK_UIDS, T_INT64, [1, 2, 3], C.c_int64), "uids")
    check(set_(v, A_PACK_PTRS, T_VOID_PTR, pointers, C.c_void_p), "ptrs")
    check(set_(v, A_PACK_WORKSPACE, T_VOID_PTR, [workspace], C.c_void_p),
          "ws")
    check(lib.cudnnBackendFinalize(v), "finalize pack")
    return v

def execute(v):
    status = lib.cudnnBackendExecute(handle, plan, v)
    msg = C.create_string_buffer(256)
    lib.cudnnGetLastErrorString(msg, SZ(256))
    return f"{status} {msg.value.decode()}"

print("good:", execute(pack([a, b, c], ws)))
check(lib.cuStreamSynchronize(stream), "sync")
# 1 KiB before the end of an allocation (the fake's are whole 2 MiB pages)
small = device_alloc(2 << 20) + (2 << 20) - 1024
print("small output:", execute(pack([a, b, small], ws)))
print("host output:", execute(pack([a, b, C.addressof(host)], ws)))
print("no workspace:", execute(pack([a, b, c], None)))
v = create(VARPACK)
check(set_(v, A_PACK_UIDS, T_INT64, [1, 2], C.c_int64), "uids")
check(set_(v, A_PACK_PTRS, T_VOID_PTR, [a], C.c_void_p), "ptrs")
print("uneven pack:", lib.cudnnBackendFinalize(v))
"""))
    assert out["stream kept"] == "True"
    assert out["good"] == "0 "
    assert out["small output"].startswith("2000 ")
    assert "tensor 3" in out["small output"]
    assert "12288 bytes" in out["small output"]
    assert out["host output"].startswith("2000 ")
    assert out["no workspace"].startswith("2000 ")
    assert "workspace" in out["no workspace"]
    assert out["uneven pack"] == "2000"


def test_cudnn_engine_0_needs_no_workspace() -> None:
    # XLA with autotuning off runs engine 0 of a convolution with a scratch
    # buffer of no bytes: a plan of engine 0 has no workspace and runs with
    # none, while engine 1 (the heuristics') keeps the workspace rule.
    out = results(run(CUDNN + r"""
def engine_plan(index):
    engine = create(ENGINE)
    check(set_(engine, 1300, T_DESC, [graph.value], C.c_void_p), "graph")
    check(set_(engine, A_ENGINE_INDEX, T_INT64, [index], C.c_int64), "index")
    status = lib.cudnnBackendFinalize(engine)
    if status != 0:
        return status, None, None
    cfg = create(ENGINECFG)
    check(set_(cfg, A_CFG_ENGINE, T_DESC, [engine.value], C.c_void_p), "e")
    check(lib.cudnnBackendFinalize(cfg), "finalize cfg")
    plan = create(PLAN)
    check(set_(plan, A_PLAN_HANDLE, T_HANDLE, [handle.value], C.c_void_p),
          "plan handle")
    check(set_(plan, A_PLAN_CFG, T_DESC, [cfg.value], C.c_void_p), "cfg")
    check(lib.cudnnBackendFinalize(plan), "finalize plan")
    return 0, cfg, plan

a, b, c = device_alloc(4096), device_alloc(3072), device_alloc(12288)
v = create(VARPACK)
check(set_(v, A_PACK_UIDS, T_INT64, [1, 2, 3], C.c_int64), "uids")
check(set_(v, A_PACK_PTRS, T_VOID_PTR, [a, b, c], C.c_void_p), "ptrs")
check(lib.cudnnBackendFinalize(v), "finalize pack")
for index in (0, 1):
    _, cfg, plan = engine_plan(index)
    print(f"cfg {index}:", get(cfg, A_CFG_WORKSPACE, T_INT64, C.c_int64))
    print(f"plan {index}:", get(plan, A_PLAN_WORKSPACE, T_INT64, C.c_int64))
    print(f"run {index}:", lib.cudnnBackendExecute(handle, plan, v))
print("engine 2:", engine_plan(2)[0])
"""))
    assert out["cfg 0"] == "(0, [0])"
    assert out["plan 0"] == "(0, [0])"
    assert out["run 0"] == "0"
    assert out["cfg 1"] == "(0, [12288])"
    assert out["plan 1"] == "(0, [12288])"
    assert out["run 1"] == "2000"  # the pack has no workspace
    assert out["engine 2"] == "3000"  # NOT_SUPPORTED


NCCL = r"""
FLOAT32 = 7
lib.ncclAlltoAll.argtypes = [C.c_uint64, C.c_uint64, SZ, C.c_int, P, P]
lib.ncclAllGather.argtypes = [C.c_uint64, C.c_uint64, SZ, C.c_int, P, P]
lib.ncclBroadcast.argtypes = [C.c_uint64, C.c_uint64, SZ, C.c_int, C.c_int,
                              P, P]
lib.ncclSend.argtypes = [C.c_uint64, SZ, C.c_int, C.c_int, P, P]
lib.ncclRecv.argtypes = [C.c_uint64, SZ, C.c_int, C.c_int, P, P]
comms = (P * DEVICES)()
check(lib.ncclCommInitAll(comms, DEVICES, (C.c_int * DEVICES)(
    *range(DEVICES))), "ncclCommInitAll")
import struct

def floats(values):
    return struct.pack(f"{len(values)}f", *values)

def unfloats(data):
    return list(struct.unpack(f"{len(data) // 4}f", data))

def sync():
    for d in range(DEVICES):
        check(lib.cuCtxSetCurrent(ctx[d]), "set current")
        check(lib.cuCtxSynchronize(), "sync")
"""


def test_nccl_alltoall_moves_the_blocks_between_fake_devices() -> None:
    out = results(run(NCCL + r"""
n, block = DEVICES, 2
send, recv = [], []
for r in range(n):
    s = device_alloc(4 * n * block, r)
    to_device(s, floats([100 * r + i for i in range(n * block)]))
    send.append(s)
    recv.append(device_alloc(4 * n * block, r))
check(lib.ncclGroupStart(), "group start")
for r in range(n):
    check(lib.cuCtxSetCurrent(ctx[r]), "set current")
    check(lib.ncclAlltoAll(send[r], recv[r], block, FLOAT32, comms[r], None),
          "ncclAlltoAll")
check(lib.ncclGroupEnd(), "group end")
sync()
for r in range(n):
    print(f"rank {r}:", unfloats(from_device(recv[r], 4 * n * block)))
print("RCCL's spelling:", hasattr(lib, "ncclAllToAll"))
""", devices=3))
    # rank r's block j is rank j's block r (nccl.h)
    assert out["rank 0"] == "[0.0, 1.0, 100.0, 101.0, 200.0, 201.0]"
    assert out["rank 1"] == "[2.0, 3.0, 102.0, 103.0, 202.0, 203.0]"
    assert out["rank 2"] == "[4.0, 5.0, 104.0, 105.0, 204.0, 205.0]"
    assert out["RCCL's spelling"] == "False"


def test_nccl_allgather_broadcast_and_grouped_send_recv() -> None:
    out = results(run(NCCL + r"""
n = DEVICES
mine = [device_alloc(8, r) for r in range(n)]
for r in range(n):
    to_device(mine[r], floats([10 * r, 10 * r + 1]))
gathered = [device_alloc(8 * n, r) for r in range(n)]
for r in range(n):  # no group: each call is its own
    check(lib.cuCtxSetCurrent(ctx[r]), "set current")
    check(lib.ncclAllGather(mine[r], gathered[r], 2, FLOAT32, comms[r], None),
          "ncclAllGather")
sync()
print("gathered 1:", unfloats(from_device(gathered[1], 8 * n)))
got = [device_alloc(8, r) for r in range(n)]
for r in range(n):
    check(lib.cuCtxSetCurrent(ctx[r]), "set current")
    check(lib.ncclBroadcast(mine[r], got[r], 2, FLOAT32, 1, comms[r], None),
          "ncclBroadcast")
sync()
print("broadcast 0:", unfloats(from_device(got[0], 8)))
# a ring exchange: each rank sends to the next and receives from the last,
# both in one group (one group a rank, as XLA issues them)
ring = [device_alloc(8, r) for r in range(n)]
for r in range(n):
    check(lib.cuCtxSetCurrent(ctx[r]), "set current")
    check(lib.ncclGroupStart(), "group start")
    check(lib.ncclSend(mine[r], 2, FLOAT32, (r + 1) % n, comms[r], None),
          "ncclSend")
    check(lib.ncclRecv(ring[r], 2, FLOAT32, (r - 1) % n, comms[r], None),
          "ncclRecv")
    check(lib.ncclGroupEnd(), "group end")
sync()
print("ring 0:", unfloats(from_device(ring[0], 8)))
print("bad peer:", lib.ncclSend(mine[0], 2, FLOAT32, n, comms[0], None))
print("bad type:", lib.ncclAllGather(mine[0], gathered[0], 2, 99, comms[0],
                                     None))
""", devices=3))
    assert out["gathered 1"] == "[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]"
    assert out["broadcast 0"] == "[10.0, 11.0]"
    assert out["ring 0"] == "[20.0, 21.0]"
    assert out["bad peer"] == "4"  # ncclInvalidArgument
    assert out["bad type"] == "4"


def test_nccl_comm_query_properties_and_split() -> None:
    out = results(run(NCCL + r"""
class Props(C.Structure):  # ncclCommProperties_t's leading fields
    _fields_ = [("size", SZ), ("magic", C.c_uint), ("version", C.c_uint),
                ("rank", C.c_int), ("nRanks", C.c_int), ("cudaDev", C.c_int),
                ("nvmlDev", C.c_int), ("deviceApiSupport", C.c_bool),
                ("rest", C.c_char * 300)]
p = Props(size=C.sizeof(Props))
p.deviceApiSupport = True
comm = [P(c) for c in comms]
print("query:", lib.ncclCommQueryProperties(comm[1], C.byref(p)))
print("props:", p.rank, p.nRanks, p.cudaDev, p.deviceApiSupport)
# split ranks 0 and 2 off (color 0; rank 1 takes no part)
new = [P() for _ in range(DEVICES)]
for r, color in enumerate([0, -1, 0]):
    check(lib.ncclCommSplit(comm[r], color, 10 - r, C.byref(new[r]), None),
          "ncclCommSplit")
count, rank = C.c_int(), C.c_int()
check(lib.ncclCommCount(new[0], C.byref(count)), "count")
check(lib.ncclCommUserRank(new[0], C.byref(rank)), "rank")
print("split:", count.value, rank.value, new[1].value)
""", devices=3))
    assert out["query"] == "0"
    assert out["props"] == "1 3 1 False"
    # ordered by key: rank 2 (key 8) first, then rank 0 (key 10)
    assert out["split"] == "2 1 None"


def test_cublaslt_descriptors_and_algorithm_ids() -> None:
    out = results(run(r"""
handle, stream, got = P(), P(), P()
check(lib.cublasCreate_v2(C.byref(handle)), "cublasCreate")
check(lib.cuStreamCreate(C.byref(stream), 0), "stream")
check(lib.cublasSetStream_v2(handle, stream), "cublasSetStream")
check(lib.cublasGetStream_v2(handle, C.byref(got)), "cublasGetStream")
print("stream kept:", got.value == stream.value)
check(lib.cublasSetMathMode(handle, 4), "set math mode")  # TF32
mode = C.c_int(-1)
check(lib.cublasGetMathMode(handle, C.byref(mode)), "get math mode")
print("math mode:", mode.value)
check(lib.cublasDestroy_v2(handle), "cublasDestroy")
print("destroyed:", lib.cublasSetStream_v2(handle, stream))
layout = P()
check(lib.cublasLtMatrixLayoutCreate(C.byref(layout), 0, C.c_uint64(3),
                                     C.c_uint64(5), C.c_int64(7)), "layout")
rows, written = C.c_uint64(), SZ()
print("rows:", lib.cublasLtMatrixLayoutGetAttribute(
    layout, 2, C.byref(rows), SZ(8), C.byref(written)), rows.value)
desc = P()
check(lib.cublasLtMatmulDescCreate(C.byref(desc), 68, 0), "desc")
epilogue = C.c_uint32(2)  # CUBLASLT_EPILOGUE_RELU
check(lib.cublasLtMatmulDescSetAttribute(desc, 7, C.byref(epilogue),
                                         SZ(4)), "set epilogue")
got = C.c_uint32()
print("epilogue:", lib.cublasLtMatmulDescGetAttribute(
    desc, 7, C.byref(got), SZ(4), C.byref(written)), got.value)
print("wrong size:", lib.cublasLtMatmulDescGetAttribute(
    desc, 7, C.byref(got), SZ(8), C.byref(written)))
# (handle, computeType, scaleType, A, B, C, D types, requested, ids, count)
ids, n = (C.c_int * 4)(-1, -1, -1, -1), C.c_int()
print("ids:", lib.cublasLtMatmulAlgoGetIds(
    None, 68, 0, 0, 0, 0, 0, 4, ids, C.byref(n)), n.value, ids[0])
"""))
    assert out["stream kept"] == "True"
    assert out["math mode"] == "4"
    assert out["destroyed"] == "1"  # CUBLAS_STATUS_NOT_INITIALIZED
    assert out["rows"] == "0 3"
    assert out["epilogue"] == "0 2"
    assert out["wrong size"] == "7"  # CUBLAS_STATUS_INVALID_VALUE
    assert out["ids"] == "0 1 0"


# Two processes, one fake device each, meeting at one unique id: the
# script runs as rank 0, which starts rank 1 (the same script, given the
# id in hex) and prints rank 1's lines prefixed "rank1 ".
NCCL_PROCESSES = NCCL + r"""
import os, subprocess, time
UINT8 = 1
lib.ncclAllReduce.argtypes = [C.c_uint64, C.c_uint64, SZ, C.c_int, C.c_int,
                              P, P]

class UniqueId(C.Structure):
    _fields_ = [("internal", C.c_char * 128)]

uid = UniqueId()
if len(sys.argv) > 2:
    rank = 1
    C.memmove(C.byref(uid), bytes.fromhex(sys.argv[2]), 128)
else:
    rank = 0
    check(lib.ncclGetUniqueId(C.byref(uid)), "ncclGetUniqueId")
    child = subprocess.Popen(
        [sys.executable, sys.argv[0], LIBRARY, bytes(uid).hex()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
segment = bytes(uid).split(b"\0")[0].decode()
comm = P()
check(lib.ncclCommInitRank(C.byref(comm), 2, uid, rank), "ncclCommInitRank")

def pattern(r, n):
    return bytes((i * 7 + r * 101) % 251 for i in range(n))

def segment_exists(name):
    return os.path.exists("/dev/shm" + name)

def join_child():
    if rank != 0:
        return
    out, err = child.communicate(timeout=60)
    for line in out.splitlines():
        print("rank1 " + line)
    sys.stderr.write(err)
    print("child exit:", child.returncode)
"""


def run_processes(body: str, tmp_path) -> "subprocess.CompletedProcess[str]":
    env = dict(os.environ)
    env["JAXLAKE_FAKEGPU_COUNT"] = "1"
    script = tmp_path / "ranks.py"
    script.write_text("import sys\nLIBRARY = sys.argv[1]\nDEVICES = 1\n" +
                      PRELUDE + NCCL_PROCESSES + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), _library()], env=env,
                          capture_output=True, text=True, timeout=60)


def test_nccl_communicator_spans_two_processes(tmp_path) -> None:
    proc = run_processes(r"""
N = 3 << 19  # 1.5 MiB a rank: more than one round of staging
mine = device_alloc(N)
to_device(mine, pattern(rank, N))
gathered = device_alloc(2 * N)
check(lib.ncclAllGather(mine, gathered, N, UINT8, comm, None), "allgather")
check(lib.cuCtxSynchronize(), "sync")
print("gather:", from_device(gathered, 2 * N) == pattern(0, N) + pattern(1, N))
# all-to-all: rank r's block j is rank j's block r
blocks = device_alloc(16)
to_device(blocks, bytes([10 * rank + i for i in range(16)]))
swapped = device_alloc(16)
check(lib.ncclAlltoAll(blocks, swapped, 8, UINT8, comm, None), "alltoall")
got = device_alloc(N)
check(lib.ncclBroadcast(mine, got, N, UINT8, 1, comm, None), "broadcast")
# an all-reduce is accepted (it computes: a kernel, which does not run)
print("allreduce:", lib.ncclAllReduce(mine, got, 0, UINT8, 0, comm, None))
# a send and a receive each way in one group, of several mailbox chunks
M = 600 << 10
sent, received = device_alloc(M), device_alloc(M)
to_device(sent, pattern(rank + 5, M))
check(lib.ncclGroupStart(), "group start")
check(lib.ncclSend(sent, M, UINT8, 1 - rank, comm, None), "send")
check(lib.ncclRecv(received, M, UINT8, 1 - rank, comm, None), "recv")
check(lib.ncclGroupEnd(), "group end")
check(lib.cuCtxSynchronize(), "sync")
print("alltoall:", list(from_device(swapped, 16)))
print("broadcast:", from_device(got, N) == pattern(1, N))
print("sendrecv:", from_device(received, M) == pattern(6 - rank, M))
err = C.c_int(-1)
check(lib.ncclCommGetAsyncError(comm, C.byref(err)), "async error")
print("async error:", err.value)
print("segment while open:", segment_exists(segment))
check(lib.ncclCommDestroy(comm), "destroy")
join_child()
if rank == 0:
    print("segment after both destroyed:", segment_exists(segment))
""", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = results(proc.stdout)
    assert out["child exit"] == "0", proc.stdout + proc.stderr
    for prefix in ("", "rank1 "):
        assert out[prefix + "gather"] == "True"
        assert out[prefix + "broadcast"] == "True", proc.stdout
        assert out[prefix + "sendrecv"] == "True"
        assert out[prefix + "allreduce"] == "0"
        assert out[prefix + "async error"] == "0"
        assert out[prefix + "segment while open"] == "True"
    assert out["alltoall"] == str([0, 1, 2, 3, 4, 5, 6, 7,
                                   10, 11, 12, 13, 14, 15, 16, 17])
    assert out["rank1 alltoall"] == str([8, 9, 10, 11, 12, 13, 14, 15,
                                         18, 19, 20, 21, 22, 23, 24, 25])
    assert out["segment after both destroyed"] == "False"


def test_nccl_split_of_a_communicator_spanning_processes_keeps_the_parent(
        tmp_path) -> None:
    # rank 0 splits off alone; rank 1 takes no part (NCCL_SPLIT_NOCOLOR)
    proc = run_processes(r"""
N = 4096
mine, gathered = device_alloc(N), device_alloc(2 * N)
to_device(mine, pattern(rank, N))
check(lib.ncclAllGather(mine, gathered, N, UINT8, comm, None), "allgather")
check(lib.cuCtxSynchronize(), "sync")  # both ranks have joined
alone = P(1234)
start = time.monotonic()
check(lib.ncclCommSplit(comm, 0 if rank == 0 else -1, 0, C.byref(alone),
                        None), "ncclCommSplit")
print("split returned within a second:", time.monotonic() - start < 1)
if rank == 0:
    count = C.c_int()
    check(lib.ncclCommCount(alone, C.byref(count)), "count")
    own = device_alloc(N)
    check(lib.ncclAllGather(mine, own, N, UINT8, alone, None), "allgather")
    check(lib.cuCtxSynchronize(), "sync")
    print("alone:", count.value, from_device(own, N) == pattern(0, N))
    check(lib.ncclCommDestroy(alone), "destroy")
else:
    print("no color:", alone.value)
err = C.c_int(-1)
check(lib.ncclCommGetAsyncError(comm, C.byref(err)), "async error")
print("async error:", err.value)
to_device(gathered, bytes(2 * N))
check(lib.ncclAllGather(mine, gathered, N, UINT8, comm, None), "allgather")
check(lib.cuCtxSynchronize(), "sync")
print("gather after:",
      from_device(gathered, 2 * N) == pattern(0, N) + pattern(1, N))
check(lib.ncclCommDestroy(comm), "destroy")
join_child()
""", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = results(proc.stdout)
    assert out["child exit"] == "0", proc.stdout + proc.stderr
    assert out["alone"] == "1 True"
    assert out["rank1 no color"] == "None"
    for prefix in ("", "rank1 "):
        assert out[prefix + "split returned within a second"] == "True"
        assert out[prefix + "async error"] == "0"
        assert out[prefix + "gather after"] == "True"


def test_nccl_split_whose_peer_process_died_fails(tmp_path) -> None:
    proc = run_processes(r"""
N = 64
mine, gathered = device_alloc(N), device_alloc(2 * N)
check(lib.ncclAllGather(mine, gathered, N, UINT8, comm, None), "allgather")
check(lib.cuCtxSynchronize(), "sync")  # both ranks have joined
if rank == 1:
    os._exit(0)  # never splits
join_child()
new = P()
start = time.monotonic()
print("split:", lib.ncclCommSplit(comm, 0, 0, C.byref(new), None), new.value)
print("bounded:", time.monotonic() - start < 10)
err = C.c_int(-1)
check(lib.ncclCommGetAsyncError(comm, C.byref(err)), "async error")
print("async error:", err.value)
check(lib.ncclCommDestroy(comm), "destroy")
""", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = results(proc.stdout)
    assert out["split"] == "6 None", proc.stdout + proc.stderr  # RemoteError
    assert out["bounded"] == "True"
    assert out["async error"] == "6"
    assert "ncclCommSplit: rank 1" in proc.stderr, proc.stderr


# Four ranks in two processes, two fake devices each (process p holds
# ranks 2p and 2p + 1, one thread a rank: a split waits for every rank).
NCCL_SPLIT_RANKS = r"""
import os, subprocess, threading
UINT8, NOCOLOR, N = 1, -1, 3000
lib.ncclAllGather.argtypes = [C.c_uint64, C.c_uint64, SZ, C.c_int, P, P]

class UniqueId(C.Structure):
    _fields_ = [("internal", C.c_char * 128)]

uid = UniqueId()
if len(sys.argv) > 2:
    process = 1
    C.memmove(C.byref(uid), bytes.fromhex(sys.argv[2]), 128)
else:
    process = 0
    check(lib.ncclGetUniqueId(C.byref(uid)), "ncclGetUniqueId")
    child = subprocess.Popen(
        [sys.executable, sys.argv[0], LIBRARY, bytes(uid).hex()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

def pattern(r, n):
    return bytes((i * 7 + r * 101) % 251 for i in range(n))

lines = []

def gather(comm, d, rank):
    n, r = C.c_int(), C.c_int()
    check(lib.ncclCommCount(comm, C.byref(n)), "count")
    check(lib.ncclCommUserRank(comm, C.byref(r)), "user rank")
    mine = device_alloc(N, d)
    to_device(mine, pattern(rank, N))
    got = device_alloc(n.value * N, d)
    check(lib.ncclAllGather(mine, got, N, UINT8, comm, None), "allgather")
    check(lib.cuCtxSynchronize(), "sync")
    return n.value, r.value, from_device(got, n.value * N)

def rank_main(d):
    rank = 2 * process + d
    check(lib.cuCtxSetCurrent(ctx[d]), "set current")
    comm = P()
    check(lib.ncclCommInitRank(C.byref(comm), 4, uid, rank), "init")
    # by parity, keys reversed: parent rank c + 2 is rank 0 of color c
    parity = P()
    check(lib.ncclCommSplit(comm, rank % 2, 10 - rank, C.byref(parity),
                            None), "split by parity")
    n, r, got = gather(parity, d, rank)
    c = rank % 2
    lines.append(f"rank{rank} parity: {n} {r} "
                 f"{got == pattern(c + 2, N) + pattern(c, N)}")
    # again, rank 3 taking no part: ranks 0, 1, 2 in parent order
    three = P(1)
    check(lib.ncclCommSplit(comm, NOCOLOR if rank == 3 else 5, 0,
                            C.byref(three), None), "split without 3")
    if rank == 3:
        lines.append(f"rank3 no color: {three.value}")
    else:
        n, r, got = gather(three, d, rank)
        lines.append(f"rank{rank} three: {n} {r} "
                     f"{got == pattern(0, N) + pattern(1, N) + pattern(2, N)}")
        check(lib.ncclCommDestroy(three), "destroy")
    check(lib.ncclCommDestroy(parity), "destroy")
    check(lib.ncclCommDestroy(comm), "destroy")

threads = [threading.Thread(target=rank_main, args=(d,)) for d in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for line in lines:
    print(line)
if process == 0:
    out, err = child.communicate(timeout=60)
    sys.stdout.write(out)
    sys.stderr.write(err)
    print("child exit:", child.returncode)
"""


def test_nccl_split_across_processes_by_parity(tmp_path) -> None:
    env = dict(os.environ)
    env["JAXLAKE_FAKEGPU_COUNT"] = "2"
    script = tmp_path / "split.py"
    script.write_text("import sys\nLIBRARY = sys.argv[1]\nDEVICES = 2\n" +
                      PRELUDE + NCCL_SPLIT_RANKS)
    proc = subprocess.run([sys.executable, str(script), _library()], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = results(proc.stdout)
    assert out["child exit"] == "0", proc.stdout + proc.stderr
    assert out["rank0 parity"] == "2 1 True", proc.stdout + proc.stderr
    assert out["rank1 parity"] == "2 1 True"
    assert out["rank2 parity"] == "2 0 True"
    assert out["rank3 parity"] == "2 0 True"
    for rank in range(3):
        assert out[f"rank{rank} three"] == f"3 {rank} True", proc.stdout
    assert out["rank3 no color"] == "None"


def test_nccl_peer_process_that_died_fails_the_communicator(tmp_path) -> None:
    proc = run_processes(r"""
import signal
if rank == 1:
    os._exit(3)  # dies after joining, before any collective
N = 64
mine, gathered = device_alloc(N), device_alloc(2 * N)
start = time.monotonic()
check(lib.ncclAllGather(mine, gathered, N, UINT8, comm, None), "allgather")
check(lib.cuCtxSynchronize(), "sync")
print("bounded:", time.monotonic() - start < 10)
err = C.c_int(-1)
check(lib.ncclCommGetAsyncError(comm, C.byref(err)), "async error")
print("async error:", err.value)
print("next call:", lib.ncclAllGather(mine, gathered, N, UINT8, comm, None))
check(lib.ncclCommDestroy(comm), "destroy")
print("segment after destroy:", segment_exists(segment))
join_child()
# a killed run's segment: a process that joins and is killed leaves it;
# the next ncclGetUniqueId removes it
killed = subprocess.run([sys.executable, "-c", '''
import ctypes as C, os, signal, sys
lib = C.CDLL(sys.argv[1])
class UniqueId(C.Structure):
    _fields_ = [("internal", C.c_char * 128)]
uid, comm = UniqueId(), C.c_void_p()
assert lib.ncclGetUniqueId(C.byref(uid)) == 0
assert lib.ncclCommInitRank(C.byref(comm), 2, uid, 0) == 0
print(bytes(uid).split(b"\\0")[0].decode(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
''', LIBRARY], capture_output=True, text=True, timeout=30)
stale = killed.stdout.strip()
print("killed run's segment:", segment_exists(stale))
check(lib.ncclGetUniqueId(C.byref(UniqueId())), "ncclGetUniqueId")
print("after a new id:", segment_exists(stale))
""", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = results(proc.stdout)
    assert out["child exit"] == "3"
    assert out["bounded"] == "True", proc.stderr
    assert out["async error"] == "6"  # ncclRemoteError
    assert out["next call"] == "6"
    assert "rank 1 (process" in proc.stderr and "exited" in proc.stderr
    assert out["segment after destroy"] == "False"
    assert out["killed run's segment"] == "True"
    assert out["after a new id"] == "False"


def test_nccl_collectives_across_processes_run_in_issue_order(tmp_path
                                                              ) -> None:
    # Rank 0 issues its first all-gather on a stream held back by a host
    # flag, its second on another stream; rank 1 issues both on one stream.
    # The second may not run (and meet rank 1's first) before the first.
    proc = run_processes(r"""
N = 64
a, b = device_alloc(N), device_alloc(N)
to_device(a, bytes([10 + rank]) * N)
to_device(b, bytes([20 + rank]) * N)
ga, gb = device_alloc(2 * N), device_alloc(2 * N)
first, second = P(), P()
check(lib.cuStreamCreate(C.byref(first), 0), "stream")
check(lib.cuStreamCreate(C.byref(second), 0), "stream")
flag = P()
check(lib.cuMemHostAlloc(C.byref(flag), SZ(4096), 0), "host alloc")
C.c_uint32.from_address(flag.value).value = 0
if rank == 0:  # held until the flag is 1 (CU_STREAM_WAIT_VALUE_GEQ)
    check(lib.cuStreamWaitValue32(first, C.c_uint64(flag.value),
                                  C.c_uint32(1), 0), "hold")
check(lib.ncclAllGather(a, ga, N, UINT8, comm, first), "allgather a")
check(lib.ncclAllGather(b, gb, N, UINT8, comm, second if rank == 0
                        else first), "allgather b")
time.sleep(0.3)
C.c_uint32.from_address(flag.value).value = 1
check(lib.cuCtxSynchronize(), "sync")
print("first:", from_device(ga, 2 * N) == bytes([10]) * N + bytes([11]) * N)
print("second:", from_device(gb, 2 * N) == bytes([20]) * N + bytes([21]) * N)
check(lib.ncclCommDestroy(comm), "destroy")
join_child()
""", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = results(proc.stdout)
    assert out["child exit"] == "0", proc.stdout + proc.stderr
    for prefix in ("", "rank1 "):
        assert out[prefix + "first"] == "True", proc.stdout
        assert out[prefix + "second"] == "True", proc.stdout
