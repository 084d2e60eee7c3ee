"""What third-party JAX programs do that the other fake-GPU tests do not
(benchmarks/compat/sweep.sh runs such programs whole): loops on values
that kernels compute, which never ended on the fake (the loop guard,
JAXLAKE_FAKEGPU_LOOP_LIMIT), and jax.profiler's use of CUPTI, which the
fake answered "not supported"; each checked at the fake's library and
under `jaxlake run --fake-gpu`. They are CPU tests of the integration, never a
stand-in for a GPU figure.
"""

from __future__ import annotations

from fakegpu_util import (DRIVER_PRELUDE, NEEDS_FAKE_GPU, NEEDS_JAX, PRELUDE,
                          fake_run, library_run, result)


@NEEDS_FAKE_GPU
def test_one_byte_reads_of_a_stuck_flag_end_at_the_loop_limit() -> None:
    proc = library_run("""
flag = U64()
ck(lib.cuMemAlloc_v2(ctypes.byref(flag), ctypes.c_size_t(16)), "alloc")
def put(v):
    b = ctypes.c_ubyte(v)
    ck(lib.cuMemcpyHtoD_v2(flag, ctypes.byref(b), ctypes.c_size_t(1)), "HtoD")
out, other = ctypes.c_ubyte(), ctypes.c_ubyte()
def read(into=out, nbytes=1, async_=False):
    if async_:
        ck(lib.cuMemcpyDtoHAsync_v2(ctypes.byref(into), flag,
                                    ctypes.c_size_t(nbytes), None), "DtoHA")
        ck(lib.cuStreamSynchronize(None), "sync")
    else:
        ck(lib.cuMemcpyDtoH_v2(ctypes.byref(into), flag,
                               ctypes.c_size_t(nbytes)), "DtoH")
    return into.value
put(1)
first = [read(async_=i % 2 == 1) for i in range(5)]   # the 5th ends the loop
stuck = [read() for _ in range(4)]                    # now ends at the 2nd
elsewhere = [read(into=other) for _ in range(4)]      # another reader
wide = [read(nbytes=2) & 0xff for _ in range(8)]      # not one byte: exact
put(2)
changed = [read() for _ in range(3)]                  # a new value: a new count
print("RESULT " + json.dumps(dict(first=first, stuck=stuck, wide=wide,
                                  elsewhere=elsewhere, changed=changed)))
""", prelude=DRIVER_PRELUDE, env={"JAXLAKE_FAKEGPU_LOOP_LIMIT": "5"})
    out = result(proc)
    assert out["first"] == [1, 1, 1, 1, 0]
    assert out["stuck"] == [1, 0, 1, 0]
    assert out["elsewhere"] == [1, 1, 1, 1]
    assert out["wide"] == [1] * 8
    assert out["changed"] == [2, 0, 2]
    assert proc.stderr.count("JAXLAKE_FAKEGPU_LOOP_LIMIT") == 1


@NEEDS_FAKE_GPU
def test_nested_loops_on_one_stuck_flag_both_end() -> None:
    # Two loops, one inside the other, whose predicates XLA placed at the
    # same device address, each read into its own host buffer (as each
    # while loop has its own): the inner loop must not take every 0 the
    # guard hands out, or the outer one never ends.
    proc = library_run("""
flag = U64()
ck(lib.cuMemAlloc_v2(ctypes.byref(flag), ctypes.c_size_t(16)), "alloc")
one = ctypes.c_ubyte(1)
ck(lib.cuMemcpyHtoD_v2(flag, ctypes.byref(one), ctypes.c_size_t(1)), "HtoD")
outer_pred, inner_pred = ctypes.c_ubyte(), ctypes.c_ubyte()
def read(into):
    ck(lib.cuMemcpyDtoH_v2(ctypes.byref(into), flag, ctypes.c_size_t(1)))
    return into.value
outer = inner = 0
while read(outer_pred) and outer < 1000:
    outer += 1
    while read(inner_pred) and inner < 100000:
        inner += 1
print("RESULT " + json.dumps(dict(outer=outer, inner=inner)))
""", prelude=DRIVER_PRELUDE, env={"JAXLAKE_FAKEGPU_LOOP_LIMIT": "5"})
    out = result(proc)
    assert out["outer"] == 4                 # its 5th read is the 0
    assert out["inner"] == 4 + 3 * 1         # 4, then 1 a turn once stuck


@NEEDS_FAKE_GPU
def test_loop_limit_zero_turns_the_guard_off() -> None:
    proc = library_run("""
flag = U64()
ck(lib.cuMemAlloc_v2(ctypes.byref(flag), ctypes.c_size_t(16)), "alloc")
one = ctypes.c_ubyte(1)
ck(lib.cuMemcpyHtoD_v2(flag, ctypes.byref(one), ctypes.c_size_t(1)), "HtoD")
out = ctypes.c_ubyte()
reads = []
for _ in range(3000):
    ck(lib.cuMemcpyDtoH_v2(ctypes.byref(out), flag, ctypes.c_size_t(1)))
    reads.append(out.value)
print("RESULT " + json.dumps(dict(zeros=reads.count(0))))
""", prelude=DRIVER_PRELUDE, env={"JAXLAKE_FAKEGPU_LOOP_LIMIT": "0"})
    assert result(proc)["zeros"] == 0


@NEEDS_JAX
def test_while_loop_on_a_flag_kernels_would_clear_ends() -> None:
    # The loop's flag starts True (a copy of the argument) and only the
    # body's kernel, which does not run here, would clear it: XLA reads it
    # back each iteration. Without the loop guard this never ends.
    proc = fake_run(PRELUDE + """
f = jax.jit(lambda flag, x: jax.lax.while_loop(
    lambda c: c[0], lambda c: (jnp.logical_not(c[0]), c[1] + 1), (flag, x)))
out = f(jax.device_put(np.bool_(True)), jnp.zeros(4))
jax.block_until_ready(out)
report(done=True)
""", timeout=120)
    assert result(proc)["done"]
    assert "JAXLAKE_FAKEGPU_LOOP_LIMIT" in proc.stderr


@NEEDS_FAKE_GPU
def test_cupti_subscribers_and_activity_api_answer_as_cupti_does() -> None:
    proc = library_run("""
c_void_pp = ctypes.POINTER(ctypes.c_void_p)
t1, t2 = U64(), U64()
ck(lib.cuptiGetTimestamp(ctypes.byref(t1)), "timestamp")
ck(lib.cuptiGetTimestamp(ctypes.byref(t2)), "timestamp")
a, b = ctypes.c_void_p(), ctypes.c_void_p()
# One subscriber at a time: a second is refused until the first leaves.
ck(lib.cuptiSubscribe(ctypes.byref(a), None, None), "subscribe")
second = lib.cuptiSubscribe_v2(ctypes.byref(b), None, None, None)
ck(lib.cuptiUnsubscribe(a), "unsubscribe")
ck(lib.cuptiSubscribe_v2(ctypes.byref(b), None, None, None), "subscribe_v2")
CB = ctypes.CFUNCTYPE(None)
req, done = CB(lambda: None), CB(lambda: None)
size, one = ctypes.c_size_t(1), ctypes.c_uint8(1)
codes = dict(
    enable_callback=lib.cuptiEnableCallback(1, b, 6, 1),
    enable_domain=lib.cuptiEnableDomain(1, b, 6),
    register=lib.cuptiActivityRegisterCallbacks_v2(b, req, done),
    attribute=lib.cuptiActivitySetAttribute_v2(b, 4, ctypes.byref(size),
                                               ctypes.byref(one)),
    attribute_all=lib.cuptiActivitySetAttribute_v2(None, 4,
                                                   ctypes.byref(size),
                                                   ctypes.byref(one)),
    enable=lib.cuptiActivityEnable_v2(b, 10, None),
    disable=lib.cuptiActivityDisable_v2(b, 10),
    flush=lib.cuptiActivityFlushAll(1),
    unknown_subscriber=lib.cuptiActivityEnable_v2(ctypes.c_void_p(8), 10,
                                                  None),
    unsubscribe=lib.cuptiUnsubscribe(b),
    unsubscribe_again=lib.cuptiUnsubscribe(b),
    after_unsubscribe=lib.cuptiEnableDomain(1, b, 6),
    second=second,
)
buf = (ctypes.c_uint8 * 64)()
rec = ctypes.c_void_p()
codes["next_record"] = lib.cuptiActivityGetNextRecord(buf, ctypes.c_size_t(0),
                                                      ctypes.byref(rec))
dropped = ctypes.c_size_t(7)
codes["dropped"] = lib.cuptiActivityGetNumDroppedRecords(
    None, 0, ctypes.byref(dropped))
s = ctypes.c_char_p()
codes["string"] = lib.cuptiGetResultString(12, ctypes.byref(s))
print("RESULT " + json.dumps(dict(
    codes=codes, later=t2.value >= t1.value > 0,
    dropped=dropped.value, string=s.value.decode())))
""", prelude=DRIVER_PRELUDE)
    out = result(proc)
    assert out["later"]
    codes = out["codes"]
    for ok in ("enable_callback", "enable_domain", "register", "attribute",
               "attribute_all", "enable", "disable", "flush", "unsubscribe",
               "dropped", "string"):
        assert codes[ok] == 0, (ok, codes)
    for bad in ("unknown_subscriber", "unsubscribe_again",
                "after_unsubscribe"):
        assert codes[bad] == 1, (bad, codes)      # INVALID_PARAMETER
    # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
    assert codes["second"] == 39, codes
    assert codes["next_record"] == 12             # MAX_LIMIT_REACHED
    assert out["dropped"] == 0
    assert out["string"] == "CUPTI_ERROR_MAX_LIMIT_REACHED"
    assert "not supported" not in proc.stderr


@NEEDS_JAX
def test_profiler_trace_starts_without_cupti_errors(tmp_path) -> None:
    # XLA's GPU tracer subscribes to CUPTI and enables its activity kinds;
    # the fake answered those "not supported" and XLA logged CUPTI errors.
    proc = fake_run(PRELUDE + f"""
import os
f = jax.jit(lambda a: (a @ a).sum())
with jax.profiler.trace({str(tmp_path)!r}):
    f(jnp.ones((64, 64))).block_until_ready()
files = [n for _, _, ns in os.walk({str(tmp_path)!r}) for n in ns]
report(files=len(files))
""", timeout=120)
    assert result(proc)["files"] > 0
    assert "not supported" not in proc.stderr
    assert "CUPTI" not in proc.stderr, proc.stderr[-3000:]
