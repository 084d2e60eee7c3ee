"""The jaxlake command: `python -m jaxlake demo` and `jaxlake options`."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import List

import jaxlake


def run(args: List[str], cwd: pathlib.Path) -> "subprocess.CompletedProcess[str]":
    # cwd is a temporary folder: `python -m` puts the working folder on
    # sys.path, and the source tree's jaxlake/ has no compiled module.
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAKE_")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_demo_shows_stitching(tmp_path: pathlib.Path) -> None:
    result = run([sys.executable, "-m", "jaxlake", "demo"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "stitch" in out and "all facts hold" in out
    assert "FAIL" not in out


def test_demo_ignores_the_environment(tmp_path: pathlib.Path) -> None:
    env = dict(os.environ, JAXLAKE_STITCH="0", JAXLAKE_SMALL_LIMIT="0")
    result = subprocess.run([sys.executable, "-m", "jaxlake", "demo"],
                            cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_options_lists_the_table(tmp_path: pathlib.Path) -> None:
    result = run([sys.executable, "-m", "jaxlake", "options"], tmp_path)
    assert result.returncode == 0, result.stderr
    for option in jaxlake.option_table():
        assert option.name in result.stdout
        assert option.env in result.stdout


def test_console_script(tmp_path: pathlib.Path) -> None:
    script = pathlib.Path(sys.executable).parent / "jaxlake"
    if not script.exists():  # not installed into this interpreter's bin/
        script = pathlib.Path(sys.executable)
        args = [str(script), "-m", "jaxlake", "--help"]
    else:
        args = [str(script), "--help"]
    result = run(args, tmp_path)
    assert result.returncode == 0
    assert "demo" in result.stdout and "options" in result.stdout


def test_no_command_prints_help(tmp_path: pathlib.Path) -> None:
    result = run([sys.executable, "-m", "jaxlake"], tmp_path)
    assert result.returncode == 2
    assert "demo" in result.stdout
