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
memory) when given; else XLA's own memory fraction, XLA_CLIENT_MEM_FRACTION
or its deprecated spelling XLA_PYTHON_CLIENT_MEM_FRACTION when set (jaxlib
refuses the two together, and so does jaxlake); each of these is a hard
cap. With none of them, a lake that does not preallocate may hold the
device's whole memory: it grows on demand as far as the driver gives, as
XLA's cuda_async pool (which the lake serves) does, and gives its cached
memory back when another allocation of the process (cuBLAS/cuDNN
workspaces, NCCL, loaded modules, other pools) finds the device full. A
preallocating lake takes XLA's default, 0.75.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import threading
import warnings
from typing import (Any, Dict, Iterator, List, Mapping, MutableMapping,
                    Optional, Tuple)

from jaxlake._src import options as _options
from jaxlake._src.errors import ConfigurationError
from jaxlake._src.lake.stats import Stats
# The driver search, the shim and the device probe live in shim.py; their
# names are the integration's too (re-exported for its users).
from jaxlake._src.xla.shim import (
    CUDA_SUCCESS as CUDA_SUCCESS,
    DRIVER_DIRS as DRIVER_DIRS,
    MIN_DRIVER_VERSION as MIN_DRIVER_VERSION,
    REAL_DRIVER_ENV as REAL_DRIVER_ENV,
    VMM_ATTRIBUTE as VMM_ATTRIBUTE,
    Device as Device,
    _already_loaded_shim as _already_loaded_shim,
    _Shim as _Shim,
    driver_candidates as driver_candidates,
    driver_version as driver_version,
    find_real_driver as find_real_driver,
    jax_backends_initialised as jax_backends_initialised,
    loaded_drivers as loaded_drivers,
    probe_devices as probe_devices,
    shim_path as shim_path,
)

#: The options configure() takes (the lake's; granularity and device memory
#: belong to the real device).
LAKE_OPTIONS: Tuple[str, ...] = tuple(
    o.name for o in _options.OPTIONS if o.lake)

#: Environment variables of the integration that are not lake options.
ENABLE_ENV = "JAXLAKE"
TRACE_ENV = "JAXLAKE_TRACE_FILE"
HOOKS_ENV = "JAXLAKE_SHIM_HOOKS"
REQUIRED_ENV = "JAXLAKE_REQUIRED"
FRACTION_ENV = "JAXLAKE_CAPACITY_FRACTION"
assert all(v in _options.OTHER_VARIABLES for v in (
    REAL_DRIVER_ENV, TRACE_ENV, HOOKS_ENV, REQUIRED_ENV, FRACTION_ENV))

#: XLA's share of device memory, and its default (also the capacity of a
#: preallocating lake, see the module's docstring). jaxlib (0.10 to 0.12) reads
#: XLA_CLIENT_MEM_FRACTION, else the deprecated XLA_PYTHON_CLIENT_MEM_
#: FRACTION, and raises ValueError when both are set.
XLA_FRACTION_ENV = "XLA_CLIENT_MEM_FRACTION"
XLA_DEPRECATED_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
XLA_FRACTION_ENVS = (XLA_FRACTION_ENV, XLA_DEPRECATED_FRACTION_ENV)
XLA_DEFAULT_FRACTION = 0.75

#: XLA's compiler rematerialises a program to fit a memory limit it takes
#: from its allocator. Under JAX's default that is the slop factor (XLA's
#: default 95%) of the preallocated pool, 0.75 of the device; under
#: cuda_async without preallocation, the lake's setting, it was about 0.8
#: of the device times the slop factor (measured on the fake GPU with jax
#: 0.10.2: 194.6 MiB on a 256 MiB device, 733.2 MiB on 1 GiB with a factor
#: of 89; docs/results/fit.md, "Real runs"). So the lake sets the factor
#: that makes XLA compile for its capacity as JAX's default compiles for
#: its pool, unless the program's XLA_FLAGS set one.
SLOP_FLAG = "xla_gpu_memory_limit_slop_factor"
#: capacity_rule()'s source when no fraction or capacity is set and the
#: lake does not preallocate: the whole device, as under cuda_async.
WHOLE_DEVICE = "the device's whole memory (no capacity or fraction set)"
XLA_DEFAULT_SLOP = 95
NO_POOL_LIMIT_SHARE = 0.8

ALLOCATOR_ENV = "XLA_PYTHON_CLIENT_ALLOCATOR"
PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"
FLAG_PREFIX = "--jaxlake_"

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
    # An entry is text, as an environment variable is: checked as such, so
    # that its errors name the entry and what text it may hold.
    parsed = {name: _options.parse_text(name, value, f"--jaxlake_{name}")
              for name, value in flags.items()}
    merged: Dict[str, Any] = {**parsed, **{k: v for k, v in options.items()
                                           if v is not None}}
    resolved = _options.resolve_options(merged, environ)
    resolved = {k: v for k, v in resolved.items() if k in LAKE_OPTIONS}
    if trace is None:
        trace = environ.get(TRACE_ENV) or None
    return resolved, trace, required


def xla_fraction(environ: Optional[Mapping[str, str]] = None
                 ) -> Optional[Tuple[float, str]]:
    """XLA's memory fraction as the environment gives it, and the variable
    that gave it: XLA_CLIENT_MEM_FRACTION, else the deprecated
    XLA_PYTHON_CLIENT_MEM_FRACTION; None when neither is set (XLA then
    takes 0.75). ConfigurationError when both are set (jaxlib raises
    ValueError then) or the value is not a decimal fraction in (0, 1]."""
    env = os.environ if environ is None else environ
    given = {var: env.get(var, "").strip() for var in XLA_FRACTION_ENVS}
    if all(given.values()):
        raise ConfigurationError(
            f"{XLA_FRACTION_ENV}={given[XLA_FRACTION_ENV]!r} and "
            f"{XLA_DEPRECATED_FRACTION_ENV}="
            f"{given[XLA_DEPRECATED_FRACTION_ENV]!r} are both set: set only "
            f"{XLA_FRACTION_ENV} (jaxlib raises ValueError when both are "
            "set; the other spelling is deprecated)")
    for var in XLA_FRACTION_ENVS:
        text = given[var]
        if not text:
            continue
        try:
            fraction = float(text)
        except ValueError:
            fraction = -1.0
        if not 0.0 < fraction <= 1.0:
            raise ConfigurationError(
                f"{var}={text!r} is not a decimal fraction in (0, 1]")
        return fraction, var
    return None


def capacity_rule(resolved: Mapping[str, Any],
                  environ: Optional[Mapping[str, str]] = None
                  ) -> Tuple[Optional[int], float, str]:
    """(bytes, fraction, where it comes from) of the lake's capacity: the
    `capacity` option (bytes, or a fraction), else XLA's memory fraction
    (xla_fraction()), else the whole device (1.0, source WHOLE_DEVICE), or
    XLA's default 0.75 for a lake that preallocates. Exactly one of bytes
    and fraction is set (the other is None or 0.0). The shim applies the
    same rule (cc/shim/options.h)."""
    cap = resolved.get("capacity")
    if isinstance(cap, float):
        return None, cap, "the capacity option (a fraction)"
    if cap:
        return int(cap), 0.0, "the capacity option"
    given = xla_fraction(environ)
    if given is not None:
        return None, given[0], given[1]
    if resolved.get("preallocate"):
        return None, XLA_DEFAULT_FRACTION, (
            "XLA's default memory fraction (the lake preallocates)")
    return None, 1.0, WHOLE_DEVICE


def slop_factor(fraction: float) -> int:
    """The --xla_gpu_memory_limit_slop_factor under which XLA, over the
    lake, compiles for a capacity of `fraction` of the device as it
    compiles for JAX's default pool of that fraction."""
    return max(1, round(XLA_DEFAULT_SLOP * fraction / NO_POOL_LIMIT_SHARE))


def with_memory_limit(flags: str, resolved: Mapping[str, Any],
                      environ: Optional[Mapping[str, str]] = None) -> str:
    """`flags` (XLA_FLAGS) with the slop factor of slop_factor() for the
    lake's capacity added, unless they set one already, the capacity is
    a number of bytes (its share of the device is not known before CUDA
    starts), or it is the whole device by default (WHOLE_DEVICE: XLA then
    compiles as under cuda_async, whose room the lake takes)."""
    if f"--{SLOP_FLAG}" in flags:
        return flags
    nbytes, fraction, source = capacity_rule(resolved, environ)
    if nbytes is not None or source == WHOLE_DEVICE:
        return flags
    entry = f"--{SLOP_FLAG}={slop_factor(fraction)}"
    return f"{flags} {entry}" if flags.strip() else entry


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
    defaults to XLA's memory fraction when one is set, else the whole
    device, capacity_rule()); they win over `--jaxlake_<option>`
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
        capacity_rule(resolved)  # a bad or doubled XLA memory fraction
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
    if status.active:
        # jax.Device.memory_stats() then gives the lake's figures.
        from jaxlake._src.xla import memstats
        memstats.install(_loaded_shim)
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
    _set_allocator_env(resolved)
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
    _set_allocator_env(resolved)
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
        elif value is not None:  # capacity None: the rule of capacity_rule()
            env[var] = _env_value(value)
    if trace:
        env[TRACE_ENV] = os.path.abspath(trace)
    return env


def _set_allocator_env(resolved: Mapping[str, Any]) -> None:
    """XLA's cuda_async allocator is the one the shim serves; XLA compiles
    for the lake's capacity (with_memory_limit())."""
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
            "block at start (JAXLAKE_PREALLOCATE=1 makes the lake take its "
            "capacity at its first allocation instead)", stacklevel=4)
    os.environ[PREALLOCATE_ENV] = "false"
    os.environ["XLA_FLAGS"] = with_memory_limit(
        os.environ.get("XLA_FLAGS", ""), resolved)
    _warn_versions_and_routing()


def _warn_versions_and_routing() -> None:
    """Says when jax, jaxlib and the CUDA plugin disagree or lie outside
    the tested range, and names every XLA flag that routes allocations
    around the lake (checked against the installed plugin)."""
    from jaxlake._src.xla import plugin
    _, flags = _xla_flag_values(os.environ.get("XLA_FLAGS", ""))
    for text in plugin.version_warnings() + plugin.routing_warnings(
            {}, flags):
        warnings.warn(f"jaxlake: {text}", stacklevel=5)


def _xla_flag_values(value: str) -> Tuple[str, Dict[str, str]]:
    """(XLA_FLAGS without jaxlake's entries, {flag name: value} of the
    rest; a bare flag is "true")."""
    kept, _ = split_xla_flags(value)
    out: Dict[str, str] = {}
    for token in shlex.split(kept) if kept.strip() else []:
        name, eq, val = token.lstrip("-").partition("=")
        out[name] = val if eq else "true"
    return kept, out


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

    `jax.Device.memory_stats()` gives the lake's capacity, in-use and
    reserved figures too, under the keys of JAX's default allocator
    (jaxlake/_src/xla/memstats.py); utilisation and stitching are only
    here.
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
    """Calls of the hooked driver entry points (served/forwarded/failed,
    and for the allocating ones the memory given back under pressure:
    pressure/pressure_ok/pressure_bytes)."""
    shim = _loaded_shim()
    return shim.hooks() if shim is not None else {}


def empty_cache(device: Optional[int] = None) -> int:
    """Releases cached memory of one lake (or all); returns bytes."""
    shim = _loaded_shim()
    if shim is None:
        return 0
    return max(0, shim.empty_cache(-1 if device is None else int(device)))


def check(device: Optional[int] = None) -> None:
    """Checks the invariants of XLA's lakes (one device's, or all): raises
    InvariantError naming every problem found. Without an active lake there
    is nothing to check."""
    shim = _loaded_shim()
    if shim is None:
        return
    problems = shim.check(-1 if device is None else int(device))
    if problems:
        from jaxlake._src.errors import InvariantError
        raise InvariantError(problems.strip())


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
