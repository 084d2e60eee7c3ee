"""Trace files: the writer, the reader, RMM's CSV and conversion.

Here the file format contract (docs/traces.md), its errors with line
numbers, lenient reading and conversion; replays of trace files are in
test_replay.py.
"""

from __future__ import annotations

import gzip
import json
import pathlib

import pytest

from jaxlake._src.trace import tracefile
from jaxlake._src.trace.tracefile import TraceError, TraceWriter
from trace_util import alloc, free, write


# -- the writer --------------------------------------------------------------


@pytest.mark.parametrize("name", ["w.jsonl", "w.jsonl.gz"])
def test_writer_round_trip(tmp_path: pathlib.Path, name: str) -> None:
    path = tmp_path / name
    with TraceWriter(path, "lm", devices=2, meta={"model": "small"}) as w:
        w.alloc(1, 4096, kind="param")
        w.alloc(2, 100, dev=1, stream=3, t=10)
        w.free(1)
        w.free(2, dev=1, stream=3)
        assert w.events == 4 and w.live == 0
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")
    first = (gzip.decompress(raw) if name.endswith(".gz") else raw)
    header = json.loads(first.splitlines()[0])
    assert header == {"format": "jaxlake-trace", "version": 1, "name": "lm",
                      "devices": 2, "source": "recorder",
                      "meta": {"model": "small"}}
    trace = tracefile.read_trace(path)
    assert (trace.name, trace.devices, trace.source, trace.meta) == \
        ("lm", 2, "recorder", {"model": "small"})
    assert trace.events() == [
        tracefile.Event(0, "alloc", 1, 0, 4096, 0, "param"),
        tracefile.Event(10, "alloc", 2, 1, 100, 3, None),
        tracefile.Event(11, "free", 1, 0, 4096, 0, None),
        tracefile.Event(12, "free", 2, 1, 100, 3, None),
    ]


def test_writer_into_memory(tmp_path: pathlib.Path) -> None:
    with TraceWriter(tmp_path / "f.jsonl", "lm", source="s") as on_file:
        on_file.alloc(1, 4096, stream=7)
        on_file.free(1, t=9)
    w = TraceWriter(None, "lm", source="s")
    w.alloc(1, 4096, stream=7)
    w.free(1, t=9)
    w.close()
    assert w.text() == (tmp_path / "f.jsonl").read_text()
    with pytest.raises(ValueError, match="written to a file"):
        on_file.text()


def test_gzip_output_is_reproducible(tmp_path: pathlib.Path) -> None:
    def make(path: pathlib.Path) -> bytes:
        with TraceWriter(path, "r") as w:
            w.alloc(1, 10)
        return path.read_bytes()
    assert make(tmp_path / "a.jsonl.gz") == make(tmp_path / "b.jsonl.gz")


def test_writer_refuses_bad_events(tmp_path: pathlib.Path) -> None:
    with TraceWriter(tmp_path / "w.jsonl", "bad", devices=1) as w:
        with pytest.raises(ValueError, match="size must be at least 1"):
            w.alloc(1, 0)
        with pytest.raises(ValueError, match="size must be at least 1"):
            w.alloc(1, -4)
        with pytest.raises(TypeError, match="size must be an int"):
            w.alloc(1, 1.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="not below devices=1"):
            w.alloc(1, 8, dev=1)
        with pytest.raises(ValueError, match="unknown kind 'weights'"):
            w.alloc(1, 8, kind="weights")
        with pytest.raises(ValueError, match="not live"):
            w.free(5)
        w.alloc(1, 8, t=5)
        with pytest.raises(ValueError, match="already live"):
            w.alloc(1, 8)
        with pytest.raises(ValueError, match="goes back in time"):
            w.free(1, t=4)
        assert w.events == 1
    with pytest.raises(ValueError, match="closed"):
        w.alloc(2, 8)
    # What was written before the errors is a valid trace.
    assert len(tracefile.read_trace(tmp_path / "w.jsonl")) == 1


# -- the reader: errors with line numbers --------------------------------------


@pytest.mark.parametrize("line, reason", [
    (alloc(1, -5), 'negative "size"'),
    (alloc(1, 0), '"size" must be positive'),
    (free(9), "free of id 9 on device 0, which is not live"),
    ('{"t": 0, "op": "alloc", "id": 1', "the line ends early"),
    ("{oops}", "malformed JSON at column 2"),
    (alloc(1, 8, dev=3), "is not below devices=1"),
    (alloc(1, 8, kind="weights"), 'unknown "kind"'),
])
def test_errors_name_file_and_line(tmp_path: pathlib.Path, line: str,
                                   reason: str) -> None:
    path = write(tmp_path / "bad.jsonl", [alloc(7, 64), line, free(7)])
    with pytest.raises(TraceError, match=reason) as info:
        tracefile.read_trace(path)
    assert info.value.line == 3
    assert str(info.value).startswith(f"{path}:3: ")


def test_truncated_last_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "cut.jsonl"
    write(path, [alloc(1, 64)])
    with open(path, "a") as f:
        f.write('{"t": 1, "op": "fr')
    with pytest.raises(TraceError, match="truncated line") as info:
        tracefile.read_trace(path)
    assert info.value.line == 3


def test_header_is_required(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nohead.jsonl"
    path.write_text(alloc(1, 64) + "\n")
    with pytest.raises(TraceError, match="missing header") as info:
        tracefile.read_trace(path)
    assert info.value.line == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TraceError, match="empty trace"):
        tracefile.read_trace(empty)
    with pytest.raises(TraceError, match="cannot read the trace"):
        tracefile.read_trace(tmp_path / "missing.jsonl")


def test_lenient_reading_skips_and_reports(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "damaged.jsonl", [
        alloc(1, 64), alloc(2, -1), free(2), "garbage", free(1),
        alloc(3, 0)])
    trace = tracefile.read_trace(path, lenient=True)
    assert [e.op for e in trace.events()] == ["alloc", "free"]
    assert [s.line for s in trace.skipped] == [3, 4, 5, 7]
    assert "negative" in trace.skipped[0].reason
    assert "not live" in trace.skipped[1].reason


def test_truncated_gzip(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    with TraceWriter(path, "cut") as w:
        for i in range(2000):
            w.alloc(i, 1000 + i)
    data = path.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated") as info:
        tracefile.read_trace(cut)
    assert info.value.line > 1
    trace = tracefile.read_trace(cut, lenient=True)
    assert 0 < len(trace) < 2000
    assert trace.skipped and "truncated" in trace.skipped[-1].reason
    garbage = tmp_path / "garbage.jsonl.gz"
    garbage.write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    with pytest.raises(TraceError, match="gzip"):
        tracefile.read_trace(garbage)


# -- RMM CSV -----------------------------------------------------------------


RMM = """Thread,Time,Action,Pointer,Size,Stream
140230,1634567890.000012,allocate,0x7f3a00000000,4194304,0x0
140230,1634567890.000020,allocate,0x7f3a00400000,1000,0x7f01
140230,1634567890.100000,deallocate,0x7f3a00000000,4194304,0x0
140230,1634567890.200000,free,0x7f3a00400000,1000,0x7f01
140230,1634567890.300000,allocate,0x7f3a00000000,64,0x0
"""


def test_reads_rmm_csv(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rmm_log.csv"
    path.write_text(RMM)
    trace = tracefile.read_trace(path)
    assert (trace.format, trace.name, trace.source) == \
        ("csv", "rmm_log", "rmm-csv")
    events = trace.events()
    assert [e.op for e in events] == ["alloc", "alloc", "free", "free",
                                      "alloc"]
    assert events[0].id == 0x7f3a00000000 and events[0].size == 4194304
    assert events[1].stream == 0x7f01
    assert events[0].t == 1634567890000012000


def test_csv_errors_name_the_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(RMM.replace("0x7f3a00400000,1000,", "0x7f3a00400000,-3,",
                                1))
    with pytest.raises(TraceError, match="negative Size") as info:
        tracefile.read_trace(path)
    assert info.value.line == 3


def test_convert_round_trips(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "rmm.csv"
    src.write_text(RMM)
    as_jsonl = tmp_path / "rmm.jsonl.gz"
    tracefile.convert(src, as_jsonl)
    back = tmp_path / "back.csv"
    tracefile.convert(as_jsonl, back)
    again = tmp_path / "again.jsonl"
    tracefile.convert(back, again)
    first = tracefile.read_trace(as_jsonl).events()
    assert tracefile.read_trace(again).events() == first
    assert tracefile.read_trace(back).events() == first
    lines = back.read_text().splitlines()
    assert lines[0] == tracefile.CSV_HEADER
    assert lines[1] == "0,1634567890.000012000,allocate,0x7f3a00000000,4194304,0x0"
    # Kinds and the header survive JSON lines -> JSON lines.
    with TraceWriter(tmp_path / "k.jsonl", "k", meta={"x": 1}) as w:
        w.alloc(1, 5, kind="grad")
    tracefile.convert(tmp_path / "k.jsonl", tmp_path / "k2.jsonl.gz")
    k2 = tracefile.read_trace(tmp_path / "k2.jsonl.gz")
    assert k2.events()[0].kind == "grad" and k2.meta == {"x": 1}


def test_csv_cannot_hold_two_devices(tmp_path: pathlib.Path) -> None:
    with TraceWriter(tmp_path / "two.jsonl", "two", devices=2) as w:
        w.alloc(1, 5, dev=1)
    with pytest.raises(ValueError, match="no device column"):
        tracefile.convert(tmp_path / "two.jsonl", tmp_path / "two.csv")
