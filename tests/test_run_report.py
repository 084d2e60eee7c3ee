"""What a user sees of the lake from outside a program: the report
`jaxlake run` prints at exit, `jax.Device.memory_stats()` under the lake,
gzip trace files from the shim, and the error for a trace with no events.

The programs run under `jaxlake run --fake-gpu` (XLA's real GPU client over
jaxlake's fake GPU, or plain ctypes calls into the shim where JAX is not
needed), on a machine with no GPU.
"""

from __future__ import annotations

import gzip
import json
import pathlib
import re
import subprocess
import sys
from typing import Dict, List, Optional

from fakegpu_util import (JAXLAKE, NEEDS_FAKE_GPU, NEEDS_JAX, fake_run,
                          python, result)
from jaxlake._src.options import format_bytes

GZIP_MAGIC = b"\x1f\x8b"


REPORT_HEAD = re.compile(r"^jaxlake: lake report, pid (\d+) \((.*)\)(.*)$")


def reports(stderr: str) -> Dict[int, List[Dict[str, str]]]:
    """The exit reports in `stderr`: pid -> rows (column -> text)."""
    out: Dict[int, List[Dict[str, str]]] = {}
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        m = REPORT_HEAD.match(line)
        if not m:
            continue
        header = lines[i + 1]
        assert header.split() == ["device", "served", "forwarded",
                                  "captured", "peak", "in", "use", "peak",
                                  "reserved", "U", "stitches"], header
        rows = []
        for row in lines[i + 2:]:
            cells = re.split(r"\s{2,}", row.strip())
            if not row.startswith("  ") or not cells[0].isdigit():
                break
            rows.append(dict(zip(("device", "served", "forwarded",
                                  "captured", "peak", "reserved", "U",
                                  "stitches"), cells)))
        out[int(m.group(1))] = rows
    return out


# Allocates through the hooked pool entry point, as XLA's cuda_async
# allocator does, with ctypes: no JAX needed.
CTYPES_ALLOC = """
import ctypes, os, sys
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
def pool_of(ordinal):
    dev = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(dev), ordinal)
    ctx = ctypes.c_void_p()
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    cuda.cuCtxSetCurrent(ctx)
    pool = ctypes.c_void_p()
    cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev)
    return pool
def alloc(pool, nbytes):
    p = ctypes.c_uint64()
    assert cuda.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t(nbytes), pool, None) == 0
    return p
def free(p):
    assert cuda.cuMemFreeAsync(p, None) == 0
"""


# -- the exit report --------------------------------------------------------------


@NEEDS_JAX
def test_exit_report_gives_each_device_the_lakes_figures() -> None:
    code = """
        import json, os, jax, jax.numpy as jnp, numpy as np, jaxlake
        from jaxlake._src.xla import integration as xla
        bufs = [jax.device_put(np.full(3 << 20, i, np.float32)) for i in range(8)]
        for b in bufs[::2]:
            b.delete()
        # The frees wait on events recorded on the transfer stream; work
        # put on that stream after them, once done, has let them pass, so
        # the lake can stitch the freed pieces however loaded the machine.
        jax.device_put(np.zeros(1, np.float32)).block_until_ready()
        big = jax.device_put(np.ones(30 << 20, np.uint8)); big.block_until_ready()
        y = jax.jit(lambda a: a * 2)(bufs[1]); y.block_until_ready()
        raw = xla._loaded_shim().stats(0)
        print("RESULT " + json.dumps({"pid": os.getpid(), "raw": raw}), flush=True)
    """
    proc = fake_run(python(code))
    out = result(proc)
    found = reports(proc.stderr)
    assert list(found) == [out["pid"]], proc.stderr[-3000:]
    rows = found[out["pid"]]
    assert [r["device"] for r in rows] == ["0"]
    row, raw = rows[0], out["raw"]
    gauges, counters = raw["gauges"], raw["counters"]
    # Every pool request of XLA's reached the lake; the figures are the
    # lake's own at the end of the program.
    assert int(row["served"]) == raw["allocations"]["served"] >= 10
    assert row["forwarded"] == "0" and row["captured"] == "0"
    assert row["peak"] == format_bytes(gauges["bytes_in_use"]["peak"])
    assert row["reserved"] == format_bytes(gauges["bytes_reserved"]["peak"])
    u = gauges["bytes_in_use"]["peak"] / gauges["bytes_reserved"]["peak"]
    assert row["U"] == f"{u:.3f}" and 0.5 < u <= 1.0
    assert int(row["stitches"]) == (counters["alloc_stitch"]
                                    + counters["alloc_stitch_grow"]) >= 1
    # One short block at the very end of stderr.
    tail = proc.stderr.rstrip("\n").splitlines()
    assert REPORT_HEAD.match(tail[-3]), tail[-4:]

    quiet = fake_run(python(code), args=["--quiet"])
    result(quiet)
    assert "lake report" not in quiet.stderr, quiet.stderr[-2000:]


@NEEDS_FAKE_GPU
def test_exit_report_names_each_process_and_skips_those_that_allocated_nothing(
        ) -> None:
    child = CTYPES_ALLOC + """
pool = pool_of(int(sys.argv[1]))
ps = [alloc(pool, n << 20) for n in (4, 6, 4)]
free(ps[1])
print("CHILD", os.getpid(), flush=True)
"""
    parent = CTYPES_ALLOC + f"""
import subprocess
pool = pool_of(0)
p = alloc(pool, 8 << 20)
subprocess.run([sys.executable, "-c", {child!r}, "1"], check=True)
subprocess.run([sys.executable, "-c", "print('no device here')"], check=True)
print("PARENT", os.getpid(), flush=True)
"""
    proc = fake_run([sys.executable, "-c", parent],
                    args=["--fake-gpu-count", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    pids = dict(line.split() for line in proc.stdout.splitlines()
                if line.startswith(("CHILD", "PARENT")))
    found = reports(proc.stderr)
    # The process that allocated nothing printed no report.
    assert sorted(found) == sorted(int(p) for p in pids.values()), \
        proc.stderr[-3000:]
    parent_rows = found[int(pids["PARENT"])]
    child_rows = found[int(pids["CHILD"])]
    assert [(r["device"], r["served"], r["forwarded"]) for r in parent_rows] \
        == [("0", "1", "0")]
    assert [(r["device"], r["served"], r["peak"]) for r in child_rows] == [
        ("1", "3", format_bytes(14 << 20))]
    assert child_rows[0]["U"] == "1.000"


@NEEDS_FAKE_GPU
def test_a_forked_child_leaves_the_report_and_the_trace_to_its_parent(
        tmp_path: pathlib.Path) -> None:
    code = CTYPES_ALLOC + """
pool = pool_of(0)
p = alloc(pool, 4 << 20)
child = os.fork()
if child == 0:
    sys.exit(0)  # a normal exit: the C library's exit handlers run
os.waitpid(child, 0)
free(alloc(pool, 2 << 20))
print("PARENT", os.getpid(), flush=True)
"""
    trace = tmp_path / "t.jsonl.gz"
    proc = fake_run([sys.executable, "-c", code],
                    args=["--trace", str(trace)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent = int(proc.stdout.split()[-1])
    found = reports(proc.stderr)
    assert list(found) == [parent], proc.stderr[-3000:]
    assert found[parent][0]["served"] == "2"
    # The parent's three events, compressed once, at its own exit.
    lines = gzip.decompress(trace.read_bytes()).decode().splitlines()
    assert len(lines) - 1 == 3, lines
    assert not (tmp_path / "t.jsonl.gz.part").exists()


@NEEDS_FAKE_GPU
def test_exit_report_of_an_inactive_lake_counts_the_forwarded_requests() -> None:
    code = CTYPES_ALLOC + """
pool = pool_of(0)
for _ in range(3):
    free(alloc(pool, 1 << 20))
"""
    proc = fake_run([sys.executable, "-c", code],
                    env={"JAXLAKE_SHIM_HOOKS": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "lake inactive: JAXLAKE_SHIM_HOOKS=0" in proc.stderr
    (rows,) = reports(proc.stderr).values()
    assert [(r["device"], r["served"], r["forwarded"], r["peak"])
            for r in rows] == [("0", "0", "3", "-")]


# -- jax.Device.memory_stats() ------------------------------------------------------


def test_lake_memory_stats_takes_the_lakes_figures_and_keeps_xlas_others() -> None:
    from jaxlake._src.xla import memstats
    xla = {"num_allocs": 7, "bytes_in_use": 100, "peak_bytes_in_use": 300,
           "largest_alloc_size": 64, "bytes_limit": 0, "bytes_reserved": 0,
           "peak_bytes_reserved": 0, "largest_free_block_bytes": 0,
           "some_newer_key": 5}
    lake = {"capacity": 6 << 30,
            "free": {"bytes": 10 << 20, "largest_block": 4 << 20},
            "gauges": {"bytes_in_use": {"current": 120, "peak": 320},
                       "bytes_reserved": {"current": 12 << 20,
                                          "peak": 16 << 20}},
            "counters": {"allocs": 9}}
    out = memstats.lake_memory_stats(xla, lake)
    assert out == {"num_allocs": 7, "bytes_in_use": 120,
                   "peak_bytes_in_use": 320, "largest_alloc_size": 64,
                   "bytes_limit": 6 << 30, "bytes_reserved": 12 << 20,
                   "peak_bytes_reserved": 16 << 20,
                   "largest_free_block_bytes": 10 << 20,
                   "pool_bytes": 12 << 20, "peak_pool_bytes": 16 << 20,
                   "some_newer_key": 5}
    # Without stitching a request gets at most the largest free run.
    assert memstats.lake_memory_stats(xla, lake, stitch_everything=False)[
        "largest_free_block_bytes"] == 4 << 20


def test_patched_memory_stats_keeps_xlas_figures_where_there_is_no_lake(
        ) -> None:
    from jaxlake._src.xla import memstats

    class Device:  # stands in for jaxlib's class
        def __init__(self, platform: str) -> None:
            self.platform = platform
            self.local_hardware_id = 0

        def memory_stats(self) -> Optional[Dict[str, int]]:
            return {"bytes_limit": 0} if self.platform == "gpu" else None

    original = Device.memory_stats
    assert memstats.patch_class(Device)
    assert memstats.patch_class(Device)  # once: the original is kept
    assert getattr(Device, memstats.ORIGINAL_ATTR) is original
    assert Device.memory_stats is not original
    # No shim in this process: XLA's figures as they are; CPU devices too.
    assert Device("gpu").memory_stats() == {"bytes_limit": 0}
    assert Device("cpu").memory_stats() is None


#: The keys JAX's default allocator (BFC, preallocated) reports on the fake
#: GPU (jax 0.10.2 and 0.12.0.1), which a program under the lake must find
#: too.
BFC_KEYS = {"num_allocs", "bytes_in_use", "peak_bytes_in_use",
            "largest_alloc_size", "bytes_limit", "bytes_reserved",
            "peak_bytes_reserved", "largest_free_block_bytes", "pool_bytes",
            "peak_pool_bytes"}


@NEEDS_JAX
def test_memory_stats_under_the_lake_has_its_capacity_and_figures() -> None:
    proc = fake_run(python("""
        import json, jax, jax.numpy as jnp, numpy as np
        from jaxlake._src.xla import integration as xla
        keep = [jax.device_put(np.full(5 << 20, i, np.float32)) for i in range(6)]
        for b in keep[::2]:
            b.delete()
        y = jax.jit(lambda a: (a * 2).sum())(keep[1]); y.block_until_ready()
        stats = jax.devices()[0].memory_stats()
        raw = xla._loaded_shim().stats(0)

        # MaxText's print_mem_stats, in short: it divides by bytes_limit.
        def print_mem_stats(label):
            for d in jax.local_devices():
                s = d.memory_stats()
                used = round(s["bytes_in_use"] / 2**30, 2)
                limit = round(s["bytes_limit"] / 2**30, 2)
                print(f"{label}: {used}/{limit} GiB "
                      f"({round(100 * used / limit, 2)}%) on {d}")
        print_mem_stats("after the step")
        print("RESULT " + json.dumps({"stats": stats, "raw": raw}))
    """))
    out = result(proc)
    stats, raw = out["stats"], out["raw"]
    assert "after the step: " in proc.stdout
    assert BFC_KEYS <= set(stats), sorted(stats)
    gauges = raw["gauges"]
    # No capacity or fraction set: the fake H100's whole 80 GiB.
    assert stats["bytes_limit"] == raw["capacity"] == 80 << 30
    assert stats["bytes_in_use"] == gauges["bytes_in_use"]["current"] > 0
    assert stats["peak_bytes_in_use"] == gauges["bytes_in_use"]["peak"]
    assert stats["bytes_reserved"] == stats["pool_bytes"] \
        == gauges["bytes_reserved"]["current"]
    assert stats["peak_bytes_reserved"] == stats["peak_pool_bytes"] \
        == gauges["bytes_reserved"]["peak"]
    assert stats["bytes_in_use"] <= stats["bytes_reserved"] \
        <= stats["bytes_limit"]
    assert stats["peak_bytes_in_use"] <= stats["peak_bytes_reserved"]
    # Three 20 MiB buffers were freed and stay in the lake, less what the
    # step took again (its 20 MiB temporary, and a chunk or two for its
    # small outputs): stitching can serve all of it at once, more than the
    # largest free run.
    assert stats["largest_free_block_bytes"] == raw["free"]["bytes"] \
        >= 36 << 20
    assert raw["free"]["bytes"] > raw["free"]["largest_block"] > 0
    assert stats["largest_alloc_size"] >= 20 << 20
    assert stats["num_allocs"] >= 6


# -- trace files --------------------------------------------------------------------


@NEEDS_FAKE_GPU
def test_shim_trace_to_a_gz_name_is_gzip(tmp_path: pathlib.Path) -> None:
    from jaxlake._src.trace import tracefile
    code = CTYPES_ALLOC + """
import jaxlake
pool = pool_of(0)
ps = [alloc(pool, 2 << 20) for _ in range(5)]
for p in ps:
    free(p)
with jaxlake.trace(sys.argv[1]):
    free(alloc(pool, 6 << 20))
"""
    run_gz, block_gz = tmp_path / "run.jsonl.gz", tmp_path / "block.JSONL.GZ"
    proc = fake_run([sys.executable, "-c", code, str(block_gz)],
                    args=["--trace", str(run_gz)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # `jaxlake run --trace` (written until jaxlake.trace() stops it to
    # start its own) and jaxlake.trace() (until the block ends), each
    # compressed, its text file gone.
    for path, events in ((run_gz, 10), (block_gz, 2)):
        data = path.read_bytes()
        assert data[:2] == GZIP_MAGIC, data[:40]
        lines = gzip.decompress(data).decode().splitlines()
        assert json.loads(lines[0])["source"] == "shim"
        assert len(lines) - 1 == events, lines
        assert len(tracefile.read_trace(str(path))) == events
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "block.JSONL.GZ", "run.jsonl.gz"]


@NEEDS_FAKE_GPU
def test_gz_trace_of_a_process_that_dies_stays_readable_as_text(
        tmp_path: pathlib.Path) -> None:
    code = CTYPES_ALLOC + """
pool = pool_of(0)
for _ in range(35):
    free(alloc(pool, 1 << 20))
os._exit(0)
"""
    trace = tmp_path / "t.jsonl.gz"
    proc = fake_run([sys.executable, "-c", code], args=["--trace", str(trace)],
                    env={"JAXLAKE_TRACE_FLUSH": "16"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    part = tmp_path / "t.jsonl.gz.part"
    lines = part.read_text().splitlines()
    # No exit handler ran: the whole flushes (64 of the 70 events) are there.
    assert json.loads(lines[0])["format"] == "jaxlake-trace"
    assert len(lines) - 1 == 64


EMPTY_SHIM_TRACE = ('{"format": "jaxlake-trace", "version": 1, "name": '
                    '"shim", "devices": 1, "source": "shim", "meta": '
                    '{"outside_pool_bytes": 4096}}\n')


def test_replaying_a_trace_with_no_events_is_a_usage_error(
        tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "empty.jsonl.gz"
    trace.write_bytes(gzip.compress(EMPTY_SHIM_TRACE.encode()))
    proc = subprocess.run([JAXLAKE, "replay", str(trace)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "U_fit" not in proc.stdout and "0.000" not in proc.stdout
    assert f"{trace}: the trace has no allocation events" in proc.stderr
    assert "JAXLAKE_SHIM_HOOKS=0" in proc.stderr  # a likely cause
    # The same in a suite: named, with the same status.
    proc = subprocess.run([JAXLAKE, "bench", "--suite", str(tmp_path),
                           "--out", str(tmp_path / "out"), "--no-plots",
                           "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no allocation events" in proc.stderr and str(trace) in proc.stderr


@NEEDS_FAKE_GPU
def test_a_trace_taken_with_hooks_off_is_refused_by_replay(
        tmp_path: pathlib.Path) -> None:
    code = CTYPES_ALLOC + """
pool = pool_of(0)
free(alloc(pool, 1 << 20))
"""
    trace = tmp_path / "off.jsonl"
    proc = fake_run([sys.executable, "-c", code], args=["--trace", str(trace),
                                                         "--quiet"],
                    env={"JAXLAKE_SHIM_HOOKS": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    replay = subprocess.run([JAXLAKE, "replay", str(trace), "--fit"],
                            capture_output=True, text=True, timeout=120)
    assert replay.returncode == 2, replay.stdout + replay.stderr
    assert "no allocation events" in replay.stderr
