"""Allocation trace files: the writer, the reader and the RMM CSV converter.

The format is the contract of docs/traces.md: JSON lines (gzip-compressed
when the file name ends in .gz), a versioned header line, then one event
object per line. RMM's memory-event CSV is read and written too.

Writing is plain Python (the recorder writes events as they happen).
Reading is done by the compiled core (jaxlake._core.parse_trace), because
traces of millions of events must load in seconds; Python only opens the
file and decompresses it. Both formats go through the same parser, so every
error names the file, the line number and what is wrong.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import zlib
from typing import (Any, Dict, Iterator, List, Mapping, NamedTuple, Optional,
                    Set, Tuple, Union)

from jaxlake._src.errors import JaxlakeError

FORMAT = "jaxlake-trace"
VERSION = 1
#: The event kinds docs/traces.md allows on an alloc.
KINDS = ("param", "opt_state", "input", "output", "temp", "grad",
         "activation", "other")
CSV_HEADER = "Thread,Time,Action,Pointer,Size,Stream"

PathLike = Union[str, "os.PathLike[str]"]


class TraceError(JaxlakeError, ValueError):
    """A trace file is malformed; `line` is the 1-based line number (0 when
    the problem is not on one line, e.g. an unreadable file)."""

    def __init__(self, message: str, path: str = "", line: int = 0,
                 skippable: bool = False) -> None:
        where = f"{path}:{line}: " if path and line else (
            f"{path}: " if path else (f"line {line}: " if line else ""))
        super().__init__(where + message)
        self.path = path
        self.line = line
        self.reason = message
        #: Whether a lenient read would skip the line (header problems and
        #: unreadable files are fatal in both modes).
        self.skippable = skippable


class Event(NamedTuple):
    """One event of a trace (docs/traces.md)."""

    t: int
    op: str             # "alloc" or "free"
    id: int
    dev: int
    size: int           # requested bytes (a free: its allocation's)
    stream: int
    kind: Optional[str]  # alloc only, None when not given


class Skipped(NamedTuple):
    """A line that a lenient read skipped."""

    line: int
    reason: str


# -- writing -----------------------------------------------------------------


def _open_write(path: PathLike) -> io.TextIOBase:
    name = os.fspath(path)
    if name.lower().endswith(".gz"):
        raw = open(name, "wb")
        # mtime=0 and no file name in the gzip header: the same events give
        # the same bytes, so bundled traces diff cleanly.
        compressed = gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                   compresslevel=6, mtime=0)
        text = io.TextIOWrapper(compressed, encoding="utf-8", newline="\n")
        text._jaxlake_raw = raw  # type: ignore[attr-defined]
        return text
    return open(name, "w", encoding="utf-8", newline="\n")


def _check_int(what: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}")
    return value


class TraceWriter:
    """Writes a trace in the JSON-lines format, event by event.

        with TraceWriter("run.jsonl.gz", "lm-small", meta={"model": "s"}) as w:
            w.alloc(1, 4096)
            w.free(1)

    `t` defaults to one more than the previous event's time (0 first); a
    given `t` must not go back in time. The writer checks each event as the
    reader would (positive size, known kind, device in range, no second
    allocation of a live id, no free of an id that is not live) and raises
    ValueError at once, so a bad trace is never written silently. Ids are
    live per device.

    `path` None writes into memory: text() returns what was written (what
    jaxlake.view reads from a Lake's recording).
    """

    def __init__(self, path: Optional[PathLike], name: str, devices: int = 1,
                 source: str = "recorder",
                 meta: Optional[Mapping[str, Any]] = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        _check_int("devices", devices, 1)
        if not isinstance(source, str) or not source:
            raise ValueError(
                f"source must be a non-empty string, got {source!r}")
        self.path = "<memory>" if path is None else os.fspath(path)
        self.name = name
        self.devices = devices
        header = {"format": FORMAT, "version": VERSION, "name": name,
                  "devices": devices, "source": source,
                  "meta": dict(meta or {})}
        try:
            line = json.dumps(header, sort_keys=False, default=str)
        except (TypeError, ValueError) as e:
            raise ValueError(f"meta is not JSON-serialisable: {e}") from None
        # Event lines come from the format's one writer
        # (cc/replay/trace_line.h), the same the shim and the replay use.
        self._line: Any = _core().trace_line
        self._memory: Optional[io.StringIO] = (
            io.StringIO() if path is None else None)
        self._file: Optional[io.TextIOBase] = (
            self._memory if self._memory is not None
            else _open_write(self.path))
        self._file.write(line + "\n")
        self._t = -1
        self._live: Set[Tuple[int, int]] = set()
        self.events = 0

    def _time(self, t: Optional[int]) -> int:
        if t is None:
            return self._t + 1
        _check_int("t", t, 0)
        if t < self._t:
            raise ValueError(f"t={t} goes back in time (previous event at "
                             f"t={self._t}); times must not decrease")
        return t

    def _check_open(self) -> io.TextIOBase:
        if self._file is None:
            raise ValueError(f"trace {self.path} is closed")
        return self._file

    def alloc(self, id: int, size: int, dev: int = 0, stream: int = 0,
              kind: Optional[str] = None, t: Optional[int] = None) -> None:
        """Records an allocation of `size` requested bytes."""
        out = self._check_open()
        _check_int("id", id, 0)
        _check_int("size", size, 1)
        _check_int("dev", dev, 0)
        _check_int("stream", stream, 0)
        if dev >= self.devices:
            raise ValueError(f"dev={dev} is not below devices={self.devices}")
        if kind is not None and kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}: expected one of "
                             + ", ".join(KINDS))
        key = (dev, id)
        if key in self._live:
            raise ValueError(f"id {id} is already live on device {dev} "
                             "(free it before allocating it again)")
        time = self._time(t)
        self._live.add(key)
        self._t = time
        out.write(self._line(time, id, dev, size, stream, True, kind or ""))
        self.events += 1

    def free(self, id: int, dev: int = 0, stream: int = 0,
             t: Optional[int] = None) -> None:
        """Records the free of a live allocation."""
        out = self._check_open()
        _check_int("id", id, 0)
        _check_int("dev", dev, 0)
        _check_int("stream", stream, 0)
        key = (dev, id)
        if key not in self._live:
            raise ValueError(f"free of id {id} on device {dev}, which is not "
                             "live (never allocated, or already freed)")
        time = self._time(t)
        self._live.discard(key)
        self._t = time
        out.write(self._line(time, id, dev, 0, stream, False, ""))
        self.events += 1

    @property
    def live(self) -> int:
        """Allocations written and not freed."""
        return len(self._live)

    def text(self) -> str:
        """What an in-memory writer (path None) has written so far."""
        if self._memory is None:
            raise ValueError(f"trace {self.path} is written to a file, not "
                             "into memory")
        return self._memory.getvalue()

    def close(self) -> None:
        """Flushes and closes the file (idempotent); an in-memory writer
        keeps its text."""
        if self._file is None or self._file is self._memory:
            self._file = None
            return
        f, self._file = self._file, None
        raw = getattr(f, "_jaxlake_raw", None)
        f.close()
        if raw is not None:
            raw.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


# -- reading -----------------------------------------------------------------


#: The path that means standard input to read_trace.
STDIN = "-"


def read_bytes(path: PathLike, lenient: bool = False) -> bytes:
    """The bytes of a trace file ("-": standard input), decompressed when it
    is gzip (by its magic number, whatever its name).

    A truncated gzip stream gives what decompresses, marked as cut (the
    parser then reports the cut line). A corrupt one (damaged bytes, a
    failed check) raises TraceError naming the damage; with lenient=True it
    gives the bytes that decompress before the damage, marked as cut."""
    name = os.fspath(path)
    try:
        if name == STDIN:
            import sys
            data = sys.stdin.buffer.read()
        else:
            with open(name, "rb") as f:
                data = f.read()
    except OSError as e:
        raise TraceError(f"cannot read the trace: {e.strerror or e}",
                         name) from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, ValueError, zlib.error) as e:
            partial, damage = gunzip_salvage(data)
            if damage is None:
                # A truncated stream: keep what decompresses, so a damaged
                # trace can still be read leniently (its last line is cut).
                return partial + b"\x00"  # marks the cut for the parser
            if lenient and partial:
                return partial + b"\x00"
            raise TraceError(
                f"corrupt gzip data ({damage or e}); "
                f"{len(partial)} bytes decompress before the damage"
                + (" (--lenient reads the events before it)"
                   if partial and not lenient else ""),
                name) from None
    return data


#: Bytes fed to the decompressor at a time by gunzip_salvage().
_SALVAGE_CHUNK = 1 << 10  # (what zlib refuses loses at most one)


def gunzip_salvage(data: bytes) -> Tuple[bytes, Optional[str]]:
    """(the bytes that decompress, what stopped the decompression) of a gzip
    stream that gzip.decompress refused: the damage is None for a stream
    that merely ends early, else zlib's or the gzip check's message."""
    d = zlib.decompressobj(wbits=31)
    out: List[bytes] = []
    for start in range(0, len(data), _SALVAGE_CHUNK):
        try:
            out.append(d.decompress(data[start:start + _SALVAGE_CHUNK]))
        except zlib.error as e:
            return b"".join(out), str(e)
        if d.eof:
            break
    if not out or (not d.eof and not b"".join(out)):
        return b"", "not a gzip stream"
    return b"".join(out), None


def sniff_format(data: bytes) -> str:
    """"jsonl" or "csv", from the first non-blank character of the file."""
    head = data[:4096].lstrip()[:64]
    if head.startswith(b"{"):
        return "jsonl"
    if head.lower().startswith(b"thread") or b"," in head.split(b"\n")[0]:
        return "csv"
    return "jsonl"


@dataclasses.dataclass
class Trace:
    """A parsed trace: the header, the events and what a lenient read
    skipped. The events live in the compiled core (`core`, passed to the
    replay engine as is); `events()` turns them into Python tuples."""

    path: str
    format: str                 # "jsonl" or "csv" (the file's format)
    name: str
    devices: int
    source: str
    meta: Dict[str, Any]
    version: int
    skipped: List[Skipped]
    core: Any = dataclasses.field(repr=False)

    def __len__(self) -> int:
        return int(self.core.size())

    def events(self) -> List[Event]:
        """Every event, in file order."""
        return [Event(t, "alloc" if a else "free", i, d, s, st,
                      k if k else None)
                for (t, a, i, d, s, st, k) in self.core.events()]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    @property
    def header(self) -> Dict[str, Any]:
        return {"format": FORMAT, "version": self.version, "name": self.name,
                "devices": self.devices, "source": self.source,
                "meta": self.meta}


def _core() -> Any:
    from jaxlake import _core
    return _core


def _base_name(path: str) -> str:
    if path in (STDIN, "<stdin>"):
        return "stdin"
    base = os.path.basename(path)
    for suffix in (".gz", ".jsonl", ".csv"):
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
    return base or "trace"


def parse_trace(data: bytes, path: str = "<bytes>", lenient: bool = False,
                format: Optional[str] = None) -> Trace:
    """Parses the bytes of a trace (see read_trace)."""
    fmt = format or sniff_format(data)
    if fmt not in ("jsonl", "csv"):
        raise ValueError(f"unknown trace format {fmt!r}: expected jsonl or "
                         "csv")
    core = _core().parse_trace(data, fmt == "csv", lenient)
    error = core.error()
    if error:
        line, reason, fatal = error
        raise TraceError(reason, path, line, skippable=not fatal)
    skipped = [Skipped(line, reason) for line, reason in core.skipped()]
    if fmt == "csv":
        return Trace(path=path, format="csv", name=_base_name(path),
                     devices=1, source="rmm-csv", meta={}, version=VERSION,
                     skipped=skipped, core=core)
    try:
        header = json.loads(core.header())
    except ValueError as e:  # the core accepted it: should not happen
        raise TraceError(f"the header is not valid JSON ({e})", path,
                         1) from None
    name = header.get("name", _base_name(path))
    if not isinstance(name, str) or not name:
        raise TraceError(f"the header's \"name\" must be a non-empty "
                         f"string, got {name!r}", path, core.header_line)
    meta = header.get("meta", {})
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise TraceError(f"the header's \"meta\" must be an object, got "
                         f"{type(meta).__name__}", path, core.header_line)
    source = header.get("source", "")
    return Trace(path=path, format="jsonl", name=name,
                 devices=int(core.devices), source=str(source or ""),
                 meta=meta, version=int(header.get("version", VERSION)),
                 skipped=skipped, core=core)


def read_trace(path: PathLike, lenient: bool = False) -> Trace:
    """Reads a trace in either format (JSON lines, optionally gzip, or RMM's
    memory-event CSV, told apart by content).

    Raises TraceError (a ValueError) naming the file and line of the first
    malformed or truncated line, free of an unknown id, second allocation of
    a live id, or size that is not positive. With lenient=True such lines
    are skipped instead and listed in `Trace.skipped`; a bad header is an
    error in both modes.
    """
    name = os.fspath(path)
    return parse_trace(read_bytes(name, lenient), "<stdin>" if name == STDIN else name,
                       lenient)


# -- converting --------------------------------------------------------------


def _write_bytes(path: PathLike, data: bytes) -> None:
    name = os.fspath(path)
    if name.lower().endswith(".gz"):
        with open(name, "wb") as raw, gzip.GzipFile(
                filename="", mode="wb", fileobj=raw, compresslevel=6,
                mtime=0) as f:
            f.write(data)
    else:
        with open(name, "wb") as f:
            f.write(data)


def write_jsonl(trace: Trace, path: PathLike,
                name: Optional[str] = None) -> int:
    """Writes `trace` as JSON lines; returns the number of events."""
    header = dict(trace.header)
    header["name"] = name or trace.name
    header["source"] = trace.source or "converted"
    _write_bytes(path, trace.core.to_jsonl(json.dumps(header, default=str)))
    return len(trace)


def write_csv(trace: Trace, path: PathLike) -> int:
    """Writes `trace` as RMM's memory-event CSV; returns the event count.

    Time is t / 1e9 seconds with nine decimals (so t survives a round
    trip), Pointer 0x + the id in hex, Thread 0; frees carry the size of
    the allocation they free. RMM's CSV has no device column: a trace with
    events on a device other than 0 raises ValueError.
    """
    _write_bytes(path, trace.core.to_csv())
    return len(trace)


def output_format(path: PathLike) -> str:
    """"csv" when the name ends in .csv or .csv.gz (any case), else
    "jsonl"."""
    name = os.fspath(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return "csv" if name.endswith(".csv") else "jsonl"


def convert(src: PathLike, dst: PathLike, lenient: bool = False) -> Trace:
    """Converts between the formats; the output format follows dst's name
    (.csv / .csv.gz: RMM CSV, else JSON lines). Returns the trace read."""
    trace = read_trace(src, lenient=lenient)
    if output_format(dst) == "csv":
        write_csv(trace, dst)
    else:
        write_jsonl(trace, dst)
    return trace
