"""Runs a Python program as `python PROGRAM ARGS...` would, then prints
each local device's memory_stats() (one line per device, prefixed
MEMORY_STATS, as JSON), also when the program fails. The program is run
unmodified (runpy, as __main__, its folder first on sys.path);
benchmarks/validate_models.py reads the lines for XLA's own peak in use.

    python benchmarks/memory_stats_run.py examples/train_lm.py --preset tiny
"""

from __future__ import annotations

import json
import os
import runpy
import sys


def _stats() -> None:
    jax = sys.modules.get("jax")
    if jax is None:
        return
    try:
        devices = jax.local_devices()
    except Exception:  # pylint: disable=broad-except
        return  # no backend: nothing to report
    for device in devices:
        try:
            stats = device.memory_stats()
        except Exception:  # pylint: disable=broad-except
            stats = None
        print("MEMORY_STATS " + json.dumps(
            {"device": str(device), "stats": stats}), flush=True)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: memory_stats_run.py PROGRAM [ARGS...]")
    program = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    try:
        runpy.run_path(program, run_name="__main__")
    finally:
        _stats()


if __name__ == "__main__":
    main()
