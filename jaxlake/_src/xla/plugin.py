"""What the installed JAX CUDA plugin accepts, read from its binary, and the
versions of jax, jaxlib and the plugin against the range jaxlake was tested
with.

XLA's flags and the values of its CommandBufferUpdateMode enum are compiled
into xla_cuda_plugin.so: the flag names as strings, the enum as a serialized
protobuf descriptor (an EnumDescriptorProto: field 1 its name, field 2 each
value, itself field 1 a name and field 2 a number). Reading them from the
installed plugin keeps the doctor's and configure()'s checks true for
whichever jax release is installed (0.10 has NEVER_UPDATE and
CAPTURE_CMD_NEVER_UPDATE; 0.11 and 0.12 SKIP_TEMP and SKIP_PROFILED).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import mmap
import os
import re
from importlib import metadata
from typing import Dict, FrozenSet, List, Mapping, Optional, Tuple

#: The lowest and the newest jax (and jaxlib and plugin) release tested, and
#: the first release the extras leave out (pyproject.toml says how).
TESTED_JAX = ("0.10.0", "0.12.0.1")
UNTESTED_FROM = (0, 13)

#: Update modes known when no plugin is installed to read them from: jax
#: 0.11 and 0.12 (jax 0.10 had ALWAYS_UPDATE, NEVER_UPDATE and
#: CAPTURE_CMD_NEVER_UPDATE).
DEFAULT_UPDATE_MODES = ("ALWAYS_UPDATE", "SKIP_TEMP", "SKIP_PROFILED")

#: What routing allocations to XLA's own VMM allocator costs against the
#: lake. The measured figures live in docs/results/suite.md (the
#: xla-vmm policy of `jaxlake bench`); keep this text in step with that table.
VMM_ALLOCATOR_COST = (
    "XLA's VMM allocator gives every buffer its own physical allocation "
    "rounded up to the allocation granularity, reuses freed memory only for "
    "a request of exactly the same rounded size, and makes driver calls for "
    "every allocation without such a match. Over jaxlake's 21 bundled "
    "traces (jaxlake bench, docs/benchmarks.md), the smallest device that "
    "runs each trace is on geometric mean 0.608 used by XLA's VMM allocator "
    "against 0.989 by the lake (U_fit), with 9,217 driver calls against "
    "1,401; it comes close only on programs of a few large buffers")

#: XLA settings that send device allocations around the lake: flag, the
#: values that do, and where the allocations go instead.
ROUTING_FLAGS: Tuple[Tuple[str, Tuple[str, ...], str], ...] = (
    ("xla_gpu_temp_buffer_use_separate_color", ("true", "1"),
     "temporaries go to a second cuda_async allocator with a pool of its "
     "own, which the lake does not serve"),
    ("xla_gpu_enable_nccl_user_buffers", ("true", "1"),
     "collective buffers are allocated by NCCL (ncclMemAlloc), outside the "
     "lake"),
    ("xla_gpu_experimental_enable_nccl_symmetric_buffers", ("true", "1"),
     "symmetric collective buffers are allocated and registered by NCCL, "
     "outside the lake"),
)
UPDATE_MODE_FLAG = "xla_gpu_command_buffer_update_mode"

#: The distributions whose versions must agree.
DISTRIBUTIONS = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt",
                 "jax-cuda13-plugin", "jax-cuda13-pjrt")

_FLAG = re.compile(rb"\x00(xla_[a-z0-9_]+)\x00")


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """What one xla_cuda_plugin.so accepts."""

    path: str
    flags: FrozenSet[str]
    update_modes: Tuple[str, ...]


def plugin_library() -> Optional[str]:
    """Path of the installed CUDA plugin's xla_cuda_plugin.so (CUDA 12
    first), found without importing it, or None."""
    for major in ("12", "13"):
        try:
            spec = importlib.util.find_spec(f"jax_plugins.xla_cuda{major}")
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin:
            continue
        path = os.path.join(os.path.dirname(spec.origin),
                            "xla_cuda_plugin.so")
        if os.path.isfile(path):
            return path
    return None


def _varint(data: bytes, at: int) -> Tuple[int, int]:
    value, shift = 0, 0
    while at < len(data):
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    raise ValueError("truncated varint")


def enum_values(data: bytes, name: str) -> Tuple[str, ...]:
    """The value names of the protobuf enum `name` whose descriptor is
    serialized in `data` (empty when it is not there)."""
    key = b"\n" + bytes([len(name)]) + name.encode()
    at = data.find(key)
    if at < 0:
        return ()
    at += len(key)
    values: List[str] = []
    while at < len(data) and data[at] == 0x12:  # field 2: an enum value
        length, at = _varint(data, at + 1)
        value, at = data[at:at + length], at + length
        if len(value) < 2 or value[0] != 0x0A:
            break
        size, start = _varint(value, 1)
        values.append(value[start:start + size].decode("ascii", "replace"))
    return tuple(values)


_CACHE: Dict[Tuple[str, int, int], PluginInfo] = {}


def read_plugin(path: str) -> PluginInfo:
    """The flags and update modes of a plugin library (cached by path, size
    and modification time; the library is mapped, not read into memory)."""
    st = os.stat(path)
    key = (path, st.st_size, int(st.st_mtime))
    if key not in _CACHE:
        with open(path, "rb") as f, \
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            flags = frozenset(m.group(1).decode()
                              for m in _FLAG.finditer(data))
            at = data.find(b"\n\x17CommandBufferUpdateMode")
            window = bytes(data[at:at + 4096]) if at >= 0 else b""
        _CACHE[key] = PluginInfo(path, flags,
                                 enum_values(window, "CommandBufferUpdateMode"))
    return _CACHE[key]


def installed_plugin() -> Optional[PluginInfo]:
    """The installed plugin's flags and update modes, or None."""
    path = plugin_library()
    return None if path is None else read_plugin(path)


def update_modes(info: Optional[PluginInfo] = None) -> Tuple[str, ...]:
    """The installed plugin's CommandBufferUpdateMode values, or
    DEFAULT_UPDATE_MODES without a plugin."""
    info = installed_plugin() if info is None else info
    return info.update_modes if info and info.update_modes \
        else DEFAULT_UPDATE_MODES


def installed_versions() -> Dict[str, Optional[str]]:
    """Versions of jax, jaxlib and the CUDA plugins (None: not installed)."""
    out: Dict[str, Optional[str]] = {}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _release(version: str) -> Tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def plugin_command(versions: Mapping[str, Optional[str]]) -> Optional[str]:
    """The pip command that installs the CUDA plugin and PJRT at the
    installed jaxlib's version (CUDA 13 when a CUDA 13 plugin is there),
    or None without jaxlib."""
    jaxlib = versions.get("jaxlib")
    if not jaxlib:
        return None
    major = "13" if versions.get("jax-cuda13-plugin") or \
        versions.get("jax-cuda13-pjrt") else "12"
    return (f"pip install 'jax-cuda{major}-plugin=={jaxlib}' "
            f"'jax-cuda{major}-pjrt=={jaxlib}'")


def version_warnings(versions: Optional[Mapping[str, Optional[str]]] = None
                     ) -> List[str]:
    """Where jax, jaxlib and the CUDA plugins disagree, or lie outside the
    tested range: one sentence each (warnings, not errors)."""
    v = installed_versions() if versions is None else versions
    out: List[str] = []
    jax, jaxlib = v.get("jax"), v.get("jaxlib")
    if jax and jaxlib and jax != jaxlib:
        out.append(f"jax {jax} with jaxlib {jaxlib}: they should be the "
                   "same release")
    for major in ("12", "13"):
        found = [(d, v.get(d)) for d in (f"jax-cuda{major}-plugin",
                                         f"jax-cuda{major}-pjrt")]
        if jaxlib and any(ver for _, ver in found) and \
                any(ver != jaxlib for _, ver in found):
            have = ", ".join(f"{d} {ver or 'missing'}" for d, ver in found)
            out.append(f"{have} with jaxlib {jaxlib}: JAX does not load a "
                       "plugin of another version; "
                       f"{plugin_command(v)} matches it")
    low, high = _release(TESTED_JAX[0]), _release(TESTED_JAX[1])
    for dist in ("jax", "jaxlib"):
        ver = v.get(dist)
        if ver and (_release(ver) < low or
                    _release(ver)[:2] >= UNTESTED_FROM):
            out.append(f"{dist} {ver} is outside the range jaxlake was "
                       f"tested with ({TESTED_JAX[0]} to "
                       f"{'.'.join(map(str, high[:2]))}.x)")
    return out


def routing_warnings(environ: Mapping[str, str],
                     flags: Mapping[str, str],
                     info: Optional[PluginInfo] = None,
                     allocator_env: str = "XLA_PYTHON_CLIENT_ALLOCATOR",
                     preallocate_env: str = "XLA_PYTHON_CLIENT_PREALLOCATE"
                     ) -> List[str]:
    """Every setting of `environ` and of the XLA flags `flags` ({name:
    value}) that routes allocations around the lake, each checked against
    the installed plugin's flags and update modes."""
    if info is None and any(
            f in flags for f in (UPDATE_MODE_FLAG,
                                 *(r[0] for r in ROUTING_FLAGS))):
        info = installed_plugin()
    out: List[str] = []

    def unknown(name: str) -> bool:
        if info is not None and name not in info.flags:
            out.append(f"XLA_FLAGS sets {name}, which the installed CUDA "
                       f"plugin ({info.path}) does not know: XLA refuses "
                       "unknown flags")
            return True
        return False

    if UPDATE_MODE_FLAG in flags and not unknown(UPDATE_MODE_FLAG):
        value = flags[UPDATE_MODE_FLAG]
        modes = update_modes(info)
        if value not in modes:
            out.append(f"XLA_FLAGS sets {UPDATE_MODE_FLAG}={value}, which is "
                       f"not one of XLA's values ({', '.join(modes)})")
        elif value != "ALWAYS_UPDATE":
            out.append(f"XLA_FLAGS sets {UPDATE_MODE_FLAG}={value}: XLA then "
                       "switches every allocator kind to its own VMM "
                       "allocator, bypassing the lake (use ALWAYS_UPDATE, "
                       f"the default). {VMM_ALLOCATOR_COST}")
    for name, values, where in ROUTING_FLAGS:
        if name in flags and not unknown(name) and \
                flags[name].strip().lower() in values:
            out.append(f"XLA_FLAGS sets {name}={flags[name]}: {where}")
    allocator = environ.get(allocator_env)
    if allocator == "vmm":
        out.append(f"{allocator_env}=vmm: XLA uses its own VMM allocator "
                   f"instead of the lake. {VMM_ALLOCATOR_COST}")
    elif allocator not in (None, "", "cuda_async"):
        out.append(f"{allocator_env}={allocator}: jaxlake serves only "
                   "cuda_async (configure() and `jaxlake run` set it)")
    prealloc = environ.get(preallocate_env)
    if prealloc is not None and prealloc.strip().lower() not in (
            "0", "false", "no", "off"):
        out.append(f"{preallocate_env}={prealloc}: preallocation hands the "
                   "whole device to the lake in one block at start "
                   "(configure() and `jaxlake run` set it to false; "
                   "JAXLAKE_PREALLOCATE=1 makes the lake take its capacity "
                   "at its first allocation instead)")
    return out
