"""What the tests of the examples share: the skip when their packages are
missing, a CPU environment for their subprocesses, and a run that fails the
test with the example's output."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

_NEEDS = ("the examples need jax, flax, optax and orbax-checkpoint "
          "(pip install 'jaxlake[examples]', on Python 3.11 and newer)")


def require_examples() -> None:
    """Skips the calling test module when a package the examples need is
    missing. Found, not imported: the examples run in subprocesses, and
    importing jax here would fix its platform choice for other modules."""
    for module in ("jax", "flax", "optax", "orbax"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is missing: {_NEEDS}",
                        allow_module_level=True)


def cpu_env() -> Dict[str, str]:
    """This process's environment, for an example on the CPU."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_example(script: str, *args: str, timeout: float, ok: bool = True
                ) -> subprocess.CompletedProcess:
    """Runs examples/`script` with `args` on the CPU; with `ok`, fails the
    test with its output unless it exits 0."""
    cmd = [sys.executable, str(EXAMPLES / script), *args]
    done = subprocess.run(cmd, env=cpu_env(), capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))
    if ok and done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def example_help(module: str, timeout: float) -> Tuple[str, str]:
    """The --help text of examples/`module`.py's parser(), and one line per
    option (its flags and help), from one subprocess."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            f"import {module} as m; p = m.parser(); "
            "print(p.format_help()); print('-- options --'); "
            "print('\\n'.join(f'{a.option_strings} {a.help}' for a in "
            "p._actions if a.dest != 'help'))")
    out = subprocess.run([sys.executable, "-c", code, str(EXAMPLES)],
                         env=cpu_env(), capture_output=True, text=True,
                         timeout=timeout, check=True).stdout
    help_text, options = out.split("-- options --")
    return help_text, options
