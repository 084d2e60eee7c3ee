"""benchmarks/gpu/pool_probe.py over the fake GPU's driver: the shape of
what it writes, its arithmetic, its error reports, and the GPU check's
`pool` step.

This tests the probe, not a GPU: the fake's pool (cc/fakegpu/memory_alloc.cc)
rounds a request up to 512 bytes and charges exactly that, so reserved
equals used everywhere and the device's free memory is handed out to the
last piece. What a real driver's pool does is what the probe measures on a
GPU (benchmarks/gpu/check.sh --only env,pool).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
from typing import Any, Dict, List

from fakegpu_util import SHIM_TEST_DEVICES, fake_library

REPO = pathlib.Path(__file__).resolve().parents[1]
GPU = REPO / "benchmarks" / "gpu"
FAKE_POOL_ROUNDING = 512  # the fake pool's request rounding


def _probe_module() -> Any:
    spec = importlib.util.spec_from_file_location("pool_probe",
                                                  GPU / "pool_probe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(out: pathlib.Path, *extra: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, str(GPU / "pool_probe.py"), "--libcuda",
         fake_library(), "--out", str(out), *extra],
        env={"PATH": "/usr/bin:/bin", **SHIM_TEST_DEVICES},
        capture_output=True, text=True, timeout=60, cwd="/")


def test_probe_over_the_fake_pool(tmp_path: pathlib.Path) -> None:
    probe = _probe_module()
    out = tmp_path / "pool_probe.json"
    result = _run(out)
    assert result.returncode == 0, result.stdout + result.stderr
    doc: Dict[str, Any] = json.loads(out.read_text())
    assert doc["format"] == "jaxlake-pool-probe" and doc["version"] == 1
    assert doc["error"] is None and "(jaxlake fake)" in doc["source"]
    # Nothing is left allocated, nothing left in the pool.
    assert doc["after_cleanup"]["reserved"] == 0
    assert doc["after_cleanup"]["used"] == 0
    assert doc["after_cleanup"]["free"] == doc["after_cleanup"]["total"]

    # Single allocations: the fake rounds nothing beyond its 512 bytes,
    # so the pool grows by what the request uses, and the device's free
    # memory drops by as much.
    rows: List[Dict[str, Any]] = doc["single"]["rows"]
    assert [r["bytes"] for r in rows] == list(probe.SINGLE_SIZES)
    for r in rows:
        assert r["reserved_before"] == 0, r
        assert r["reserved_growth"] == r["used_growth"] == r["free_drop"], r
        assert r["overhead"] == r["reserved_growth"] - r["bytes"], r
        assert 0 <= r["overhead"] < FAKE_POOL_ROUNDING, r
    assert doc["single"]["apparent_granularity"] == FAKE_POOL_ROUNDING

    # Packing: many small requests cost exactly what they ask.
    assert [(r["count"], r["bytes"]) for r in doc["packing"]] == \
        list(probe.PACKING)
    for r in doc["packing"]:
        assert r["requested"] == r["count"] * r["bytes"]
        assert r["reserved_growth"] == r["used_growth"] == r["requested"], r
        assert r["reserved_over_requested"] == 1.0
        assert r["lost_per_allocation"] == 0.0

    # The tail: a request ending 0.6 MiB into its third 2 MiB page leaves
    # 1.4 MiB of that page; the fake charges the small ones byte for byte.
    tail = doc["tail"]
    assert tail["big"] == 2 * probe.PAGE + 6 * probe.MIB // 10
    assert tail["page_free_end"] == 3 * probe.PAGE - tail["big"]
    assert 0 <= tail["big_reserved_growth"] - tail["big"] < \
        FAKE_POOL_ROUNDING
    assert len(tail["small_offsets_from_end"]) == tail["count"] == 16
    assert tail["smalls_reserved_growth"] == tail["smalls_used_growth"] == \
        tail["count"] * tail["small"]
    assert tail["smalls_fit_in_reserved"] is False

    # The edge: the pool hands out all of the device's free memory.
    assert [r["x"] for r in doc["edge"]] == list(probe.DEFAULT_EDGE_X)
    for r in doc["edge"]:
        assert r["big_allocated"], r
        assert r["free"] == 1 << 30  # JAXLAKE_FAKEGPU_MEMORY, nothing held
        assert r["big"] == r["free"] - r["x"]
        assert r["handed_out"] == r["big"] + r["pieces"] * r["piece"]
        assert r["shortfall"] == r["free"] - r["handed_out"]
        assert 0 <= r["shortfall"] < r["piece"], r
        assert r["reserved_full"] == r["used_full"] == r["handed_out"], r
        assert r["free_full"] == r["shortfall"]
    # The table names each part.
    for word in ("apparent granularity: 512 bytes", "packing 256 x 4096",
                 "tail:", "edge x=64.0000 MiB", "after cleanup: reserved 0"):
        assert word in result.stdout, result.stdout


def test_driver_errors_name_the_call(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "p.json"
    result = _run(out, "--device", "7")  # the fake has three devices
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "cuDeviceGet failed with CUDA error 101 " \
        "(CUDA_ERROR_INVALID_DEVICE)" in result.stderr
    doc = json.loads(out.read_text())
    assert doc["error"]["call"] == "cuDeviceGet"
    assert doc["error"]["name"] == "CUDA_ERROR_INVALID_DEVICE"
    missing = subprocess.run(
        [sys.executable, str(GPU / "pool_probe.py"), "--libcuda",
         str(tmp_path / "no-libcuda.so"), "--out", str(out)],
        capture_output=True, text=True, timeout=60, cwd="/")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert json.loads(out.read_text())["error"]["call"] == "dlopen"


def test_edge_beyond_the_free_memory(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "p.json"
    result = _run(out, "--edge-x", "2GiB,1000")
    assert result.returncode == 0, result.stderr
    beyond, odd = json.loads(out.read_text())["edge"]
    assert beyond["big_allocated"] is False and beyond["shortfall"] is None
    assert "no single request of free - x" in result.stdout
    # 1000 bytes short of the free memory: no 64 KiB piece fits after it.
    assert odd["pieces"] == 0 and odd["shortfall"] == 1000
    bad = _run(out, "--edge-x", "lots")
    assert bad.returncode == 2 and "--edge-x 'lots'" in bad.stderr


def test_lowest_power_of_two() -> None:
    probe = _probe_module()
    assert [probe.lowest_power_of_two(n) for n in
            (1, 512, 2 << 20, (2 << 20) + 512, 3 << 20, 6 << 19)] == \
        [1, 512, 2 << 20, 512, 1 << 20, 1 << 20]


def test_the_gpu_check_pool_step(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, str(GPU / "gpu_check.py"), "--no-gpu-ok",
         "--only", "pool", "--libcuda", fake_library(),
         "--out", str(tmp_path)],
        env={"PATH": "/usr/bin:/bin", **SHIM_TEST_DEVICES},
        capture_output=True, text=True, timeout=120, cwd="/")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert result.returncode == 0, result.stdout + result.stderr
    step = summary["steps"]["pool"]
    assert step["passed"] and summary["status"] == "passed"
    assert step["apparent_granularity"] == FAKE_POOL_ROUNDING
    assert step["reserved_growth"]["1"] == FAKE_POOL_ROUNDING
    assert set(step["edge_shortfall"].values()) == {0}
    assert (tmp_path / "pool_probe.json").is_file()
