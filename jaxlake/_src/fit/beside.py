"""Two programs on one shared fake device: a first job, and a second run
beside it (`jaxlake fit --beside`, benchmarks/shared_gpu.py, and the
recording of the bundled pair by benchmarks/traces/build.py).

Both run under `jaxlake run --fake-gpu --fake-gpu-shared NAME`
(cc/fakegpu/shared.cc): `cuMemGetInfo` and every creation of device memory
count both processes' bytes, as on one GPU; each process's contents stay
its own. The first job starts alone; once it is under way (ready()), the
second runs to its end; then the first is stopped (SIGKILL: `jaxlake run`
execs the program, so the process started is the program). The pair fits
when the second ends cleanly and the first has not failed.

The first job is under way when the file its command names at {READY}
(e.g. `--log-json {READY}` of the examples, one line a step) holds
`ready_lines` lines; a first command without {READY} is under way once
its device bytes in the shared accounting have stayed the same, and above
zero, for `settle` seconds.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import threading
import time
import uuid
from typing import Dict, List, Mapping, Optional, Sequence

from jaxlake._src.fit.search import FitError

#: Where the first command names the file it writes a line to per step.
READY_PLACEHOLDER = "{READY}"


def shared_name(prefix: str = "pair") -> str:
    """A fresh name for --fake-gpu-shared."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def shared_file(name: str) -> str:
    """The POSIX shared-memory file of the accounting named `name`."""
    return f"/dev/shm/jaxlake-fakegpu-{os.getuid()}-{name}"


def remove_shared(name: str) -> None:
    """Removes the accounting's file once no process uses it."""
    try:
        os.unlink(shared_file(name))
    except FileNotFoundError:
        pass


class Monitor:
    """Samples each process's device bytes from the shared accounting
    (`jaxlake_fakegpu_shared_usage` of the fake GPU's library) every
    `period` seconds, keeping each pid's peak and the total's. The
    accounting it joins is the one JAXLAKE_FAKEGPU_SHARED names in this
    process's environment when the library is first used (join())."""

    def __init__(self, library: str, period: float = 0.05) -> None:
        self.lib = ctypes.CDLL(library)
        self.lib.jaxlake_fakegpu_shared_usage.restype = ctypes.c_int
        self.period = period
        self.peaks: Dict[int, int] = {}
        self.total_peak = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def join(cls, name: str, memory: int) -> "Monitor":
        """A monitor of the shared device `name` of `memory` bytes (one
        device): sets the fake GPU's variables in this process, which the
        library reads when it starts."""
        os.environ.update(JAXLAKE_FAKEGPU_SHARED=name,
                          JAXLAKE_FAKEGPU_MEMORY=str(memory),
                          JAXLAKE_FAKEGPU_COUNT="1")
        from jaxlake._src.xla import fakegpu
        return cls(fakegpu.library_path())

    def sample(self) -> Dict[int, int]:
        pids = (ctypes.c_int * 64)()
        used = (ctypes.c_ulonglong * 64)()
        n = self.lib.jaxlake_fakegpu_shared_usage(0, pids, used, 64)
        if n < 0:
            raise RuntimeError("the fake GPU's memory is not shared "
                               "(JAXLAKE_FAKEGPU_SHARED unset?)")
        return {pids[i]: used[i] for i in range(min(n, 64))}

    def start(self) -> None:
        self.peaks, self.total_peak = {}, 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.sample()
            for pid, n in now.items():
                self.peaks[pid] = max(self.peaks.get(pid, 0), n)
            self.total_peak = max(self.total_peak, sum(now.values()))
            time.sleep(self.period)


def why(output: str) -> str:
    """What a failed run's output says of why, from its first line that
    names an error (out of memory first)."""
    for key in ("Out of memory while trying to allocate", "RESOURCE_EXHAUSTED",
                "out of memory", "Error", "error"):
        for line in output.splitlines():
            if key in line:
                return line[line.index(key):].strip()[:120]
    return output.strip().splitlines()[-1][:120] if output.strip() else "?"


@dataclasses.dataclass
class PairOutcome:
    """One run of a second job beside a first."""

    first_ok: bool          # the first was still running (or ended well)
    second_code: int        # the second's exit status
    second_output: str      # its stdout and stderr
    first_output: str
    first_alone: int = 0    # the first's device bytes when the second began
    first_peak: int = 0     # (0 without a monitor)
    second_peak: int = 0
    total_peak: int = 0
    seconds: float = 0.0

    @property
    def fits(self) -> bool:
        return self.first_ok and self.second_code == 0

    def why(self) -> str:
        if self.fits:
            return ""
        if self.second_code != 0:
            return why(self.second_output)
        return "first: " + why(self.first_output)


class FirstFailed(FitError):
    """The first job failed, or ended, before the second started: alone
    on the device. `output` is its output."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


def with_ready(argv: Sequence[str], path: str) -> List[str]:
    """The first command with {READY} replaced by `path`."""
    return [a.replace(READY_PLACEHOLDER, path) for a in argv]


def has_ready(argv: Sequence[str]) -> bool:
    return any(READY_PLACEHOLDER in a for a in argv)


def _lines(path: str) -> int:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def wait_ready(first: "subprocess.Popen[bytes]", ready: Optional[str],
               ready_lines: int, settle: float, timeout: float,
               monitor: Optional[Monitor]) -> bool:
    """Waits until the first job is under way (module doc); False when it
    ended first or the timeout passed."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline and first.poll() is None:
        if ready is not None:
            if _lines(ready) >= ready_lines:
                return True
        elif monitor is not None:
            now = monitor.sample().get(first.pid, 0)
            if now != last:
                last, since = now, time.monotonic()
            elif now > 0 and time.monotonic() - since >= settle:
                return True
        else:
            if time.monotonic() - since >= settle:
                return True
        time.sleep(0.2)
    return False


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def run_pair(first_cmd: Sequence[str], first_env: Mapping[str, str],
             second_cmd: Sequence[str], second_env: Mapping[str, str],
             logdir: str, tag: str, monitor: Optional[Monitor] = None,
             ready_lines: int = 2, settle: float = 5.0,
             timeout: float = 600.0, cwd: Optional[str] = None
             ) -> PairOutcome:
    """Runs `second_cmd` beside `first_cmd` (module doc). The first's
    {READY} is a file in `logdir`; both jobs' output goes to
    `logdir/TAG-first.log` and `TAG-second.log`. FitError when the first
    job fails or ends before it is under way (it failed alone: nothing
    ran beside it yet)."""
    start = time.monotonic()
    os.makedirs(logdir, exist_ok=True)
    ready: Optional[str] = None
    if has_ready(first_cmd):
        ready = os.path.join(logdir, f"{tag}-first.ready")
        if os.path.exists(ready):
            os.unlink(ready)
        first_cmd = with_ready(first_cmd, ready)
    first_log = os.path.join(logdir, f"{tag}-first.log")
    second_log = os.path.join(logdir, f"{tag}-second.log")
    if monitor is not None:
        monitor.start()
    with open(first_log, "w", encoding="utf-8") as out1:
        first = subprocess.Popen(list(first_cmd), env=dict(first_env),
                                 stdout=out1, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, cwd=cwd)
    try:
        under_way = wait_ready(first, ready, ready_lines, settle, timeout,
                               monitor)
        if not under_way:
            code = first.poll()
            if code is None:
                first.kill()
                first.wait()
            text = _read(first_log)
            tail = "\n".join(text.strip().splitlines()[-15:])
            what = (f"ended with exit status {code}" if code is not None
                    else f"was not under way after {timeout:.0f}s")
            raise FirstFailed(
                f"the first job {what} before the second started, alone on "
                "the device: " + " ".join(first_cmd) + (
                    "\n(it must keep running until it is stopped: give it "
                    "more steps)" if code == 0 else "")
                + f"\nits last lines (all of it in {first_log}):\n{tail}",
                text)
        first_alone = (monitor.sample().get(first.pid, 0)
                       if monitor is not None else 0)
        try:
            with open(second_log, "w", encoding="utf-8") as out2:
                second = subprocess.run(
                    list(second_cmd), env=dict(second_env), stdout=out2,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    timeout=timeout, cwd=cwd)
            second_code = second.returncode
        except subprocess.TimeoutExpired:
            second_code = -int(signal.SIGKILL)
        except OSError as e:
            with open(second_log, "a", encoding="utf-8") as out2:
                out2.write(f"cannot run {second_cmd[0]!r}: {e}\n")
            second_code = 127
        code = first.poll()
        # Ended by itself with status 0 is not a failure of the first.
        first_ok = code is None or code == 0
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
        first.wait()
        if monitor is not None:
            monitor.stop()
    peaks = monitor.peaks if monitor is not None else {}
    return PairOutcome(
        first_ok=first_ok, second_code=second_code,
        second_output=_read(second_log), first_output=_read(first_log),
        first_alone=first_alone, first_peak=peaks.get(first.pid, 0),
        second_peak=max((n for pid, n in peaks.items() if pid != first.pid),
                        default=0),
        total_peak=monitor.total_peak if monitor is not None else 0,
        seconds=time.monotonic() - start)
