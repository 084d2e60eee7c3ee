"""jaxlake's hooks for the examples: configure() first, memory_report() last.

Imports nothing from jax: configure() must run before jax starts.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional


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
    (or None when disabled) after printing, in one line, why the lake is
    inactive. A bad option ends the program with a one-line error."""
    if not enabled:
        return None
    import jaxlake
    try:
        status = jaxlake.configure(**_options(option_pairs or []))
    except jaxlake.JaxlakeError as e:
        raise SystemExit(f"error: --jaxlake-option: {e}") from None
    if not status.active:
        # The reason's first clause; `jaxlake doctor` gives all of it.
        reason = str(status.reason).split(":")[0].strip()
        print(f"jaxlake: lake inactive: {reason} (--no-jaxlake hides "
              "this; `jaxlake doctor` says more)", flush=True)
    return status


def finish(status: Any, log_json: Optional[str] = None) -> None:
    """Prints jaxlake.memory_report() when the lake was active; with
    `log_json`, appends a summary record of device 0's memory: XLA's own
    memory_stats() and, with the lake, jaxlake.stats()."""
    active = status is not None and status.active
    if active:
        import jaxlake
        print(jaxlake.memory_report(), flush=True)
    if log_json:
        import jax
        record: Dict[str, Any] = {
            "summary": True, "lake": active,
            "memory_stats": jax.devices()[0].memory_stats()}
        if active:
            import jaxlake
            record["jaxlake"] = jaxlake.stats().as_dict()
        with open(log_json, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")
