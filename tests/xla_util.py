"""What the XLA integration's test files (tests/test_xla*.py) share: a
fresh interpreter per scenario (run_python), and the skip conditions."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Dict, Optional

import pytest

from jaxlake._src.xla import integration as xla

#: Why the XLA tests skip without jax (pytest.importorskip's reason).
NO_JAX = ("the integration tests start JAX on the CPU: pip install '.[test]' "
          "brings it on Python 3.11 and newer (no jax 0.10 before)")

HAS_DRIVER = xla.find_real_driver()[0] is not None
REPO = pathlib.Path(__file__).resolve().parents[1]
NEEDS_SHIM = pytest.mark.skipif(
    not os.path.isfile(xla.shim_path()),
    reason="this build of jaxlake has no CUDA shim (x86-64 Linux only)")


def run_python(code: str, env: Optional[Dict[str, str]] = None,
               timeout: int = 180) -> "subprocess.CompletedProcess[str]":
    """Runs `code` in a fresh interpreter with `env` added."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("JAXLAKE") and k != "XLA_FLAGS"}
    full["JAX_PLATFORMS"] = "cpu"
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          env=full, capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def plugin_library() -> pathlib.Path:
    """xla_cuda_plugin.so of the installed CUDA plugin (the test extra
    brings jax-cuda12-pjrt at jaxlib's version)."""
    from jaxlake._src.xla import plugin
    path = plugin.plugin_library()
    if path is None:
        pytest.skip("no jax CUDA plugin is installed (the test extra "
                    "brings it on Python 3.11 or newer)")
    return pathlib.Path(path)
