"""Finding the real CUDA driver, loading jaxlake's libcuda.so.1 stand-in
(the shim) and probing the devices through it.

The shim forwards every driver call to the real driver, which it finds the
way find_real_driver() does (cc/shim/loader.cc searches the same places in
the same order). configure() (jaxlake/_src/xla/integration.py) and
`jaxlake doctor` use what is here.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

#: The real driver's absolute path, when the search must not be used.
REAL_DRIVER_ENV = "JAXLAKE_REAL_LIBCUDA"


# Where drivers live on the systems we know, searched after the absolute
# directories of LD_LIBRARY_PATH: the same list, in the same order, as
# kDriverDirs in cc/shim/loader.cc (tests/test_xla_fake_driver.py compares them).
DRIVER_DIRS: Tuple[str, ...] = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/wsl/lib",
    "/run/opengl-driver/lib",
    "/usr/local/cuda/compat",
)

CUDA_SUCCESS = 0
VMM_ATTRIBUTE = 102  # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
MIN_DRIVER_VERSION = 10020  # the VMM API arrived with CUDA 10.2


def shim_path() -> str:
    """Path of the libcuda.so.1 stand-in shipped with the package."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    return os.path.join(package, "_lib", "libcuda.so.1")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def driver_candidates(environ: Optional[Mapping[str, str]] = None
                      ) -> List[str]:
    """Where the real driver is looked for, in order (JAXLAKE_REAL_LIBCUDA
    aside): libcuda.so.1 in each absolute directory of LD_LIBRARY_PATH, then
    in DRIVER_DIRS. The shim's loader searches the same places in the same
    order, so a forward-compatibility driver put first in LD_LIBRARY_PATH
    is the one both find."""
    env = os.environ if environ is None else environ
    out: List[str] = []
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":")
            if d.startswith("/")] + list(DRIVER_DIRS)
    for d in dirs:
        path = os.path.join(d, "libcuda.so.1")
        if path not in out:
            out.append(path)
    return out


def find_real_driver(environ: Optional[Mapping[str, str]] = None
                     ) -> Tuple[Optional[str], str]:
    """The real driver's absolute path, or None and why none was found.

    JAXLAKE_REAL_LIBCUDA when set (that file and no other), else the first
    of driver_candidates() that exists and is not the shim.
    """
    env = os.environ if environ is None else environ
    shim = shim_path()
    given = env.get(REAL_DRIVER_ENV)
    if given:
        if not os.path.isabs(given) or not os.path.isfile(given):
            return None, (f"{REAL_DRIVER_ENV}={given!r} is not an absolute "
                          "path to a file")
        if _same_file(given, shim):
            return None, (f"{REAL_DRIVER_ENV} points at jaxlake's own "
                          "libcuda.so.1; it must name the real driver")
        return given, ""
    for path in driver_candidates(env):
        if os.path.isfile(path) and not _same_file(path, shim):
            return path, ""
    return None, ("no CUDA driver found: libcuda.so.1 is in none of the "
                  "directories of LD_LIBRARY_PATH nor in "
                  f"{', '.join(DRIVER_DIRS)} (set {REAL_DRIVER_ENV} to its "
                  "absolute path)")


def loaded_drivers() -> List[str]:
    """Paths of libcuda libraries mapped into this process (the shim too)."""
    found: List[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                base = os.path.basename(path)
                if base.startswith("libcuda.so") and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def jax_backends_initialised() -> bool:
    """True once JAX has created its backends (the driver is open then)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


# -- the shim -----------------------------------------------------------------


class _Shim:
    """The loaded libcuda.so.1 stand-in (ctypes)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        lib = self.lib
        lib.jaxlake_shim_api_version.restype = ctypes.c_int
        for name in ("jaxlake_shim_reason", "jaxlake_shim_hooks_json",
                     "jaxlake_shim_status_json"):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_size_t
            fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.jaxlake_shim_stats_json.restype = ctypes.c_longlong
        lib.jaxlake_shim_stats_json.argtypes = [
            ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.jaxlake_shim_lake_devices.restype = ctypes.c_int
        lib.jaxlake_shim_lake_devices.argtypes = [
            ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.jaxlake_shim_empty_cache.restype = ctypes.c_longlong
        lib.jaxlake_shim_empty_cache.argtypes = [ctypes.c_int]
        lib.jaxlake_shim_check.restype = ctypes.c_size_t
        lib.jaxlake_shim_check.argtypes = [ctypes.c_int, ctypes.c_char_p,
                                           ctypes.c_size_t]
        lib.jaxlake_shim_trace_start.restype = ctypes.c_int
        lib.jaxlake_shim_trace_start.argtypes = [ctypes.c_char_p,
                                                 ctypes.c_char_p]
        lib.jaxlake_shim_trace_stop.restype = ctypes.c_longlong
        lib.jaxlake_shim_active.restype = ctypes.c_int
        # Newer entry points: absent from a shim of an older build.
        if hasattr(lib, "jaxlake_shim_open_lake"):
            lib.jaxlake_shim_open_lake.restype = ctypes.c_int
            lib.jaxlake_shim_open_lake.argtypes = [ctypes.c_int]
        if hasattr(lib, "jaxlake_shim_exit_report"):
            lib.jaxlake_shim_exit_report.restype = ctypes.c_size_t
            lib.jaxlake_shim_exit_report.argtypes = [ctypes.c_char_p,
                                                     ctypes.c_size_t]
        lib.jaxlake_shim_disable.restype = None
        lib.jaxlake_shim_disable.argtypes = [ctypes.c_char_p]

    @staticmethod
    def _text(fn: Any, *args: Any) -> Optional[str]:
        size = 4096
        while True:
            buf = ctypes.create_string_buffer(size)
            n = fn(*args, buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = int(n) + 1

    @property
    def active(self) -> bool:
        return bool(self.lib.jaxlake_shim_active())

    def reason(self) -> str:
        return self._text(self.lib.jaxlake_shim_reason) or ""

    def status(self) -> Dict[str, Any]:
        return dict(json.loads(
            self._text(self.lib.jaxlake_shim_status_json) or "{}"))

    def hooks(self) -> Dict[str, Dict[str, int]]:
        return dict(json.loads(
            self._text(self.lib.jaxlake_shim_hooks_json) or "{}"))

    def devices(self) -> List[int]:
        out = (ctypes.c_int * 64)()
        n = self.lib.jaxlake_shim_lake_devices(out, 64)
        return [out[i] for i in range(min(n, 64))]

    def stats(self, device: int) -> Optional[Dict[str, Any]]:
        text = self._text(self.lib.jaxlake_shim_stats_json, device)
        return None if text is None else dict(json.loads(text))

    def open_lake(self, device: int) -> bool:
        """Whether `device` has a lake, making it now if it has none yet
        (needs an initialised driver)."""
        if not hasattr(self.lib, "jaxlake_shim_open_lake"):
            return device in self.devices()
        return bool(self.lib.jaxlake_shim_open_lake(device))

    def exit_report(self) -> str:
        """The report JAXLAKE_EXIT_REPORT=1 prints at exit, as of now."""
        if not hasattr(self.lib, "jaxlake_shim_exit_report"):
            return ""
        return self._text(self.lib.jaxlake_shim_exit_report) or ""

    def empty_cache(self, device: int) -> int:
        return int(self.lib.jaxlake_shim_empty_cache(device))

    def check(self, device: int) -> str:
        return self._text(self.lib.jaxlake_shim_check, device) or ""

    def trace_start(self, path: str, name: Optional[str]) -> int:
        return int(self.lib.jaxlake_shim_trace_start(
            os.fsencode(path), None if name is None else name.encode()))

    def trace_stop(self) -> int:
        return int(self.lib.jaxlake_shim_trace_stop())

    def disable(self, reason: str) -> None:
        self.lib.jaxlake_shim_disable(reason.encode("utf-8", "replace"))

    # Forwarded driver calls, for the probe.
    def driver_call(self, name: str, *args: Any) -> int:
        fn = getattr(self.lib, name)
        fn.restype = ctypes.c_int
        return int(fn(*args))


def _already_loaded_shim() -> Optional[_Shim]:
    """The shim if this process already has it (LD_PRELOAD, a hook)."""
    for path in loaded_drivers():
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | os.RTLD_NOLOAD)
        except OSError:
            continue
        if hasattr(lib, "jaxlake_shim_api_version"):
            return _Shim(path)
    return None


# -- probing the driver ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Device:
    """A CUDA device as the driver reports it."""

    ordinal: int
    total_memory: int
    vmm: bool


def driver_version(shim: _Shim) -> Tuple[int, str]:
    """The driver's CUDA version and a problem (or ""), through the shim.
    cuDriverGetVersion needs no cuInit: CUDA stays uninitialised."""
    version = ctypes.c_int(0)
    if shim.driver_call("cuDriverGetVersion", ctypes.byref(version)):
        return 0, "cuDriverGetVersion failed: the driver is unusable"
    if version.value < MIN_DRIVER_VERSION:
        return version.value, (
            f"the CUDA driver is too old for virtual memory management "
            f"(version {version.value}, need {MIN_DRIVER_VERSION} or newer)")
    return version.value, ""


def probe_devices(shim: _Shim) -> Tuple[List[Device], str]:
    """The devices and a problem (or ""), through the shim's forwarding
    entry points. This initialises CUDA (cuInit): `jaxlake doctor` uses it,
    configure() does not."""
    rc = shim.driver_call("cuInit", ctypes.c_uint(0))
    if rc != CUDA_SUCCESS:
        return [], f"cuInit failed with CUDA error {rc}"
    count = ctypes.c_int(0)
    if shim.driver_call("cuDeviceGetCount", ctypes.byref(count)):
        return [], "cuDeviceGetCount failed"
    devices: List[Device] = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        vmm = ctypes.c_int(0)
        total = ctypes.c_size_t(0)
        if shim.driver_call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(i)):
            continue
        shim.driver_call("cuDeviceGetAttribute", ctypes.byref(vmm),
                         ctypes.c_int(VMM_ATTRIBUTE), dev)
        shim.driver_call("cuDeviceTotalMem_v2", ctypes.byref(total), dev)
        devices.append(Device(i, total.value, bool(vmm.value)))
    if not devices:
        return [], "the driver reports no CUDA device"
    if not any(d.vmm for d in devices):
        return devices, (
            "no device supports virtual memory management "
            "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)")
    return devices, ""


__all__ = ["CUDA_SUCCESS", "DRIVER_DIRS", "Device", "MIN_DRIVER_VERSION",
           "REAL_DRIVER_ENV", "VMM_ATTRIBUTE", "driver_candidates",
           "driver_version", "find_real_driver", "jax_backends_initialised",
           "loaded_drivers", "probe_devices", "shim_path"]
