"""What the tests that run programs on the fake GPU share: why they skip,
how a program runs under `jaxlake run --fake-gpu`, and how its result is
read back (a `RESULT {json}` line on stdout).

The programs run XLA's real GPU client over jaxlake's fake GPU, on a
machine with no GPU; they are CPU tests of the integration, never a stand-in
for a GPU figure (benchmarks/gpu/check.sh is that).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Dict, List, Optional, Sequence, Union

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
JAXLAKE = str(pathlib.Path(sys.executable).with_name("jaxlake"))

#: Autotuning times candidate kernels that do not run on the fake: off, to
#: keep the tests short on two cores.
XLA_FLAGS = "--xla_gpu_autotune_level=0"

#: What a test program starts with: `served(name)`, the lake's hook counts
#: for one entry point, and `report(**kw)`, the RESULT line.
PRELUDE = """
import json, numpy as np, jax, jax.numpy as jnp, jaxlake
def served(name):
    return jaxlake.hook_counts().get(name, {})
def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


#: The devices the shim's tests ask of the fake GPU (as tests/shim/fake_gpu.h
#: does for the C++ ones): three of 1 GiB, 0 and 1 with virtual memory
#: management and peer access, 2 with neither.
SHIM_TEST_DEVICES = {
    "JAXLAKE_FAKEGPU_COUNT": "3",
    "JAXLAKE_FAKEGPU_MEMORY": str(1 << 30),
    "JAXLAKE_FAKEGPU_NO_VMM": "2",
}


def driver_env(library: str) -> Dict[str, str]:
    """The environment that makes the fake GPU `library` the shim's real
    driver, with the shim tests' devices."""
    return {"JAXLAKE_REAL_LIBCUDA": library, **SHIM_TEST_DEVICES}


def fake_library() -> str:
    """Where this build's fake GPU library is."""
    from jaxlake._src.xla import fakegpu
    return fakegpu.library_path()


def fake_gpu_reason() -> Optional[str]:
    """Why the fake GPU library cannot be used here (None: it can)."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return "the fake GPU and the shim are built on x86-64 Linux only"
    if not os.path.isfile(fake_library()):
        return f"this build has no fake GPU ({fake_library()})"
    return None


def jax_reason() -> Optional[str]:
    """Why JAX cannot run on the fake GPU here (None: it can)."""
    for mod in ("jax", "jax_plugins.xla_cuda12"):
        try:
            if importlib.util.find_spec(mod) is None:
                return (f"{mod} is not installed (the test extra installs "
                        "jax[cuda12-local] on Python 3.11 and newer)")
        except (ImportError, ValueError):
            return f"{mod} cannot be imported"
    return fake_gpu_reason()


#: A case's start for library_run(prelude=...): the fake's driver through
#: ctypes (lib), a checked call (ck), device 0's primary context current.
DRIVER_PRELUDE = """
import ctypes, json, os, sys
lib = ctypes.CDLL(sys.argv[1])
def ck(r, what=""):
    assert r == 0, f"{what}: error {r}"
ck(lib.cuInit(0))
_dev = ctypes.c_int()
ck(lib.cuDeviceGet(ctypes.byref(_dev), 0))
_ctx = ctypes.c_void_p()
ck(lib.cuDevicePrimaryCtxRetain(ctypes.byref(_ctx), _dev))
ck(lib.cuCtxSetCurrent(_ctx))
U64 = ctypes.c_uint64
"""


def fit_real_reason() -> str:
    """Why `jaxlake fit`'s real runs cannot use the installed package's
    fake GPU here ("": they can)."""
    why = fake_gpu_reason()
    if why is not None:
        return why
    from jaxlake._src.xla import fakegpu
    if not os.path.isfile(fakegpu.library_path()):
        return "this build has no fake GPU"
    if fakegpu.nvidia_wheels():
        return "NVIDIA's CUDA wheels are installed"
    try:
        import jax_plugins.xla_cuda12  # noqa: F401
    except ImportError:
        return "the CUDA 12 plugin is not installed"
    return ""


NEEDS_FAKE_GPU = pytest.mark.skipif(fake_gpu_reason() is not None,
                                    reason=str(fake_gpu_reason()))
NEEDS_JAX = pytest.mark.skipif(jax_reason() is not None,
                               reason=str(jax_reason()))


def python(code: str) -> List[str]:
    """The command that runs `code` (dedented) in this interpreter."""
    return [sys.executable, "-c", textwrap.dedent(code)]


def fake_run(command: Union[str, Sequence[str]], *,
             args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
             timeout: int = 300, cwd: Optional[pathlib.Path] = None
             ) -> "subprocess.CompletedProcess[str]":
    """Runs `command` (a Python script, or an argv) under
    `jaxlake run --fake-gpu ARGS --`, with none of the caller's JAXLAKE*,
    JAX_PLATFORMS, XLA_FLAGS or LD_PRELOAD settings, autotuning off, and
    `env` on top."""
    argv = python(command) if isinstance(command, str) else list(command)
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("JAXLAKE") and k not in (
                "JAX_PLATFORMS", "XLA_FLAGS", "LD_PRELOAD")}
    full["XLA_FLAGS"] = XLA_FLAGS
    full.update(env or {})
    return subprocess.run([JAXLAKE, "run", "--fake-gpu", *args, "--",
                           *argv], env=full, capture_output=True, text=True,
                          timeout=timeout, cwd=str(cwd or ROOT))


def library_run(script: str, *, prelude: str = "",
                env: Optional[Dict[str, str]] = None, timeout: int = 120
                ) -> "subprocess.CompletedProcess[str]":
    """Runs `prelude` + `script` (dedented), a Python program that drives
    the fake GPU library itself through ctypes, without JAX: the library's
    path is its sys.argv[1]. `env` goes on top of this environment."""
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script),
         fake_library()],
        env=full, capture_output=True, text=True, timeout=timeout,
        cwd=str(ROOT))


def result(proc: "subprocess.CompletedProcess[str]") -> Dict:
    """The last RESULT line's JSON, once the program exited 0."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return dict(json.loads(lines[-1][len("RESULT "):]))


def held_stream(lib: str) -> str:
    """Python code that makes a new stream of the driver `lib` (a ctypes
    library) wait on a host flag (cuStreamWaitValue32, GEQ 1): work
    enqueued on `stream` after it stays in flight until `release()` writes
    the flag. The code it joins defines ctypes, U64 and ck(result, what)."""
    return f"""
flag = ctypes.c_void_p()
ck({lib}.cuMemHostAlloc(ctypes.byref(flag), ctypes.c_size_t(4096), 0), "host")
ctypes.c_uint32.from_address(flag.value).value = 0
stream = ctypes.c_void_p()
ck({lib}.cuStreamCreate(ctypes.byref(stream), 0), "stream")
ck({lib}.cuStreamWaitValue32(stream, U64(flag.value), ctypes.c_uint32(1), 0),
   "hold")
def release():
    ctypes.c_uint32.from_address(flag.value).value = 1
"""


#: A JAX program of one n MiB array (n its argument) and a jitted
#: reduction of it: what the fit tests fit on the fake GPU.
N_MIB_PROGRAM = """
import sys
import jax, jax.numpy as jnp
n = int(sys.argv[1])
x = jnp.ones((n, 1 << 18), jnp.float32)   # n MiB
y = jax.jit(lambda a: (a * 2).sum(axis=0))(x)
y.block_until_ready()
"""
