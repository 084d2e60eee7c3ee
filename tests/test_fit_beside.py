"""`jaxlake fit --beside`: one GPU shared by two processes. The models
replay each value's trace beside the first job's (the first holds what the
policy holds for it, the value gets what is left); bad input gets a clear
error; and one tiny real pair runs on a shared fake device."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

import pytest
from fakegpu_util import fit_real_reason

from jaxlake._src.fit import beside, engine, real, run
from jaxlake._src.fit.search import FIRST_JOB, FitError, Vary
from jaxlake._src.trace.tracefile import TraceWriter

MIB = 1 << 20


def _one_buffer(path: Path, mib: int) -> str:
    with TraceWriter(str(path), path.stem) as w:
        w.alloc(1, mib * MIB, kind="temp")
    return str(path)


def _values(folder: Path):
    def make(value: int) -> str:
        return _one_buffer(folder / f"v{value}.jsonl", value)
    return make


def _fit(tmp_path: Path, policies: List[str], first_mib: int,
         memory_mib: int = 64) -> run.FitReport:
    first = _one_buffer(tmp_path / "first.jsonl", first_mib)
    return run.fit(["prog", "{n}"], Vary("n", 1, 64), list(range(1, 65)),
                   engine.Gpu.parse(f"{memory_mib}MiB"), policies,
                   make_trace=_values(tmp_path), beside=["first", "job"],
                   first_trace=first)


def test_models_give_the_value_what_the_first_job_leaves(
        tmp_path: Path) -> None:
    # A 64 MiB device; the first job holds one 20 MiB buffer. The lake
    # (whole device by default) holds 20 MiB for it and leaves 44 MiB;
    # JAX's default preallocates 48 MiB (0.75) in the first process and
    # leaves 16 MiB, where the second's BFC, asking for its own 48 MiB,
    # backs off to 48 x 0.9^11 = 15.06 MiB; the growing BFC's first
    # region doubles to 32 MiB and leaves 32 MiB, under its own limit of
    # 48, which the second's one 32 MiB region fills.
    report = _fit(tmp_path, ["jaxlake", "bfc-prealloc", "bfc"], 20)
    largest = {f.policy: f.largest for f in report.fits}
    assert largest == {"jaxlake": 44, "bfc-prealloc": 15, "bfc": 32}
    assert report.first_holds == {"jaxlake": 20 * MIB,
                                  "bfc-prealloc": 48 * MIB,
                                  "bfc": 32 * MIB}
    data = report.to_json()
    assert data["beside"]["command"] == ["first", "job"]
    assert "beside the first job first job" in run.format_report(report)


def test_a_first_job_that_does_not_fit_alone_fits_nothing(
        tmp_path: Path) -> None:
    # 50 MiB is more than JAX's default's 48 MiB: the first job fails alone
    # under it, and no value fits; the lake holds it and leaves 14 MiB.
    report = _fit(tmp_path, ["jaxlake", "bfc-prealloc"], 50)
    by = {f.policy: f for f in report.fits}
    assert by["jaxlake"].largest == 14
    assert by["bfc-prealloc"].largest is None
    failure = by["bfc-prealloc"].next_failure
    assert failure is not None and failure.reason == FIRST_JOB
    assert "does not fit its capacity" in failure.describe_failure()


def _jaxlake(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run([*engine.jaxlake_command(), *args],
                          capture_output=True, text=True, env=env,
                          timeout=120, cwd=tempfile.gettempdir())


@pytest.mark.parametrize("extra, message", [
    (["--beside", ""], "give the first job's command"),
    (["--beside", "python 'unclosed"], "No closing quotation"),
    (["--beside", "python a.py", "--engine", "recorder"],
     "runs no program on a device"),
    (["--beside", "python a.py", "--devices", "2"], "give --devices 1"),
    (["--beside", "python a.py", "--beside-steps", "0"], "1 or more"),
    (["--beside", "python a.py", "--beside-wait", "0"], "positive number"),
])
def test_beside_argument_errors(extra: List[str], message: str) -> None:
    done = _jaxlake("fit", "--gpu", "256MiB", "--vary", "b=1..4", *extra,
                    "--", "python", "x.py", "{b}")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr, done.stderr
    assert done.stderr.startswith("jaxlake fit: error: --beside")




def _skip_reason() -> str:
    return fit_real_reason()


#: The first job: takes a 16 MiB array, then writes a line a "step" to
#: the file given (its {READY}) until it is stopped.
FIRST = """
import sys, time
import jax.numpy as jnp
x = jnp.ones((16, 1 << 18), jnp.float32)
x.block_until_ready()
while True:
    with open(sys.argv[1], "a") as f:
        f.write("step\\n")
    time.sleep(0.2)
"""

#: The candidate: an array of argv[1] MiB.
SECOND = """
import sys
import jax.numpy as jnp
y = jnp.ones((int(sys.argv[1]), 1 << 18), jnp.float32)
y.block_until_ready()
"""


@pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason() or "-")
def test_a_real_pair_on_one_shared_fake_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 256 MiB shared. JAX's default preallocates 192 MiB in the first
    # process, so a 100 MiB array in the second cannot be had; the lake
    # holds only the first's 16 MiB array, and it can.
    (tmp_path / "first.py").write_text(FIRST)
    (tmp_path / "second.py").write_text(SECOND)
    first = [sys.executable, str(tmp_path / "first.py"),
             beside.READY_PLACEHOLDER]
    second = [sys.executable, str(tmp_path / "second.py"), "100"]
    gpu = engine.Gpu.parse("256MiB")
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=0")
    outcome = {}
    for name in ("real:jax-default", "real:jaxlake"):
        outcome[name] = real.run_beside(
            second, first, gpu, real.BY_NAME[name], None, str(tmp_path),
            name[5:], name, None, ready_lines=2)
    assert not outcome["real:jax-default"].fits
    assert "RESOURCE_EXHAUSTED" in outcome["real:jax-default"].message
    assert not outcome["real:jax-default"].first_failed
    assert outcome["real:jaxlake"].fits
    # The shared accounting's file is gone with the pair.
    assert not [f for f in os.listdir("/dev/shm")
                if f.startswith(f"jaxlake-fakegpu-{os.getuid()}-fit-")]
    # A first job that fails alone is bad input, said as such.
    with pytest.raises(FitError, match="failed alone|before the second"):
        real.run_beside(second, [sys.executable, "-c", "raise SystemExit(3)"],
                        gpu, real.BY_NAME["real:jaxlake"], None,
                        str(tmp_path), "bad", "bad", None)


def test_a_first_job_without_a_fake_gpu_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where `jaxlake run` has no --fake-gpu, the first job fails alone with
    # argparse's message: the fit stops saying the fake GPU is unavailable.
    def no_fake(*args: object, **kwargs: object) -> None:
        raise beside.FirstFailed(
            "the first job ended with exit status 2",
            "jaxlake run: error: unrecognized arguments: --fake-gpu")
    monkeypatch.setattr(beside, "run_pair", no_fake)
    with pytest.raises(engine.FakeGpuUnavailable, match="fake GPU is "
                       "unavailable"):
        real.run_beside(["prog"], ["first"], engine.Gpu.parse("256MiB"),
                        real.BY_NAME["real:jaxlake"], None, str(tmp_path),
                        "t", "t", None)
    # Without the fake's message it is the first job's own failure.
    def fails(*args: object, **kwargs: object) -> None:
        raise beside.FirstFailed("the first job ended with exit status 3",
                                 "Traceback: ValueError")
    monkeypatch.setattr(beside, "run_pair", fails)
    with pytest.raises(FitError, match="exit status 3") as info:
        real.run_beside(["prog"], ["first"], engine.Gpu.parse("256MiB"),
                        real.BY_NAME["real:jaxlake"], None, str(tmp_path),
                        "t", "t", None)
    assert not isinstance(info.value, engine.FakeGpuUnavailable)
