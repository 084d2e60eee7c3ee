"""The XLA integration without a GPU: configure(), the start-up hook,
XLA_FLAGS handling, `jaxlake run`/`doctor`, and the reporting API over the
shim forwarding to the fake driver (tests/shim/fake_cuda.cc).

configure() acts once per process, so each scenario runs in a fresh Python
process.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any, Dict, Optional

import pytest

import jaxlake
from jaxlake._src.xla import integration as xla
from jaxlake._src.xla import cli as xla_cli

jax = pytest.importorskip("jax", reason="the integration tests start JAX "
                          "on the CPU; pip install '.[test]' brings it")

HAS_DRIVER = xla.find_real_driver()[0] is not None


def run_python(code: str, env: Optional[Dict[str, str]] = None,
               timeout: int = 180) -> "subprocess.CompletedProcess[str]":
    """Runs `code` in a fresh interpreter with `env` added."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("JAXLAKE") and k != "XLA_FLAGS"}
    full["JAX_PLATFORMS"] = "cpu"
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          env=full, capture_output=True, text=True,
                          timeout=timeout, cwd="/")


# -- pure functions -----------------------------------------------------------


def test_split_xla_flags_keeps_other_flags_intact() -> None:
    kept, ours = xla.split_xla_flags(
        "--xla_gpu_autotune_level=0 --jaxlake_capacity=4GiB "
        "--xla_dump_to='/tmp/a b' --jaxlake --jaxlake_stitch=false "
        "--xla_force_host_platform_device_count=8")
    assert ours == {"capacity": "4GiB", "enable": "true", "stitch": "false"}
    assert kept == ("--xla_gpu_autotune_level=0 '--xla_dump_to=/tmp/a b' "
                    "--xla_force_host_platform_device_count=8")
    assert xla.split_xla_flags("") == ("", {})
    assert xla.split_xla_flags("--xla_a=1") == ("--xla_a=1", {})


def test_strip_xla_flags_removes_only_jaxlake_entries() -> None:
    env = {"XLA_FLAGS": "--xla_a=1 --jaxlake_capacity=1GiB --xla_b"}
    assert xla.strip_xla_flags(env) == {"capacity": "1GiB"}
    assert env["XLA_FLAGS"] == "--xla_a=1 --xla_b"
    env = {"XLA_FLAGS": "--jaxlake"}
    xla.strip_xla_flags(env)
    assert "XLA_FLAGS" not in env


def test_shim_environment_normalises_values() -> None:
    env = xla.shim_environment(
        {"capacity": 0.5, "stitch": False, "stitch_min": 1 << 29,
         "small_limit": 1 << 20}, "/usr/lib/libcuda.so.1", None)
    assert env["JAXLAKE_CAPACITY_FRACTION"] == "0.5"
    assert env["JAXLAKE_STITCH"] == "0"
    assert env["JAXLAKE_STITCH_MIN"] == str(1 << 29)
    assert env["JAXLAKE_REAL_LIBCUDA"] == "/usr/lib/libcuda.so.1"


def test_setting_warnings_name_the_bypass() -> None:
    warn = xla_cli.setting_warnings({
        "XLA_FLAGS": "--xla_gpu_command_buffer_update_mode=RECONSTRUCT",
        "XLA_PYTHON_CLIENT_ALLOCATOR": "bfc",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "true"})
    assert len(warn) == 3
    assert "own VMM allocator" in warn[0]
    assert not xla_cli.setting_warnings({
        "XLA_FLAGS": "--xla_gpu_command_buffer_update_mode=ALWAYS_UPDATE"})


# -- configure() without a driver ------------------------------------------------


@pytest.mark.skipif(HAS_DRIVER, reason="a CUDA driver is installed here")
def test_no_driver_inactive_and_jax_runs_on_cpu() -> None:
    result = run_python("""
        import jax, jaxlake
        status = jaxlake.configure(capacity="1GiB")
        assert not status.active and not status
        print("REASON", status.reason)
        print("SUM", float(jax.numpy.arange(4.0).sum()))
    """)
    assert result.returncode == 0, result.stderr
    assert "REASON no CUDA driver found" in result.stdout
    assert "SUM 6.0" in result.stdout


@pytest.mark.skipif(HAS_DRIVER, reason="a CUDA driver is installed here")
def test_required_raises_when_inactive() -> None:
    result = run_python("""
        import jaxlake
        try:
            jaxlake.configure(required=True)
        except jaxlake.ConfigurationError as e:
            print("RAISED", e)
    """)
    assert "RAISED jaxlake.configure(required=True): no CUDA driver" in \
        result.stdout, result.stderr


def test_configure_after_backends_exist_raises() -> None:
    result = run_python("""
        import jax, jaxlake
        jax.devices()
        try:
            jaxlake.configure()
        except jaxlake.ConfigurationError as e:
            print("RAISED", e)
    """)
    assert "RAISED JAX has already initialised its backends" in \
        result.stdout, result.stderr
    assert "before the first jax.devices()" in result.stdout


def test_bad_option_values_name_the_option() -> None:
    result = run_python("""
        import jaxlake
        for kwargs in ({"capacity": "lots"}, {"stich": True},
                       {"granularity": 4096}, {"stitch_cache": -1}):
            try:
                jaxlake.configure(**kwargs)
            except jaxlake.ConfigurationError as e:
                print("RAISED", e)
    """)
    lines = [l for l in result.stdout.splitlines() if l.startswith("RAISED")]
    assert len(lines) == 4, result.stdout + result.stderr
    assert "capacity" in lines[0] and "'lots'" in lines[0]
    assert "stich" in lines[1] and "did you mean" in lines[1]
    assert "host and sim" in lines[2]
    assert "stitch_cache" in lines[3]


def test_bad_xla_flags_entry_is_named() -> None:
    # The start-up hook sees the entry first and reports it on stderr.
    result = run_python("import os; print('FLAGS', os.environ['XLA_FLAGS'])",
                        {"XLA_FLAGS": "--xla_a=1 --jaxlake_capcity=1GiB"})
    assert "jaxlake: XLA_FLAGS entry --jaxlake_capcity" in result.stderr
    assert "did you mean 'capacity'" in result.stderr
    assert "FLAGS --xla_a=1" in result.stdout
    # configure() itself, when the hook is not installed or was bypassed.
    env = {"XLA_FLAGS": "--jaxlake_stitch_min=lots"}
    flags = xla.split_xla_flags(env["XLA_FLAGS"])[1]
    with pytest.raises(jaxlake.ConfigurationError, match="stitch_min"):
        jaxlake.resolve_options(flags)


# -- the start-up hook -------------------------------------------------------------


def test_startup_hook_is_inert_without_jaxlake() -> None:
    result = run_python("""
        import sys, os
        print("LOADED", "jaxlake._src.xla.integration" in sys.modules)
        print("FLAGS", os.environ.get("XLA_FLAGS"))
    """, {"XLA_FLAGS": "--xla_a=1"})
    assert "LOADED False" in result.stdout, result.stderr
    assert "FLAGS --xla_a=1" in result.stdout
    assert result.stderr == ""


def test_startup_hook_acts_with_jaxlake_1() -> None:
    result = run_python("""
        import sys, os
        print("LOADED", "jaxlake._src.xla.integration" in sys.modules)
        print("FLAGS", os.environ.get("XLA_FLAGS"))
        import jax
        print("SUM", float(jax.numpy.arange(3.0).sum()), len(jax.devices()))
    """, {"JAXLAKE": "1",
          "XLA_FLAGS": "--xla_force_host_platform_device_count=2 "
                       "--jaxlake_capacity=2GiB --xla_dump_hlo_as_text"})
    assert "LOADED True" in result.stdout, result.stderr
    # XLA would abort on the unknown flag: the hook removed it, nothing else.
    assert ("FLAGS --xla_force_host_platform_device_count=2 "
            "--xla_dump_hlo_as_text") in result.stdout
    assert "SUM 3.0 2" in result.stdout
    if not HAS_DRIVER:
        assert "jaxlake: lake inactive: no CUDA driver found" in result.stderr


def test_startup_hook_acts_on_xla_flags_alone() -> None:
    result = run_python("""
        import sys
        print("LOADED", "jaxlake._src.xla.integration" in sys.modules)
    """, {"XLA_FLAGS": "--jaxlake"})
    assert "LOADED True" in result.stdout, result.stderr


def test_startup_hook_required_stops_the_program() -> None:
    if HAS_DRIVER:
        pytest.skip("a CUDA driver is installed here")
    result = run_python("print('RAN')", {"JAXLAKE": "1",
                                         "JAXLAKE_REQUIRED": "1"})
    assert result.returncode == 1
    assert "RAN" not in result.stdout


# -- over the fake driver -------------------------------------------------------------

# What XLA's cuda_async allocator does, through ctypes on libcuda.so.1.
XLA_LIKE = """
import ctypes, json, os, sys
import jaxlake
status = jaxlake.configure(capacity="64MiB", trace=sys.argv[1] if len(sys.argv) > 1 else None)
print("ACTIVE", status.active, status.reason)
cuda = ctypes.CDLL("libcuda.so.1")  # what the CUDA plugin's dlopen gets
assert hasattr(cuda, "jaxlake_shim_api_version"), "not the shim"
c = ctypes.c_void_p
assert cuda.cuInit(0) == 0
dev = ctypes.c_int(); assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = c(); assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
pool = c(); assert cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev) == 0
stream = c(); assert cuda.cuStreamCreate(ctypes.byref(stream), 0) == 0
ptrs = []
for size in (8 << 20, 1000, 24 << 20):
    p = ctypes.c_uint64()
    rc = cuda.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t(size), pool, stream)
    assert rc == 0, rc
    ptrs.append(p.value)
big = ctypes.c_uint64()
print("OOM_RC", cuda.cuMemAllocFromPoolAsync(ctypes.byref(big), ctypes.c_size_t(1 << 30), pool, stream))
used = ctypes.c_uint64()
cuda.cuMemPoolGetAttribute(pool, 3, ctypes.byref(used))  # USED_MEM_CURRENT
print("POOL_USED", used.value)
s = jaxlake.stats()
print("ALLOCS", s.allocs, "IN_USE", s.bytes_in_use, "RESERVED", s.bytes_reserved)
print(jaxlake.memory_report())
for p in ptrs:
    assert cuda.cuMemFreeAsync(ctypes.c_uint64(p), stream) == 0
print("FREES", jaxlake.stats().frees)
print("HOOKS", json.dumps(jaxlake.hook_counts()))
"""


@pytest.fixture(scope="module")
def fake_driver(built: Any) -> str:
    """Path of the fake driver library, built by CMake for the tests."""
    path = built.build / "jaxlake_fakecuda" / "libfakecuda.so"
    assert path.is_file(), f"the C++ build made no {path}"
    return str(path)


@pytest.mark.skipif(not os.path.isfile(xla.shim_path()),
                    reason="this build of jaxlake has no CUDA shim "
                           "(x86-64 Linux only)")
def test_configure_over_fake_driver_serves_xla_calls(
        fake_driver: str, tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "trace.jsonl"
    result = run_python(XLA_LIKE.replace(
        "sys.argv[1] if len(sys.argv) > 1 else None", repr(str(trace))),
        {"JAXLAKE_REAL_LIBCUDA": fake_driver})
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "ACTIVE True" in out
    assert "OOM_RC 2" in out  # CUDA_ERROR_OUT_OF_MEMORY
    assert "ALLOCS 3 IN_USE " + str((8 << 20) + 1000 + (24 << 20)) in out
    assert f"POOL_USED {(8 << 20) + 1000 + (24 << 20)}" in out or \
        "POOL_USED" in out
    assert "jaxlake memory report" in out
    assert "FREES 3" in out
    hooks = json.loads(out.split("HOOKS ", 1)[1].splitlines()[0])
    assert hooks["cuMemAllocFromPoolAsync"]["served"] >= 3
    lines = trace.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "jaxlake-trace"
    events = [json.loads(l) for l in lines[1:]]
    assert [e["op"] for e in events].count("alloc") == 3
    assert [e["op"] for e in events].count("free") == 3


@pytest.mark.skipif(not os.path.isfile(xla.shim_path()),
                    reason="this build of jaxlake has no CUDA shim")
def test_configure_twice_with_other_options_raises(fake_driver: str) -> None:
    result = run_python("""
        import jaxlake
        a = jaxlake.configure(capacity="64MiB")
        b = jaxlake.configure(capacity="64MiB")
        print("SAME", a is b, a.active)
        try:
            jaxlake.configure(capacity="128MiB")
        except jaxlake.ConfigurationError as e:
            print("RAISED", e)
    """, {"JAXLAKE_REAL_LIBCUDA": fake_driver})
    assert "SAME True True" in result.stdout, result.stdout + result.stderr
    assert "RAISED jaxlake.configure() was already called" in result.stdout


@pytest.mark.skipif(not os.path.isfile(xla.shim_path()),
                    reason="this build of jaxlake has no CUDA shim")
def test_jaxlake_run_preloads_the_shim(fake_driver: str) -> None:
    code = ("import ctypes, os; cuda = ctypes.CDLL('libcuda.so.1'); "
            "print('SHIM', hasattr(cuda, 'jaxlake_shim_api_version')); "
            "print('ALLOC', os.environ['XLA_PYTHON_CLIENT_ALLOCATOR']); "
            "print('CAP', os.environ['JAXLAKE_CAPACITY'])")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAKE")}
    env.update({"JAXLAKE_REAL_LIBCUDA": fake_driver, "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": "--jaxlake_capacity=1GiB"})
    result = subprocess.run(
        [sys.executable, "-m", "jaxlake", "run", "--", sys.executable, "-c",
         code], env=env, capture_output=True, text=True, timeout=120,
        cwd="/")
    assert result.returncode == 0, result.stderr
    assert "SHIM True" in result.stdout
    assert "ALLOC cuda_async" in result.stdout
    assert f"CAP {1 << 30}" in result.stdout


def test_doctor_reports(tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAKE")}
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = "--xla_gpu_command_buffer_update_mode=RECONSTRUCT"
    result = subprocess.run([sys.executable, "-m", "jaxlake", "doctor"],
                            env=env, capture_output=True, text=True,
                            timeout=180, cwd="/")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for key in ("jaxlake:", "jax:", "shim:", "CUDA driver:", "lake:",
                "hooks live:"):
        assert key in out, out
    assert "own VMM allocator" in out
    if not HAS_DRIVER:
        assert "inactive: no CUDA driver found" in out


def test_public_names() -> None:
    for name in ("configure", "stats", "memory_report", "trace"):
        assert callable(getattr(jaxlake, name))


@pytest.mark.skipif(not os.path.isfile(xla.shim_path()),
                    reason="this build of jaxlake has no CUDA shim")
def test_capacity_fraction_applies_to_the_device(fake_driver: str) -> None:
    result = run_python("""
        import ctypes
        import jaxlake
        from jaxlake._src.xla import integration as xla
        status = jaxlake.configure(capacity=0.25)
        assert status.active, status.reason
        cuda = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(dev), 0)
        ctx = ctypes.c_void_p(); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        cuda.cuCtxSetCurrent(ctx)
        pool = ctypes.c_void_p(); cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev)
        p = ctypes.c_uint64()
        assert cuda.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t(4 << 20), pool, None) == 0
        total = status.devices[0].total_memory
        print("CAP", xla._loaded_shim().stats(0)["capacity"], total)
    """, {"JAXLAKE_REAL_LIBCUDA": fake_driver})
    assert result.returncode == 0, result.stdout + result.stderr
    cap, total = map(int, result.stdout.split("CAP ")[1].split())
    chunk = 2 << 20
    assert cap == int(total * 0.25) // chunk * chunk


def test_lake_cuda_backend_over_fake_driver(fake_driver: str) -> None:
    result = run_python("""
        import jaxlake
        lake = jaxlake.Lake("cuda", capacity=0.5, device=0)
        blocks = [lake.allocate(8 << 20) for _ in range(8)]
        for b in blocks[::2]:
            lake.free(b)
        big, state = lake.allocate_with_state(24 << 20)
        lake.check()
        print("STATE", state, lake.backend, lake.capacity,
              lake.stats().bytes_reserved)
        try:
            jaxlake.Lake("cuda", device=99)
        except jaxlake.ConfigurationError as e:
            print("RAISED", e)
    """, {"JAXLAKE_REAL_LIBCUDA": fake_driver})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "STATE stitch cuda" in result.stdout
    assert "RAISED backend 'cuda', device 99" in result.stdout
