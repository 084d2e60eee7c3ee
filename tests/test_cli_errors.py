"""The `jaxlake` command as a user meets it when something is wrong: damaged
input, a reader that goes away, a misspelt option, a lake that cannot be
active. Each runs the real command in a child process, and no case may end
in a Python traceback."""

from __future__ import annotations

import gzip
import importlib.util
import os
import pathlib
import random
import subprocess
import sys
import zlib
from typing import Dict, List, Optional

import pytest

from jaxlake._src.bench import suite as bench
from jaxlake._src.trace.tracefile import TraceWriter

MIB = 1 << 20


def jaxlake_cmd(args: List[str], cwd: pathlib.Path,
                env: Optional[Dict[str, str]] = None,
                stdout: Optional[int] = None,
                timeout: float = 300) -> "subprocess.CompletedProcess[str]":
    # cwd is a temporary folder: `python -m` puts it on sys.path, and the
    # source tree's jaxlake/ has no compiled module.
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("JAXLAKE")}
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "jaxlake"] + args, cwd=cwd,
                          env=base, stdout=subprocess.PIPE if stdout is None
                          else stdout, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def no_traceback(result: "subprocess.CompletedProcess[str]") -> None:
    text = (result.stdout or "") + result.stderr
    assert "Traceback" not in text, text
    assert "Exception ignored" not in text, text


def write_trace(path: pathlib.Path, events: int = 4000) -> pathlib.Path:
    with TraceWriter(path, "corrupt-me") as w:
        for i in range(events):
            w.alloc(i, MIB + 4096 * (i % 97))
            if i >= 8:
                w.free(i - 8)
    return path


def corrupt_gzip(path: pathlib.Path) -> pathlib.Path:
    """Bytes replaced mid-file so that gzip.decompress raises zlib.error
    (the raw traceback of the defect), not just a failed check."""
    data = path.read_bytes()
    rng = random.Random(7)
    for _ in range(1000):
        damaged = bytearray(data)
        start = rng.randrange(len(data) // 3, 2 * len(data) // 3)
        for i in range(start, start + 64):
            damaged[i] = rng.randrange(256)
        try:
            gzip.decompress(bytes(damaged))
        except zlib.error:
            path.write_bytes(bytes(damaged))
            return path
        except (OSError, EOFError):
            continue
    raise AssertionError("no damage found that zlib itself refuses")


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("corrupt")
    return corrupt_gzip(write_trace(folder / "bad.jsonl.gz"))


# -- defect: a corrupt gzip trace ------------------------------------------------


@pytest.mark.parametrize("args", [
    ["replay", "{t}"],
    ["replay", "{t}", "--lenient"],
    ["plot", "{t}", "-o", "{d}/p.png"],
    ["trace", "convert", "{t}", "{d}/out.csv"],
    ["trace", "info", "{t}"],
    ["view", "{t}", "-o", "{d}/v.html"],
    ["bench", "--suite", "{s}", "--no-plots", "--no-progress", "--out",
     "{d}/bench"],
], ids=lambda a: " ".join(a[:2]))
def test_corrupt_gzip_is_a_clear_error(
        args: List[str], corrupt: pathlib.Path,
        tmp_path: pathlib.Path) -> None:
    if args[0] == "view" and importlib.util.find_spec("plotly") is None:
        pytest.skip("plotly is not installed (the view extra brings it)")
    if args[0] == "plot" and importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    argv = [a.format(t=corrupt, d=tmp_path, s=corrupt.parent) for a in args]
    result = jaxlake_cmd(argv, tmp_path)
    no_traceback(result)
    if "--lenient" in argv:
        # What decompresses before the damage is read; the cut is reported.
        assert result.returncode == 0, result.stderr
        assert "skipped" in result.stdout and "events" in result.stdout
    else:
        assert result.returncode == 1, result.stdout + result.stderr
        assert "corrupt gzip data" in result.stderr, result.stderr
        assert str(corrupt.name) in result.stderr


def test_corrupt_gzip_in_python(corrupt: pathlib.Path) -> None:
    from jaxlake._src.trace import tracefile
    with pytest.raises(tracefile.TraceError, match="corrupt gzip") as info:
        tracefile.read_trace(corrupt)
    assert info.value.skippable is False
    trace = tracefile.read_trace(corrupt, lenient=True)
    assert 0 < len(trace) < 2 * 4000


# -- defect: a reader that goes away (`jaxlake doctor | head`) -------------------


@pytest.fixture(scope="module")
def small_suite(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("pipe-suite")
    bench.write_synthetic(str(folder), scale=0.01)
    return folder


# Every subcommand that prints to standard output.
PRINTING = [
    ["--help"],
    ["--version"],
    ["demo"],
    ["options"],
    ["doctor", "--no-jax"],
    ["bench", "--suite", "{s}", "--no-plots", "--no-progress", "--out",
     "{d}/b"],
    ["replay", "{t}"],
    ["replay", "{t}", "--json", "-"],
    ["plot", "{t}", "-o", "{d}/p.png"],
    ["trace", "info", "{t}"],
    ["trace", "convert", "{t}", "{d}/c.csv"],
    ["trace"],
    ["view", "{t}", "-o", "{d}/v.html"],
    ["replay", "--help"],
]


@pytest.mark.parametrize("args", PRINTING, ids=lambda a: " ".join(a[:2]))
def test_closed_pipe_ends_quietly(args: List[str], small_suite: pathlib.Path,
                                  tmp_path: pathlib.Path) -> None:
    if args[0] == "view" and importlib.util.find_spec("plotly") is None:
        pytest.skip("plotly is not installed (the view extra brings it)")
    if args[0] == "plot" and importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    trace = sorted(small_suite.glob("*.jsonl.gz"))[0]
    argv = [a.format(s=small_suite, d=tmp_path, t=trace) for a in args]
    # A pipe whose reader is closed before the command starts: its first
    # write to standard output fails, as under `| head` once head is done.
    read, write = os.pipe()
    os.close(read)
    try:
        result = jaxlake_cmd(argv, tmp_path, stdout=write)
    finally:
        os.close(write)
    no_traceback(result)
    assert "BrokenPipe" not in result.stderr, result.stderr
    # 141: 128 + SIGPIPE, as a shell reports; `jaxlake trace` without an
    # action prints its help and exits 2 (usage) in any case.
    usage = (2,) if argv == ["trace"] else ()
    assert result.returncode in (0, 141) + usage, result.stderr


def test_closed_pipe_after_some_output(small_suite: pathlib.Path,
                                       tmp_path: pathlib.Path) -> None:
    """`jaxlake bench | head -3`: the reader takes a little, then leaves."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAXLAKE")}
    bench_cmd = subprocess.Popen(
        [sys.executable, "-m", "jaxlake", "bench", "--suite", str(small_suite),
         "--no-plots", "--no-progress", "--out", str(tmp_path / "b")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert bench_cmd.stdout is not None and bench_cmd.stderr is not None
    first = bench_cmd.stdout.readline()
    bench_cmd.stdout.close()
    err = bench_cmd.stderr.read().decode()
    code = bench_cmd.wait(timeout=300)
    assert first.startswith(b"jaxlake bench:")
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code in (0, 141), err


# -- defect: a subcommand's misspelt option ------------------------------------


def test_misspelt_option_gets_the_subcommands_usage(
        tmp_path: pathlib.Path) -> None:
    result = jaxlake_cmd(["replay", "--capacty", "1G", "t.jsonl"], tmp_path)
    assert result.returncode == 2
    no_traceback(result)
    assert result.stderr.startswith("usage: jaxlake replay"), result.stderr
    assert "--capacty: did you mean --capacity?" in result.stderr
    nested = jaxlake_cmd(["trace", "convert", "a", "b", "--lenent"],
                         tmp_path)
    assert nested.returncode == 2
    assert nested.stderr.startswith("usage: jaxlake trace convert")
    assert "did you mean --lenient?" in nested.stderr
    stray = jaxlake_cmd(["doctor", "--no-jax", "extra"], tmp_path)
    assert stray.returncode == 2
    assert stray.stderr.startswith("usage: jaxlake doctor")
    assert "unrecognized arguments: extra" in stray.stderr


# -- defect: a lake asked for and not had ------------------------------------


def test_run_with_a_bad_option_warns_at_start_and_end(
        tmp_path: pathlib.Path) -> None:
    code = "import sys; print('RAN'); sys.exit(3)"
    result = jaxlake_cmd(["run", "--", sys.executable, "-c", code], tmp_path,
                         env={"JAXLAKE_CAPACITY": "banana"})
    no_traceback(result)
    assert "RAN" in result.stdout
    assert result.returncode == 3  # the program's own status
    err = result.stderr
    assert "JAXLAKE_CAPACITY='banana' is invalid" in err
    assert "or None" not in err
    assert "the lake is NOT active" in err and "--required" in err
    assert "jaxlake run: option capacity: environment variable" in err
    # ... and again once the program has ended, after its output.
    assert err.rstrip().splitlines()[-1].startswith(
        "jaxlake: WARNING: this program ran WITHOUT the lake")


def test_run_required_refuses_a_bad_option(tmp_path: pathlib.Path) -> None:
    result = jaxlake_cmd(["run", "--required", "--", sys.executable, "-c",
                          "print('RAN')"], tmp_path,
                         env={"JAXLAKE_CAPACITY": "banana"})
    no_traceback(result)
    assert result.returncode == 1
    assert "RAN" not in result.stdout
    assert "banana" in result.stderr and "not run" in result.stderr


@pytest.mark.parametrize("extra, status", [({}, 0),
                                           ({"JAXLAKE_REQUIRED": "1"}, 1)])
def test_jaxlake_1_with_a_bad_option(extra: Dict[str, str], status: int,
                                     tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAXLAKE")}
    env.update({"JAXLAKE": "1", "JAXLAKE_CAPACITY": "banana"}, **extra)
    result = subprocess.run([sys.executable, "-c", "print('RAN')"],
                            cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    no_traceback(result)
    assert result.returncode == status, result.stderr
    assert "banana" in result.stderr and "or None" not in result.stderr
    if status == 0:
        assert "RAN" in result.stdout
        assert "JAXLAKE=1 asked for the lake" in result.stderr
        assert "JAXLAKE_REQUIRED=1 makes this an error" in result.stderr
        assert result.stderr.rstrip().splitlines()[-1].startswith(
            "jaxlake: WARNING: this program ran WITHOUT the lake")
    else:
        assert "RAN" not in result.stdout


@pytest.mark.parametrize("flag, named, hint", [
    ("--jaxlake_capacity=banana", "XLA_FLAGS entry --jaxlake_capacity",
     "leave the entry out for the whole device"),
    ("--jaxlake_capacity=0", "XLA_FLAGS entry --jaxlake_capacity",
     "leave out --jaxlake_capacity"),
    ("--jaxlake_stitch=maybe", "XLA_FLAGS entry --jaxlake_stitch",
     "1/true/on/yes"),
])
def test_xla_flags_entry_with_a_bad_value(flag: str, named: str, hint: str,
                                          tmp_path: pathlib.Path) -> None:
    # An XLA_FLAGS entry is text, like an environment variable: its error
    # names the entry and never offers None, which no flag can spell.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAXLAKE")}
    env.update({"JAXLAKE": "1", "JAXLAKE_REQUIRED": "1",
                "XLA_FLAGS": f"--xla_dump_to=/nonexistent {flag}"})
    result = subprocess.run([sys.executable, "-c", "print('RAN')"],
                            cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    no_traceback(result)
    assert result.returncode == 1, result.stderr
    assert "RAN" not in result.stdout
    assert named in result.stderr, result.stderr
    assert hint in result.stderr, result.stderr
    assert "None" not in result.stderr, result.stderr
