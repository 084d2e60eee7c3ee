"""`jax.Device.memory_stats()` under the lake.

Under what the lake needs (XLA's `cuda_async` allocator, preallocation
off), XLA's `memory_stats()` is its own bookkeeping of what it requested:
`bytes_limit` is 0 (the preallocated size, of which there is none) and the
reserved figures are 0, so a program that divides by `bytes_limit` (as
MaxText's memory report does) fails. When the lake is active, configure()
replaces the method on jaxlib's Device class with one that takes XLA's
figures and puts the lake's in, under the keys JAX's default allocator
(BFC, preallocated) reports:

    bytes_limit                  the lake's capacity on that device
    bytes_in_use                 bytes requested by live allocations (lake)
    peak_bytes_in_use            its peak (lake)
    bytes_reserved, pool_bytes   physical bytes the lake holds
    peak_bytes_reserved,         their peak
      peak_pool_bytes
    largest_free_block_bytes     the largest request the lake can serve
                                 from the memory it holds: every free chunk
                                 with stitching on (and no max_pieces),
                                 else its largest run of free chunks
    num_allocs,                  XLA's own (its count of requests, and the
      largest_alloc_size         largest one), which the lake does not keep

Any other key XLA reports is passed on as XLA computed it. A device
without a lake (not a CUDA device, a device the shim refused, an inactive
lake) keeps XLA's figures as they are.

The class is found wherever the installed jax keeps it (jax 0.10 to 0.12:
`jax._src.lib.xla_client.Device`, which is `jax.Device`); when jax is not
imported yet, a finder on sys.meta_path patches it as soon as jax has
loaded it, and then leaves.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Any, Callable, Dict, Mapping, Optional

#: An attribute set on the patched class, holding XLA's own method.
ORIGINAL_ATTR = "_jaxlake_xla_memory_stats"

_lock = threading.Lock()
_finder: Optional["_Finder"] = None
#: The shim of this process, or None (set by install(); until then the
#: patched method keeps XLA's figures).
_shim_of: Callable[[], Any] = lambda: None


def lake_memory_stats(xla: Optional[Mapping[str, Any]],
                      lake: Mapping[str, Any],
                      stitch_everything: bool = True) -> Dict[str, Any]:
    """XLA's memory_stats() dict with the lake's figures put in (the keys
    of the module's docstring). `lake` is the shim's statistics of the
    device (jaxlake_shim_stats_json); `stitch_everything`: whether a
    request may be stitched from every free chunk (stitching on, no
    max_pieces)."""
    out: Dict[str, Any] = dict(xla or {})
    gauges = lake["gauges"]
    in_use = gauges["bytes_in_use"]
    reserved = gauges["bytes_reserved"]
    free = lake.get("free", {})
    out.update({
        "bytes_limit": int(lake["capacity"]),
        "bytes_in_use": int(in_use["current"]),
        "peak_bytes_in_use": int(in_use["peak"]),
        "bytes_reserved": int(reserved["current"]),
        "peak_bytes_reserved": int(reserved["peak"]),
        "pool_bytes": int(reserved["current"]),
        "peak_pool_bytes": int(reserved["peak"]),
        "largest_free_block_bytes": int(
            free.get("bytes", 0) if stitch_everything
            else free.get("largest_block", 0)),
    })
    out.setdefault("num_allocs", int(lake["counters"].get("allocs", 0)))
    out.setdefault("largest_alloc_size", 0)
    return out


def _device_figures(device: Any, xla: Any) -> Any:
    """What the patched memory_stats() returns for `device`, given what
    XLA's own returned."""
    if xla is None or getattr(device, "platform", None) != "gpu":
        return xla
    shim = _shim_of()
    ordinal = getattr(device, "local_hardware_id", None)
    if shim is None or not shim.active or ordinal is None:
        return xla
    if not shim.open_lake(int(ordinal)):
        return xla
    raw = shim.stats(int(ordinal))
    if raw is None:
        return xla
    options = shim.status().get("options", {})
    everything = bool(options.get("stitch", True)) and \
        not int(options.get("max_pieces", 0))
    return lake_memory_stats(xla, raw, everything)


def patch_class(cls: Any) -> bool:
    """Replaces `cls.memory_stats` with the lake's (once). False when the
    class has no such method or cannot be changed."""
    if getattr(cls, ORIGINAL_ATTR, None) is not None:
        return True
    original = getattr(cls, "memory_stats", None)
    if original is None:
        return False

    def memory_stats(self: Any) -> Any:
        stats = original(self)
        try:
            return _device_figures(self, stats)
        except Exception:  # pylint: disable=broad-except
            return stats  # never worse than XLA's own figures

    memory_stats.__doc__ = (getattr(original, "__doc__", None) or "") + (
        "\n\nUnder jaxlake: the lake's figures (jaxlake/_src/xla/"
        "memstats.py).")
    memory_stats.__name__ = "memory_stats"
    try:
        setattr(cls, ORIGINAL_ATTR, original)
        setattr(cls, "memory_stats", memory_stats)
    except (AttributeError, TypeError):
        return False
    return True


def _device_class() -> Any:
    """jaxlib's Device class if jax has loaded it, else None."""
    lib = sys.modules.get("jax._src.lib")
    client = getattr(lib, "xla_client", None)
    if client is None:
        client = sys.modules.get("jaxlib.xla_client")
    return getattr(client, "Device", None)


class _Finder(importlib.abc.MetaPathFinder):
    """Imports nothing: at each import it looks whether jax has loaded its
    Device class yet, patches it, and leaves sys.meta_path."""

    def find_spec(self, name, path, target=None):  # type: ignore
        if name.startswith("jax"):
            _try_patch()
        return None


def _try_patch() -> bool:
    global _finder
    cls = _device_class()
    if cls is None:
        return False
    with _lock:
        done = patch_class(cls)
        if _finder is not None:
            try:
                sys.meta_path.remove(_finder)
            except ValueError:
                pass
            _finder = None
    return done


def install(shim_of: Callable[[], Any]) -> None:
    """Makes jax.Device.memory_stats() report the lake's figures (those of
    the shim that `shim_of()` returns, None when there is none): now if
    jax has loaded its Device class, else as soon as it does."""
    global _finder, _shim_of
    _shim_of = shim_of
    if _try_patch():
        return
    with _lock:
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)
