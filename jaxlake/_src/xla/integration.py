"""Hands XLA's GPU allocations to the lake.

XLA's GPU client takes no outside allocator. Its `cuda_async` allocator,
though, allocates every device buffer with `cuMemAllocFromPoolAsync` and
frees it with `cuMemFreeAsync`, which the CUDA plugin looks up in
`libcuda.so.1` with dlopen/dlsym. jaxlake ships a stand-in for that library
(jaxlake/_lib/libcuda.so.1, built from cc/shim/): loaded with RTLD_GLOBAL
before anything opens the real driver, it is what the plugin's later
`dlopen("libcuda.so.1")` returns. It forwards every driver call to the real
driver and serves those two from one lake per device.

So configure() must run before JAX initialises its backends (the first
`jax.devices()` or operation); `import jax` alone is fine. The environment
(`JAXLAKE=1`, `JAXLAKE_<OPTION>`, `--jaxlake_<option>` in XLA_FLAGS) takes
the same path through the start-up hook (jaxlake/_src/xla/startup.py).

configure() does not initialise CUDA: it loads the shim, which loads the
real driver, and asks only cuDriverGetVersion (which needs no cuInit). The
devices, their VMM support and the lakes are checked at the first hooked
call, when JAX has initialised CUDA itself. So a process may still fork
after configure() exactly as after `import jax`: CUDA is not initialised in
it until JAX starts (after that, as always with CUDA, a forked child must not
use CUDA; start children with the "spawn" method).

Capacity: the `capacity` option (bytes, or a fraction of each device's
memory) when given; else XLA's own memory fraction,
XLA_PYTHON_CLIENT_MEM_FRACTION when set, else 0.75 (XLA's default): the
rest of the device stays for cuBLAS/cuDNN workspaces, NCCL, loaded modules
and the executor's own allocations, which the lake never gives its cached
memory back to. An explicit lake capacity wins over
XLA_PYTHON_CLIENT_MEM_FRACTION.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import shlex
import sys
import threading
import warnings
from typing import (Any, Dict, Iterator, List, Mapping, MutableMapping,
                    Optional, Tuple)

from jaxlake._src import options as _options
from jaxlake._src.errors import ConfigurationError
from jaxlake._src.core.stats import Stats

#: The options configure() takes (the lake's; granularity and device memory
#: belong to the real device).
LAKE_OPTIONS: Tuple[str, ...] = tuple(
    o.name for o in _options.OPTIONS if o.lake)

#: Environment variables of the integration that are not lake options.
ENABLE_ENV = "JAXLAKE"
REAL_DRIVER_ENV = "JAXLAKE_REAL_LIBCUDA"
TRACE_ENV = "JAXLAKE_TRACE_FILE"
HOOKS_ENV = "JAXLAKE_SHIM_HOOKS"
REQUIRED_ENV = "JAXLAKE_REQUIRED"
FRACTION_ENV = "JAXLAKE_CAPACITY_FRACTION"
assert all(v in _options.OTHER_VARIABLES for v in (
    REAL_DRIVER_ENV, TRACE_ENV, HOOKS_ENV, REQUIRED_ENV, FRACTION_ENV))

#: XLA's share of device memory, and its default (also the lake's default
#: capacity, see the module's docstring).
XLA_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
XLA_DEFAULT_FRACTION = 0.75

ALLOCATOR_ENV = "XLA_PYTHON_CLIENT_ALLOCATOR"
PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"
FLAG_PREFIX = "--jaxlake_"

# Where drivers live on the systems we know, searched after the absolute
# directories of LD_LIBRARY_PATH: the same list, in the same order, as
# kDriverDirs in cc/shim/loader.cc (tests/test_xla.py compares them).
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


# -- XLA_FLAGS -----------------------------------------------------------------


def split_xla_flags(value: str) -> Tuple[str, Dict[str, str]]:
    """Splits XLA_FLAGS into (the flags XLA should see, jaxlake's entries).

    `--jaxlake_<option>=<value>` entries become {option: value}; a bare
    `--jaxlake_<option>` means "true"; `--jaxlake` or `--jaxlake_enable`
    turns the lake on (key "enable"). Every other token is kept as it was,
    in order.
    """
    kept: List[str] = []
    ours: Dict[str, str] = {}
    for token in shlex.split(value) if value.strip() else []:
        if token == "--jaxlake" or token.startswith(FLAG_PREFIX):
            name, _, val = token[len(FLAG_PREFIX):].partition("=")
            if token == "--jaxlake":
                name = "enable"
            ours[name or "enable"] = val if val else "true"
        else:
            kept.append(token)
    return " ".join(shlex.quote(t) for t in kept), ours


def strip_xla_flags(environ: Optional[MutableMapping[str, str]] = None
                    ) -> Dict[str, str]:
    """Removes jaxlake's entries from XLA_FLAGS (XLA aborts on unknown
    flags) and returns them."""
    env = os.environ if environ is None else environ
    value = env.get("XLA_FLAGS")
    if value is None:
        return {}
    kept, ours = split_xla_flags(value)
    if ours:
        if kept:
            env["XLA_FLAGS"] = kept
        else:
            del env["XLA_FLAGS"]
    return ours


def resolve_settings(environ: MutableMapping[str, str],
                     options: Mapping[str, Any],
                     trace: Optional[str], required: bool
                     ) -> Tuple[Dict[str, Any], Optional[str], bool]:
    """(lake options, trace path, required) from the keyword arguments,
    then the `--jaxlake_*` entries of XLA_FLAGS (removed from `environ`),
    then the JAXLAKE_* variables of `environ`. Raises ConfigurationError
    naming a bad option, entry or value."""
    flags = strip_xla_flags(environ)
    flags.pop("enable", None)
    if "trace" in flags:
        value = flags.pop("trace")
        trace = trace if trace is not None else value
    if "required" in flags:
        required = truthy(flags.pop("required")) or required
    for name in flags:
        if name not in LAKE_OPTIONS:
            raise ConfigurationError(
                f"XLA_FLAGS entry --jaxlake_{name}: "
                + str(_options.unknown_option_error(name)))
    for name in options:
        if name not in LAKE_OPTIONS:
            raise _options.unknown_option_error(name) if \
                name not in _options._BY_NAME else ConfigurationError(
                    f"option {name!r} belongs to the host and sim "
                    "backends; configure() takes: "
                    + ", ".join(LAKE_OPTIONS))
    merged: Dict[str, Any] = {**flags, **{k: v for k, v in options.items()
                                          if v is not None}}
    resolved = _options.resolve_options(merged, environ)
    resolved = {k: v for k, v in resolved.items() if k in LAKE_OPTIONS}
    if trace is None:
        trace = environ.get(TRACE_ENV) or None
    return resolved, trace, required


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
        lib.jaxlake_shim_trace_start.restype = ctypes.c_int
        lib.jaxlake_shim_trace_start.argtypes = [ctypes.c_char_p,
                                                 ctypes.c_char_p]
        lib.jaxlake_shim_trace_stop.restype = ctypes.c_longlong
        lib.jaxlake_shim_active.restype = ctypes.c_int
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

    def empty_cache(self, device: int) -> int:
        return int(self.lib.jaxlake_shim_empty_cache(device))

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


def capacity_rule(resolved: Mapping[str, Any],
                  environ: Optional[Mapping[str, str]] = None
                  ) -> Tuple[Optional[int], float, str]:
    """(bytes, fraction, where it comes from) of the lake's capacity: the
    `capacity` option (bytes, or a fraction), else XLA_PYTHON_CLIENT_MEM_
    FRACTION, else XLA's default 0.75. Exactly one of bytes and fraction is
    set (the other is None or 0.0). The shim applies the same rule
    (cc/shim/options.h)."""
    env = os.environ if environ is None else environ
    cap = resolved.get("capacity")
    if isinstance(cap, float):
        return None, cap, "the capacity option (a fraction)"
    if cap:
        return int(cap), 0.0, "the capacity option"
    given = env.get(XLA_FRACTION_ENV, "").strip()
    if given:
        try:
            fraction = float(given)
        except ValueError:
            fraction = -1.0
        if not 0.0 < fraction <= 1.0:
            raise ConfigurationError(
                f"{XLA_FRACTION_ENV}={given!r} is not a decimal fraction in "
                "(0, 1]")
        return None, fraction, XLA_FRACTION_ENV
    return None, XLA_DEFAULT_FRACTION, "XLA's default memory fraction"


def effective_capacity(resolved: Mapping[str, Any], total_memory: int,
                       granularity: int = 2 << 20,
                       environ: Optional[Mapping[str, str]] = None) -> int:
    """The capacity a lake on a device of `total_memory` bytes gets."""
    nbytes, fraction, _ = capacity_rule(resolved, environ)
    if nbytes is not None:
        return nbytes
    share = int(total_memory * fraction)
    return max(granularity, share // granularity * granularity)


# -- configure() ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Status:
    """What configure() did. True when the lake serves XLA's allocations.

    Active means the shim is loaded with its hooks on and the driver is new
    enough; the devices (and their VMM support) are checked when JAX
    initialises CUDA, and a device that cannot have a lake then stays with
    the driver's pool (`jaxlake.status()` and `jaxlake doctor` say why).
    `devices` is filled only where CUDA was initialised to look (doctor).
    """

    active: bool
    reason: str
    driver: Optional[str] = None
    shim: Optional[str] = None
    driver_version: int = 0
    devices: Tuple[Device, ...] = ()
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.active

    def __str__(self) -> str:
        if self.active:
            return (f"jaxlake: lake active (driver {self.driver}, CUDA "
                    f"{self.driver_version}); devices are checked when JAX "
                    "starts")
        return f"jaxlake: lake inactive: {short_reason(self.reason)}"


def short_reason(reason: str) -> str:
    """The first clause of an inactive lake's reason, for a one-line
    message (`jaxlake doctor` and Status.reason give the whole of it)."""
    head = reason.split(": ", 1)[0].split("; ", 1)[0].strip()
    return head + (" (`jaxlake doctor` says more)" if head != reason else "")


_lock = threading.Lock()
_configured: Optional[Tuple[Tuple[Tuple[str, Any], ...], Status]] = None
_shim: Optional[_Shim] = None


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(int(value))


def configure(*, required: bool = False, trace: Optional[str] = None,
              **options: Any) -> Status:
    """Routes XLA's GPU allocations through the lake. Call it before JAX
    initialises its backends (the first `jax.devices()` or operation).

    Keyword arguments are lake options (see `jaxlake options`; capacity may
    be bytes, a size string or a fraction of the device memory, and
    defaults to XLA's memory fraction); they win over `--jaxlake_<option>`
    entries in XLA_FLAGS, which win over JAXLAKE_<OPTION> variables.
    `trace` names a file to write the allocation trace to (JSON lines,
    docs/traces.md).

    Returns a Status: active, or inactive with the reason (no driver, a
    driver too old for VMM, ...). An inactive lake changes nothing in the
    process or its environment. With required=True an inactive lake raises
    ConfigurationError instead. Calling it again with the same options
    returns the same status; with other options it raises, and so does a
    call whose options differ from those of a shim loaded before it (by
    `jaxlake run` or LD_PRELOAD), which can no longer change.
    CUDA is not initialised here (see the module's docstring on fork).
    """
    global _configured
    with _lock:
        resolved, trace, required = resolve_settings(
            os.environ, options, trace, required)
        capacity_rule(resolved)  # a bad XLA_PYTHON_CLIENT_MEM_FRACTION
        key = tuple(sorted(resolved.items())) + (("trace", trace),)
        if _configured is not None:
            if _configured[0] == key:
                return _configured[1]
            raise ConfigurationError(
                "jaxlake.configure() was already called with other options "
                f"({dict(_configured[0])}); the lake cannot be reconfigured "
                "once loaded: call configure() once, before JAX starts")
        status = _configure(resolved, trace)
        _configured = (key, status)
    if required and not status.active:
        raise ConfigurationError(
            f"jaxlake.configure(required=True): {status.reason}")
    return status


def _option_mismatches(shim: _Shim, resolved: Mapping[str, Any]
                       ) -> List[str]:
    """The options whose value in the loaded shim differs from `resolved`,
    as 'name: shim has X, asked Y'."""
    have = shim.status().get("options", {})
    want = shim_environment(resolved, "", None)
    out: List[str] = []
    for name in LAKE_OPTIONS:
        var = _options._BY_NAME[name].env
        if name == "capacity":
            got = (int(have.get("capacity", 0)),
                   round(float(have.get("capacity_fraction", 0.0)), 6))
            asked = (0, round(float(want[FRACTION_ENV]), 6)) \
                if FRACTION_ENV in want else (int(want.get(var, 0)), 0.0)
            if got[1] and asked[1]:
                got = (0, got[1])  # with a fraction, the bytes do not count
            if got != asked:
                out.append(f"capacity: the shim has {got[0]} bytes / "
                           f"fraction {got[1]}, asked {asked[0]} bytes / "
                           f"fraction {asked[1]}")
            continue
        value = have.get(name)
        got_text = _env_value(value) if isinstance(value, (bool, int)) \
            else str(value)
        if got_text != want.get(var):
            out.append(f"{name}: the shim has {got_text}, asked "
                       f"{want.get(var)}")
    return out


def _restore_environ(saved: Mapping[str, Optional[str]]) -> None:
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def _configure(resolved: Dict[str, Any], trace: Optional[str]) -> Status:
    global _shim
    if jax_backends_initialised():
        raise ConfigurationError(
            "JAX has already initialised its backends, so the CUDA driver is "
            "open and XLA's allocator is fixed: call jaxlake.configure() "
            "before the first jax.devices() or JAX operation (import jax is "
            "fine), or start the program with `jaxlake run` or JAXLAKE=1")
    shim = _already_loaded_shim()
    if shim is not None:
        return _configure_loaded(shim, resolved, trace)
    real = loaded_drivers()
    if real:
        raise ConfigurationError(
            f"the CUDA driver ({real[0]}) is already loaded in this "
            "process, so XLA would not see jaxlake's hooks: call "
            "jaxlake.configure() before anything initialises CUDA, or "
            "start the program with `jaxlake run`")
    driver, why = find_real_driver()
    if driver is None:
        return Status(False, why, options=resolved)
    if not os.path.isfile(shim_path()):
        return Status(False, f"this build of jaxlake has no CUDA shim "
                      f"({shim_path()} is missing)", driver=driver,
                      options=resolved)
    # The shim reads these at its first call: set them first, and take them
    # back if the lake turns out inactive.
    # The trace starts once the lake is known to be active (below), so an
    # inactive one leaves no file behind.
    env = shim_environment(resolved, driver, None)
    saved = {var: os.environ.get(var) for var in [*env, FRACTION_ENV]}
    if FRACTION_ENV not in env:
        os.environ.pop(FRACTION_ENV, None)  # a parent's, not asked here
    os.environ.update(env)
    shim = _Shim(shim_path())
    _shim = shim
    version, problem = driver_version(shim)
    if not problem and not shim.active:
        problem = shim.reason() or "the shim is inactive"
    if problem:
        # Loaded, it stays (a library cannot be taken out safely); disabled,
        # it forwards every call, and nothing is left in the environment.
        shim.disable(problem)
        _restore_environ(saved)
        return Status(False, problem, driver=driver, shim=shim.path,
                      driver_version=version, options=resolved)
    if trace:
        rc = shim.trace_start(os.path.abspath(trace), None)
        if rc != 0:
            shim.disable(f"cannot write the trace to {trace}")
            _restore_environ(saved)
            raise OSError(-rc, f"cannot write the trace to {trace}")
    _set_allocator_env()
    return Status(True, "", driver=driver, shim=shim.path,
                  driver_version=version, options=resolved)


def _configure_loaded(shim: _Shim, resolved: Dict[str, Any],
                      trace: Optional[str]) -> Status:
    """configure() where the shim was loaded before it (`jaxlake run`,
    LD_PRELOAD): its options are fixed, so asking for others raises."""
    global _shim
    _shim = shim
    status = shim.status()
    driver = status.get("real_libcuda") or None
    mismatches = _option_mismatches(shim, resolved)
    if mismatches:
        raise ConfigurationError(
            "jaxlake's shim was loaded before configure() (by `jaxlake run` "
            "or LD_PRELOAD) and read its options then; they cannot change "
            "now: " + "; ".join(mismatches) + ". Give the options to the "
            "command instead (JAXLAKE_<OPTION> variables or --jaxlake_<option>"
            " entries in XLA_FLAGS)")
    version, problem = driver_version(shim)
    if not problem and not shim.active:
        problem = shim.reason() or "the shim is inactive"
    if problem:
        return Status(False, problem, driver=driver, shim=shim.path,
                      driver_version=version, options=resolved)
    if trace:
        rc = shim.trace_start(os.path.abspath(trace), None)
        if rc != 0:
            raise OSError(-rc, f"cannot write the trace to {trace}")
    _set_allocator_env()
    return Status(True, "", driver=driver, shim=shim.path,
                  driver_version=version, options=resolved)


def truthy(value: Optional[str]) -> bool:
    """An environment-style boolean: 1/true/on/yes (any case)."""
    return (value or "").strip().lower() in ("1", "true", "on", "yes")


def shim_environment(resolved: Mapping[str, Any], driver: str,
                     trace: Optional[str]) -> Dict[str, str]:
    """The variables the shim reads when it loads (cc/shim/options.h):
    every option as plain bytes, counts or 0/1; a capacity fraction as
    JAXLAKE_CAPACITY_FRACTION (the shim applies it to each device)."""
    env = {REAL_DRIVER_ENV: driver}
    for name, value in resolved.items():
        var = _options._BY_NAME[name].env
        if name == "capacity" and isinstance(value, float):
            # The shim reads the fraction (and then ignores JAXLAKE_CAPACITY,
            # which stays readable for a child's own configure()).
            env[FRACTION_ENV] = repr(value)
            env[var] = repr(value)
        elif value is not None:  # capacity None: XLA's memory fraction
            env[var] = _env_value(value)
    if trace:
        env[TRACE_ENV] = os.path.abspath(trace)
    return env


def _set_allocator_env() -> None:
    """XLA's cuda_async allocator is the one the shim serves."""
    allocator = os.environ.get(ALLOCATOR_ENV)
    if allocator not in (None, "", "cuda_async"):
        warnings.warn(
            f"{ALLOCATOR_ENV}={allocator} is replaced by cuda_async: jaxlake "
            "serves XLA's cuda_async allocator, and with any other allocator "
            "XLA's buffers would bypass the lake", stacklevel=4)
    os.environ[ALLOCATOR_ENV] = "cuda_async"
    prealloc = os.environ.get(PREALLOCATE_ENV)
    if prealloc is not None and prealloc.strip().lower() not in (
            "false", "0", "no", "off"):
        warnings.warn(
            f"{PREALLOCATE_ENV}={prealloc} is replaced by false: "
            "preallocation would hand the whole device to the lake in one "
            "block at start", stacklevel=4)
    os.environ[PREALLOCATE_ENV] = "false"


# -- reporting ------------------------------------------------------------------


def _loaded_shim() -> Optional[_Shim]:
    global _shim
    if _shim is None:
        _shim = _already_loaded_shim()
    return _shim


def status() -> Status:
    """The lake's status in this process (configured or not). The reason
    of an active one names what the shim found since: a device that could
    not have a lake (no VMM support, ...) and stays with the driver."""
    if _configured is not None:
        configured = _configured[1]
        shim = _loaded_shim()
        if configured.active and shim is not None and shim.reason():
            return dataclasses.replace(configured, reason=shim.reason())
        return configured
    shim = _loaded_shim()
    if shim is None:
        return Status(False, "jaxlake.configure() was not called and the "
                      "shim is not loaded")
    return Status(shim.active, shim.reason(), shim=shim.path)


def devices() -> List[int]:
    """Ordinals of the devices whose allocations the lake serves."""
    shim = _loaded_shim()
    return shim.devices() if shim is not None else []


def stats(device: Optional[int] = None) -> Stats:
    """Statistics of the lake of `device` (default: the first one that
    served an allocation).

    Note: `jax.Device.memory_stats()` under the cuda_async allocator is
    XLA's own bookkeeping of what it requested; reserved bytes and
    fragmentation are only here.
    """
    shim = _loaded_shim()
    if shim is None:
        raise ConfigurationError(
            f"no lake in this process: {status().reason}")
    ordinals = shim.devices()
    if device is None:
        if not ordinals:
            raise ConfigurationError(
                "the lake has served no allocation yet (no device has a "
                "lake); run a JAX operation on the GPU first")
        device = ordinals[0]
    raw = shim.stats(int(device))
    if raw is None:
        raise ConfigurationError(
            f"device {device} has no lake; devices with one: {ordinals}")
    gauges = {name: (g["current"], g["peak"])
              for name, g in raw["gauges"].items()}
    return Stats.from_core({"gauges": gauges, "counters": raw["counters"],
                            "driver_calls": raw["driver_calls"]})


def hook_counts() -> Dict[str, Dict[str, int]]:
    """Calls of the hooked driver entry points (served/forwarded/failed)."""
    shim = _loaded_shim()
    return shim.hooks() if shim is not None else {}


def empty_cache(device: Optional[int] = None) -> int:
    """Releases cached memory of one lake (or all); returns bytes."""
    shim = _loaded_shim()
    if shim is None:
        return 0
    return max(0, shim.empty_cache(-1 if device is None else int(device)))


def memory_report() -> str:
    """A table of each lake's figures, for people."""
    st = status()
    shim = _loaded_shim()
    if shim is None or not (st.active or shim.active):
        return f"jaxlake: lake inactive: {short_reason(st.reason)}"
    rows = []
    for device in shim.devices():
        s = stats(device)
        rows.append((device, s))
    if not rows:
        return "jaxlake: lake active, no allocation served yet"
    from jaxlake._src.table import format_table
    size = _options.format_bytes
    header = ("device", "in use", "peak", "reserved", "peak reserved",
              "util", "stitched", "reused", "grown", "OOM", "maps")
    table = [(str(device), size(s.bytes_in_use), size(s.bytes_in_use_peak),
              size(s.bytes_reserved), size(s.bytes_reserved_peak),
              f"{s.utilisation:.3f}", str(s.alloc_stitch + s.alloc_stitch_grow),
              str(s.alloc_stitch_reuse), str(s.alloc_grow), str(s.ooms),
              str(s.driver_calls.get("map", 0)))
             for device, s in rows]
    return ("jaxlake memory report (physical bytes; stitched ranges add "
            "none)\n" + format_table(table, header))


@contextlib.contextmanager
def trace(path: str, name: Optional[str] = None) -> Iterator[str]:
    """Writes the lake's allocation trace (JSON lines, docs/traces.md) to
    `path` while the block runs."""
    shim = _loaded_shim()
    if shim is None or not shim.active:
        raise ConfigurationError(
            f"jaxlake.trace() needs an active lake: {status().reason}")
    rc = shim.trace_start(os.path.abspath(path), name)
    if rc != 0:
        raise OSError(-rc, f"cannot write the trace to {path}")
    try:
        yield path
    finally:
        shim.trace_stop()
