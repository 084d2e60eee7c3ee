"""The fake GPU's cuBLAS routines, CUPTI and CUDA 13's kernel launch entry
points, and JAX's batched linear algebra and profiler over them.

The first tests drive libjaxlake_fakegpu.so through ctypes, by NVIDIA's
names, signatures and enum values (cublas_api.h, cupti_callbacks.h,
cupti_activity.h, crt/host_runtime.h), each in a subprocess of its own
(test_fake_gpu_libs.run). The last runs one JAX program (batched solves,
QR and inverses, a complex SVD, a profiler trace) under `jaxlake run
--fake-gpu`, with the lake and without it.
"""

from __future__ import annotations

import json
import pathlib
from typing import Dict

import pytest

from fakegpu_util import PRELUDE, fake_run, jax_reason, result
from test_fake_gpu_libs import results, run

# What the cuBLAS tests start with: a handle, four 16 x 16 float matrices in
# device memory, and the device arrays of a batch (pointers, pivots, infos).
# cublasStatus_t: SUCCESS 0, NOT_INITIALIZED 1, INVALID_VALUE 7.
CUBLAS = r"""
F, I, D = C.c_float, C.c_int, C.c_double
h = P()
check(lib.cublasCreate_v2(C.byref(h)), "create")
N, BATCH = 16, 4
mats = device_alloc(BATCH * N * N * 4)
ptrs = device_alloc(BATCH * 8)
taus = device_alloc(BATCH * 8)
pivots = device_alloc(BATCH * N * 4)
infos = device_alloc(BATCH * 4)
host = C.create_string_buffer(BATCH * N * N * 4)
one = F(1.0)
dev = lambda p: C.c_uint64(p)
"""


def test_cublas_batched_factorizations_check_their_arguments() -> None:
    out = results(run(CUBLAS + r"""
print("getrf:", lib.cublasSgetrfBatched(h, N, dev(ptrs), N, dev(pivots),
                                        dev(infos), BATCH))
print("getrf no pivots:", lib.cublasSgetrfBatched(h, N, dev(ptrs), N, None,
                                                  dev(infos), BATCH))
print("getrf lda:", lib.cublasSgetrfBatched(h, N, dev(ptrs), N - 1,
                                            dev(pivots), dev(infos), BATCH))
print("getrf host array:", lib.cublasSgetrfBatched(h, N, host, N,
                                                   dev(pivots), dev(infos),
                                                   BATCH))
# device memory comes in 2 MiB: the pivots of a batch of 2^16 matrices
# (4 MiB) are past the end of that
MANY = 1 << 16
print("getrf pivots short:", lib.cublasSgetrfBatched(
    h, N, dev(device_alloc(MANY * 8)), N, dev(pivots),
    dev(device_alloc(MANY * 4)), MANY))
print("getrf handle:", lib.cublasSgetrfBatched(P(12345), N, dev(ptrs), N,
                                               dev(pivots), dev(infos),
                                               BATCH))
print("getri:", lib.cublasZgetriBatched(h, N, dev(ptrs), N, dev(pivots),
                                        dev(taus), N, dev(infos), BATCH))
print("matinv:", lib.cublasCmatinvBatched(h, N, dev(ptrs), N, dev(taus), N,
                                          dev(infos), BATCH))
print("matinv 33:", lib.cublasCmatinvBatched(h, 33, dev(ptrs), 33,
                                             dev(taus), 33, dev(infos),
                                             BATCH))
# geqrf, getrs and gels write their host info: 0, or -i for argument i
info = I(99)
print("geqrf:", lib.cublasSgeqrfBatched(h, N, N, dev(ptrs), N, dev(taus),
                                        C.byref(info), BATCH), info.value)
info.value = 99
print("geqrf lda:", lib.cublasDgeqrfBatched(h, N, N, dev(ptrs), N - 1,
                                            dev(taus), C.byref(info),
                                            BATCH), info.value)
print("geqrf m:", lib.cublasCgeqrfBatched(h, -1, N, dev(ptrs), N, dev(taus),
                                          C.byref(info), BATCH), info.value)
print("geqrf tau host:", lib.cublasZgeqrfBatched(h, N, N, dev(ptrs), N, host,
                                                 C.byref(info), BATCH),
      info.value)
print("geqrf no info:", lib.cublasSgeqrfBatched(h, N, N, dev(ptrs), N,
                                                dev(taus), None, BATCH))
info.value = 99
print("getrs:", lib.cublasSgetrsBatched(h, 0, N, 2, dev(ptrs), N,
                                        dev(pivots), dev(taus), N,
                                        C.byref(info), BATCH), info.value)
print("getrs trans:", lib.cublasSgetrsBatched(h, 7, N, 2, dev(ptrs), N,
                                              dev(pivots), dev(taus), N,
                                              C.byref(info), BATCH),
      info.value)
print("gels ldc:", lib.cublasDgelsBatched(h, 0, N, N, 1, dev(ptrs), N,
                                          dev(taus), N - 1, C.byref(info),
                                          dev(infos), BATCH), info.value)
print("trsm batched:", lib.cublasStrsmBatched(h, 0, 0, 0, 0, N, 2,
                                              C.byref(one), dev(ptrs), N,
                                              dev(taus), N, BATCH))
print("trsm batched lda:", lib.cublasStrsmBatched(h, 1, 0, 0, 0, N, 2,
                                                  C.byref(one), dev(ptrs),
                                                  1, dev(taus), N, BATCH))
print("trsm batched side:", lib.cublasStrsmBatched(h, 2, 0, 0, 0, N, 2,
                                                   C.byref(one), dev(ptrs),
                                                   N, dev(taus), N, BATCH))
"""))
    assert out["getrf"] == "0" and out["getrf no pivots"] == "0", out
    assert out["getrf lda"] == "7" and out["getrf host array"] == "7", out
    assert out["getrf pivots short"] == "7", out
    assert out["getrf handle"] == "1", out
    assert out["getri"] == "0" and out["matinv"] == "0", out
    assert out["matinv 33"] == "7", out  # matinvBatched takes n <= 32
    assert out["geqrf"] == "0 0", out
    assert out["geqrf lda"] == "7 -5", out
    assert out["geqrf m"] == "7 -2", out
    assert out["geqrf tau host"] == "7 -6", out
    assert out["geqrf no info"] == "7", out
    assert out["getrs"] == "0 0" and out["getrs trans"] == "7 -2", out
    assert out["gels ldc"] == "7 -9", out
    assert out["trsm batched"] == "0", out
    assert out["trsm batched lda"] == "7", out  # the right side: lda >= n
    assert out["trsm batched side"] == "7", out


def test_cublas_level_1_2_3_check_sizes_memory_and_pointer_mode() -> None:
    out = results(run(CUBLAS + r"""
print("sgemm:", lib.cublasSgemm_v2(h, 0, 0, N, N, N, C.byref(one), dev(mats),
                                   N, dev(mats), N, C.byref(one), dev(mats),
                                   N))
# device memory comes in 2 MiB: a 512 x 512 float matrix (1 MiB) fits, a
# double-complex one (4 MiB) does not
M = 512
big = device_alloc(M * M * 4)
print("sgemm 512:", lib.cublasSgemm_v2(h, 0, 0, M, M, M, C.byref(one),
                                       dev(big), M, dev(big), M,
                                       C.byref(one), dev(big), M))
print("zgemm short:", lib.cublasZgemm_v2(h, 0, 0, M, M, M, C.byref(one),
                                         dev(big), M, dev(big), M,
                                         C.byref(one), dev(big), M))
print("sgemm host C:", lib.cublasSgemm_v2(h, 0, 0, N, N, N, C.byref(one),
                                          dev(mats), N, dev(mats), N,
                                          C.byref(one), host, N))
print("sgemm ldc:", lib.cublasSgemm_v2(h, 0, 0, N, N, N, C.byref(one),
                                       dev(mats), N, dev(mats), N,
                                       C.byref(one), dev(mats), N - 1))
print("sgemm op:", lib.cublasSgemm_v2(h, 4, 0, N, N, N, C.byref(one),
                                      dev(mats), N, dev(mats), N,
                                      C.byref(one), dev(mats), N))
L = C.c_longlong
print("sgemm 64:", lib.cublasSgemm_v2_64(h, 0, 0, L(N), L(N), L(N),
                                         C.byref(one), dev(mats), L(N),
                                         dev(mats), L(N), C.byref(one),
                                         dev(mats), L(N)))
print("strided:", lib.cublasSgemmStridedBatched(
    h, 0, 0, N, N, N, C.byref(one), dev(mats), N, L(N * N), dev(mats), N,
    L(N * N), C.byref(one), dev(mats), N, L(N * N), BATCH))
print("strided past end:", lib.cublasSgemmStridedBatched(
    h, 0, 0, N, N, N, C.byref(one), dev(mats), N, L(N * N), dev(mats), N,
    L(N * N), C.byref(one), dev(big), N, L(M * M), 3))
# cudaDataType_t CUDA_R_32F 0, cublasComputeType_t CUBLAS_COMPUTE_32F 68
print("gemmex:", lib.cublasGemmEx(h, 0, 0, N, N, N, C.byref(one), dev(mats),
                                  0, N, dev(mats), 0, N, C.byref(one),
                                  dev(mats), 0, N, 68, -1))
print("gemmex type:", lib.cublasGemmEx(h, 0, 0, N, N, N, C.byref(one),
                                       dev(mats), 99, N, dev(mats), 0, N,
                                       C.byref(one), dev(mats), 0, N, 68,
                                       -1))
alpha_c = (F * 2)(1.0, 0.0)
print("cscal:", lib.cublasCscal_v2(h, N, alpha_c, dev(mats), 1))
print("cscal host x:", lib.cublasCscal_v2(h, N, alpha_c, host, 1))
# level 1 as the reference BLAS: no elements, or an increment of 0, is fine;
# level 2 refuses an increment of 0
print("cscal inc 0:", lib.cublasCscal_v2(h, N, alpha_c, dev(mats), 0))
print("cscal none:", lib.cublasCscal_v2(h, -1, alpha_c, None, 1))
print("gemv inc 0:", lib.cublasSgemv_v2(h, 0, N, N, C.byref(one), dev(mats),
                                        N, dev(mats), 0, C.byref(one),
                                        dev(mats), 1))
print("csscal:", lib.cublasCsscal_v2(h, N, C.byref(one), dev(mats), 2))
print("cscal handle:", lib.cublasCscal_v2(P(12345), N, alpha_c, dev(mats),
                                          1))
print("zscal past end:", lib.cublasZscal_v2(h, M * M, alpha_c, dev(big), 1))
res = F()
print("sdot:", lib.cublasSdot_v2(h, N, dev(mats), 1, dev(mats), 1,
                                 C.byref(res)))
print("sdot no result:", lib.cublasSdot_v2(h, N, dev(mats), 1, dev(mats), 1,
                                           None))
print("gemv:", lib.cublasDgemv_v2(h, 1, N // 2, N // 2, C.byref(D(1)),
                                  dev(mats), N // 2, dev(mats), 1,
                                  C.byref(D(0)), dev(mats), 1))
print("trsm:", lib.cublasZtrsm_v2(h, 0, 1, 2, 1, N // 2, N // 2, alpha_c,
                                  dev(mats), N // 2, dev(mats), N // 2))
print("herk fill:", lib.cublasCherk_v2(h, 2, 0, N, N, C.byref(one),
                                       dev(mats), N, C.byref(one), dev(mats),
                                       N))
# in the device pointer mode the scalars are device memory
check(lib.cublasSetPointerMode_v2(h, 1), "device pointer mode")
print("device mode, host alpha:", lib.cublasSscal_v2(h, N, C.byref(one),
                                                     dev(mats), 1))
print("device mode, device alpha:", lib.cublasSscal_v2(h, N, dev(taus),
                                                       dev(mats), 1))
print("empty:", lib.cublasSaxpy_v2(h, 0, dev(taus), None, 1, None, 1))
"""))
    assert out["sgemm"] == "0" and out["sgemm 64"] == "0", out
    assert out["sgemm 512"] == "0", out
    assert out["zgemm short"] == "7" and out["sgemm host C"] == "7", out
    assert out["sgemm ldc"] == "7" and out["sgemm op"] == "7", out
    assert out["strided"] == "0" and out["strided past end"] == "7", out
    assert out["gemmex"] == "0" and out["gemmex type"] == "7", out
    assert out["cscal"] == "0" and out["cscal host x"] == "7", out
    assert out["cscal inc 0"] == "0" and out["cscal none"] == "0", out
    assert out["gemv inc 0"] == "7", out
    assert out["csscal"] == "0" and out["cscal handle"] == "1", out
    assert out["zscal past end"] == "7", out
    assert out["sdot"] == "0" and out["sdot no result"] == "7", out
    assert out["gemv"] == "0" and out["trsm"] == "0", out
    assert out["herk fill"] == "7", out
    assert out["device mode, host alpha"] == "7", out
    assert out["device mode, device alpha"] == "0", out
    assert out["empty"] == "0", out


def test_cupti_subscriber_activities_and_timestamps() -> None:
    out = results(run(r"""
U32, U64 = C.c_uint32, C.c_uint64
t1, t2 = U64(), U64()
check(lib.cuptiGetTimestamp(C.byref(t1)), "timestamp")
check(lib.cuptiGetTimestamp(C.byref(t2)), "timestamp")
print("timestamps rise:", 0 < t1.value <= t2.value)
print("timestamp null:", lib.cuptiGetTimestamp(None))
sub, other = P(), P()
print("subscribe:", lib.cuptiSubscribe_v2(C.byref(sub), None, None, None))
print("second subscriber:", lib.cuptiSubscribe(C.byref(other), None, None))
print("timestamp v2:", lib.cuptiGetTimestamp_v2(sub, C.byref(t1)))
# CUPTI_CB_DOMAIN_DRIVER_API 1, RUNTIME_API 2
print("enable domain:", lib.cuptiEnableDomain(1, sub, 1))
print("bad domain:", lib.cuptiEnableDomain(1, sub, 99))
print("stranger:", lib.cuptiEnableCallback(1, P(12345), 2, 5))
state = U32(7)
check(lib.cuptiGetCallbackState(C.byref(state), sub, 1, 123), "state")
print("driver callback on:", state.value)
check(lib.cuptiGetCallbackState(C.byref(state), sub, 2, 123), "state")
print("runtime callback on:", state.value)
check(lib.cuptiEnableDomain(0, sub, 1), "disable")
check(lib.cuptiGetCallbackState(C.byref(state), sub, 1, 123), "state")
print("driver callback off:", state.value)
# activities: the buffer callbacks are never asked for a buffer
calls = []
REQ = C.CFUNCTYPE(None, C.POINTER(C.c_void_p), C.POINTER(C.c_size_t),
                  C.POINTER(C.c_size_t))
DONE = C.CFUNCTYPE(None, P, P, U32, C.c_size_t, C.c_size_t)
req = REQ(lambda *a: calls.append("request"))
done = DONE(lambda *a: calls.append("complete"))
print("register:", lib.cuptiActivityRegisterCallbacks_v2(sub, req, done))
print("register null:", lib.cuptiActivityRegisterCallbacks(None, done))
# CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL 10; 0 is CUPTI_ACTIVITY_KIND_INVALID
print("enable kind:", lib.cuptiActivityEnable_v2(sub, 10, None))
print("enable invalid kind:", lib.cuptiActivityEnable(0))
size, value = C.c_size_t(4), U32(3)
print("set attribute:", lib.cuptiActivitySetAttribute_v2(None, 5,
                                                         C.byref(size),
                                                         C.byref(value)))
back = U32()
check(lib.cuptiActivityGetAttribute(5, C.byref(size), C.byref(back)), "get")
print("attribute:", back.value)
# CUpti_ActivityThreadIdType: DEFAULT 0, SYSTEM 1
tid = C.c_int(7)
print("thread id type:", lib.cuptiSetThreadIdType(1),
      lib.cuptiGetThreadIdType(C.byref(tid)), tid.value)
print("bad thread id type:", lib.cuptiSetThreadIdType(2))
print("flush:", lib.cuptiActivityFlushAll(1))
print("buffer calls:", len(calls))
buf, rec = (C.c_uint8 * 64)(), P()
print("next record:", lib.cuptiActivityGetNextRecord(buf, 0, C.byref(rec)))
dropped = C.c_size_t(9)
check(lib.cuptiActivityGetNumDroppedRecords(None, 0, C.byref(dropped)), "dr")
print("dropped:", dropped.value)
print("unsubscribe:", lib.cuptiUnsubscribe(sub))
print("unsubscribe again:", lib.cuptiUnsubscribe(sub))
print("subscribe again:", lib.cuptiSubscribe(C.byref(other), None, None))
print("finalize:", lib.cuptiFinalize())
s = C.c_char_p()
check(lib.cuptiGetResultString(39, C.byref(s)), "string")
print("name:", s.value.decode())
"""))
    assert out["timestamps rise"] == "True", out
    assert out["timestamp null"] == "1", out  # CUPTI_ERROR_INVALID_PARAMETER
    assert out["subscribe"] == "0" and out["timestamp v2"] == "0", out
    assert out["second subscriber"] == "39", out
    assert out["enable domain"] == "0" and out["bad domain"] == "1", out
    assert out["stranger"] == "1", out
    assert out["driver callback on"] == "1", out
    assert out["runtime callback on"] == "0", out
    assert out["driver callback off"] == "0", out
    assert out["register"] == "0" and out["register null"] == "1", out
    assert out["enable kind"] == "0", out
    assert out["enable invalid kind"] == "21", out  # CUPTI_ERROR_INVALID_KIND
    assert out["set attribute"] == "0" and out["attribute"] == "3", out
    assert out["thread id type"] == "0 0 1", out
    assert out["bad thread id type"] == "1", out
    assert out["flush"] == "0" and out["buffer calls"] == "0", out
    assert out["next record"] == "12", out  # CUPTI_ERROR_MAX_LIMIT_REACHED
    assert out["dropped"] == "0", out
    assert out["unsubscribe"] == "0" and out["unsubscribe again"] == "1", out
    assert out["subscribe again"] == "0" and out["finalize"] == "0", out
    assert out["name"] == "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"


def test_cuda13_kernel_launch_entry_points() -> None:
    out = results(run(r"""
class Dim3(C.Structure):
    _fields_ = [("x", C.c_uint), ("y", C.c_uint), ("z", C.c_uint)]
symbol = C.create_string_buffer(8)  # stands for a function of nvcc's code
kernel = P()
print("get:", lib.__cudaGetKernel(C.byref(kernel), symbol))
print("same:", kernel.value == C.addressof(symbol))
print("get null:", lib.__cudaGetKernel(C.byref(kernel), None))
lib.__cudaLaunchKernel.argtypes = [P, Dim3, Dim3, P, C.c_size_t, P]
args = (P * 1)(None)
print("launch:", lib.__cudaLaunchKernel(C.addressof(symbol), Dim3(4, 1, 1),
                                        Dim3(128, 1, 1), args, 0, None))
print("launch null:", lib.__cudaLaunchKernel(None, Dim3(1, 1, 1),
                                             Dim3(1, 1, 1), args, 0, None))
"""))
    assert out["get"] == "0" and out["same"] == "True", out
    assert out["get null"] == "1", out  # cudaErrorInvalidValue
    assert out["launch"] == "0" and out["launch null"] == "1", out


PROGRAM = PRELUDE + """
import os
rng = np.random.default_rng(0)
small = jnp.asarray(rng.standard_normal((4, 16, 16)), jnp.float32)
small = small + 16 * jnp.eye(16)
rhs = jnp.asarray(rng.standard_normal((4, 16, 3)), jnp.float32)
cplx = jnp.asarray(rng.standard_normal((24, 20)) +
                   1j * rng.standard_normal((24, 20)), jnp.complex64)
ops = {
    # batches of small matrices: cuBLAS's batched LU, QR and solves
    "solve_batched": lambda: jnp.linalg.solve(small, rhs),
    "qr_batched": lambda: jnp.linalg.qr(small),
    "inv_batched": lambda: jnp.linalg.inv(small),
    "det_batched": lambda: jnp.linalg.det(small),
    "lu_batched": lambda: jax.lax.linalg.lu(small),
    "solve_triangular_batched":
        lambda: jax.scipy.linalg.solve_triangular(small, rhs, lower=True),
    "svd_complex": lambda: jnp.linalg.svd(cplx),
    "lstsq_complex": lambda: jnp.linalg.lstsq(cplx, cplx[:, 0]),
}
done = []
jax.profiler.start_trace(os.environ["TRACE_DIR"])
for name, op in ops.items():
    jax.block_until_ready(op())
    done.append(name)
jax.profiler.stop_trace()
report(done=done)
"""


@pytest.mark.skipif(jax_reason() is not None, reason=str(jax_reason()))
@pytest.mark.parametrize("lake", [True, False], ids=["lake", "no-lake"])
def test_jax_batched_linalg_and_profiler_run_on_the_fake(
        lake: bool, tmp_path: pathlib.Path) -> None:
    stats = tmp_path / "stats.json"
    traces = tmp_path / "profile"
    args = [] if lake else ["--no-lake"]
    proc = fake_run(PROGRAM, args=args,
                    env={"JAXLAKE_FAKEGPU_STATS": str(stats),
                         "JAXLAKE_FAKEGPU_LOG": "stderr",
                         "TRACE_DIR": str(traces)})
    out = result(proc)
    assert len(out["done"]) == 8, out
    assert "not supported by the fake" not in proc.stderr, proc.stderr[-4000:]
    # XLA's profiler met no CUPTI error, and wrote its trace
    assert "CUPTI" not in proc.stderr, proc.stderr[-4000:]
    assert "Previous call returned an error" not in proc.stderr
    assert list(traces.rglob("*.xplane.pb")), sorted(traces.rglob("*"))
    calls: Dict[str, int] = json.loads(stats.read_text())["calls"]
    # (jax 0.12's profiler reads CUPTI's clock through the subscriber's
    # _v2 call, jax 0.10's through the plain one.)
    for names in (("cublasSgetrfBatched",), ("cublasSgeqrfBatched",),
                  ("cuptiGetTimestamp", "cuptiGetTimestamp_v2"),
                  ("cuptiActivityFlushAll",)):
        assert sum(calls.get(n, 0) for n in names) >= 1, (names, sorted(
            k for k in calls if k.startswith(("cublas", "cupti"))))
    if lake:
        assert "lake report" in proc.stderr
    else:
        assert "no lake: XLA's own allocator" in proc.stderr
