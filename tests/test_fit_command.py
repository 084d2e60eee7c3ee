"""`jaxlake fit`: the search on synthetic traces, the report and its JSON,
bad input, and both engines on real programs (the recorder and the fake
GPU on the tiny LM example, the fake GPU on small user scripts)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from fakegpu_util import N_MIB_PROGRAM, fake_gpu_reason

from jaxlake._src.fit import engine, real, run, search
from jaxlake._src.fit.search import FitError, Probe, Vary
from jaxlake._src.trace.tracefile import TraceWriter

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _jaxlake(*args: str, timeout: int = 300,
             xla_flags: Optional[str] = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    # (not from the source folder, where `-m jaxlake` finds the sources)
    return subprocess.run([*engine.jaxlake_command(), *args],
                          capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=tempfile.gettempdir())


# -- the grid and the search -------------------------------------------------


def test_grid_pow2_and_linear() -> None:
    assert search.grid(Vary("b", 1, 128)) == [1, 2, 4, 8, 16, 32, 64, 128]
    # LO and HI that are not powers of two are candidates too
    assert search.grid(Vary("b", 3, 20)) == [3, 4, 8, 16, 20]
    assert search.grid(Vary("b", 5, 9), "linear", 1) == [5, 6, 7, 8, 9]
    assert search.grid(Vary("b", 2, 11), "linear", 4) == [2, 6, 10, 11]


def _probe_upto(limit: int, seen: List[int]):
    def probe(value: int) -> Probe:
        seen.append(value)
        fits = value <= limit
        return Probe(value, fits, 100, value, value,
                     None if fits else search.SHORTAGE)
    return probe


@pytest.mark.parametrize("limit", [0, 1, 2, 5, 17, 63, 64, 100])
def test_search_finds_the_largest_value_that_fits(limit: int) -> None:
    values = list(range(1, 65))
    seen: List[int] = []
    f = search.search_policy(values, _probe_upto(limit, seen), "p", 100)
    expected = min(limit, 64) if limit >= 1 else None
    assert f.largest == expected
    assert f.next_value == (None if limit >= 64 else limit + 1)
    assert (f.next_failure is None) == (limit >= 64)
    # exponential then binary: a logarithmic number of probes, no repeats
    assert len(seen) == len(set(seen)) <= 2 * 7 + 1
    assert f.probed == seen


def test_search_is_exponential_then_binary() -> None:
    seen: List[int] = []
    search.search_policy(list(range(100)), _probe_upto(40, seen), "p", 1)
    # indices 0, 1, 3, 7, 15, 31, 63 (fails), then halving (31, 63)
    assert seen[:7] == [0, 1, 3, 7, 15, 31, 63]
    assert seen[7:] == [47, 39, 43, 41, 40]


def _fragmenting(folder: Path, calls: List[int]):
    """n blocks of 4 MiB, every other freed, then one request of half of
    them: peak live 4n MiB, in holes a policy that cannot stitch misses."""
    def make(value: int) -> str:
        calls.append(value)
        path = folder / f"t{value}.jsonl"
        with TraceWriter(path, f"frag-{value}") as w:
            for i in range(value):
                w.alloc(i, 4 * MIB, kind="activation")
            for i in range(1, value, 2):
                w.free(i)
            w.alloc(10_000, (value // 2) * 4 * MIB, kind="temp")
        return str(path)
    return make


def test_traces_are_shared_and_failures_classified(tmp_path: Path) -> None:
    calls: List[int] = []
    vary = Vary("n", 2, 16)
    values = search.grid(vary, "linear", 2)
    # (every policy held to XLA's share: like with like)
    report = run.fit(["prog", "--n", "{n}"], vary, values,
                     engine.Gpu.parse("64MiB"), ["jaxlake", "bfc", "torch"],
                     fraction=0.75, make_trace=_fragmenting(tmp_path, calls))
    # each value's trace made once, whatever the number of policies
    assert len(calls) == len(set(calls))
    assert sorted(calls) == sorted(t.value for t in report.traces)
    assert report.capacity == {"jaxlake": 48 * MIB, "bfc": 48 * MIB,
                               "torch": 48 * MIB}
    lake = report.policy("jaxlake")
    bfc = report.policy("bfc")
    assert lake is not None and bfc is not None
    # jaxlake stitches the holes: it stops only where the live bytes
    # alone (4n MiB) exceed 48 MiB
    assert lake.largest == 12
    assert lake.next_failure is not None
    assert lake.next_failure.reason == search.SHORTAGE
    assert lake.next_failure.peak_live == 56 * MIB
    # BFC runs out with the live bytes under the capacity: fragmentation,
    # naming the request that failed
    assert bfc.largest is not None and bfc.largest < 12
    nf = bfc.next_failure
    assert nf is not None and nf.reason == search.FRAGMENTATION
    assert nf.peak_live <= 48 * MIB
    assert nf.request_kind == "temp"
    assert nf.request_size == (nf.value // 2) * 4 * MIB
    gains = report.gains()
    assert gains["bfc"] == pytest.approx(100.0 * (12 - bfc.largest)
                                         / bfc.largest)
    text = run.format_report(report)
    assert "fragmentation: a temp request of" in text
    assert "shortage: peak live 56 MiB > capacity 48 MiB" in text


def test_json_schema(tmp_path: Path) -> None:
    vary = Vary("n", 2, 16)
    report = run.fit(["prog", "{n}"], vary, search.grid(vary, "linear", 2),
                     engine.Gpu.parse("64MiB"), ["jaxlake", "bfc"],
                     fraction=0.75, make_trace=_fragmenting(tmp_path, []))
    data = json.loads(json.dumps(report.to_json()))
    assert data["fraction"] == 0.75 and data["lake_share"] is None
    assert data["format"] == "jaxlake-fit" and data["version"] == 2
    assert data["gpu"] == {"name": "64 MiB", "memory": 64 * MIB,
                           "devices": 1}
    assert data["vary"]["name"] == "n"
    assert set(data["policies"]) == {"jaxlake", "bfc"}
    for name, p in data["policies"].items():
        assert {"largest", "next_failure", "capacity", "peak_live",
                "peak_reserved", "utilisation", "headroom"} <= set(p)
        nf = p["next_failure"]
        assert nf["reason"] in ("shortage", "fragmentation")
        if nf["reason"] == "fragmentation":
            assert {"size", "kind"} <= set(nf["request"])
        assert p["probes"], name
    assert data["policies"]["jaxlake"]["largest"] == 12
    assert data["policies"]["bfc"]["next_failure"]["reason"] == \
        "fragmentation"
    assert data["gain_percent"]["bfc"] > 0


def test_capacity_rules() -> None:
    names = ["jaxlake", "bfc"]
    g = 80 << 30
    # no fraction: XLA's 0.75 for the others, the whole device for the
    # lake (it grows into it as XLA's cuda_async pool does)
    assert run.capacities(g, names) == {"jaxlake": 80 << 30,
                                        "bfc": 60 << 30}
    assert run.lake_share() == 1.0
    # a fraction (--fraction, XLA_CLIENT_MEM_FRACTION) holds them all
    assert run.capacities(g, names, fraction=0.5) == {"jaxlake": 40 << 30,
                                                      "bfc": 40 << 30}
    assert run.capacities(g, names, fraction=0.75)["jaxlake"] == 60 << 30
    assert run.lake_share(0.75) is None
    # the lake's own capacity option is jaxlake's (bytes or a fraction)
    assert run.capacities(g, names, lake_capacity=0.9) == {
        "jaxlake": 72 << 30, "bfc": 60 << 30}
    assert run.capacities(g, names, lake_capacity=70 << 30)["jaxlake"] == \
        70 << 30
    # memory outside the pool comes off every capacity, in whole granules
    out = run.capacities(g, names, outside=3 * MIB)
    assert out["bfc"] == (60 << 30) - 4 * MIB
    assert out["jaxlake"] == (80 << 30) - 4 * MIB


def test_outside_pool_from_the_trace_header() -> None:
    assert engine.outside_pool({}) is None
    assert engine.outside_pool({"outside_pool_bytes": 5 * MIB}) == 5 * MIB
    # a program that died before the shim's first flush leaves null
    assert engine.outside_pool({"outside_pool_bytes": None}) is None
    assert engine.outside_pool({"outside_pool_bytes": -1}) is None
    assert engine.outside_pool({"outside_pool_bytes": True}) is None


def test_each_value_has_its_own_outside_pool(tmp_path: Path) -> None:
    # n MiB live in the pool and 4n MiB outside it: with 48 MiB of
    # capacity, n=8 would fit without the outside memory, and n=9 fits
    # not even then (9 + 36 MiB, 48 - 36 = 12 MiB of capacity, rounded
    # to granules). The capacity of each value is its own trace's.
    def make(value: int) -> str:
        path = tmp_path / f"o{value}.jsonl"
        with TraceWriter(path, f"o{value}",
                         meta={"outside_pool_bytes": 4 * value * MIB}) as w:
            w.alloc(1, value * MIB, kind="temp")
        return str(path)

    vary = Vary("n", 1, 16)
    report = run.fit(["prog", "{n}"], vary, search.grid(vary, "linear", 1),
                     engine.Gpu.parse("64MiB"), ["jaxlake"], make_trace=make)
    lake = report.policy("jaxlake")
    assert lake is not None
    # No fraction: the lake's capacity is the whole 64 MiB device. n MiB
    # fits in 64 - 4n MiB (granules of 2 MiB) up to n = 12
    assert report.lake_share == 1.0
    assert lake.largest == 12
    assert lake.next_failure is not None and lake.next_failure.value == 13
    assert lake.next_failure.capacity == 12 * MIB
    assert "jaxlake all of it (no fraction set" in run.format_report(report)
    assert report.capacity["jaxlake"] == 60 * MIB  # n=1's: 64 - 4
    assert report.outside_pool == max(t.outside_pool or 0
                                      for t in report.traces)
    data = report.to_json()
    assert data["outside_pool"] == report.outside_pool
    assert {t["value"]: t["outside_pool"] for t in data["traces"]}[12] == \
        48 * MIB
    text = run.format_report(report)
    assert "memory outside XLA's pool: 4 MiB to " in text
    assert "subtracted from every capacity" in text


def test_fake_gpu_command_line() -> None:
    gpu = engine.Gpu.parse("h200")
    cmd = engine.fake_gpu_command(["python", "t.py"], "/tmp/x.jsonl", gpu)
    assert cmd[:cmd.index("run")] == engine.jaxlake_command()
    assert "--fake-gpu=h200" in cmd
    memory = [a for a in cmd if a.startswith("--fake-gpu-memory=")]
    assert memory and int(memory[0].split("=")[1]) >= 141 << 30
    assert cmd[-3:] == ["--", "python", "t.py"]
    assert cmd[cmd.index("--trace") + 1] == "/tmp/x.jsonl"
    assert engine.recorder_command(["p", "--out={TRACE}"], "/t") == \
        ["p", "--out=/t"]
    assert engine.recorder_command(["p"], "/t") == ["p", "--trace", "/t"]


def test_fake_gpu_problem_reads_argparse_errors() -> None:
    text = ("usage: jaxlake run ...\njaxlake run: error: unrecognized "
            "arguments: --fake-gpu=h100 --fake-gpu-memory=1")
    assert "fake GPU is unavailable" in (engine.fake_gpu_problem(text) or "")
    assert engine.fake_gpu_problem("Traceback: the program's own") is None


# -- bad input ---------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--gpu", "h100", "--vary", "batch", "--", "p", "{batch}"],
     "expected NAME=LO..HI"),
    (["--gpu", "h100", "--vary", "batch=8..2", "--", "p", "{batch}"],
     "HI (2) is below LO (8)"),
    (["--gpu", "h100", "--vary", "batch=0..4", "--", "p", "{batch}"],
     "LO must be at least 1"),
    (["--gpu", "h100", "--vary", "batch=a..4", "--", "p", "{batch}"],
     "whole numbers"),
    (["--gpu", "h100", "--vary", "batch=1..4", "--", "p", "--batch", "8"],
     "the command has no {batch}"),
    (["--gpu", "h999", "--vary", "batch=1..4", "--", "p", "{batch}"],
     "--gpu 'h999': expected one of h100, h200, a100-80gb"),
    (["--gpu", "-5GiB", "--vary", "batch=1..4", "--", "p", "{batch}"],
     "--gpu"),
    (["--gpu", "h100", "--vary", "batch=1..4", "--step", "fast", "--",
      "p", "{batch}"], "--step 'fast'"),
    (["--gpu", "h100", "--vary", "batch=1..4", "--policies", "bfcc", "--",
      "p", "{batch}"], "did you mean 'bfc'"),
    (["--gpu", "h100", "--vary", "batch=1..4", "--fraction", "1.5", "--",
      "p", "{batch}"], "--fraction 1.5"),
    (["--gpu", "h100", "--vary", "batch=1..4"], "give the command after --"),
    (["--gpu", "h100", "--devices", "0", "--vary", "batch=1..4", "--", "p",
      "{batch}"], "--devices 0: give a number of devices from 1 to 64"),
    (["--gpu", "h100", "--devices", "2", "--engine", "recorder", "--vary",
      "batch=1..4", "--", "p", "{batch}"],
     "devices are the fake-gpu engine's"),
])
def test_bad_input_is_one_clear_line(args: List[str], words: str) -> None:
    done = _jaxlake("fit", *args, timeout=60)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("jaxlake fit: error:") or \
        "jaxlake fit: error:" in done.stderr


def test_failing_command_is_reported(tmp_path: Path) -> None:
    done = _jaxlake("fit", "--gpu", "64MiB", "--vary", "n=1..2",
                    "--engine", "recorder", "--traces", str(tmp_path), "--",
                    sys.executable, "-c", "import sys; print('boom'); "
                    "sys.exit(3)", "{n}", timeout=60)
    assert done.returncode == 2
    assert "n=1: the command failed with exit status 3" in done.stderr
    assert "boom" in done.stderr and "Traceback" not in done.stderr


# -- the engines on real programs --------------------------------------------


def _needs_recorder() -> None:
    for module in ("jax", "flax", "optax", "orbax"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is missing: the LM example needs jax, "
                        "flax, optax and orbax-checkpoint")
    from jaxlake._src.trace.gpu import plugin_problem
    problem = plugin_problem()
    if problem:
        pytest.skip(f"no device-less CUDA compile here: {problem}")


def test_recorder_engine_on_the_tiny_lm(tmp_path: Path) -> None:
    _needs_recorder()
    out = tmp_path / "fit.json"
    done = _jaxlake(
        "fit", "--gpu", "96MiB", "--vary", "batch=32..64",
        "--engine", "recorder", "--traces", str(tmp_path / "traces"),
        "--fraction", "0.75",
        "--json", str(out), "--policies", "jaxlake,bfc,xla-vmm", "--",
        sys.executable, str(EXAMPLES / "train_lm.py"), "--preset", "tiny",
        "--batch", "{batch}", "--steps", "2", "--compile-only",
        "--no-progress", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    # two values, each recorded once for the three policies
    assert [t["value"] for t in data["traces"]] == [32, 64]
    assert "batch=32: recorded" in done.stderr
    lake = data["policies"]["jaxlake"]
    # the tiny LM at batch 64 needs more live bytes than 72 MiB: a shortage
    assert lake["largest"] == 32
    assert lake["next_failure"]["reason"] == "shortage"
    assert lake["next_failure"]["peak_live"] > 72 * MIB
    assert lake["peak_live"] <= lake["peak_reserved"] <= 72 * MIB
    for name, p in data["policies"].items():
        assert p["largest"] is None or p["largest"] <= lake["largest"], name
    assert "largest batch" in done.stdout
    # a second search reuses the kept traces: nothing recorded again
    again = _jaxlake(
        "fit", "--gpu", "96MiB", "--vary", "batch=32..64",
        "--engine", "recorder", "--traces", str(tmp_path / "traces"),
        "--policies", "jaxlake", "--", sys.executable,
        str(EXAMPLES / "train_lm.py"), "--preset", "tiny", "--batch",
        "{batch}", "--steps", "2", "--compile-only", "--no-progress",
        timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "recorded" not in again.stderr and "trace reused" in again.stderr


TRACE_SCRIPT = """
import json, sys
n, path = int(sys.argv[1]), sys.argv[sys.argv.index("--trace") + 1]
with open(path, "w") as f:
    f.write(json.dumps({"format": "jaxlake-trace", "version": 1,
                        "name": "t", "devices": 1, "source": "test",
                        "meta": {}}) + "\\n")
    f.write(json.dumps({"t": 0, "op": "alloc", "id": 1, "dev": 0,
                        "size": n << 20}) + "\\n")
"""


def test_recorder_traces_serve_every_gpu(tmp_path: Path) -> None:
    # A recorder's trace does not depend on the GPU: the H200's search
    # reuses the H100's traces (the fake GPU's would not: its model is
    # part of the trace).
    script = tmp_path / "rec.py"
    script.write_text(TRACE_SCRIPT)
    traces = str(tmp_path / "traces")
    vary = Vary("n", 1 << 10, 1 << 17)
    values = search.grid(vary, "pow2", 1)
    argv = [sys.executable, str(script), "{n}"]
    first = run.fit(argv, vary, values, engine.Gpu.parse("h100"),
                    ["jaxlake"], engine="recorder", traces_dir=traces)
    made = sorted(os.listdir(traces))
    lake = first.policy("jaxlake")
    # (no fraction: the lake's capacity is the whole device)
    assert lake is not None and lake.largest == 1 << 16  # 64 GiB of 80
    second = run.fit(argv, vary, values, engine.Gpu.parse("h200"),
                     ["jaxlake"], engine="recorder", traces_dir=traces)
    lake = second.policy("jaxlake")
    assert lake is not None and lake.largest == 1 << 17  # 128 of 141 GiB
    assert {t.value for t in first.traces} & {t.value for t in second.traces}
    # only the values the H100's search did not try were recorded again
    new = sorted(set(os.listdir(traces)) - set(made))
    assert len(new) == len({t.value for t in second.traces}
                           - {t.value for t in first.traces}) * 2  # + .log
    assert engine.Gpu.parse("h200").fake_model != \
        engine.Gpu.parse("h100").fake_model


_FAKE_WHY = fake_gpu_reason()

SCRIPT = N_MIB_PROGRAM


def _fit_script_on_the_fake_gpu(
        tmp_path: Path, text: str
) -> "Tuple[subprocess.CompletedProcess[str], Dict[str, Any]]":
    """`jaxlake fit` (fake GPU, a 256 MiB device, every policy held to
    0.75 of it, jaxlake and bfc) over the script `text`, which takes n;
    its run and its JSON report."""
    script = tmp_path / "user.py"
    script.write_text(text)
    out = tmp_path / "fit.json"
    done = _jaxlake("fit", "--gpu", "256MiB", "--vary", "n=16..512",
                    "--fraction", "0.75",
                    "--json", str(out), "--policies", "jaxlake,bfc", "--",
                    sys.executable, str(script), "{n}", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads(out.read_text())


@pytest.mark.skipif(_FAKE_WHY is not None,
                    reason=f"the fake GPU is unavailable: {_FAKE_WHY}")
def test_fake_gpu_engine_on_a_small_script(tmp_path: Path) -> None:
    done, data = _fit_script_on_the_fake_gpu(tmp_path, SCRIPT)
    assert data["engine"] == "fake-gpu"
    lake = data["policies"]["jaxlake"]
    # 192 MiB of capacity: 256 MiB of input cannot fit; 16 MiB must
    assert lake["largest"] is not None and 16 <= lake["largest"] <= 128
    assert lake["next_failure"]["reason"] == "shortage"
    assert lake["next_failure"]["peak_live"] > 192 * MIB
    # XLA's client takes nothing outside its pool for this program, and
    # the traces say so (a figure, not "not reported")
    assert data["outside_pool"] == 0
    assert "memory outside XLA's pool: 0 B" in done.stdout


@pytest.mark.skipif(_FAKE_WHY is not None,
                    reason=f"the fake GPU is unavailable: {_FAKE_WHY}")
def test_fake_gpu_engine_on_the_tiny_lm(tmp_path: Path) -> None:
    # The tiny preset's training (two steps, XLA's real client on the fake
    # GPU) on a 256 MiB device: 192 MiB of capacity. Autotuning is off, as
    # docs/benchmarks.md runs it: on the fake it times kernels that do not
    # run.
    out = tmp_path / "fit.json"
    done = _jaxlake(
        "fit", "--gpu", "256MiB", "--vary", "batch=64..128", "--json",
        str(out), "--fraction", "0.75", "--policies", "jaxlake,bfc", "--",
        sys.executable,
        str(EXAMPLES / "train_lm.py"), "--preset", "tiny", "--dtype",
        "float32", "--attention", "xla", "--batch", "{batch}", "--steps",
        "2", "--no-progress", timeout=300,
        xla_flags="--xla_gpu_autotune_level=0")
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["engine"] == "fake-gpu"
    assert [t["value"] for t in data["traces"]] == [64, 128]
    for name in ("jaxlake", "bfc"):
        p = data["policies"][name]
        # batch 64 fits; at 128 the live bytes alone exceed 192 MiB
        assert p["largest"] == 64, (name, p)
        assert p["next_failure"]["reason"] == "shortage", (name, p)
        assert p["next_failure"]["peak_live"] > 192 * MIB
        assert p["peak_live"] <= p["peak_reserved"] <= 192 * MIB
    assert "batch=128: recorded" in done.stderr


OUTSIDE_SCRIPT = """
import ctypes
import sys
import jax, jax.numpy as jnp
n = int(sys.argv[1])
x = jnp.ones((n, 1 << 18), jnp.float32)   # n MiB, in XLA's pool
# 64 MiB outside it, as a library calling cuMemAlloc would take
cuda = ctypes.CDLL("libcuda.so.1")
ptr = ctypes.c_ulonglong(0)
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 20)) == 0
y = jax.jit(lambda a: (a * 2).sum(axis=0))(x)
y.block_until_ready()
"""


@pytest.mark.skipif(_FAKE_WHY is not None,
                    reason=f"the fake GPU is unavailable: {_FAKE_WHY}")
def test_fake_gpu_engine_subtracts_memory_outside_the_pool(
        tmp_path: Path) -> None:
    done, data = _fit_script_on_the_fake_gpu(tmp_path, OUTSIDE_SCRIPT)
    # the shim counted the forwarded cuMemAlloc in every trace's header
    assert data["outside_pool"] == 64 * MIB
    assert {t["outside_pool"] for t in data["traces"]} == {64 * MIB}
    lake = data["policies"]["jaxlake"]
    # 192 MiB less 64 MiB: the next value fails with its live bytes
    # under 192 MiB, so it would have fit without the subtraction
    assert lake["capacity"] == 128 * MIB
    assert lake["largest"] is not None and 16 <= lake["largest"] <= 64
    nf = lake["next_failure"]
    assert nf["reason"] == "shortage"
    assert 128 * MIB < nf["peak_live"] <= 192 * MIB
    assert "memory outside XLA's pool: 64 MiB" in done.stdout
    assert "capacity: jaxlake 128 MiB, bfc 128 MiB" in done.stdout


@pytest.mark.skipif(_FAKE_WHY is None,
                    reason="the fake GPU is available here: its engine runs")
def test_fake_gpu_engine_unavailable_says_so(tmp_path: Path) -> None:
    done = _jaxlake("fit", "--gpu", "256MiB", "--vary", "n=1..2", "--",
                    sys.executable, "-c", "pass", "{n}", timeout=60)
    assert done.returncode == 1
    assert "the fake GPU is unavailable" in done.stderr
    assert "--engine recorder" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_value_that_runs_out_of_the_fake_device_is_a_shortage(
        tmp_path: Path) -> None:
    # Values up to 8 record a trace of n MiB; larger ones run out of the
    # fake device (as XLA's client does when a batch needs more than even
    # the oversized fake holds). The search goes on: those values are a
    # shortage for every policy, recorded once, with the failed request.
    calls: List[int] = []

    def make(value: int) -> str:
        calls.append(value)
        if value > 8:
            raise engine.OutOfFakeMemory(f"n={value}: ran out", 1 << 40,
                                         value << 30)
        path = tmp_path / f"f{value}.jsonl"
        with TraceWriter(path, f"f{value}") as w:
            w.alloc(1, value * MIB, kind="temp")
        return str(path)

    vary = Vary("n", 1, 64)
    report = run.fit(["prog", "{n}"], vary, search.grid(vary),
                     engine.Gpu.parse("64MiB"), ["jaxlake", "bfc"],
                     make_trace=make)
    for name in ("jaxlake", "bfc"):
        fit = report.policy(name)
        assert fit is not None and fit.largest == 8
        failure = fit.next_failure
        assert failure is not None and failure.value == 16
        assert failure.reason == search.SHORTAGE and failure.beyond == 1 << 40
        assert "ran out of a 1 TiB fake device" in \
            failure.describe_failure()
        assert "a request of 16 GiB" in failure.describe_failure()
        data = failure.to_json()
        assert data["peak_live"] is None and data["reason"] == "shortage"
        assert data["ran_out_of_fake_device"] == 1 << 40
    assert sorted(set(calls)) == sorted(calls)   # each value recorded once
    run.format_report(report)   # the table prints such a failure


@pytest.mark.parametrize("output,expected", [
    ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
     "trying to allocate 241.00GiB. [executable_name='jit_train_step']",
     (True, 241 << 30)),
    ("RESOURCE_EXHAUSTED: Out of memory allocating something", (True, None)),
    # XLA rounds the size to two decimals: not whole bytes, the nearest
    ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
     "trying to allocate 75.08GiB with allocator GPU_0_bfc on device 0.",
     (True, round(75.08 * (1 << 30)))),
    # under cuda_async (the lake's) the allocator's line has it exactly
    ("E1205 gpu_cudamallocasync_allocator.cc:366] gpu_async_0 "
     "cuMemAllocAsync failed to allocate 80621460968 bytes: "
     "RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY\n"
     "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
     "trying to allocate 75.08GiB with allocator gpu_async_0 on device 0.",
     (True, 80621460968)),
    ("Traceback ... ValueError: bad batch", (False, None)),
])
def test_out_of_memory_is_read_from_xlas_message(
        output: str, expected: Tuple[bool, Optional[int]]) -> None:
    assert engine.out_of_memory(output) == expected


# -- several devices, and programs such as MaxText -------------------------

#: MaxText's training, as `jaxlake fit` runs it: `python -m` and key=value
#: options, the placeholder inside one of them.
MAXTEXT = ["python", "-m", "maxtext.trainers.pre_train.train", "base.yml",
           "model_name=qwen2.5-1.5b", "per_device_batch_size={batch}",
           "run_name=fit"]


def test_devices_reach_every_run_and_key_value_options_take_the_value(
        ) -> None:
    gpu = dataclasses.replace(engine.Gpu.parse("h100"), count=8)
    command = search.substitute(MAXTEXT, Vary("batch", 1, 128), 16)
    assert command[3:] == ["base.yml", "model_name=qwen2.5-1.5b",
                           "per_device_batch_size=16", "run_name=fit"]
    recording = engine.fake_gpu_command(command, "/tmp/t.jsonl", gpu)
    assert "--fake-gpu-count=8" in recording
    assert recording[recording.index("--") + 1:] == command
    for lake in (True, False):
        runs = real.command(command, gpu, lake=lake)
        assert "--fake-gpu-count=8" in runs
        assert f"--fake-gpu-memory={80 << 30}" in runs
        assert ("--no-lake" in runs) is not lake
    one = engine.fake_gpu_command(command, "/tmp/t.jsonl",
                                  engine.Gpu.parse("h100"))
    assert "--fake-gpu-count=1" in one


def test_several_devices_are_fitted_device_by_device(tmp_path: Path) -> None:
    # Each of 2 devices holds n MiB, on a 64 MiB GPU (48 MiB of capacity a
    # device): n = 32 fits on each, though both together hold 64 MiB, and
    # the figures at the largest value are one device's, not their sum.
    def make(value: int) -> str:
        path = tmp_path / f"d{value}.jsonl"
        with TraceWriter(path, f"d{value}", devices=2) as w:
            w.alloc(1, value * MIB, dev=0, kind="temp")
            w.alloc(2, value * MIB, dev=1, kind="temp")
        return str(path)

    vary = Vary("n", 1, 64)
    gpu = dataclasses.replace(engine.Gpu.parse("64MiB"), count=2)
    report = run.fit(["prog", "{n}"], vary, search.grid(vary), gpu,
                     ["jaxlake", "bfc"], fraction=0.75, make_trace=make)
    for name in ("jaxlake", "bfc"):
        f = report.policy(name)
        assert f is not None and f.largest == 32, name
        a = f.at_largest
        assert a is not None and a.capacity == 48 * MIB
        assert a.peak_live == 32 * MIB
        assert 32 * MIB <= a.peak_reserved <= 48 * MIB, (name, a)
        assert a.headroom >= 0 and 0.5 < a.utilisation <= 1.0
        assert f.next_failure is not None and \
            f.next_failure.reason == search.SHORTAGE
    data = report.to_json()
    assert data["gpu"]["devices"] == 2
    assert data["policies"]["jaxlake"]["peak_reserved"] <= 48 * MIB
    assert "2 devices a run" in run.format_report(report)


def _capture_runs(monkeypatch: Any) -> List[Tuple[List[str], Dict[str, str]]]:
    """Replaces the running of commands: each run is kept (command and
    environment), writes the trace it is asked for, and succeeds."""
    seen: List[Tuple[List[str], Dict[str, str]]] = []

    def fake_run(command: List[str], log: str,
                 env: Optional[Dict[str, str]] = None) -> int:
        seen.append((list(command), dict(env or {})))
        if "--trace" in command:
            path = command[command.index("--trace") + 1]
            with TraceWriter(path, "t") as w:
                w.alloc(1, MIB)
        return 0

    monkeypatch.setattr(engine, "run_command", fake_run)
    return seen


def test_every_run_compiles_afresh(monkeypatch: Any, tmp_path: Path) -> None:
    # A program that keeps JAX's persistent compilation cache (MaxText:
    # jax_cache_dir) would load an earlier run's programs, compiled for
    # another value or another device size, and skip compiling and
    # autotuning: every recording and real run has the cache off.
    seen = _capture_runs(monkeypatch)
    monkeypatch.delenv(engine.COMPILATION_CACHE_ENV, raising=False)
    gpu = dataclasses.replace(engine.Gpu.parse("h100"), count=2)
    argv = search.substitute(MAXTEXT, Vary("batch", 1, 8), 2)
    engine.record("fake-gpu", argv, str(tmp_path / "t.jsonl"), gpu,
                  "batch=2", None)
    for name in (real.LAKE, "real:jax-default"):
        outcome = real.run_once(argv, gpu, real.BY_NAME[name], None,
                                str(tmp_path / "run.log"), "batch=2", None)
        assert outcome.fits
    assert len(seen) == 3
    for command, env in seen:
        assert env[engine.COMPILATION_CACHE_ENV] == "false", command
        assert "--fake-gpu-count=2" in command
    # the program's own choice stands
    seen.clear()
    monkeypatch.setenv(engine.COMPILATION_CACHE_ENV, "true")
    engine.record("fake-gpu", argv, str(tmp_path / "u.jsonl"), gpu,
                  "batch=2", None)
    assert seen[0][1][engine.COMPILATION_CACHE_ENV] == "true"
