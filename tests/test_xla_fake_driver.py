"""The XLA integration over the shim forwarding to the fake driver
(the fake GPU, cc/fakegpu, as its driver): configure() serving XLA-like calls, the default
capacity (XLA's memory fraction), options after the shim was loaded, an
inactive configure() that leaves no trace, start-up cost, the driver
search, the trace file, and the memory limit XLA compiles for.

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
from typing import Dict, Optional

import pytest

import jaxlake
from fakegpu_util import driver_env
from jaxlake._src.xla import integration as xla
from jaxlake._src.xla import cli as xla_cli
from xla_util import HAS_DRIVER, NEEDS_SHIM, NO_JAX, REPO, run_python

jax = pytest.importorskip("jax", reason=NO_JAX)


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
USED_MEM_CURRENT = 7  # CU_MEMPOOL_ATTR_USED_MEM_CURRENT
assert cuda.cuMemPoolGetAttribute(pool, USED_MEM_CURRENT, ctypes.byref(used)) == 0
print("POOL_USED", used.value)
s = jaxlake.stats()
print("ALLOCS", s.allocs, "IN_USE", s.bytes_in_use, "RESERVED", s.bytes_reserved)
print(jaxlake.memory_report())
for p in ptrs:
    assert cuda.cuMemFreeAsync(ctypes.c_uint64(p), stream) == 0
print("FREES", jaxlake.stats().frees)
print("HOOKS", json.dumps(jaxlake.hook_counts()))
"""


@pytest.mark.skipif(not os.path.isfile(xla.shim_path()),
                    reason="this build of jaxlake has no CUDA shim "
                           "(x86-64 Linux only)")
def test_configure_over_fake_driver_serves_xla_calls(
        fake_driver: str, tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "trace.jsonl"
    result = run_python(XLA_LIKE.replace(
        "sys.argv[1] if len(sys.argv) > 1 else None", repr(str(trace))),
        driver_env(fake_driver))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "ACTIVE True" in out
    assert "OOM_RC 2" in out  # CUDA_ERROR_OUT_OF_MEMORY
    assert "ALLOCS 3 IN_USE " + str((8 << 20) + 1000 + (24 << 20)) in out
    # Used memory as handed out: whole 2 MiB chunks for the two large
    # requests, the small one rounded to the 256-byte alignment.
    assert f"POOL_USED {(8 << 20) + 1024 + (24 << 20)}" in out
    assert "jaxlake memory report" in out
    assert "FREES 3" in out
    hooks = json.loads(out.split("HOOKS ", 1)[1].splitlines()[0])
    # Three allocations and the out-of-memory request, all the lake's.
    assert hooks["cuMemAllocFromPoolAsync"]["served"] == 4
    assert hooks["cuMemAllocFromPoolAsync"]["failed"] == 1
    assert hooks["cuMemAllocFromPoolAsync"]["forwarded"] == 0
    assert hooks["cuMemAllocFromPoolAsync"]["captured"] == 0
    assert hooks["cuMemFreeAsync"]["served"] == 3
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
    """, driver_env(fake_driver))
    assert "SAME True True" in result.stdout, result.stdout + result.stderr
    assert "RAISED jaxlake.configure() was already called" in result.stdout


def _jaxlake_run_at_1gib(code: str, fake_driver: str
                         ) -> "subprocess.CompletedProcess[str]":
    """Runs `code` under `jaxlake run` over the fake driver, with
    XLA_FLAGS=--jaxlake_capacity=1GiB."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAKE")}
    env.update({**driver_env(fake_driver), "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": "--jaxlake_capacity=1GiB"})
    return subprocess.run(
        [sys.executable, "-m", "jaxlake", "run", "--", sys.executable, "-c",
         code], env=env, capture_output=True, text=True, timeout=120,
        cwd="/")


@pytest.mark.skipif(not os.path.isfile(xla.shim_path()),
                    reason="this build of jaxlake has no CUDA shim")
def test_jaxlake_run_preloads_the_shim(fake_driver: str) -> None:
    code = ("import ctypes, os; cuda = ctypes.CDLL('libcuda.so.1'); "
            "print('SHIM', hasattr(cuda, 'jaxlake_shim_api_version')); "
            "print('ALLOC', os.environ['XLA_PYTHON_CLIENT_ALLOCATOR']); "
            "print('CAP', os.environ['JAXLAKE_CAPACITY'])")
    result = _jaxlake_run_at_1gib(code, fake_driver)
    assert result.returncode == 0, result.stderr
    assert "SHIM True" in result.stdout
    assert "ALLOC cuda_async" in result.stdout
    assert f"CAP {1 << 30}" in result.stdout



def alloc_on_device(device: int, nbytes: int) -> str:
    """Python lines that make `device` ready as XLA does (cuInit, primary
    context, default pool) and allocate `nbytes` from its pool through the
    hook (the address in `p`)."""
    return f"""
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(dev), {device})
ctx = ctypes.c_void_p(); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)
pool = ctypes.c_void_p(); cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev)
p = ctypes.c_uint64()
assert cuda.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t({nbytes}), pool, None) == 0
"""


ALLOC_4MIB_ON_DEVICE_0 = alloc_on_device(0, 4 << 20)
# The same, then prints the lake's capacity.
ALLOC_ON_DEVICE_0 = """
import ctypes
from jaxlake._src.xla import integration as xla
""" + ALLOC_4MIB_ON_DEVICE_0 + """print("CAP", xla._loaded_shim().stats(0)["capacity"])
"""

FAKE_DEVICE_BYTES = 1 << 30  # fakegpu_util.SHIM_TEST_DEVICES
CHUNK = 2 << 20


@NEEDS_SHIM
@pytest.mark.parametrize("kwargs,xla_fraction,expected", [
    # No capacity or fraction: the whole device, as XLA's cuda_async pool
    # may take; preallocating, XLA's default 0.75.
    ("", None, FAKE_DEVICE_BYTES),
    ("preallocate=True", None, int(FAKE_DEVICE_BYTES * 0.75) // CHUNK * CHUNK),
    ("", "0.5", FAKE_DEVICE_BYTES // 2),
    ("preallocate=True", "0.5", FAKE_DEVICE_BYTES // 2),
    ("capacity=0.25", None, FAKE_DEVICE_BYTES // 4),
    # An explicit lake capacity wins over XLA's fraction.
    ("capacity='64MiB'", "0.5", 64 << 20),
    ("capacity=0.3", "0.9", int(FAKE_DEVICE_BYTES * 0.3) // CHUNK * CHUNK),
])
@pytest.mark.parametrize("variable", ["XLA_CLIENT_MEM_FRACTION",
                                      "XLA_PYTHON_CLIENT_MEM_FRACTION"])
def test_capacity_rule_of_python_and_shim(
        fake_driver: str, kwargs: str, xla_fraction: Optional[str],
        expected: int, variable: str) -> None:
    """jaxlib reads XLA_CLIENT_MEM_FRACTION, else its deprecated spelling
    XLA_PYTHON_CLIENT_MEM_FRACTION: the lake (Python and shim) too, as a
    hard cap; without one a growing lake may take the whole device."""
    env = driver_env(fake_driver)
    if xla_fraction is not None:
        env[variable] = xla_fraction
    result = run_python(textwrap.dedent(f"""
        import jaxlake
        from jaxlake._src.xla import integration as xla
        status = jaxlake.configure({kwargs})
        assert status.active, status.reason
        print("PY", xla.effective_capacity(status.options, {FAKE_DEVICE_BYTES}))
    """) + ALLOC_ON_DEVICE_0, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"CAP {expected}" in result.stdout, result.stdout
    # The doctor's figure (Python) is the shim's.
    assert f"PY {expected}" in result.stdout, result.stdout


def test_both_xla_memory_fractions_are_refused() -> None:
    """jaxlib raises ValueError when both spellings are set; the lake's
    capacity rule, `jaxlake fit` and `jaxlake run` refuse them too, naming
    both; one alone is read, the new spelling's name reported."""
    both = {"XLA_CLIENT_MEM_FRACTION": "0.9",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
    with pytest.raises(jaxlake.ConfigurationError,
                       match="XLA_CLIENT_MEM_FRACTION='0.9' and "
                             "XLA_PYTHON_CLIENT_MEM_FRACTION='0.5' are "
                             "both set"):
        xla.capacity_rule({}, both)
    assert xla.capacity_rule({}, {"XLA_CLIENT_MEM_FRACTION": "0.9"}) == (
        None, 0.9, "XLA_CLIENT_MEM_FRACTION")
    assert xla.effective_capacity({}, 1 << 30, environ={
        "XLA_CLIENT_MEM_FRACTION": "0.5"}) == 512 << 20
    with pytest.raises(jaxlake.ConfigurationError,
                       match="XLA_CLIENT_MEM_FRACTION='1.5' is not a decimal"):
        xla.capacity_rule({}, {"XLA_CLIENT_MEM_FRACTION": "1.5"})
    # An explicit lake capacity needs no fraction at all.
    assert xla.capacity_rule({"capacity": 1 << 20}, both)[0] == 1 << 20
    # Neither: the whole device, or XLA's 0.75 for a preallocating lake.
    assert xla.capacity_rule({}, {}) == (None, 1.0, xla.WHOLE_DEVICE)
    assert xla.capacity_rule({"preallocate": True}, {})[:2] == (None, 0.75)
    assert xla.effective_capacity({}, (1 << 30) + 5, environ={}) == 1 << 30


@NEEDS_SHIM
def test_shim_refuses_both_xla_memory_fractions(fake_driver: str) -> None:
    """The shim, loaded by `jaxlake run` or LD_PRELOAD without Python's
    check, is inactive when both spellings are set, and says why."""
    env = {**driver_env(fake_driver),
           "XLA_CLIENT_MEM_FRACTION": "0.9",
           "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
    result = run_python("""
        from jaxlake._src.xla import shim as shim_module
        shim = shim_module._Shim(shim_module.shim_path())
        print("ACTIVE", shim.active)
        print("REASON", shim.reason())
    """, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ACTIVE False" in result.stdout, result.stdout
    assert "XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION are " \
        "both set" in result.stdout, result.stdout


@NEEDS_SHIM
def test_doctor_shows_the_effective_capacity(fake_driver: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAKE")}
    env.update({"JAX_PLATFORMS": "cpu", **driver_env(fake_driver),
                "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})
    result = subprocess.run([sys.executable, "-m", "jaxlake", "doctor",
                             "--no-jax"], env=env, capture_output=True,
                            text=True, timeout=180, cwd="/")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "capacity:              0.5 of each device's memory (from " \
        "XLA_PYTHON_CLIENT_MEM_FRACTION)" in out, out
    assert "device 0:              1.00 GiB, virtual memory management " \
        "supported; lake capacity 512 MiB" in out, out
    assert "device 2:              1.00 GiB, virtual memory management NOT " \
        "supported" in out, out
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION")
    env["JAXLAKE_CAPACITY"] = "256MiB"
    out = subprocess.run([sys.executable, "-m", "jaxlake", "doctor",
                          "--no-jax"], env=env, capture_output=True,
                         text=True, timeout=180, cwd="/").stdout
    assert "capacity:              256 MiB (from the capacity option)" in out
    assert "lake capacity 256 MiB" in out, out
    env.pop("JAXLAKE_CAPACITY")
    out = subprocess.run([sys.executable, "-m", "jaxlake", "doctor",
                          "--no-jax"], env=env, capture_output=True,
                         text=True, timeout=180, cwd="/").stdout
    assert "capacity:              the whole device (no capacity or " \
        "memory fraction set" in out, out
    assert "lake capacity 1.00 GiB" in out, out


# -- defect: options given to configure() after the shim was loaded -------------


@NEEDS_SHIM
def test_configure_cannot_change_a_preloaded_shims_options(
        fake_driver: str) -> None:
    """Loaded by LD_PRELOAD, the shim has read its options: configure()
    with others raises and says why; with the same ones it is active."""
    result = run_python("""
        import jaxlake
        try:
            jaxlake.configure(capacity="64MiB")
        except jaxlake.ConfigurationError as e:
            print("RAISED", e)
        status = jaxlake.configure(capacity="1GiB")
        print("ACTIVE", status.active)
    """, {**driver_env(fake_driver),
          "LD_PRELOAD": xla.shim_path(),
          "JAXLAKE_CAPACITY": str(1 << 30)})
    assert "RAISED jaxlake's shim was loaded before configure()" in \
        result.stdout, result.stdout + result.stderr
    assert (f"capacity: the shim has {1 << 30} bytes / fraction 0.0, asked "
            f"{64 << 20} bytes / fraction 0.0") in result.stdout
    assert "ACTIVE True" in result.stdout


@NEEDS_SHIM
def test_configure_under_jaxlake_run_with_other_options_raises(
        fake_driver: str) -> None:
    code = textwrap.dedent("""
        import jaxlake
        try:
            status = jaxlake.configure(capacity="64MiB")
            print("STATUS", status, status.options["capacity"])
        except jaxlake.ConfigurationError as e:
            print("RAISED", e)
        print("SAME", jaxlake.configure().active)
    """)
    result = _jaxlake_run_at_1gib(code, fake_driver)
    assert "RAISED jaxlake.configure() was already called" in result.stdout, \
        result.stdout + result.stderr
    assert "SAME True" in result.stdout


@NEEDS_SHIM
@pytest.mark.parametrize("flags,expected", [
    ("", FAKE_DEVICE_BYTES),
    ("--jaxlake_capacity=0.5", FAKE_DEVICE_BYTES // 2),
    ("--jaxlake_capacity=96MiB", 96 << 20),
])
def test_jaxlake_run_hands_its_options_to_the_program(
        fake_driver: str, flags: str, expected: int) -> None:
    """The program's own configure() (the examples call it) accepts what
    `jaxlake run` set up, whatever the capacity form, and the lake gets it."""
    code = textwrap.dedent("""
        import jaxlake
        status = jaxlake.configure()
        print("ACTIVE", status.active, status.reason)
    """) + ALLOC_ON_DEVICE_0
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAKE")}
    env.update({**driver_env(fake_driver), "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": flags})
    result = subprocess.run(
        [sys.executable, "-m", "jaxlake", "run", "--", sys.executable, "-c",
         code], env=env, capture_output=True, text=True, timeout=120,
        cwd="/")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ACTIVE True" in result.stdout
    assert f"CAP {expected}" in result.stdout, result.stdout


@NEEDS_SHIM
def test_status_names_a_device_found_without_vmm_later(
        fake_driver: str) -> None:
    """configure() checks no device; the first request on device 2 (no VMM
    in the fake driver) finds it out, and status() says so."""
    result = run_python("""
        import ctypes, jaxlake
        print("BEFORE", repr(jaxlake.configure().reason))
        """ + textwrap.indent(alloc_on_device(2, 4096), " " * 8) + """
        status = jaxlake.status()
        print("AFTER", status.active, status.reason)
    """, driver_env(fake_driver))
    assert "BEFORE ''" in result.stdout, result.stdout + result.stderr
    assert "AFTER True device 2: device 2 does not support virtual memory " \
        "management" in result.stdout, result.stdout


# -- defect: an inactive configure() leaves no trace ----------------------------

SNAPSHOT = """
import json, os, subprocess, sys
def snapshot():
    return {k: v for k, v in os.environ.items()
            if k.startswith(("JAXLAKE", "XLA_"))}
before = snapshot()
"""
AFTER = """
print("ENV_SAME", snapshot() == before, json.dumps(snapshot()))
child = subprocess.run([sys.executable, "-c",
    "import os; print(sorted(k for k in os.environ if k.startswith(('JAXLAKE', 'XLA_PYTHON'))))"],
    capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "JAXLAKE"})
print("CHILD", child.stdout.strip())
"""


@NEEDS_SHIM
@pytest.mark.parametrize("setting,reason", [
    ({"JAXLAKE_FAKEGPU_DRIVER_VERSION": "10010"},
     "too old for virtual memory"),
    ({"JAXLAKE_SHIM_HOOKS": "0"}, "JAXLAKE_SHIM_HOOKS=0"),
])
def test_inactive_configure_changes_nothing(
        fake_driver: str, setting: Dict[str, str], reason: str,
        tmp_path: pathlib.Path) -> None:
    env = {**driver_env(fake_driver), **setting}
    trace = tmp_path / "never.jsonl"
    result = run_python(SNAPSHOT + f"""
import ctypes, jaxlake
status = jaxlake.configure(capacity="64MiB", stitch=False, trace={str(trace)!r})
print("ACTIVE", status.active, status.reason)
print("TRACE_FILE", os.path.exists({str(trace)!r}))
""" + AFTER + """
# The loaded shim forwards every call: the driver's pool serves this one.
""" + ALLOC_4MIB_ON_DEVICE_0 + """hooks = jaxlake.hook_counts()["cuMemAllocFromPoolAsync"]
from jaxlake._src.xla import integration as xla
print("HOOK", hooks["served"], hooks["forwarded"], xla.devices())
""", env)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "ACTIVE False" in out and reason in out, out
    assert "TRACE_FILE False" in out, out
    assert "ENV_SAME True" in out, out
    # The child sees only the test's own variables.
    own = sorted(k for k in env if k.startswith("JAXLAKE"))
    assert f"CHILD {own}" in out, out
    assert "HOOK 0 1 []" in out, out


@pytest.mark.skipif(HAS_DRIVER, reason="a CUDA driver is installed here")
def test_no_driver_changes_nothing() -> None:
    result = run_python(SNAPSHOT + """
import jaxlake
print("ACTIVE", jaxlake.configure().active)
""" + AFTER)
    assert "ACTIVE False" in result.stdout, result.stdout + result.stderr
    assert "ENV_SAME True" in result.stdout
    assert "CHILD []" in result.stdout


# -- defect: start-up cost and fork safety --------------------------------------


@NEEDS_SHIM
def test_configure_does_not_initialise_cuda(fake_driver: str) -> None:
    """configure() asks only cuDriverGetVersion (no cuInit), so the process
    may fork as after `import jax`; the lake's checks wait for the first
    hooked call."""
    result = run_python(textwrap.dedent(f"""
        import ctypes, os, jaxlake
        status = jaxlake.configure()
        print("ACTIVE", status.active, status.driver_version)
        fake = ctypes.CDLL({fake_driver!r})
        calls = fake.jaxlake_fakegpu_calls
        calls.restype = ctypes.c_ulonglong
        for name in (b"cuInit", b"cuDriverGetVersion", b"cuDeviceGetCount"):
            print("CALLS", name.decode(), calls(name))
        pid = os.fork()
        if pid == 0:
            # The child starts CUDA on its own, as a fresh process would.
            cuda = ctypes.CDLL("libcuda.so.1")
            os._exit(0 if cuda.cuInit(0) == 0 else 3)
        print("CHILD", os.waitpid(pid, 0)[1])
    """) + ALLOC_ON_DEVICE_0, driver_env(fake_driver))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "ACTIVE True 13000" in out
    assert "CALLS cuInit 0" in out
    assert "CALLS cuDriverGetVersion 1" in out
    assert "CALLS cuDeviceGetCount 0" in out
    assert "CHILD 0" in out
    assert f"CAP {FAKE_DEVICE_BYTES}" in out


def test_startup_hook_imports_nothing_heavy() -> None:
    """With JAXLAKE=1 but no driver, the hook costs an import of jaxlake:
    no subprocess (the old linker-cache query) and no JAX."""
    result = run_python("""
        import sys
        print("JAX", "jax" in sys.modules)
        print("SUBPROCESS", "subprocess" in sys.modules)
    """, {"JAXLAKE": "1", "JAXLAKE_REAL_LIBCUDA": "/nonexistent"})
    assert "JAX False" in result.stdout, result.stdout + result.stderr
    assert "SUBPROCESS False" in result.stdout, result.stdout


# -- defect: one driver search order ---------------------------------------------


def test_driver_dirs_are_the_loaders() -> None:
    text = (REPO / "cc" / "shim" / "loader.cc").read_text()
    block = text[text.index("kDriverDirs[] = {"):]
    block = block[:block.index("};")]
    import re
    assert tuple(re.findall(r'"([^"]+)"', block)) == xla.DRIVER_DIRS


@NEEDS_SHIM
def test_python_and_the_shim_find_the_same_driver(
        fake_driver: str, tmp_path: pathlib.Path) -> None:
    """LD_LIBRARY_PATH first (a forward-compatibility driver), in its order,
    for both the Python side and the shim's own loader."""
    first, second = tmp_path / "compat", tmp_path / "other"
    for d in (first, second):
        d.mkdir()
        (d / "libcuda.so.1").symlink_to(fake_driver)
    env = {"LD_LIBRARY_PATH": f"relative/dir:{first}:{second}"}
    assert xla.find_real_driver(env) == (str(first / "libcuda.so.1"), "")
    assert xla.driver_candidates(env)[:2] == [
        str(first / "libcuda.so.1"), str(second / "libcuda.so.1")]
    # The shim, preloaded without JAXLAKE_REAL_LIBCUDA, searches itself.
    result = run_python("""
        import ctypes, json
        cuda = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(); assert cuda.cuDriverGetVersion(ctypes.byref(v)) == 0
        from jaxlake._src.xla import integration as xla
        print("SHIM", xla._already_loaded_shim().status()["real_libcuda"])
        print("PY", xla.find_real_driver()[0])
    """, {**env, "LD_PRELOAD": xla.shim_path()})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SHIM {first / 'libcuda.so.1'}" in result.stdout, result.stdout
    assert f"PY {first / 'libcuda.so.1'}" in result.stdout


# -- defect: the trace reaches the file if the process dies ----------------------

TRACE_ALLOCS = ALLOC_ON_DEVICE_0 + """
import os, sys
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else N):
    q = ctypes.c_uint64()
    assert cuda.cuMemAllocFromPoolAsync(ctypes.byref(q), ctypes.c_size_t(4096), pool, None) == 0
    assert cuda.cuMemFreeAsync(q, None) == 0
"""


@NEEDS_SHIM
@pytest.mark.parametrize("ending,expected_events", [
    ("pass", 1 + 2 * 100),           # a normal exit: everything, at exit
    ("os._exit(0)", 192),             # killed: all but the unflushed tail
])
def test_trace_is_flushed_periodically_and_at_exit(
        fake_driver: str, tmp_path: pathlib.Path, ending: str,
        expected_events: int) -> None:
    trace = tmp_path / "t.jsonl"
    code = ("import jaxlake\nassert jaxlake.configure(trace=%r).active\nN = 100\n"
            % str(trace)) + TRACE_ALLOCS + ending + "\n"
    result = run_python(code, {**driver_env(fake_driver),
                               "JAXLAKE_TRACE_FLUSH": "64"})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = trace.read_text().splitlines()
    assert json.loads(lines[0])["format"] == "jaxlake-trace"
    # 201 events: the 4 MiB allocation and 100 allocate/free pairs; with
    # os._exit only whole groups of 64 reached the file.
    assert len(lines) - 1 == expected_events, len(lines)


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
    """, driver_env(fake_driver))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "STATE stitch cuda" in result.stdout
    assert "RAISED backend 'cuda', device 99" in result.stdout


# -- the memory limit XLA compiles for -------------------------------------------


def test_xla_compiles_for_the_lakes_capacity() -> None:
    """Under JAX's default XLA rematerialises to 0.95 of its 0.75 pool;
    under the lake (cuda_async, no preallocation) its limit is about 0.8
    of the device times the slop factor, so the lake sets the factor that
    gives the same limit for its capacity (docs/results/fit.md, "Real
    runs"), and leaves a factor the program set, a capacity in bytes, or
    the whole device by default (XLA compiles as under cuda_async then),
    alone."""
    assert xla.slop_factor(0.75) == 89
    assert xla.slop_factor(0.5) == 59
    assert xla.with_memory_limit("", {}, {}) == ""
    assert xla.with_memory_limit("", {"preallocate": True}, {}) == \
        "--xla_gpu_memory_limit_slop_factor=89"
    assert xla.with_memory_limit("", {}, {"XLA_CLIENT_MEM_FRACTION": "0.75"}) \
        == "--xla_gpu_memory_limit_slop_factor=89"
    assert xla.with_memory_limit(
        "--xla_gpu_autotune_level=0", {},
        {"XLA_CLIENT_MEM_FRACTION": "0.5"}) == \
        "--xla_gpu_autotune_level=0 --xla_gpu_memory_limit_slop_factor=59"
    assert xla.with_memory_limit("--xla_gpu_memory_limit_slop_factor=70",
                                 {}, {}) == \
        "--xla_gpu_memory_limit_slop_factor=70"
    assert xla.with_memory_limit("", {"capacity": 1 << 30}, {}) == ""
    assert xla.with_memory_limit("", {"capacity": 0.6}, {}) == \
        "--xla_gpu_memory_limit_slop_factor=71"


@NEEDS_SHIM
def test_jaxlake_run_and_configure_set_the_memory_limit(
        fake_driver: str) -> None:
    env = {**driver_env(fake_driver), "PATH": os.environ["PATH"],
           "XLA_CLIENT_MEM_FRACTION": "0.5"}
    out = xla_cli.run_environment(env, None)
    assert "--xla_gpu_memory_limit_slop_factor=59" in out["XLA_FLAGS"]
    code = """
        import os, jaxlake
        assert jaxlake.configure().active
        print("FLAGS", os.environ["XLA_FLAGS"] + ".")
    """
    result = run_python(code, {**driver_env(fake_driver),
                               "XLA_FLAGS": "--xla_gpu_autotune_level=0",
                               "XLA_CLIENT_MEM_FRACTION": "0.75"})
    assert result.returncode == 0, result.stderr
    assert "FLAGS --xla_gpu_autotune_level=0 " \
        "--xla_gpu_memory_limit_slop_factor=89." in result.stdout
    # The whole device by default: XLA's own limit, as under cuda_async.
    result = run_python(code, {**driver_env(fake_driver),
                               "XLA_FLAGS": "--xla_gpu_autotune_level=0"})
    assert result.returncode == 0, result.stderr
    assert "FLAGS --xla_gpu_autotune_level=0." in result.stdout
