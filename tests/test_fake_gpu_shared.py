"""One fake device shared by processes (JAXLAKE_FAKEGPU_SHARED,
cc/fakegpu/shared.cc): free memory and out-of-memory count every process's
bytes, and a process that is gone, even killed, gives its share back.

Each process drives libjaxlake_fakegpu.so's driver API through ctypes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from typing import Dict, Iterator

import pytest

from fakegpu_util import JAXLAKE, NEEDS_FAKE_GPU, ROOT, fake_library

pytestmark = NEEDS_FAKE_GPU

MiB = 1 << 20
GiB = 1 << 30

# A process on the shared device: `alloc(n)` (cuMemAlloc), `alloc_async(n)`
# (the driver's pool), `create(n)` (cuMemCreate) return the CUresult;
# `free_bytes()` is cuMemGetInfo's free. Commands come on stdin, one a line,
# and each answer is a line on stdout.
CLIENT = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
MiB = 1 << 20
U64 = ctypes.c_uint64
r = lib.cuInit(0)
if r != 0:
    print("INIT", r, flush=True)
    sys.exit(0)
dev = ctypes.c_int()
assert lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p()
assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert lib.cuCtxSetCurrent(ctx) == 0

class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int),
                ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]

def alloc(n):
    p = U64()
    return lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n))
def alloc_async(n):
    p = U64()
    r = lib.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(n), None)
    lib.cuStreamSynchronize(None)
    return r
def create(n):
    h = U64()
    prop = Prop(type=1, loc_type=1, loc_id=0)
    return lib.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(n),
                           ctypes.byref(prop), ctypes.c_ulonglong(0))
POOL = ctypes.c_void_p()
assert lib.cuDeviceGetDefaultMemPool(ctypes.byref(POOL), dev) == 0
held = []
def pool_alloc(n):  # no synchronisation
    p = U64()
    r = lib.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(n), None)
    held.append(p.value)
    return r
def pool_free():
    return lib.cuMemFreeAsync(U64(held.pop()), None)
def sync():
    return lib.cuStreamSynchronize(None)
def set_threshold(n):
    v = U64(n)
    return lib.cuMemPoolSetAttribute(POOL, 4, ctypes.byref(v))
def pool_attr(attr):  # 5: reserved now, 7: used now
    v = U64()
    assert lib.cuMemPoolGetAttribute(POOL, attr, ctypes.byref(v)) == 0
    return v.value
def trim(keep):
    return lib.cuMemPoolTrimTo(POOL, ctypes.c_size_t(keep))
def free_bytes():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    return free.value
print("READY", flush=True)
for line in sys.stdin:
    print(eval(line), flush=True)
"""


class Client:
    """A process using the shared device, driven line by line."""

    def __init__(self, env: Dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT, fake_library()], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
        assert self.proc.stdout is not None
        self.first = self.proc.stdout.readline().strip()

    def ask(self, expr: str) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(expr + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer, self.proc.communicate(timeout=30)[1][-2000:]
        return int(answer)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def shared_env() -> Iterator[Dict[str, str]]:
    name = f"test-{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAXLAKE")}
    env.update(JAXLAKE_FAKEGPU_SHARED=name,
               JAXLAKE_FAKEGPU_MEMORY=str(GiB))
    yield env
    path = f"/dev/shm/jaxlake-fakegpu-{os.getuid()}-{name}"
    if os.path.exists(path):
        os.unlink(path)


def test_two_processes_see_one_device(shared_env: Dict[str, str]) -> None:
    a, b = Client(shared_env), Client(shared_env)
    try:
        assert a.first == "READY" and b.first == "READY"
        assert b.ask("free_bytes()") == GiB
        assert a.ask(f"alloc({400 * MiB})") == 0
        assert a.ask(f"alloc_async({200 * MiB})") == 0
        assert a.ask(f"create({100 * MiB})") == 0
        # The other process sees the device's free memory drop by all of
        # them, and cannot create beyond what is left, by any path.
        assert b.ask("free_bytes()") == GiB - 700 * MiB
        assert b.ask(f"alloc({400 * MiB})") == 2  # out of memory
        assert b.ask(f"alloc_async({400 * MiB})") == 2
        assert b.ask(f"create({400 * MiB})") == 2
        assert b.ask(f"alloc({300 * MiB})") == 0
        assert a.ask("free_bytes()") == 24 * MiB
        assert a.ask(f"alloc({100 * MiB})") == 2
        # A killed process gives its share back.
        a.proc.kill()
        a.proc.wait(timeout=30)
        assert b.ask("free_bytes()") == GiB - 300 * MiB
        assert b.ask(f"alloc({600 * MiB})") == 0
    finally:
        a.close()
        b.close()


def test_a_process_that_exits_gives_its_share_back(
        shared_env: Dict[str, str]) -> None:
    a, b = Client(shared_env), Client(shared_env)
    try:
        assert a.ask(f"alloc({512 * MiB})") == 0
        assert b.ask("free_bytes()") == GiB - 512 * MiB
        assert a.proc.stdin is not None
        a.proc.stdin.close()  # it leaves its loop and exits normally
        assert a.proc.wait(timeout=30) == 0
        assert b.ask("free_bytes()") == GiB
    finally:
        a.close()
        b.close()


def test_the_pool_keeps_freed_memory_to_its_release_threshold(
        shared_env: Dict[str, str]) -> None:
    # The driver's pool keeps what is freed to it until a synchronisation,
    # then releases what it reserves beyond its release threshold (0 by
    # default); the other process sees the device's memory as the pool
    # holds it.
    a, b = Client(shared_env), Client(shared_env)
    try:
        assert a.ask(f"pool_alloc({600 * MiB})") == 0
        assert a.ask("pool_free()") == 0
        assert a.ask("sync()") == 0
        assert b.ask("free_bytes()") == GiB  # threshold 0: all released
        assert a.ask(f"set_threshold({256 * MiB})") == 0
        assert a.ask(f"pool_alloc({600 * MiB})") == 0
        assert a.ask("pool_free()") == 0
        assert a.ask("pool_attr(5)") == 600 * MiB  # kept until synchronised
        assert a.ask("pool_attr(7)") == 0
        assert b.ask("free_bytes()") == GiB - 600 * MiB
        assert a.ask("sync()") == 0
        assert a.ask("pool_attr(5)") == 256 * MiB
        assert b.ask("free_bytes()") == GiB - 256 * MiB
        # The kept memory serves the pool's next allocations first.
        assert a.ask(f"pool_alloc({200 * MiB})") == 0
        assert b.ask("free_bytes()") == GiB - 256 * MiB
        assert a.ask(f"pool_alloc({100 * MiB})") == 0
        assert b.ask("free_bytes()") == GiB - 300 * MiB
        assert a.ask("pool_free()") == 0
        assert a.ask("pool_free()") == 0
        assert a.ask("sync()") == 0
        assert b.ask("free_bytes()") == GiB - 256 * MiB
        # The other process cannot have what the pool keeps; a trim gives
        # it back.
        assert b.ask(f"alloc({800 * MiB})") == 2
        assert a.ask("trim(0)") == 0
        assert a.ask("pool_attr(5)") == 0
        assert b.ask(f"alloc({800 * MiB})") == 0
    finally:
        a.close()
        b.close()


def test_processes_must_ask_for_the_same_device(
        shared_env: Dict[str, str]) -> None:
    a = Client(shared_env)
    try:
        assert a.ask(f"alloc({64 * MiB})") == 0
        other = dict(shared_env, JAXLAKE_FAKEGPU_MEMORY=str(2 * GiB))
        proc = subprocess.run(
            [sys.executable, "-c", CLIENT, fake_library()], env=other,
            capture_output=True, text=True, timeout=60, cwd=str(ROOT))
        assert proc.stdout.strip() == "INIT 100"  # CUDA_ERROR_NO_DEVICE
        assert "every process sharing a name must ask for the same " \
               "devices" in proc.stderr
        assert str(2 * GiB) in proc.stderr
    finally:
        a.close()


def test_without_shared_each_process_has_its_own_device() -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAXLAKE")}
    env["JAXLAKE_FAKEGPU_MEMORY"] = str(GiB)
    a, b = Client(env), Client(env)
    try:
        assert a.ask(f"alloc({700 * MiB})") == 0
        assert b.ask("free_bytes()") == GiB
        assert b.ask(f"alloc({700 * MiB})") == 0
    finally:
        a.close()
        b.close()


def test_run_flag_checks_the_name() -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAXLAKE")}
    bad = subprocess.run([JAXLAKE, "run", "--fake-gpu", "--fake-gpu-shared",
                          "a/b", "--", "true"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1
    assert "--fake-gpu-shared='a/b'" in bad.stderr
    alone = subprocess.run([JAXLAKE, "run", "--fake-gpu-shared", "x", "--",
                            "true"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert alone.returncode == 2
    assert "--fake-gpu-shared needs --fake-gpu" in alone.stderr


def test_run_flag_sets_the_name() -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAXLAKE")}
    code = textwrap.dedent("""
        import os
        print(os.environ.get("JAXLAKE_FAKEGPU_SHARED"))
    """)
    proc = subprocess.run([JAXLAKE, "run", "--fake-gpu", "--no-lake",
                           "--fake-gpu-shared", "job-1", "--",
                           sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "job-1"
    assert "--fake-gpu-shared job-1" in proc.stderr
