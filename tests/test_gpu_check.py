"""The GPU check (benchmarks/gpu/) without a GPU: its no-GPU answer, and the
steps that need no GPU (env, latency) over the fake driver
(tests/shim/fake_cuda.cc), the latency file in the format `jaxlake bench
--latency` reads, summary.json written step by step, and the sanitizer's
stress program on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
GPU = REPO / "benchmarks" / "gpu"
HAS_GPU = shutil.which("nvidia-smi") is not None


def _module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAKE")}
    env["JAX_PLATFORMS"] = "cpu"
    return env


@pytest.mark.skipif(HAS_GPU, reason="this machine has nvidia-smi")
def test_check_sh_says_no_gpu(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(["bash", str(GPU / "check.sh")],
                            env={**_env(), "OUT": str(tmp_path)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stderr.startswith("no GPU: nvidia-smi not found")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "no GPU: nvidia-smi not found"


@pytest.mark.skipif(HAS_GPU, reason="this machine has nvidia-smi")
def test_gpu_check_says_no_gpu(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, str(GPU / "gpu_check.py"), "--out", str(tmp_path)],
        env=_env(), capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "no GPU: nvidia-smi not found" in result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"].startswith("no GPU")


def test_env_and_latency_steps_over_the_fake_driver(
        fake_driver: str, tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, str(GPU / "gpu_check.py"), "--no-gpu-ok",
         "--only", "env,latency", "--libcuda", fake_driver,
         "--latency-repeats", "3", "--latency-sizes", "2MiB,8MiB,32MiB",
         "--out", str(tmp_path)],
        env=_env(), capture_output=True, text=True, timeout=300, cwd="/")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["steps"]) == ["env", "latency"], summary
    env = summary["steps"]["env"]
    assert env["driver_version"] == 13000  # the fake driver's
    assert env["versions"]["jaxlake"]
    latency = summary["steps"]["latency"]
    assert latency["passed"], summary["failures"]
    doc = json.loads((tmp_path / "latency.json").read_text())
    _module("latency").validate(doc)
    assert doc["format"] == "jaxlake-driver-latency" and doc["version"] == 1
    for kind in ("create", "map", "set_access", "unmap", "release",
                 "reserve", "address_free"):
        points = doc["calls"][kind]
        assert [p["bytes"] for p in points] == [2 << 20, 8 << 20, 32 << 20]
        assert all(p["us"] > 0 for p in points)
    assert "jaxlake fake device 0" in doc["source"]
    # The fake driver has three devices: the grant to all of them gives
    # the per-device term; the first grant is timed apart; the mostly
    # used pass ran with other handles holding memory.
    assert doc["measured"]["devices"] == 3
    assert doc["measured"]["set_access_devices"] == 3
    assert set(doc["terms"]) == {"first_set_access_us", "peer_us"}
    assert doc["measured"]["mostly_used"]["used_fraction"] > 0.3
    assert [p["bytes"] for p in doc["measured"]["mostly_used"]["calls"][
        "create"]] == [2 << 20, 8 << 20, 32 << 20]
    assert latency["terms"] == doc["terms"]
    # The env step passes where the plugin's minimum is met (the test extra
    # pins the CUDA 12 plugin; the fake driver says 13.0).
    if "jax-cuda12-plugin" in env["versions"]:
        assert env["plugin_min_driver_version"] == 12000
        assert env["passed"], summary["failures"]
    assert summary["status"] in ("passed", "failed")
    assert result.returncode == (0 if summary["status"] == "passed" else 1)


def test_the_checked_in_sample_is_what_the_step_writes(
        fake_driver: str, tmp_path: pathlib.Path) -> None:
    """benchmarks/gpu/latency-sample-fake.json, the sample for the bench's
    reader, has the shape latency.py writes today (values differ by run)."""
    out = tmp_path / "lat.json"
    subprocess.run([sys.executable, str(GPU / "latency.py"), "--libcuda",
                    fake_driver, "--out", str(out), "--repeats", "2",
                    "--sizes", "2MiB,8MiB,64MiB"], check=True, cwd="/",
                   env=_env(), capture_output=True, timeout=120)
    fresh = json.loads(out.read_text())
    sample = json.loads((GPU / "latency-sample-fake.json").read_text())
    latency = _module("latency")
    latency.validate(sample)
    assert set(sample) == set(fresh)
    assert {k: [p["bytes"] for p in v] for k, v in sample["calls"].items()} \
        == {k: [p["bytes"] for p in v] for k, v in fresh["calls"].items()}


def test_latency_validation_names_what_is_wrong() -> None:
    latency = _module("latency")
    good = {"format": "jaxlake-driver-latency", "version": 1, "source": "x",
            "calls": {k: [{"bytes": 2 << 20, "us": 1.0}]
                      for k in ("create", "map", "set_access", "unmap",
                                "release")}}
    latency.validate(good)
    for change, message in (
            ({"calls": {**good["calls"], "mapp": good["calls"]["map"]}},
             "unknown call kind 'mapp'"),
            ({"version": 2}, "format/version"),
            ({"calls": {**good["calls"],
                        "map": [{"bytes": 8, "us": 1}, {"bytes": 4, "us": 1}]}},
             "sorted")):
        with pytest.raises(ValueError, match=message):
            latency.validate({**good, **change})


def test_summary_is_written_as_each_step_finishes(
        tmp_path: pathlib.Path) -> None:
    check = _module("gpu_check")
    summary = check.Summary(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["status"] \
        == "running"
    summary.step("env", {"driver_version": 1})
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["steps"]["env"] == {"driver_version": 1, "passed": True}
    summary.step("doctor", {}, ["hooks not live"])
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["failures"] == ["doctor: hooks not live"]
    assert on_disk["steps"]["doctor"]["passed"] is False


def test_stress_program_runs_without_tracing_errors() -> None:
    """The sanitizer's program picks its shapes on the host (the old one
    called int() on a traced value inside jit)."""
    pytest.importorskip("jax", reason="needs jax: the test extra brings it "
                        "on Python 3.11 and newer")
    result = subprocess.run(
        [sys.executable, str(GPU / "stress.py"), "--no-lake",
         "--iterations", "12"], env=_env(), capture_output=True, text=True,
        timeout=300, cwd="/")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "STRESS_OK" in result.stdout
