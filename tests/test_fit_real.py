"""`jaxlake fit`'s real runs (jaxlake/_src/fit/real.py): policies that run
the program on XLA's own allocator over a fake device of the GPU's memory,
their sharing, JAX's default marked and first in the report; and one short
fit on the fake GPU whose verdicts are XLA's own out-of-memory errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Tuple

import pytest
from fakegpu_util import N_MIB_PROGRAM, fit_real_reason

from jaxlake._src.fit import engine, real, run, search
from jaxlake._src.fit.search import FitError, Vary
from jaxlake._src.trace.tracefile import TraceWriter

MIB = 1 << 20


def _traces(folder: Path):
    """n MiB live in one buffer: a trace per value."""
    def make(value: int) -> str:
        path = folder / f"t{value}.jsonl"
        with TraceWriter(path, f"t{value}") as w:
            w.alloc(1, value * MIB, kind="temp")
        return str(path)
    return make


def _runs(limit: int, calls: List[Tuple[str, int]], lake: int = 0):
    """A stand-in for the program's real runs: values up to `limit` fit
    (`lake` for the lake's own real run), larger ones end with XLA's
    out-of-memory error."""
    def run_real(policy: real.RealPolicy, value: int,
                 label: str) -> real.Outcome:
        calls.append((policy.name, value))
        if value <= (lake if policy.lake else limit):
            return real.Outcome(True)
        return real.Outcome(False, value * MIB, "RESOURCE_EXHAUSTED: Out "
                            "of memory while trying to allocate")
    return run_real


def test_real_runs_are_verdicts_shared_and_jax_default_comes_first(
        tmp_path: Path) -> None:
    calls: List[Tuple[str, int]] = []
    vary = Vary("n", 1, 64)
    values = search.grid(vary, "pow2", 1)
    report = run.fit(["prog", "{n}"], vary, values,
                     engine.Gpu.parse("64MiB"),
                     ["jaxlake", "bfc", "real:jaxlake", "real:jax-default",
                      "real:bfc", "real:bfc-growth"], fraction=0.75,
                     make_trace=_traces(tmp_path),
                     real_run=_runs(16, calls, lake=64))
    # Each real policy's verdict is its runs': 16 fits, 32 does not.
    for name in ("real:jax-default", "real:bfc", "real:bfc-growth"):
        f = report.policy(name)
        assert f is not None and f.largest == 16, name
        assert f.next_failure is not None
        assert f.next_failure.reason == search.OUT_OF_MEMORY
        assert f.next_failure.real and f.next_failure.request_size == 32 * MIB
    # real:bfc is the allocator nothing set picks: it shares JAX's
    # default's runs; bfc-growth runs its own. One run per value probed.
    ran = {name for name, _ in calls}
    assert ran == {"real:jaxlake", "real:jax-default", "real:bfc-growth"}
    assert len(calls) == len(set(calls)) == report.real_runs
    assert report.policy("real:bfc").probed == \
        report.policy("real:jax-default").probed
    # The lake against JAX's default first, like with like: the lake's real
    # run (64) against JAX's default's (16); the lake's model (32: 48 MiB
    # of capacity) against the model bfc (32); never a real run against a
    # replay.
    gains = report.gains()
    assert list(gains)[0] == "real:jax-default"
    assert gains["real:jax-default"] == pytest.approx(300.0)  # 64 vs 16
    assert gains["real:bfc-growth"] == pytest.approx(300.0)
    assert gains["bfc"] == pytest.approx(0.0)
    assert "real:jaxlake" not in gains and "jaxlake" not in gains
    data = json.loads(json.dumps(report.to_json()))
    assert data["version"] == 2
    pol = data["policies"]
    assert pol["real:jax-default"]["kind"] == "real run"
    assert pol["real:jax-default"]["jax_default"] is True
    assert pol["bfc"]["kind"] == "model" and not pol["bfc"]["jax_default"]
    assert pol["real:jax-default"]["peak_live"] is None
    nf = pol["real:jax-default"]["next_failure"]
    assert nf["reason"] == "out of memory" and nf["peak_live"] is None
    assert nf["request"]["size"] == 32 * MIB
    assert data["jax_default"]["real"] == "real:jax-default"
    assert data["jax_default"]["model"] == "bfc-prealloc"
    assert data["real_runs"] == report.real_runs
    text = run.format_report(report)
    assert "real:jax-default (JAX's default)" in text
    lines = text.splitlines()
    first = next(i for i, l in enumerate(lines) if "jaxlake's largest" in l)
    assert "against JAX's default" in lines[first]
    assert "+300% (real:jaxlake against real:jax-default)" in lines[first]
    # plain bfc is said not to be JAX's default; real:bfc is its allocator
    assert any(l.startswith("  bfc: XLA's BFC with preallocation off")
               and "not JAX's default" in l for l in lines)
    assert any(l.startswith("  real:bfc: ") and "the allocator JAX's "
               "default picks" in l for l in lines)


def test_the_model_of_jax_default_preallocates(tmp_path: Path) -> None:
    """bfc-prealloc (one region of the whole capacity, as JAX runs BFC by
    default) places a request that BFC with preallocation off cannot: its
    doubling regions (2, 4, 8, 16 MiB here) each keep a hole, and the
    device has too little left for a new region of the request's size."""
    def make(value: int) -> str:
        path = tmp_path / f"p{value}.jsonl"
        with TraceWriter(path, f"p{value}") as w:
            for i, size in enumerate((2, 2, 2, 4, 4, 8, 8)):
                w.alloc(i, size * MIB, kind="activation")
            for i in (2, 4, 6):
                w.free(i)
            w.alloc(100, value * MIB, kind="temp")
        return str(path)

    vary = Vary("n", 10, 28)
    report = run.fit(["prog", "{n}"], vary, search.grid(vary, "linear", 2),
                     engine.Gpu.parse("64MiB"), ["bfc", "bfc-prealloc"],
                     make_trace=make)
    pre, grow = report.policy("bfc-prealloc"), report.policy("bfc")
    assert pre is not None and grow is not None
    # 48 MiB of capacity, 16 MiB live: preallocated, the last hole and the
    # unused rest are one range of 26 MiB
    assert grow.largest == 18 and pre.largest == 26
    assert grow.next_failure is not None
    assert grow.next_failure.reason == search.FRAGMENTATION
    data = report.to_json()["policies"]
    assert data["bfc-prealloc"]["jax_default"]
    assert not data["bfc"]["jax_default"]


def test_real_policies_are_checked() -> None:
    with pytest.raises(FitError, match="unknown real policy 'real:nope'"):
        run.check_policies(["real:nope"])
    with pytest.raises(FitError, match="real runs run the command on the "
                       "fake GPU"):
        run.fit(["p", "{n}"], Vary("n", 1, 2), [1, 2],
                engine.Gpu.parse("64MiB"), ["real:jax-default"],
                engine="recorder")
    # a kind the installed jaxlib does not accept is refused, naming it
    policy = real.RealPolicy("real:x", (("XLA_PYTHON_CLIENT_ALLOCATOR",
                                         "address"),), (), "x",
                             allocator="address")
    assert "has no XLA_PYTHON_CLIENT_ALLOCATOR=address" in str(
        real.unavailable(policy, allocators=("default", "bfc")))
    assert real.unavailable(policy, allocators=("bfc", "address")) is None
    flagged = real.RealPolicy("real:y", (), ("--xla_z=1",), "y",
                              flag="xla_z")
    assert "has no --xla_z" in str(real.unavailable(flagged,
                                                    flags=frozenset()))


def test_a_real_run_has_only_its_policys_allocator_settings() -> None:
    environ = {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async",
               "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
               "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9", "JAXLAKE": "1",
               "JAX_PLATFORMS": "cpu", "KEEP": "1",
               "XLA_FLAGS": "--xla_gpu_autotune_level=0 "
                            "--xla_gpu_enable_allocator_spatial_"
                            "partitioning=true"}
    env = real.run_environment(environ, real.BY_NAME["real:jax-default"],
                               None)
    for var in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE",
                "XLA_PYTHON_CLIENT_MEM_FRACTION", "JAXLAKE",
                "JAX_PLATFORMS"):
        assert var not in env, var
    assert env["KEEP"] == "1"
    assert env["XLA_FLAGS"] == "--xla_gpu_autotune_level=0"
    env = real.run_environment(environ, real.BY_NAME["real:bfc-growth"],
                               0.5)
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["XLA_CLIENT_MEM_FRACTION"] == "0.5"
    cmd = real.command(["python", "t.py"], engine.Gpu.parse("256MiB"))
    assert "--no-lake" in cmd and f"--fake-gpu-memory={256 * MIB}" in cmd


@pytest.mark.parametrize("output,line", [
    ("x\njaxlib.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
     "trying to allocate 384.00MiB with allocator GPU_0_bfc\n",
     "jaxlib.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory"),
    ("CUDA_ERROR_OUT_OF_MEMORY: out of memory\n", "CUDA_ERROR_OUT_OF_MEMORY"),
    ("Traceback ... ValueError: bad batch\n", None),
])
def test_a_real_runs_out_of_memory_is_read_from_its_output(
        output: str, line: str) -> None:
    found = real.out_of_memory(output)
    if line is None:
        assert found is None
    else:
        assert found is not None and found.startswith(line)


def test_the_failed_request_is_read_from_either_allocators_message() -> None:
    """BFC names the request in MiB; XLA's VMM allocator names its
    rounded size in bytes."""
    assert real.request_size(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "384.00MiB with allocator GPU_0_bfc") == 384 * MIB
    assert real.request_size(
        "RESOURCE_EXHAUSTED: Not enough PA budget for allocation: "
        "pa_allocated=85983232B, rounded_size=123731968B, "
        "pa_budget=201326592B") == 123731968
    assert real.request_size("RESOURCE_EXHAUSTED: something") is None



SCRIPT = N_MIB_PROGRAM


def _has_fake_gpu() -> str:
    return fit_real_reason()


@pytest.mark.skipif(bool(_has_fake_gpu()), reason=_has_fake_gpu() or "-")
def test_real_runs_on_the_fake_gpu(tmp_path: Path) -> None:
    """On a 256 MiB fake device JAX's default preallocates 0.75 (192 MiB):
    64 MiB of input (and XLA's 64 MiB temporary) fit, 128 MiB end with
    XLA's own out-of-memory error; jaxlake's gain is given against it
    first."""
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    out = tmp_path / "fit.json"
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
    env.pop("JAX_PLATFORMS", None)
    done = subprocess.run(
        [*engine.jaxlake_command(), "fit", "--gpu", "256MiB", "--vary",
         "n=64..256", "--json", str(out), "--policies",
         "jaxlake,real:jaxlake,real:jax-default,real:bfc-growth", "--",
         sys.executable, str(script), "{n}"], capture_output=True,
        text=True, env=env, timeout=300, cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    for name in ("real:jax-default", "real:bfc-growth"):
        p = data["policies"][name]
        assert p["kind"] == "real run"
        assert p["largest"] in (64, 128), (name, p)
        nf = p["next_failure"]
        assert nf["value"] == 2 * p["largest"], (name, p)
        assert nf["reason"] == "out of memory"
        assert "RESOURCE_EXHAUSTED" in nf["message"]
    # JAX's default: 64 fits, 128 does not
    assert data["policies"]["real:jax-default"]["largest"] == 64
    assert data["policies"]["real:jax-default"]["jax_default"]
    # one run per value and policy: 64 and 128 (and 256 where 128 fit)
    reals = ("real:jaxlake", "real:jax-default", "real:bfc-growth")
    assert data["real_runs"] == sum(
        len(data["policies"][n]["probes"]) for n in reals)
    assert "real:jax-default at 128: out of memory" in done.stderr
    # the lake's real run against JAX's default's, like with like
    lake = data["policies"]["real:jaxlake"]["largest"]
    assert lake is not None
    assert data["gain_percent"]["real:jax-default"] == pytest.approx(
        100.0 * (lake - 64) / 64)
    assert "(real:jaxlake against real:jax-default)" in done.stdout
    assert "jaxlake" not in data["gain_percent"]


def test_a_default_without_its_lake_counterpart_is_not_compared(
        tmp_path: Path) -> None:
    """JAX's default run for real with only the lake's model: the report
    says they are not compared (a replay is no run at the GPU's size)."""
    vary = Vary("n", 1, 8)
    report = run.fit(["prog", "{n}"], vary, search.grid(vary, "pow2", 1),
                     engine.Gpu.parse("64MiB"), ["jaxlake", "real:jax-default"],
                     make_trace=_traces(tmp_path), real_run=_runs(4, []))
    assert report.gains() == {}
    text = run.format_report(report)
    assert "against JAX's default" in text and "not compared" in text


@pytest.mark.skipif(bool(_has_fake_gpu()), reason=_has_fake_gpu() or "-")
def test_xla_vmm_allocator_runs_on_the_fake_gpu(tmp_path: Path) -> None:
    """real:vmm: XLA's VMM allocator runs on the fake GPU (it needs
    cuStreamWriteValue64 for its deferred frees, which the fake
    implements), so fit accepts it. On a 256 MiB fake device its budget
    is 0.75 of it (192 MiB): 128 MiB of input fit, a 200 MiB input ends
    with the allocator's own refusal, which names the request."""
    policy = real.BY_NAME["real:vmm"]
    assert real.fake_stubs(["cuStreamWriteValue64"]) == []
    assert real.unavailable(policy) is None
    assert run.check_policies(["real:vmm"]) == ["real:vmm"]
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    saved = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
    try:
        outcomes = [real.run_once([sys.executable, str(script), str(n)],
                                  engine.Gpu.parse("256MiB"), policy, None,
                                  str(tmp_path / f"vmm{n}.log"),
                                  f"real:vmm at {n}", None)
                    for n in (128, 200)]
    finally:
        if saved is None:
            os.environ.pop("XLA_FLAGS")
        else:
            os.environ["XLA_FLAGS"] = saved
    assert outcomes[0].fits
    outcome = outcomes[1]
    assert not outcome.fits
    assert "Not enough PA budget" in outcome.message, outcome.message
    assert outcome.request == 200 * MIB


def test_every_label_of_an_xla_policy_says_whether_it_is_jax_default(
) -> None:
    """bench's legend and fit's report name XLA's allocators: each says
    whether it is JAX's default (BFC preallocated: bench's bfc with
    --preallocate, fit's bfc-prealloc and real:jax-default)."""
    from jaxlake._src.bench import columns
    for name in ("bfc", "xla-vmm", "bfc-growth"):
        assert "not JAX's default" in columns.policy_doc(name), name
        assert "not JAX's default" in run.describe(name), name
    assert "--preallocate, one region of the device: JAX's default" in \
        columns.policy_doc("bfc")
    assert "; JAX's default (jax " in run.describe("bfc-prealloc")
    for policy in real.POLICIES:
        if policy.name != real.LAKE:
            assert "JAX's default" in run.describe(policy.name), policy.name
    assert "its model is bfc, not bfc-growth" in \
        run.describe("real:bfc-growth")
