"""`jaxlake run --fake-gpu`: XLA's real GPU client on a machine with no GPU.

The fake GPU (cc/fakegpu) is one library, libjaxlake_fakegpu.so, that
implements on host memory the public API of the NVIDIA libraries JAX's CUDA
plugin opens by name: the driver (which the shim forwards to, as to a real
one), NVML, the CUDA runtime, cuDNN, cuBLAS(Lt), NCCL, cuFFT, cuSOLVER,
cuSPARSE and CUPTI's version calls. This module makes a folder of links
under those libraries' names, puts it first on LD_LIBRARY_PATH, and gives
the program the environment that makes JAX see the fake devices.

NVIDIA's own runtime must never run over the fake: it reaches the driver
through private tables the fake does not implement. JAX's plugin loads
NVIDIA's pip wheels (nvidia-*-cu12, nvidia-*-cu13) by absolute path when they
are installed (`pip install "jax[cuda12]"`), and by name through its RPATH,
which the loader searches before LD_LIBRARY_PATH. So the program also gets
the fake's loader guard (cc/fakegpu/interpose.cc) preloaded: its dlopen and
dlmopen load every NVIDIA library from the folder of links instead, and
fail, naming that folder, for one the fake does not have.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

from jaxlake._src import options as _options
from jaxlake._src.errors import ConfigurationError
from jaxlake._src.xla import shim as _shim

#: Set in the program's environment: the start-up hook then makes JAX see
#: the fake devices (install_jax_hook()).
FAKE_ENV = "JAXLAKE_FAKE_GPU"
MODEL_ENV = "JAXLAKE_FAKEGPU_MODEL"
COUNT_ENV = "JAXLAKE_FAKEGPU_COUNT"
MEMORY_ENV = "JAXLAKE_FAKEGPU_MEMORY"
CUDA_ENV = "JAXLAKE_FAKEGPU_CUDA"
#: The name of device memory accounting shared across processes
#: (cc/fakegpu/shared.cc), set by --fake-gpu-shared.
SHARED_ENV = "JAXLAKE_FAKEGPU_SHARED"
#: The folder of links, for the loader guard (interpose_path()).
LIBS_ENV = "JAXLAKE_FAKEGPU_LIBS"
#: A file the loader guard appends each routed load to, when set:
#: "<asked>\t<loaded>" or "<asked>\trefused\t<path tried>".
LOADS_ENV = "JAXLAKE_FAKEGPU_LOADS"

MODELS = {"h100": ("H100 80GB", 80 << 30), "h200": ("H200", 141 << 30)}

#: The file names the fake library answers to, as JAX's CUDA 12 and 13
#: plugins and their extensions open them. libcuda.so(.1) are the shim.
LIBRARY_NAMES = (
    "libnvidia-ml.so.1", "libcudart.so.12", "libcudart.so.13",
    "libcudnn.so.9", "libcublas.so.12", "libcublasLt.so.12",
    "libcublas.so.13", "libcublasLt.so.13", "libnccl.so.2",
    "libcufft.so.11", "libcufft.so.12", "libcupti.so.12", "libcupti.so.13",
    "libcusparse.so.12", "libcusolver.so.11", "libcusolver.so.12",
)
DRIVER_NAMES = ("libcuda.so.1", "libcuda.so")

#: NVIDIA's wheels that JAX's plugin loads by absolute path (the loader
#: guard routes those loads to the fake).
NVIDIA_MODULES = ("nvidia.cuda_runtime", "nvidia.cudnn", "nvidia.cublas",
                  "nvidia.nccl", "nvidia.cu13")

NOTICE = ("jaxlake run: fake GPU: {count} x NVIDIA {name} ({memory} each). "
          "Kernels do not run, so the values a program computes are "
          "meaningless; the sizes, order and lifetimes of its buffers, and "
          "the lake's behaviour, are XLA's own.\n")


def library_path() -> str:
    """Where the fake GPU's library is installed."""
    return os.path.join(os.path.dirname(_shim.shim_path()),
                        "libjaxlake_fakegpu.so")


def interpose_path() -> str:
    """Where the fake GPU's loader guard is installed."""
    return os.path.join(os.path.dirname(_shim.shim_path()),
                        "libjaxlake_fakegpu_interpose.so")


def parse_model(value: str) -> str:
    model = value.strip().lower()
    if model not in MODELS:
        raise ConfigurationError(
            f"--fake-gpu={value!r}: the fake GPU is h100 or h200")
    return model


def parse_count(value: object) -> int:
    try:
        count = int(str(value))
    except ValueError:
        count = 0
    if not 1 <= count <= 64:
        raise ConfigurationError(
            f"--fake-gpu-count={value!r}: give a number of devices from 1 "
            "to 64")
    return count


def parse_memory(value: str) -> int:
    try:
        n = _options.parse_size(value)
    except (ValueError, TypeError) as error:
        raise ConfigurationError(
            f"--fake-gpu-memory={value!r}: {error}") from None
    if n < 64 << 20:
        raise ConfigurationError(
            f"--fake-gpu-memory={value!r}: give at least 64MiB a device")
    return n


def parse_shared(value: str) -> str:
    """A name for --fake-gpu-shared: 1 to 200 letters, digits, '_', '-',
    '.' (it names a POSIX shared memory segment)."""
    ok = 1 <= len(value) <= 200 and all(
        c.isascii() and (c.isalnum() or c in "_-.") for c in value)
    if not ok:
        raise ConfigurationError(
            f"--fake-gpu-shared={value!r}: give a name of 1 to 200 "
            "letters, digits, '_', '-' and '.'")
    return value


def nvidia_wheels() -> List[str]:
    """NVIDIA's CUDA wheels installed here (module names)."""
    found = []
    for mod in NVIDIA_MODULES:
        try:
            if importlib.util.find_spec(mod) is not None:
                found.append(mod)
        except (ImportError, ValueError):
            pass
    return found


def cuda_major() -> int:
    """The CUDA major version of the installed JAX plugin (13 when only the
    CUDA 13 plugin is installed, else 12)."""
    def has(mod: str) -> bool:
        try:
            return importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            return False
    if has("jax_plugins.xla_cuda13") and not has("jax_plugins.xla_cuda12"):
        return 13
    return 12


def library_dir(fake: str, shim: str) -> str:
    """A folder of links: NVIDIA's library names to the fake, the driver's
    to the shim. Made once per installed build and reused."""
    st = os.stat(fake)
    key = hashlib.sha1(f"{fake}:{st.st_mtime_ns}:{st.st_size}:{shim}"
                       .encode()).hexdigest()[:12]
    base = os.path.join(tempfile.gettempdir(),
                        f"jaxlake-fakegpu-{os.getuid()}-{key}")
    if os.path.isdir(base):
        return base
    tmp = tempfile.mkdtemp(prefix=os.path.basename(base) + ".",
                           dir=os.path.dirname(base))
    for name in LIBRARY_NAMES:
        os.symlink(fake, os.path.join(tmp, name))
    for name in DRIVER_NAMES:
        os.symlink(shim, os.path.join(tmp, name))
    try:
        os.rename(tmp, base)
    except OSError:  # another process made it first
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)
    return base


def environment(environ: Dict[str, str], model: str, count: int,
                memory: Optional[int], shared: Optional[str] = None
                ) -> Tuple[Dict[str, str], str]:
    """The variables that put the fake GPU under a program, and the notice
    said once on stderr; `shared`: the name of device memory accounting
    shared with other processes. Raises ConfigurationError when it cannot
    run."""
    fake = library_path()
    shim = _shim.shim_path()
    if not os.path.isfile(fake):
        raise ConfigurationError(
            f"this build of jaxlake has no fake GPU ({fake} is missing; it "
            "is built on x86-64 Linux only)")
    guard = interpose_path()
    if not os.path.isfile(guard):
        # Without it NVIDIA's wheels, where installed, would put NVIDIA's
        # runtime over the fake driver.
        raise ConfigurationError(
            "this build of jaxlake has no loader guard for the fake GPU "
            f"({guard} is missing), so nothing keeps JAX's plugin from "
            "loading NVIDIA's own libraries; reinstall jaxlake")
    env: Dict[str, str] = {
        FAKE_ENV: "1", MODEL_ENV: model, COUNT_ENV: str(count),
        CUDA_ENV: str(cuda_major()), _shim.REAL_DRIVER_ENV: fake,
    }
    # JAX's own order on a GPU machine (CUDA first, then the CPU), told to
    # programs that look for /dev/nvidia* themselves before starting jax.
    platforms = environ.get("JAX_PLATFORMS", "")
    if not platforms:
        env["JAX_PLATFORMS"] = "cuda,cpu"
    elif not any(p.strip() in ("cuda", "gpu") for p in platforms.split(",")):
        notice_extra = (f"jaxlake run: warning: JAX_PLATFORMS={platforms} "
                        "keeps the program off the fake GPU\n")
        env["JAXLAKE_FAKEGPU_NOTE"] = notice_extra
    nbytes = memory if memory is not None else MODELS[model][1]
    env[MEMORY_ENV] = str(nbytes)
    folder = library_dir(fake, shim)
    path = environ.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = folder + (":" + path if path else "")
    # The loader guard: every dlopen of an NVIDIA library, by path or by
    # name, loads the folder's link of that name (docs/design.md, "The fake
    # GPU"). `jaxlake run` puts the shim before it.
    env[LIBS_ENV] = folder
    preload = environ.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = guard + (" " + preload if preload else "")
    notice = NOTICE.format(count=count, name=MODELS[model][0],
                           memory=_options.format_bytes(nbytes))
    if shared is not None:
        env[SHARED_ENV] = shared
        notice += (f"jaxlake run: fake GPU: device memory shared by every "
                   f"process run with --fake-gpu-shared {shared} (the "
                   "accounting only; each process's contents are its "
                   "own)\n")
    notice += env.pop("JAXLAKE_FAKEGPU_NOTE", "")
    return env, notice


def install_jax_hook() -> Optional[str]:
    """Makes JAX see the fake devices, for this process only: it stands in
    for jax._src.hardware_utils.has_visible_nvidia_gpu(), which looks for
    /dev/nvidia* files before JAX tries its CUDA backend. Runs from the
    start-up hook, before jax is imported; returns a note when this jax has
    no such function (then it needs none, or the fake cannot help)."""
    import importlib.abc
    import importlib.machinery

    target = "jax._src.hardware_utils"

    class _Loader(importlib.abc.Loader):
        def __init__(self, inner: importlib.abc.Loader) -> None:
            self._inner = inner

        def create_module(self, spec):  # type: ignore[no-untyped-def]
            return self._inner.create_module(spec)

        def exec_module(self, module):  # type: ignore[no-untyped-def]
            self._inner.exec_module(module)
            if hasattr(module, "has_visible_nvidia_gpu"):
                module.has_visible_nvidia_gpu = lambda: True
            else:
                sys.stderr.write(
                    "jaxlake: fake GPU: this jax has no "
                    f"{target}.has_visible_nvidia_gpu to stand in for\n")

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target_=None):  # type: ignore
            if name != target:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
            return spec

    if target in sys.modules:
        module = sys.modules[target]
        if hasattr(module, "has_visible_nvidia_gpu"):
            module.has_visible_nvidia_gpu = lambda: True  # type: ignore
            return None
        return f"{target} has no has_visible_nvidia_gpu"
    sys.meta_path.insert(0, _Finder())
    return None
