"""The device-less CUDA compile of the recorder: GPU target configs, JAX's
CUDA plugin (present, and at jaxlib's version), compile-only devices, and
the XLA dump flags of the per-tensor variant (jaxlake/_src/trace/recorder.py
describes how they serve a trace)."""

from __future__ import annotations

import glob
import os
import tempfile
from typing import Any, Dict, List, Optional, Tuple

from jaxlake._src.errors import JaxlakeError
from jaxlake._src.quiet import quiet_cuda_stub


#: Bundled GPU target configs, by name (jaxlake/_src/trace/data/NAME.txtpb).
DEFAULT_TARGET = "h100_sxm"
_DATA = os.path.join(os.path.dirname(__file__), "data")
class RecorderError(JaxlakeError, RuntimeError):
    """The recorder cannot do what was asked (missing plugin, bad mesh...)."""


def target_names() -> List[str]:
    """Names of the bundled GPU target configs."""
    return sorted(os.path.basename(p)[:-len(".txtpb")]
                  for p in glob.glob(os.path.join(_DATA, "*.txtpb")))


def target_config(target: str = DEFAULT_TARGET) -> str:
    """The text of a GPU target config: a bundled name or a file path."""
    if os.path.sep in target or target.endswith(".txtpb"):
        path = target
    else:
        path = os.path.join(_DATA, target + ".txtpb")
        if not os.path.exists(path):
            raise RecorderError(
                f"unknown GPU target {target!r}: bundled targets are "
                f"{', '.join(target_names())}, or pass the path of a "
                ".txtpb GPU target config")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise RecorderError(f"cannot read GPU target config {path}: "
                            f"{e.strerror or e}") from None


_TOPOLOGIES: Dict[Tuple[str, int], List[Any]] = {}


#: What `pip install 'jaxlake[record]'` brings: the CUDA plugin and PJRT
#: at jaxlib's version (either CUDA major version serves).
PLUGINS = (("jax-cuda12-plugin", "jax-cuda12-pjrt"),
           ("jax-cuda13-plugin", "jax-cuda13-pjrt"))


def plugin_problem() -> Optional[str]:
    """Why device-less CUDA compilation cannot work in this environment
    (a plugin package missing, or not at jaxlib's version), or None."""
    from importlib import metadata

    def version(dist: str) -> Optional[str]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    jaxlib = version("jaxlib")
    if jaxlib is None:
        return "jaxlib is not installed"
    found = [(names, [version(n) for n in names]) for names in PLUGINS]
    for names, versions in found:
        if all(v == jaxlib for v in versions):
            return None
    for names, versions in found:
        if any(versions):
            return ", ".join(f"{n} {v or 'missing'}"
                             for n, v in zip(names, versions)) + \
                f" with jaxlib {jaxlib}: they must be jaxlib's version"
    return "the CUDA plugin (jax-cuda12-plugin, jax-cuda12-pjrt) is not " \
        "installed"


def install_advice() -> str:
    """The exact pip command that brings the CUDA plugin and PJRT at the
    installed jaxlib's version, and the extra that does the same."""
    from jaxlake._src.xla import plugin
    command = plugin.plugin_command(plugin.installed_versions())
    extra = "pip install 'jaxlake[record]' (or 'jaxlake[record-cuda13]')"
    if command is None:
        return extra
    return f"{command}, as the installed jaxlib needs (or {extra})"


def gpu_devices(count: int, target: str = DEFAULT_TARGET) -> List[Any]:
    """`count` compile-only CUDA devices for `target` (cached)."""
    key = (target, count)
    if key not in _TOPOLOGIES:
        problem = plugin_problem()
        if problem is not None:
            raise RecorderError(
                f"the recorder compiles for the GPU without one, through "
                f"JAX's CUDA plugin, and {problem}: {install_advice()} (no "
                "GPU or NVIDIA library needed)")
        from jax.experimental import topologies
        spec = target_config(target)
        try:
            with quiet_cuda_stub():  # the plugin's "no driver" lines
                topo = topologies.get_topology_desc(
                    platform="cuda", topology_name="", target_config=spec,
                    topology=f"1x1x{count}")
        except Exception as e:  # the plugin missing, or refusing
            raise RecorderError(
                "device-less CUDA compilation is not available: "
                f"{type(e).__name__}: {e}. The recorder needs "
                "jax-cuda12-plugin and jax-cuda12-pjrt of the same version "
                f"as jaxlib: {install_advice()}; no GPU or "
                "driver is needed, but without one JAX_PLATFORMS=cpu (or "
                "jax.config.update('jax_platforms', 'cpu')) must be set "
                "before jax starts, or the CUDA plugin fails its driver "
                "check and is not loaded") from None
        _TOPOLOGIES[key] = list(topo.devices)
    return _TOPOLOGIES[key]


_DUMP_DIR: Optional[str] = None


def enable_per_tensor_dumps() -> str:
    """Turns on the XLA dumps that the per-tensor variant reads; returns
    their folder. Call it before the first jax operation (making a mesh
    counts) when the Recorder itself is made later."""
    return _enable_dumps()


def _enable_dumps() -> str:
    """Adds XLA dump flags for the per-tensor variant; returns the folder.
    Must run before jax creates its first backend (XLA reads XLA_FLAGS
    once)."""
    import sys
    global _DUMP_DIR
    if _DUMP_DIR is not None and os.path.isdir(_DUMP_DIR):
        return _DUMP_DIR
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and bridge.backends_are_initialized():
        raise RecorderError(
            "the per-tensor variant needs XLA's buffer-assignment dumps, and "
            "XLA reads XLA_FLAGS only once, when jax starts its first "
            "backend: create Recorder(per_tensor=True), or call "
            "jaxlake.enable_per_tensor_dumps(), before the first jax "
            "operation")
    folder = tempfile.mkdtemp(prefix="jaxlake-dump-")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_dump_to={folder} --xla_dump_hlo_as_text "
        "--xla_dump_large_constants=false").strip()
    _DUMP_DIR = folder
    return folder


__all__ = ["DEFAULT_TARGET", "PLUGINS", "RecorderError",
           "enable_per_tensor_dumps", "gpu_devices", "plugin_problem",
           "target_config", "target_names"]
