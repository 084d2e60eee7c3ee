"""The fake GPU's cuFFT, cuSOLVER and cuSPARSE, and JAX's FFTs, dense linear
algebra and sparse products over them.

The first tests drive libjaxlake_fakegpu.so through ctypes, by NVIDIA's
names, signatures and enum values (cufft.h, cusolverDn.h, cusparse.h), each
in a subprocess of its own (test_fake_gpu_libs.run). The workspace figures
they expect are the fake's rules (cc/fakegpu/README.md), not NVIDIA's. The
last runs one JAX program doing each operation under `jaxlake run
--fake-gpu`, with the lake and without it.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
from typing import Dict

import pytest

from fakegpu_util import PRELUDE, ROOT, fake_run, jax_reason, result
from test_fake_gpu_libs import results, run

NAMES_INC = ROOT / "cc" / "fakegpu" / "names.inc"


def test_cufft_work_area_is_the_callers_or_the_plans_own() -> None:
    out = results(run(r"""
C2C, R2C = 0x29, 0x2a
lib.jaxlake_fakegpu_used.restype = C.c_ulonglong
used = lambda: lib.jaxlake_fakegpu_used(0)
# XLA's way: no auto-allocation, the caller's work area
plan, size = C.c_int(), SZ()
check(lib.cufftCreate(C.byref(plan)), "create")
check(lib.cufftSetAutoAllocation(plan, 0), "auto off")
before = used()
n = (C.c_longlong * 1)(64)
print("make:", lib.cufftMakePlanMany64(plan, 1, n, None, C.c_longlong(1),
      C.c_longlong(64), None, C.c_longlong(1), C.c_longlong(64), C2C,
      C.c_longlong(32), C.byref(size)), size.value)
print("allocated:", used() - before)
got = SZ()
check(lib.cufftGetSize(plan, C.byref(got)), "get size")
print("get size:", got.value)
data = device_alloc(32 * 64 * 8)
print("no work area:", lib.cufftExecC2C(plan, C.c_uint64(data),
                                        C.c_uint64(data), -1))
work = device_alloc(size.value)
check(lib.cufftSetWorkArea(plan, C.c_uint64(work)), "set work area")
print("exec:", lib.cufftExecC2C(plan, C.c_uint64(data), C.c_uint64(data), -1))
host = C.create_string_buffer(32 * 64 * 8)
print("host data:", lib.cufftExecC2C(plan, host, C.c_uint64(data), -1))
print("wrong kind:", lib.cufftExecR2C(plan, C.c_uint64(data),
                                      C.c_uint64(data)))
print("direction:", lib.cufftExecC2C(plan, C.c_uint64(data),
                                     C.c_uint64(data), 0))
print("made twice:", lib.cufftMakePlan1d(plan, 64, C2C, 1, C.byref(size)))
check(lib.cufftDestroy(plan), "destroy")
print("destroy again:", lib.cufftDestroy(plan))
print("unknown plan:", lib.cufftSetStream(12345, None))
# cuFFT's default: the plan allocates its work area, and frees it
auto = C.c_int()
real = device_alloc(8 * 1024 * 4)
before = used()
check(lib.cufftPlan1d(C.byref(auto), 1024, R2C, 8), "plan1d")
print("auto allocated:", used() - before)
check(lib.cufftGetSize(auto, C.byref(got)), "get size")
print("auto size:", got.value)
print("auto exec:", lib.cufftExecR2C(auto, C.c_uint64(real),
                                     C.c_uint64(data)))
check(lib.cufftDestroy(auto), "destroy auto")
print("freed:", used() - before)
est = SZ()
print("estimate:", lib.cufftEstimate1d(1024, 0x6a, 8, C.byref(est)),
      est.value)  # D2Z
print("bad type:", lib.cufftEstimate1d(64, 7, 1, C.byref(est)))
print("bad size:", lib.cufftEstimate1d(0, C2C, 1, C.byref(est)))
"""))
    # the rule: batch x complex elements x 8 bytes (single precision)
    assert out["make"] == f"0 {32 * 64 * 8}"
    assert out["allocated"] == "0"
    assert out["get size"] == str(32 * 64 * 8)
    assert out["no work area"] == "13"  # CUFFT_NO_WORKSPACE
    assert out["exec"] == "0"
    assert out["host data"] == "4"  # CUFFT_INVALID_VALUE
    assert out["wrong kind"] == "4"
    assert out["direction"] == "4"
    assert out["made twice"] == "1"  # CUFFT_INVALID_PLAN
    assert out["destroy again"] == "1"
    assert out["unknown plan"] == "1"
    # R2C of 1024 points: 513 complex elements a transform, 8 transforms
    assert out["auto size"] == str(8 * 513 * 8)
    assert int(out["auto allocated"]) >= 8 * 513 * 8
    assert out["auto exec"] == "0"
    assert out["freed"] == "0"
    assert out["estimate"] == f"0 {8 * 513 * 16}"
    assert out["bad type"] == "3"  # CUFFT_INVALID_TYPE
    assert out["bad size"] == "8"  # CUFFT_INVALID_SIZE


def test_cusolver_workspace_queries_and_checked_solvers() -> None:
    out = results(run(r"""
I = C.c_int
h, stream, got = P(), P(), P()
check(lib.cusolverDnCreate(C.byref(h)), "create")
check(lib.cuStreamCreate(C.byref(stream), 0), "stream")
check(lib.cusolverDnSetStream(h, stream), "set stream")
check(lib.cusolverDnGetStream(h, C.byref(got)), "get stream")
print("stream kept:", got.value == stream.value)
lwork = I()
m, n = 48, 40
print("getrf:", lib.cusolverDnSgetrf_bufferSize(h, m, n, None, m,
                                                C.byref(lwork)), lwork.value)
print("syevd:", lib.cusolverDnDsyevd_bufferSize(h, 1, 0, 10, None, 10, None,
                                                C.byref(lwork)), lwork.value)
print("gesvd:", lib.cusolverDnSgesvd_bufferSize(h, m, n, C.byref(lwork)),
      lwork.value)
info = P()
check(lib.cusolverDnCreateSyevjInfo(C.byref(info)), "syevj info")
print("syevj batched:", lib.cusolverDnSsyevjBatched_bufferSize(
    h, 1, 0, 8, None, 8, None, C.byref(lwork), info, 3), lwork.value)
print("syevj too big:", lib.cusolverDnSsyevjBatched_bufferSize(
    h, 1, 0, 40, None, 40, None, C.byref(lwork), info, 3))
check(lib.cusolverDnDestroySyevjInfo(info), "destroy info")
print("stale info:", lib.cusolverDnSsyevjBatched_bufferSize(
    h, 1, 0, 8, None, 8, None, C.byref(lwork), info, 3))
params = P()
check(lib.cusolverDnCreateParams(C.byref(params)), "params")
dev, hst = SZ(), SZ()
# (handle, params, jobz, uplo, n, typeA, A, lda, typeW, W, compute, ...)
lib.cusolverDnXsyevd_bufferSize.argtypes = [
    P, P, I, I, I64, I, P, I64, I, P, I, C.POINTER(SZ), C.POINTER(SZ)]
print("Xsyevd:", lib.cusolverDnXsyevd_bufferSize(
    h, params, 1, 0, 10, 1, None, 10, 1, None, 1, C.byref(dev),
    C.byref(hst)), dev.value, hst.value)
# a factorization over device memory, then its failures
a = device_alloc(m * n * 4)
ipiv, dinfo = device_alloc(4 * n), device_alloc(4)
check(lib.cusolverDnSgeqrf_bufferSize(h, m, n, C.c_uint64(a), m,
                                      C.byref(lwork)), "geqrf size")
print("geqrf lwork:", lwork.value)
work = device_alloc(4 * lwork.value)
tau = device_alloc(4 * n)
geqrf = lambda A, W, L: lib.cusolverDnSgeqrf(h, m, n, A, m, C.c_uint64(tau),
                                              W, L, C.c_uint64(dinfo))
print("geqrf:", geqrf(C.c_uint64(a), C.c_uint64(work), lwork.value))
host = C.create_string_buffer(m * n * 4)
print("host matrix:", geqrf(host, C.c_uint64(work), lwork.value))
print("short work:", geqrf(C.c_uint64(a), C.c_uint64(work), lwork.value - 1))
check(lib.cusolverDnSgetrf_bufferSize(h, m, n, None, m, C.byref(lwork)),
      "getrf size")
print("getrf run:", lib.cusolverDnSgetrf(h, m, n, C.c_uint64(a), m,
      C.c_uint64(device_alloc(4 * lwork.value)), C.c_uint64(ipiv),
      C.c_uint64(dinfo)))
print("small lda:", lib.cusolverDnSgetrf_bufferSize(h, m, n, None, m - 1,
                                                    C.byref(lwork)))
check(lib.cusolverDnDestroyParams(params), "destroy params")
check(lib.cusolverDnDestroy(h), "destroy")
print("destroy again:", lib.cusolverDnDestroy(h))
print("destroyed handle:", lib.cusolverDnSgesvd_bufferSize(h, m, n,
                                                           C.byref(lwork)))
# an entry point the fake leaves as a stub (sparse cuSOLVER)
print("not supported:", lib.cusolverSpCreate(C.byref(P())))
"""))
    assert out["stream kept"] == "True"
    # the rule: nb = 64 columns a panel, in elements
    assert out["getrf"] == f"0 {64 * 40}"
    assert out["syevd"] == f"0 {1 + 6 * 10 + 2 * 10 * 10}"
    assert out["gesvd"] == f"0 {max(3 * 40 + 48, 5 * 40) + 64 * (48 + 40)}"
    assert out["syevj batched"] == f"0 {2 * 8 * 8 * 3}"
    assert out["syevj too big"] == "3"  # CUSOLVER_STATUS_INVALID_VALUE
    assert out["stale info"] == "3"
    assert out["Xsyevd"] == f"0 {(1 + 6 * 10 + 2 * 10 * 10) * 8} 0"
    assert out["geqrf lwork"] == str(64 * 40)
    assert out["geqrf"] == "0"
    assert out["host matrix"] == "3"
    assert out["short work"] == "3"
    assert out["getrf run"] == "0"
    assert out["small lda"] == "3"
    assert out["destroy again"] == "3"
    assert out["destroyed handle"] == "1"  # CUSOLVER_STATUS_NOT_INITIALIZED
    assert out["not supported"] == "9"  # CUSOLVER_STATUS_NOT_SUPPORTED


def test_cusparse_descriptors_buffers_and_products() -> None:
    out = results(run(r"""
I = C.c_int
R32F, IDX32, ROW = 0, 2, 2
h = P()
check(lib.cusparseCreate(C.byref(h)), "create")
lib.cusparseCreateCsr.argtypes = [C.POINTER(P), I64, I64, I64, P, P, P, I, I,
                                  I, I]
lib.cusparseCreateDnMat.argtypes = [C.POINTER(P), I64, I64, I64, P, I, I]
lib.cusparseSpMM_bufferSize.argtypes = [P, I, I, P, P, P, P, P, I, I,
                                        C.POINTER(SZ)]
lib.cusparseSpMM.argtypes = [P, I, I, P, P, P, P, P, I, I, P]
lib.cusparseGetErrorString.restype = C.c_char_p
lib.cusparseGetErrorName.restype = C.c_char_p
rows, cols, k, nnz = 30, 20, 8, 50
one, zero = C.c_float(1), C.c_float(0)

def matrices(offsets, columns, values, b, c):
    A, B, Cm = P(), P(), P()
    check(lib.cusparseCreateCsr(C.byref(A), rows, cols, nnz, offsets,
          columns, values, IDX32, IDX32, 0, R32F), "csr")
    check(lib.cusparseCreateDnMat(C.byref(B), cols, k, k, b, R32F, ROW), "B")
    check(lib.cusparseCreateDnMat(C.byref(Cm), rows, k, k, c, R32F, ROW),
          "C")
    return A, B, Cm

# sized over host memory, as jaxlib does
val = C.create_string_buffer(16)
A, B, Cm = matrices(*[C.addressof(val)] * 5)
size = SZ()
print("spmm size:", lib.cusparseSpMM_bufferSize(
    h, 0, 0, C.byref(one), A, B, C.byref(zero), Cm, R32F, 0, C.byref(size)),
    size.value)
print("host run:", lib.cusparseSpMM(h, 0, 0, C.byref(one), A, B,
      C.byref(zero), Cm, R32F, 0, C.c_void_p(device_alloc(size.value))))
for d in (A,):
    check(lib.cusparseDestroySpMat(d), "destroy A")
print("destroy again:", lib.cusparseDestroySpMat(A))
# over device memory
dev = [device_alloc(n) for n in (4 * (rows + 1), 4 * nnz, 4 * nnz,
                                 4 * cols * k, 4 * rows * k)]
A2, B2, C2 = matrices(*dev)
buf = device_alloc(size.value)
print("device run:", lib.cusparseSpMM(h, 0, 0, C.byref(one), A2, B2,
      C.byref(zero), C2, R32F, 0, C.c_void_p(buf)))
print("no buffer:", lib.cusparseSpMM(h, 0, 0, C.byref(one), A2, B2,
      C.byref(zero), C2, R32F, 0, None))
print("shapes:", lib.cusparseSpMM_bufferSize(
    h, 0, 0, C.byref(one), A2, C2, C.byref(zero), C2, R32F, 0,
    C.byref(size)))
# the tridiagonal solver jax.lax.linalg.tridiagonal_solve calls
print("gtsv2 size:", lib.cusparseSgtsv2_bufferSizeExt(
    h, 64, 2, None, None, None, None, 64, C.byref(size)), size.value)
diag = [C.c_void_p(device_alloc(4 * 64)) for _ in range(3)]
rhs = C.c_void_p(device_alloc(4 * 64 * 2))
print("gtsv2:", lib.cusparseSgtsv2(h, 64, 2, *diag, rhs, 64,
                                   C.c_void_p(device_alloc(size.value))))
print("gtsv2 m=2:", lib.cusparseSgtsv2_bufferSizeExt(
    h, 2, 1, None, None, None, None, 2, C.byref(size)))
check(lib.cusparseDestroy(h), "destroy")
print("destroy handle again:", lib.cusparseDestroy(h))
print("string:", lib.cusparseGetErrorString(10).decode())
print("name:", lib.cusparseGetErrorName(3).decode())
"""))
    # the rule: 8 (rows + 1) + nnz elements of the compute type
    assert out["spmm size"] == f"0 {8 * 31 + 50 * 4}"
    assert out["host run"] == "3"  # CUSPARSE_STATUS_INVALID_VALUE
    assert out["destroy again"] == "3"
    assert out["device run"] == "0"
    assert out["no buffer"] == "3"
    assert out["shapes"] == "3"
    assert out["gtsv2 size"] == f"0 {64 * (2 + 4) * 4}"
    assert out["gtsv2"] == "0"
    assert out["gtsv2 m=2"] == "3"
    assert out["destroy handle again"] == "3"
    assert out["string"] == "operation not supported"
    assert out["name"] == "CUSPARSE_STATUS_INVALID_VALUE"


def test_every_string_function_is_implemented() -> None:
    # names.inc's STRING lines return a string, not a status; the weak
    # stand-in says "not supported", so each must be implemented.
    names = re.findall(r"^JAXLAKE_FAKEGPU_STRING\(\w+, (\w+)\)",
                       NAMES_INC.read_text(), re.M)
    assert "cusparseGetErrorString" in names and "nvmlErrorString" in names
    out = results(run(f"""
for name in {names!r}:
    f = getattr(lib, name)
    f.restype = C.c_char_p
    f.argtypes = [C.c_int]
    text = f(0)
    print(name + ":", repr(text.decode()) if text is not None else None)
"""))
    assert set(out) == set(names)
    for name, text in out.items():
        # ncclGetLastError's message is empty while no error occurred
        empty = "''" if name == "ncclGetLastError" else None
        assert text not in ("None", "''") or text == empty, (name, text)
        assert "not supported" not in text, (name, text)


@pytest.mark.skipif(jax_reason() is not None, reason=str(jax_reason()))
def test_names_inc_covers_the_installed_plugin() -> None:
    # Every name the installed plugin looks up is listed (under whichever
    # library's line), and exactly the string functions are STRING lines.
    proc = subprocess.run([sys.executable,
                           str(ROOT / "cc" / "fakegpu" / "gen_names.py"),
                           "--check"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


PROGRAM = PRELUDE + """
from jax.experimental import sparse
jax.config.update("jax_bcoo_cusparse_lowering", True)
rng = np.random.default_rng(0)
a = jnp.asarray(rng.standard_normal((48, 40)), jnp.float32)
sq = jnp.asarray(rng.standard_normal((40, 40)), jnp.float32)
spd = sq @ sq.T + 40 * jnp.eye(40)
small = jnp.stack([spd[:8, :8]] * 3)   # batched: the Jacobi and batched calls
dl = jnp.ones(40).at[0].set(0)
du = jnp.ones(40).at[-1].set(0)
coo = sparse.BCOO.fromdense(jnp.eye(40) * 2).sort_indices()
csr = sparse.BCSR.fromdense(jnp.eye(40) * 2)
ops = {
    "fft": lambda: jnp.fft.fft(a),
    "rfft2": lambda: jnp.fft.rfft2(a),
    "svd": lambda: jnp.linalg.svd(a),
    "svd_batched": lambda: jnp.linalg.svd(small),
    "eigh": lambda: jnp.linalg.eigh(spd),
    "eigh_batched": lambda: jnp.linalg.eigh(small),
    "qr": lambda: jnp.linalg.qr(a),
    "solve": lambda: jnp.linalg.solve(sq, a[:40, :3]),
    "cholesky": lambda: jnp.linalg.cholesky(spd),
    "cholesky_batched": lambda: jnp.linalg.cholesky(small),
    "inv": lambda: jnp.linalg.inv(sq),
    "lu_factor": lambda: jax.scipy.linalg.lu_factor(sq),
    "tridiagonal_solve":
        lambda: jax.lax.linalg.tridiagonal_solve(dl, spd[0], du, sq[:, :2]),
    "bcoo_matmul": lambda: coo @ sq,
    "bcoo_matvec": lambda: coo @ sq[:, 0],
    "bcsr_matmul": lambda: csr @ sq,
}
done = []
for name, op in ops.items():
    jax.block_until_ready(op())
    done.append(name)
report(done=done, alloc=served("cuMemAllocFromPoolAsync"))
"""


@pytest.mark.skipif(jax_reason() is not None, reason=str(jax_reason()))
@pytest.mark.parametrize("lake", [True, False], ids=["lake", "no-lake"])
def test_jax_fft_linalg_and_sparse_run_on_the_fake(
        lake: bool, tmp_path: pathlib.Path) -> None:
    stats = tmp_path / "stats.json"
    trace = tmp_path / "trace.jsonl"
    args = ["--trace", str(trace)] if lake else ["--no-lake"]
    proc = fake_run(PROGRAM, args=args,
                    env={"JAXLAKE_FAKEGPU_STATS": str(stats),
                         "JAXLAKE_FAKEGPU_LOG": "stderr"})
    out = result(proc)
    assert len(out["done"]) == 16, out
    assert "not supported by the fake" not in proc.stderr, proc.stderr[-4000:]
    calls: Dict[str, int] = json.loads(stats.read_text())["calls"]
    for name in ("cufftExecC2C", "cufftExecR2C", "cufftSetWorkArea",
                 "cusolverDnSgesvdj", "cusolverDnSgesvdjBatched",
                 "cusolverDnSsyevjBatched", "cusolverDnSpotrfBatched",
                 "cusolverDnSgeqrf", "cusolverDnSgetrf", "cusolverDnSpotrf",
                 "cusparseSgtsv2", "cusparseSpMM", "cusparseSpMV"):
        assert calls.get(name, 0) >= 1, (name, sorted(
            k for k in calls if k.startswith(("cufft", "cusolver",
                                              "cusparse"))))
    # XLA gives each cuFFT plan its work area from its scratch allocator: no
    # plan allocated one itself (cuMemAlloc) beside the lake or BFC.
    assert calls.get("cuMemAlloc_v2", 0) == 0
    if lake:
        # every pool allocation, the libraries' scratch included, was the
        # lake's: the geqrf workspace of the 48 x 40 matrix (the fake's
        # rule: 64 x 40 float32) and the gtsv2 buffer (40 x (2 + 4)
        # float32) are among its allocations, which the trace records
        assert out["alloc"]["served"] > 0 and out["alloc"]["forwarded"] == 0
        sizes = {json.loads(line).get("size") for line in
                 trace.read_text().splitlines()[1:]}
        assert 64 * 40 * 4 in sizes and 40 * 6 * 4 in sizes, sorted(sizes)
        assert "lake report" in proc.stderr
    else:
        assert "no lake: XLA's own allocator" in proc.stderr
