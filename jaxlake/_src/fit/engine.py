"""Making one value's allocation trace for `jaxlake fit`: the engines.

fake-gpu  runs the unmodified command under `jaxlake run --fake-gpu`, XLA's
          real GPU client over jaxlake's fake GPU, the shim writing the
          trace (fake_gpu_command() builds that command line);
recorder  runs a command that uses jaxlake.Recorder: the trace path goes
          where the command says {TRACE}, else `--trace PATH` is appended
          (the examples' flag).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from jaxlake._src.fit.search import FitError
from jaxlake._src.options import format_size, parse_size

ENGINES = ("fake-gpu", "recorder")
TRACE_PLACEHOLDER = "{TRACE}"

#: Named GPUs: (fake GPU model, device memory in bytes). Nominal sizes,
#: those the fake GPU gives its devices; --gpu SIZE gives an exact one.
GPUS: Dict[str, Tuple[str, int]] = {
    "h100": ("h100", 80 << 30),
    "h200": ("h200", 141 << 30),
    "a100-80gb": ("h100", 80 << 30),
}

#: The most fake devices one run may have (`jaxlake run --fake-gpu-count`).
MAX_DEVICES = 64

#: JAX's switch for its persistent compilation cache.
COMPILATION_CACHE_ENV = "JAX_ENABLE_COMPILATION_CACHE"

#: Lines of a failed command's output shown in the error.
TAIL_LINES = 15


@dataclasses.dataclass(frozen=True)
class Gpu:
    """The GPU a fit is for: a name, its device memory, and how many of
    them each run of the program has (`jaxlake fit --devices`: the fake
    GPU gives every run that many devices of this memory)."""

    name: str
    memory: int
    fake_model: str = "h100"
    count: int = 1

    def fake_gpu_options(self, memory: int) -> List[str]:
        """`jaxlake run`'s options for this GPU's fake devices, each of
        `memory` bytes."""
        return [f"--fake-gpu={self.fake_model}",
                f"--fake-gpu-count={self.count}",
                f"--fake-gpu-memory={memory}"]

    @classmethod
    def parse(cls, text: str) -> "Gpu":
        key = text.strip().lower()
        if key in GPUS:
            model, memory = GPUS[key]
            return cls(key, memory, model)
        try:
            nbytes = parse_size(key)
        except ValueError:
            nbytes = -1
        if nbytes <= 0:
            raise FitError(f"--gpu {text!r}: expected one of "
                           + ", ".join(GPUS) + " or a device size such as "
                           "'256MiB' or '40GiB'")
        return cls(format_size(nbytes), nbytes, "h100")


class FakeGpuUnavailable(FitError):
    """`jaxlake run` has no --fake-gpu, or the fake GPU cannot start."""


class OutOfFakeMemory(FitError):
    """The program ran out of the fake device's memory while recording.
    That device holds several times the GPU's memory (fake_gpu_memory()),
    so the value needs more than any policy's capacity on the GPU."""

    def __init__(self, message: str, device_memory: int,
                 request: Optional[int]) -> None:
        super().__init__(message)
        self.device_memory = device_memory
        self.request = request


#: XLA's message for a buffer its allocator could not get.
_XLA_OOM = re.compile(r"RESOURCE_EXHAUSTED: Out of memory while trying to "
                      r"allocate ([0-9.]+)\s*([KMGT]?i?B)")


#: The stream-ordered allocator's own line (XLA_PYTHON_CLIENT_ALLOCATOR=
#: cuda_async, which the lake serves): the request in bytes, exactly.
_ASYNC_OOM = re.compile(r"cuMemAllocAsync failed to allocate ([0-9]+) bytes")


def out_of_memory(output: str) -> Tuple[bool, Optional[int]]:
    """Whether the output shows XLA running out of device memory, and the
    request's bytes where its message gives them: exactly from the
    stream-ordered allocator's line, else from XLA's message, which rounds
    the size to two decimals (75.08GiB: the nearest byte)."""
    if "RESOURCE_EXHAUSTED" not in output or "Out of memory" not in output:
        return False, None
    exact = _ASYNC_OOM.findall(output)
    if exact:
        return True, int(exact[-1])
    match = _XLA_OOM.search(output)
    if match is None:
        return True, None
    number, unit = match.groups()
    try:
        return True, parse_size(f"{number}{unit}")
    except ValueError:
        pass
    try:
        return True, int(round(float(number) * parse_size(f"1{unit}")))
    except ValueError:
        return True, None


def fake_gpu_memory(gpu: Gpu) -> int:
    """The fake device's memory while recording: far more than the GPU's,
    so that only a value far too large for the GPU runs out
    (OutOfFakeMemory); the fake's memory is sparse host memory, paid for
    only where data is written."""
    return max(4 * gpu.memory, 256 << 30)


def jaxlake_command() -> List[str]:
    """How to start this jaxlake's command: the `jaxlake` script beside
    this interpreter (it imports the installed package wherever it runs),
    else `python -m jaxlake`."""
    script = os.path.join(os.path.dirname(sys.executable), "jaxlake")
    if os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "jaxlake"]


def fake_gpu_command(argv: Sequence[str], trace: str, gpu: Gpu) -> List[str]:
    """The command line of one fake-GPU recording."""
    return [*jaxlake_command(), "run",
            *gpu.fake_gpu_options(fake_gpu_memory(gpu)),
            "--trace", trace, "--", *argv]


def recorder_command(argv: Sequence[str], trace: str) -> List[str]:
    """The command line of one recorder run: {TRACE} replaced by the trace
    path, else `--trace PATH` appended."""
    if any(TRACE_PLACEHOLDER in a for a in argv):
        return [a.replace(TRACE_PLACEHOLDER, trace) for a in argv]
    return [*argv, "--trace", trace]


def command_for(engine: str, argv: Sequence[str], trace: str,
                gpu: Gpu) -> List[str]:
    if engine == "fake-gpu":
        return fake_gpu_command(argv, trace, gpu)
    if engine == "recorder":
        return recorder_command(argv, trace)
    raise FitError(f"unknown engine {engine!r}: expected "
                   + " or ".join(ENGINES))


_FAKE_MISSING = ("unrecognized arguments: --fake-gpu",
                 "unrecognized arguments: --fake-gpu-memory")


def fake_gpu_problem(output: str) -> Optional[str]:
    """Why the fake GPU did not run, from `jaxlake run`'s output, or None
    when the failure was the program's own."""
    if any(m in output for m in _FAKE_MISSING) or (
            "--fake-gpu" in output and "unrecognized arguments" in output):
        return ("the fake GPU is unavailable: this jaxlake's `jaxlake run` "
                "has no --fake-gpu option")
    for line in output.splitlines():
        if line.startswith("jaxlake run: error:") and "fake" in line.lower():
            return ("the fake GPU is unavailable: "
                    + line[len("jaxlake run: error:"):].strip())
    return None


class Progress:
    """Shows a candidate's run with its elapsed time: a line updated every
    second on a terminal, a start and an end line otherwise."""

    def __init__(self, out: Optional[TextIO], label: str) -> None:
        self.out = out
        self.label = label
        self.start = time.monotonic()
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.tty = bool(out is not None and getattr(out, "isatty",
                                                    lambda: False)())

    def __enter__(self) -> "Progress":
        if self.out is None:
            return self
        if self.tty:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        else:
            self.out.write(f"  {self.label} ...\n")
            self.out.flush()
        return self

    def _tick(self) -> None:
        assert self.out is not None
        while not self._done.wait(1.0):
            self.out.write(f"\r  {self.label} ... {self.elapsed:.0f}s")
            self.out.flush()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def finish(self, what: str) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self.out is None:
            return
        prefix = "\r" if self.tty else ""
        self.out.write(f"{prefix}  {self.label}: {what} "
                       f"({self.elapsed:.1f}s)\n")
        self.out.flush()

    def __exit__(self, *exc: object) -> None:
        if not self._done.is_set():
            self.finish("interrupted" if exc[0] else "done")


def fresh_compile(env: Dict[str, str]) -> Dict[str, str]:
    """`env` with JAX's persistent compilation cache off, unless it
    already says whether to use it. Every run of a fit compiles afresh: a
    program that keeps a cache (MaxText's jax_cache_dir, ~/jax_cache by
    default) would otherwise load what an earlier run compiled (another
    value's recording, on a device of another size) and skip XLA's
    compilation and autotuning, whose allocations are part of a first
    run's peak; which runs found their programs there would depend on the
    order of the search."""
    env.setdefault(COMPILATION_CACHE_ENV, "false")
    return env


def run_command(command: Sequence[str], log: str,
                env: Optional[Dict[str, str]] = None) -> int:
    """Runs `command` with its output to the file `log`; its exit status
    (127 when it cannot start)."""
    with open(log, "w", encoding="utf-8") as out:
        try:
            return subprocess.call(list(command), stdout=out,
                                   stderr=subprocess.STDOUT, env=env,
                                   stdin=subprocess.DEVNULL)
        except OSError as e:
            out.write(f"cannot run {command[0]!r}: {e}\n")
            return 127


def tail(path: str, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return ""


def record(engine: str, argv: Sequence[str], trace: str, gpu: Gpu,
           label: str, progress: Optional[TextIO]) -> float:
    """Runs one candidate's command and leaves its trace at `trace`;
    returns the seconds it took. FitError (FakeGpuUnavailable for the
    fake GPU) when the command fails or writes no trace."""
    command = command_for(engine, argv, trace, gpu)
    log = trace + ".log"
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if engine == "fake-gpu":
        fresh_compile(env)
        # A JAX_PLATFORMS of this shell (cpu, say) would keep the program
        # off the fake GPU, whose buffers are the point.
        platforms = env.get("JAX_PLATFORMS", "")
        if platforms and not any(p.strip() in ("cuda", "gpu")
                                 for p in platforms.split(",")):
            env.pop("JAX_PLATFORMS")
    with Progress(progress, label) as p:
        code = run_command(command, log, env)
        output = tail(log, 200)
        if engine == "fake-gpu" and code != 0:
            problem = fake_gpu_problem(output)
            if problem is not None:
                p.finish("fake GPU unavailable")
                raise FakeGpuUnavailable(
                    f"{problem}; record with `--engine recorder` (for "
                    "programs that use jaxlake.Recorder, such as the "
                    "examples) instead")
        ran_out, request = out_of_memory(output) \
            if engine == "fake-gpu" and code != 0 else (False, None)
        if ran_out:
            p.finish("out of the fake device's memory")
            memory = fake_gpu_memory(gpu)
            raise OutOfFakeMemory(
                f"{label}: the program ran out of the fake device's "
                f"{format_size(memory)}", memory, request)
        if code != 0:
            p.finish(f"failed (exit status {code})")
            raise FitError(
                f"{label}: the command failed with exit status {code}: "
                + " ".join(command) + "\nits last lines (all of it in "
                f"{log}):\n" + "\n".join(output.splitlines()[-TAIL_LINES:]))
        if not os.path.isfile(trace) or os.path.getsize(trace) == 0:
            p.finish("no trace")
            hint = ("does it use jaxlake.Recorder and take --trace PATH (or "
                    "{TRACE} in the command)?" if engine == "recorder" else
                    "did the program allocate on the GPU?")
            raise FitError(f"{label}: the command wrote no trace at {trace}: "
                           + hint)
        p.finish("recorded")
        return p.elapsed


# -- memory outside the pool -------------------------------------------------

def outside_pool(meta: Dict[str, Any]) -> Optional[int]:
    """Device bytes the program took outside XLA's pool while recording:
    the "outside_pool_bytes" of the trace header's meta, which the shim
    writes (the peak of the memory it forwarded to the driver: cuMemAlloc,
    cuMemCreate, pools other than the lake's; cc/shim/README.md). None when
    the trace says nothing about it (the recorder's, or a shim trace whose
    program died before its first flush)."""
    value = meta.get("outside_pool_bytes")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
