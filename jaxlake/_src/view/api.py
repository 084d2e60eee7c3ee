"""jaxlake.view(): the page from a trace file or an in-memory recording.

`import jaxlake` imports this module, so the rest of the view (numpy,
plotly, the replays) is imported only when a page is written.
"""

from __future__ import annotations

import gzip
import os
import zlib
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Union

from jaxlake._src.trace import tracefile

if TYPE_CHECKING:  # pragma: no cover
    from jaxlake._src.bench.replay import Capacity
    from jaxlake._src.trace.tracefile import Trace

PathLike = Union[str, "os.PathLike[str]"]


def _version() -> str:
    try:
        from importlib import metadata
        return metadata.version("jaxlake")
    except Exception:  # pragma: no cover - not installed
        return "unknown"


def _complete_lines(data: bytes) -> bytes:
    """`data` up to its last newline (a file still being written)."""
    cut = data.rfind(b"\n")
    return data[:cut + 1] if cut >= 0 else b""


def _read_open(path: str) -> bytes:
    """The complete lines of a trace another writer still holds open (a
    gzip stream without its end)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, ValueError, zlib.error):
            raw, _ = tracefile.gunzip_salvage(raw)  # up to a cut or damage
    return _complete_lines(raw)


def _from_recorder(rec: Any, lenient: bool) -> "Trace":
    writer = getattr(rec, "_writer", None)
    path = str(rec.path)
    if writer is None:  # closed: the file is complete
        return tracefile.read_trace(path, lenient=lenient)
    # Still recording: flush what is written so far and read its complete
    # lines (allocations still live stay unfreed in the view).
    f = getattr(writer, "_file", None)
    if f is not None:
        f.flush()
        buffer = getattr(f, "buffer", None)
        if buffer is not None and hasattr(buffer, "flush"):
            try:
                buffer.flush(zlib.Z_SYNC_FLUSH)
            except TypeError:
                buffer.flush()
        raw = getattr(f, "_jaxlake_raw", None)
        if raw is not None:
            raw.flush()
    try:
        data = _read_open(path)
    except OSError as e:
        raise tracefile.TraceError(
            f"cannot read the recording: {e.strerror or e}", path) from None
    return tracefile.parse_trace(data, path, lenient=lenient)


def _from_lake(lake: Any) -> "Trace":
    events = lake.trace()
    if not events and not lake.options.get("record_trace", False):
        raise ValueError("this Lake records no trace: create it with "
                         "record_trace=True to view its allocations")
    writer = tracefile.TraceWriter(
        None, "lake", source="jaxlake.Lake",
        meta={"backend": getattr(lake, "backend", "")})
    for e in events:
        if e.allocate:
            writer.alloc(e.address, e.size, stream=e.stream, t=e.time_ns)
        else:
            writer.free(e.address, stream=e.stream, t=e.time_ns)
    data = writer.text().encode()
    return tracefile.parse_trace(data, "<jaxlake.Lake>", format="jsonl")


def _trace_context_path(obj: Any) -> Optional[str]:
    """The path of a jaxlake.trace(path) context manager, else None."""
    from jaxlake._src.xla import integration
    func = getattr(obj, "func", None)
    wrapped = getattr(integration.trace, "__wrapped__", None)
    if func is None or func is not wrapped:
        return None
    args = getattr(obj, "args", ())
    kwds = getattr(obj, "kwds", {})
    path = args[0] if args else kwds.get("path")
    return os.fspath(path) if path is not None else None


def load(source: Any, lenient: bool = False) -> "Trace":
    """A parsed trace from what view() accepts."""
    from jaxlake._src.lake.lake import Lake
    from jaxlake._src.trace.recorder import Recorder
    if isinstance(source, tracefile.Trace):
        return source
    if isinstance(source, (str, os.PathLike)):
        return tracefile.read_trace(source, lenient=lenient)
    if isinstance(source, Recorder):
        return _from_recorder(source, lenient)
    if isinstance(source, Lake):
        return _from_lake(source)
    path = _trace_context_path(source)
    if path is not None:
        if not os.path.exists(path):
            raise tracefile.TraceError(
                "no trace written yet (enter the jaxlake.trace() block "
                "first)", path)
        with open(path, "rb") as f:
            data = f.read()
        return tracefile.parse_trace(_complete_lines(data), path,
                                     lenient=lenient)
    raise TypeError(
        "view() takes a trace file path, a jaxlake.Recorder, the result of "
        "jaxlake.trace(path), a jaxlake.Lake created with record_trace=True, "
        f"or a parsed trace; got {type(source).__name__}")


def default_output(trace: "Trace") -> str:
    """"<trace name>.html" in the current folder."""
    name = "".join(c if c.isalnum() or c in "-_." else "_"
                   for c in trace.name).strip(".") or "trace"
    return f"{name}.html"


def check_output(output: PathLike) -> str:
    """`output` as a string, or ValueError when its folder is missing."""
    name = os.fspath(output)
    folder = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"cannot write {name}: the folder {folder} does not exist "
            "(create it first)")
    if os.path.isdir(name):
        raise IsADirectoryError(f"cannot write {name}: it is a folder; "
                                "give a file name such as view.html")
    return name


def view(source: Any, output: Optional[PathLike] = None, *,
         policies: Optional[Sequence[str]] = None,
         capacity: Union["Capacity", int, str, None] = None,
         device: Optional[int] = None, lenient: bool = False,
         snapshots: Optional[int] = None,
         options: Optional[Dict[str, Any]] = None) -> str:
    """Writes the memory view of a run as one self-contained HTML page and
    returns its path.

        jaxlake.view("run.jsonl.gz", "run.html")
        with jaxlake.Recorder("run.jsonl.gz", "lm") as rec: ...
        jaxlake.view(rec, "run.html")

    `source`: a trace file (JSON lines, optionally gzip, or RMM's CSV), a
    jaxlake.Recorder (open or closed), the result of jaxlake.trace(path), a
    jaxlake.Lake created with record_trace=True, or a parsed trace.
    `output`: the page to write (default: "<trace name>.html").
    `policies`: the policies to compare (default: all). `capacity`: device
    memory, as for `jaxlake replay` ("16GiB", "1.1x"). `device`: only that
    device (default: every device, with a selector). `snapshots`: how many
    evenly spread events the memory map can show (default 200; stitches,
    the peak of live bytes and an out-of-memory stop come on top).
    `options`: fields of the replay's PolicyOptions, as for replay().

    The page holds plotly.js and the data; nothing is fetched when it is
    opened. Long traces are downsampled so the page stays under about
    20 MB, and the page says so. Raises TraceError for a malformed trace
    (with its line number), PolicyError for an unknown policy,
    FileNotFoundError when the output's folder is missing.
    """
    from jaxlake._src.bench.replay import Capacity, check_policies
    from jaxlake._src.view import model, page
    if output is not None:
        check_output(output)
    if snapshots is None:
        snapshots = model.SNAPSHOTS
    names = check_policies(list(policies)) if policies else None
    cap = capacity if isinstance(capacity, Capacity) or capacity is None \
        else Capacity.parse(capacity)
    if isinstance(snapshots, bool) or not isinstance(snapshots, int) or \
            snapshots < 0:
        raise ValueError(f"snapshots must be an int >= 0, got {snapshots!r}")
    if device is not None and (isinstance(device, bool) or
                               not isinstance(device, int)):
        raise TypeError(f"device must be an int, got {device!r}")
    page.plotly_js()  # fail early, before replaying, without plotly
    trace = load(source, lenient=lenient)
    settings = model.Settings(
        policies=names or [], capacity=cap,
        devices=[device] if device is not None else None,
        snapshots=snapshots, options=options)
    data = model.build(trace, settings)
    text = page.render(data, _version())
    path = check_output(output if output is not None
                        else default_output(trace))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path
