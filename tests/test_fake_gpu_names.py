"""Entry points of the fake GPU that answer as a GPU without the feature
would (cc/fakegpu: runtime.cc, memory.cc, device.cc): the calls succeed or
return the error NVIDIA's headers document, and none of them is a "not
supported" stub (which would name itself on stderr).

Each case calls libjaxlake_fakegpu.so through ctypes in a fresh
interpreter, with the structures laid out as NVIDIA's public headers
declare them.
"""

from __future__ import annotations

import subprocess
from typing import Dict

import fakegpu_util
from fakegpu_util import NEEDS_FAKE_GPU, library_run


pytestmark = NEEDS_FAKE_GPU


PRELUDE = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


def run_case(script: str) -> "subprocess.CompletedProcess[str]":
    return library_run(script, prelude=PRELUDE,
                       env={"JAXLAKE_FAKEGPU_LOG": "stderr"})


def result(proc: "subprocess.CompletedProcess[str]") -> Dict:
    """The RESULT line, once the program exited 0 and named no call the
    fake does not implement."""
    assert "not supported by the fake" not in proc.stderr, proc.stderr
    return fakegpu_util.result(proc)


def test_runtime_stream_priority_range() -> None:
    out = result(run_case("""
    least, greatest = ctypes.c_int(7), ctypes.c_int(7)
    r = lib.cudaDeviceGetStreamPriorityRange(ctypes.byref(least),
                                             ctypes.byref(greatest))
    dl, dg = ctypes.c_int(7), ctypes.c_int(7)
    lib.cuCtxGetStreamPriorityRange(ctypes.byref(dl), ctypes.byref(dg))
    report(r=r, least=least.value, greatest=greatest.value,
           driver=[dl.value, dg.value])
    """))
    assert out["r"] == 0
    assert [out["least"], out["greatest"]] == out["driver"] == [0, -5]


def test_no_multicast_attribute_and_granularity() -> None:
    out = result(run_case("""
    assert lib.cuInit(0) == 0
    v = ctypes.c_int(-1)
    attr = lib.cuDeviceGetAttribute(ctypes.byref(v), 132, 0)
    class Prop(ctypes.Structure):  # CUmulticastObjectProp
        _fields_ = [("numDevices", ctypes.c_uint), ("size", ctypes.c_size_t),
                    ("handleTypes", ctypes.c_ulonglong),
                    ("flags", ctypes.c_ulonglong)]
    g = ctypes.c_size_t(0)
    prop = Prop(numDevices=1, size=2 << 20)
    r = lib.cuMulticastGetGranularity(ctypes.byref(g), ctypes.byref(prop), 1)
    bad = lib.cuMulticastGetGranularity(None, ctypes.byref(prop), 1)
    report(attr=attr, supported=v.value, r=r, bad=bad)
    """))
    assert out["attr"] == 0 and out["supported"] == 0
    assert out["r"] == 801   # CUDA_ERROR_NOT_SUPPORTED
    assert out["bad"] == 1   # CUDA_ERROR_INVALID_VALUE


def test_nvml_fabric_field_values_and_confidential_computing() -> None:
    out = result(run_case("""
    assert lib.nvmlInit_v2() == 0
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
    # nvmlGpuFabricInfo_v2_t, state preset as XLA presets it
    class FabricV2(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint),
                    ("uuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int),
                    ("clique", ctypes.c_uint), ("state", ctypes.c_ubyte),
                    ("health", ctypes.c_uint)]
    assert ctypes.sizeof(FabricV2) == 36
    f = FabricV2(version=36 | 2 << 24, state=9, clique=7)
    fabric = lib.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(f))
    old = FabricV2(version=28 | 1 << 24)
    fabric_old_version = lib.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(old))
    class Field(ctypes.Structure):  # nvmlFieldValue_t
        _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint),
                    ("timestamp", ctypes.c_longlong),
                    ("latencyUsec", ctypes.c_longlong),
                    ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                    ("value", ctypes.c_ulonglong)]
    fields = (Field * 2)()
    fields[0].fieldId = 91      # NVML_FI_DEV_NVLINK_LINK_COUNT
    fields[1].fieldId = 186     # NVML_FI_DEV_POWER_INSTANT
    fields[0].value = fields[1].value = 99
    fv = lib.nvmlDeviceGetFieldValues(h, 2, fields)
    fv_bad = lib.nvmlDeviceGetFieldValues(ctypes.c_void_p(12345), 1, fields)
    cc = (ctypes.c_uint * 3)(5, 5, 5)
    conf = lib.nvmlSystemGetConfComputeState(cc)
    report(fabric=fabric, state=f.state, clique=f.clique,
           fabric_old_version=fabric_old_version,
           fv=fv, fv_bad=fv_bad,
           returns=[fields[0].nvmlReturn, fields[1].nvmlReturn],
           links=fields[0].value, stamped=fields[0].timestamp > 0,
           conf=conf, cc=list(cc))
    """))
    assert out["fabric"] == 0 and out["state"] == 0 and out["clique"] == 0
    assert out["fabric_old_version"] == 25  # ARGUMENT_VERSION_MISMATCH
    assert out["fv"] == 0 and out["fv_bad"] == 2
    assert out["returns"] == [0, 3] and out["links"] == 0
    assert out["stamped"]
    assert out["conf"] == 0 and out["cc"] == [0, 0, 0]


def test_nvml_mig_mode_is_disabled() -> None:
    # jax 0.12's start-up asks NVML for the MIG mode: an H100 or H200 with
    # MIG disabled answers NVML_DEVICE_MIG_DISABLE (0), current and pending.
    out = result(run_case("""
    assert lib.nvmlInit_v2() == 0
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
    cur, pend = ctypes.c_uint(7), ctypes.c_uint(7)
    r = lib.nvmlDeviceGetMigMode(h, ctypes.byref(cur), ctypes.byref(pend))
    null = lib.nvmlDeviceGetMigMode(h, None, ctypes.byref(pend))
    bad = lib.nvmlDeviceGetMigMode(ctypes.c_void_p(12345), ctypes.byref(cur),
                                   ctypes.byref(pend))
    report(r=r, cur=cur.value, pend=pend.value, null=null, bad=bad)
    """))
    assert out["r"] == 0 and out["cur"] == 0 and out["pend"] == 0
    assert out["null"] == 2 and out["bad"] == 2  # INVALID_ARGUMENT
