"""The fake GPU under NVIDIA's pip wheels (`pip install "jax[cuda12]"`).

JAX's CUDA plugin loads NVIDIA's libraries from the nvidia-*-cu12 wheels by
absolute path, and by name through its RPATH. Under `jaxlake run --fake-gpu`
the loader guard (cc/fakegpu/interpose.cc), preloaded, routes every such
load to the fake's folder of links, so that none of NVIDIA's runtime code
runs over the fake driver.

The guard's own tests build small shared objects and a made-up
site-packages/nvidia tree in a temporary folder: they run everywhere the
fake GPU is built, without NVIDIA's wheels. The last tests run JAX over the
real wheels and skip, saying why, where they are not installed (the test
extra does not install them: they are gigabytes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
from typing import Dict, List, Optional

import pytest

from jaxlake._src.errors import ConfigurationError
from jaxlake._src.xla import fakegpu

ROOT = pathlib.Path(__file__).resolve().parents[1]
JAXLAKE = str(pathlib.Path(sys.executable).with_name("jaxlake"))


def _guard_reason() -> Optional[str]:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return "the fake GPU and its loader guard are built on x86-64 Linux only"
    if not os.path.isfile(fakegpu.interpose_path()):
        return f"this build has no loader guard ({fakegpu.interpose_path()})"
    return None


def _compiler() -> Optional[str]:
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


needs_guard = pytest.mark.skipif(_guard_reason() is not None,
                                 reason=str(_guard_reason()))


def _shared_object(tmp: pathlib.Path, path: pathlib.Path, source: str,
                   *flags: str) -> pathlib.Path:
    """Compiles C++ source into the shared object at path."""
    compiler = _compiler()
    if compiler is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++) on PATH to build "
                    "the test's shared objects")
    path.parent.mkdir(parents=True, exist_ok=True)
    src = tmp / (path.name + ".cc")
    src.write_text(textwrap.dedent(source))
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(path), str(src),
                    *flags], check=True, capture_output=True, text=True)
    return path


def _which(value: int) -> str:
    return f'extern "C" int which() {{ return {value}; }}\n'


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> Dict[str, pathlib.Path]:
    """A made-up site-packages with NVIDIA's layout, the fake's folder of
    links, a library outside both, and one that loads a bare name through
    its own RUNPATH."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    nvidia = site / "nvidia"
    t = {
        "cublas": _shared_object(tmp_path, nvidia / "cublas" / "lib" /
                                 "libcublas.so.12", _which(1)),
        "nvrtc": _shared_object(tmp_path, nvidia / "cuda_nvrtc" / "lib" /
                                "libnvrtc.so.12", _which(4)),
        "fake": _shared_object(tmp_path, tmp_path / "fake" /
                               "libjaxlake_fakegpu.so", _which(2)),
        "other": _shared_object(tmp_path, tmp_path / "other" /
                                "libother.so", _which(3)),
        "dep": _shared_object(tmp_path, tmp_path / "caller" / "deps" /
                              "libdep.so", _which(5)),
        "caller": _shared_object(tmp_path, tmp_path / "caller" /
                                 "libcaller.so", """
            #include <dlfcn.h>
            // Loads libdep.so by bare name: only this library's RUNPATH
            // ($ORIGIN/deps) finds it.
            extern "C" int load_dep() {
              void* h = dlopen("libdep.so", RTLD_NOW | RTLD_LOCAL);
              if (h == nullptr) return -1;
              auto f = reinterpret_cast<int (*)()>(dlsym(h, "which"));
              return f != nullptr ? f() : -2;
            }
            """, "-Wl,--enable-new-dtags,-rpath,$ORIGIN/deps", "-ldl"),
        "nvidia": nvidia,
        "links": tmp_path / "links",
        "loads": tmp_path / "loads.txt",
    }
    # The folder of links, as fakegpu.library_dir() makes it: NVIDIA's
    # names to the fake. It has no libnvrtc.so.12.
    t["links"].mkdir()
    os.symlink(t["fake"], t["links"] / "libcublas.so.12")
    return t


PROBE = r"""
import ctypes, json, os, sys
out = {}
def load(key, path):
    try:
        out[key] = ctypes.CDLL(path).which()
    except OSError as error:
        out[key] = str(error)
t = json.loads(sys.argv[1])
load("by_path", t["cublas"])
load("by_name", "libcublas.so.12")
load("missing", t["nvrtc"])
load("other", t["other"])
out["caller"] = ctypes.CDLL(t["caller"]).load_dep()
# dlmopen into a new namespace, as ctypes cannot.
libc = ctypes.CDLL(None)
libc.dlmopen.restype = ctypes.c_void_p
libc.dlmopen.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_int]
libc.dlsym.restype = ctypes.c_void_p
libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
LM_ID_NEWLM, RTLD_NOW = -1, 2
handle = libc.dlmopen(LM_ID_NEWLM, t["cublas"].encode(), RTLD_NOW)
out["dlmopen"] = (ctypes.CFUNCTYPE(ctypes.c_int)(libc.dlsym(handle, b"which"))()
                  if handle else None)
# RTLD_NOLOAD, as a program asks whether a library is loaded already.
libc.dlopen.restype = ctypes.c_void_p
libc.dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
RTLD_NOLOAD = 4
handle = libc.dlopen(t["cublas"].encode(), RTLD_NOW | RTLD_NOLOAD)
out["noload"] = (ctypes.CFUNCTYPE(ctypes.c_int)(libc.dlsym(handle, b"which"))()
                 if handle else None)
with open("/proc/self/maps") as maps:
    out["mapped"] = sorted({line.split()[-1] for line in maps
                            if t["nvidia"] in line})
print(json.dumps(out))
"""


def _probe(t: Dict[str, pathlib.Path], env: Dict[str, str]
           ) -> Dict[str, object]:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("JAXLAKE_") and k != "LD_PRELOAD"}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE,
         json.dumps({k: str(v) for k, v in t.items()})],
        env=full, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def _guarded(t: Dict[str, pathlib.Path]) -> Dict[str, str]:
    return {"LD_PRELOAD": fakegpu.interpose_path(),
            fakegpu.LIBS_ENV: str(t["links"]),
            fakegpu.LOADS_ENV: str(t["loads"])}


@needs_guard
def test_guard_loads_the_fakes_link_for_an_nvidia_path_or_name(
        tree: Dict[str, pathlib.Path]) -> None:
    out = _probe(tree, _guarded(tree))
    # By absolute path into site-packages/nvidia, by bare name, and through
    # dlmopen: the fake's library each time (which() == 2), never NVIDIA's.
    assert out["by_path"] == 2 and out["by_name"] == 2, out
    assert out["dlmopen"] == 2 and out["noload"] == 2, out
    assert out["mapped"] == [], out
    lines = tree["loads"].read_text().splitlines()
    link = str(tree["links"] / "libcublas.so.12")
    assert f"{tree['cublas']}\t{link}" in lines
    assert f"libcublas.so.12\t{link}" in lines


@needs_guard
def test_guard_refuses_a_library_the_fake_lacks_naming_its_folder(
        tree: Dict[str, pathlib.Path]) -> None:
    out = _probe(tree, _guarded(tree))
    tried = str(tree["links"] / "libnvrtc.so.12")
    assert isinstance(out["missing"], str) and tried in out["missing"], out
    assert f"{tree['nvrtc']}\trefused\t{tried}" in \
        tree["loads"].read_text().splitlines()


@needs_guard
def test_guard_leaves_other_loads_and_the_callers_runpath_alone(
        tree: Dict[str, pathlib.Path]) -> None:
    out = _probe(tree, _guarded(tree))
    assert out["other"] == 3, out
    # libcaller.so's dlopen("libdep.so") is found through libcaller's own
    # RUNPATH: the guard hands over with the caller's return address.
    assert out["caller"] == 5, out
    assert str(tree["other"]) not in tree["loads"].read_text()


@needs_guard
def test_without_the_guard_nvidias_file_is_what_loads(
        tree: Dict[str, pathlib.Path]) -> None:
    # The same program unguarded, and guarded with no folder given: the
    # made-up NVIDIA library itself is loaded (what the guard prevents).
    for env in ({}, {"LD_PRELOAD": fakegpu.interpose_path()}):
        out = _probe(tree, env)
        assert out["by_path"] == 1 and out["dlmopen"] == 1, (env, out)
        assert out["noload"] == 1, (env, out)
        assert out["caller"] == 5
        assert out["mapped"] == sorted([str(tree["cublas"]),
                                        str(tree["nvrtc"])]), out


@needs_guard
def test_environment_preloads_the_guard_with_nvidia_wheels_installed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.isfile(fakegpu.library_path()):
        pytest.skip(f"this build has no fake GPU ({fakegpu.library_path()})")
    # As if `pip install "jax[cuda12]"` had installed NVIDIA's wheels.
    monkeypatch.setattr(fakegpu, "nvidia_wheels",
                        lambda: ["nvidia.cuda_runtime", "nvidia.cublas"])
    env, _ = fakegpu.environment({"LD_PRELOAD": "/x/libother.so"}, "h100", 1,
                                 None)
    assert env["LD_PRELOAD"] == fakegpu.interpose_path() + " /x/libother.so"
    folder = env[fakegpu.LIBS_ENV]
    assert env["LD_LIBRARY_PATH"].split(":")[0] == folder
    assert os.path.realpath(os.path.join(folder, "libcudart.so.12")) == \
        os.path.realpath(fakegpu.library_path())


@needs_guard
def test_environment_without_the_guard_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    if not os.path.isfile(fakegpu.library_path()):
        pytest.skip(f"this build has no fake GPU ({fakegpu.library_path()})")
    missing = str(tmp_path / "libjaxlake_fakegpu_interpose.so")
    monkeypatch.setattr(fakegpu, "interpose_path", lambda: missing)
    with pytest.raises(ConfigurationError, match="no loader guard"):
        fakegpu.environment({}, "h100", 1, None)


# --------------------------------------------------------------------------
# Over NVIDIA's real wheels


def _wheels_reason() -> Optional[str]:
    reason = _guard_reason()
    if reason:
        return reason
    if not os.path.isfile(fakegpu.library_path()):
        return f"this build has no fake GPU ({fakegpu.library_path()})"
    major = fakegpu.cuda_major()
    try:
        if importlib.util.find_spec(f"jax_plugins.xla_cuda{major}") is None:
            return "JAX's CUDA plugin is not installed"
    except (ImportError, ValueError):
        return f"JAX's CUDA {major} plugin cannot be imported"
    wheels = ({"nvidia.cu13", "nvidia.cudnn"} if major == 13 else
              {"nvidia.cuda_runtime", "nvidia.cublas", "nvidia.cudnn"})
    if not wheels <= set(fakegpu.nvidia_wheels()):
        return (f"NVIDIA's CUDA {major} wheels are not installed (pip "
                f"install 'jax[cuda{major}]' brings them; the test extra "
                "leaves them out, they are gigabytes)")
    return None


needs_wheels = pytest.mark.skipif(_wheels_reason() is not None,
                                  reason=str(_wheels_reason()))


def _nvidia_dirs() -> List[str]:
    spec = importlib.util.find_spec("nvidia")
    assert spec is not None and spec.submodule_search_locations
    return [os.path.realpath(p) for p in spec.submodule_search_locations]


def _wheel_run(argv: List[str], tmp: pathlib.Path, timeout: int = 300
               ) -> "subprocess.CompletedProcess[str]":
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_PLATFORMS", "XLA_FLAGS", "LD_PRELOAD", "JAXLAKE")
           and not k.startswith("JAXLAKE_")}
    env["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
    env[fakegpu.LOADS_ENV] = str(tmp / "loads.txt")
    env["JAXLAKE_FAKEGPU_STATS"] = str(tmp / "stats.json")
    return subprocess.run([JAXLAKE, "run", "--fake-gpu", "--", *argv],
                          env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


def _check_loads(tmp: pathlib.Path) -> List[str]:
    """Every load the guard saw that asked for a file of NVIDIA's wheels went
    to the fake's folder or was refused; returns the libraries routed."""
    nvidia = _nvidia_dirs()
    routed = []
    for line in (tmp / "loads.txt").read_text().splitlines():
        asked, *answer = line.split("\t")
        loaded = answer[-1]
        assert not any(os.path.realpath(loaded).startswith(d + os.sep)
                       for d in nvidia), line
        if any(os.path.realpath(asked).startswith(d + os.sep)
               for d in nvidia) and answer[0] != "refused":
            routed.append(os.path.basename(asked))
    return routed


SCRIPT = r"""
import json, os, sys
import jax, jax.numpy as jnp
import jaxlake
x = jnp.ones((256, 256))
y = jax.jit(lambda a: (a @ a).sum())(x)
y.block_until_ready()
nvidia = [os.path.realpath(p) for p in sys.argv[1:]]
with open("/proc/self/maps") as maps:
    files = {line.split()[-1] for line in maps if "/" in line}
print("RESULT " + json.dumps({
    "devices": [d.platform for d in jax.devices()],
    "kind": jax.devices()[0].device_kind,
    "mapped_nvidia": sorted(f for f in files
                            if any(os.path.realpath(f).startswith(d + os.sep)
                                   for d in nvidia)),
    "mapped": len(files),
    "served": jaxlake.hook_counts().get("cuMemAllocFromPoolAsync", {}),
}))
"""


@needs_wheels
def test_jax_over_nvidias_wheels_runs_on_the_fake_and_maps_none_of_them(
        tmp_path: pathlib.Path) -> None:
    proc = _wheel_run([sys.executable, "-c", SCRIPT, *_nvidia_dirs()],
                      tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["devices"] == ["gpu"] and "H100" in out["kind"], out
    # The trace of what the process maps: no file of NVIDIA's wheels.
    assert out["mapped"] > 0 and out["mapped_nvidia"] == [], out
    assert out["served"].get("served", 0) >= 1, out
    assert out["served"].get("forwarded", 1) == 0, out
    # The plugin asked for NVIDIA's libraries by path; the fake's came.
    routed = _check_loads(tmp_path)
    major = fakegpu.cuda_major()
    for name in (f"libcudart.so.{major}", f"libcublas.so.{major}",
                 "libcudnn.so.9"):
        assert name in routed, routed
    calls = json.loads((tmp_path / "stats.json").read_text())["calls"]
    assert int(calls.get("cuGetExportTable", 0)) == 0, calls


@needs_wheels
def test_train_lm_tiny_over_nvidias_wheels(tmp_path: pathlib.Path) -> None:
    probe = tmp_path / "maps.txt"
    # The example, then the maps of its process, read from an atexit hook
    # that the -c program installs before running it.
    runner = (
        "import atexit, runpy, sys\n"
        f"atexit.register(lambda: open({str(probe)!r}, 'w').write("
        "open('/proc/self/maps').read()))\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    proc = _wheel_run([sys.executable, "-c", runner,
                       str(ROOT / "examples" / "train_lm.py"), "--preset",
                       "tiny", "--steps", "2", "--attention", "xla",
                       "--no-progress"], tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    nvidia = _nvidia_dirs()
    mapped = {line.split()[-1] for line in probe.read_text().splitlines()
              if "/" in line}
    assert mapped and not [f for f in mapped if any(
        os.path.realpath(f).startswith(d + os.sep) for d in nvidia)]
    assert "libcudnn.so.9" in _check_loads(tmp_path)
