"""jaxlake's hooks for the examples: configure() first, memory_report() last.

This is the one place that copes with a jaxlake that has no configure() or
memory_report() yet (they come with the XLA integration): it reports the
lake inactive with the reason. When every supported jaxlake has them, the
getattr fallbacks below can go.

Imports nothing from jax: configure() must run before jax starts.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional


class _Inactive:
    active = False

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _options(pairs: List[str]) -> Dict[str, str]:
    options = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"error: --jaxlake-option {pair!r} is not "
                             "NAME=VALUE (see `jaxlake options`)")
        options[name.strip().replace("-", "_")] = value.strip()
    return options


def start(enabled: bool, option_pairs: Optional[List[str]] = None) -> Any:
    """Calls jaxlake.configure(**options) when `enabled`; returns its status
    (or None when disabled) after printing why the lake is inactive."""
    if not enabled:
        return None
    options = _options(option_pairs or [])
    try:
        import jaxlake
    except ImportError as e:
        status: Any = _Inactive(f"jaxlake is not installed ({e})")
    else:
        configure = getattr(jaxlake, "configure", None)
        if configure is None:
            status = _Inactive("this jaxlake has no configure() yet")
        else:
            status = configure(**options)
    if not getattr(status, "active", False):
        print(f"jaxlake: lake inactive: {getattr(status, 'reason', '?')}",
              flush=True)
    return status


def finish(status: Any) -> None:
    """Prints jaxlake.memory_report() when the lake was active."""
    if status is None or not getattr(status, "active", False):
        return
    import jaxlake
    report = getattr(jaxlake, "memory_report", None)
    if report is not None:
        print(report(), flush=True)
