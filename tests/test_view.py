"""`jaxlake view`: the lake's snapshots, the page's data, bad input, and the
page itself in a real headless browser.

The browser tests drive Debian's `chromium` through playwright (PyPI) by
its executable path (playwright's own browser downloads are not used);
.ci/run installs the package. Where either is missing they skip and say
why. Set JAXLAKE_VIEW_SHOTS=DIR to keep their screenshots.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import jaxlake
from jaxlake import _core
from jaxlake._src.bench import suite
from jaxlake._src.bench.replay import PolicyError, _options, device_bytes
from jaxlake._src.trace import tracefile
from jaxlake._src.trace.tracefile import TraceWriter
from jaxlake._src.view import api, model, page

MIB = 1 << 20
GRAN = 2 * MIB
ROOT = Path(__file__).resolve().parent.parent
BUCKETS = ROOT / "benchmarks" / "traces" / "lm-small-buckets-eval.jsonl.gz"
PER_TENSOR = ROOT / "benchmarks" / "traces" / "lm-small-per-tensor.jsonl.gz"
STATES = list(_core.alloc_state_names())
#: Where to keep the screenshots (read at import: the tests run with no
#: JAXLAKE_* variable set).
SHOTS = os.environ.get("JAXLAKE_VIEW_SHOTS")
FREE, LIVE, LENT, SLAB = 0, 1, 2, 3

pytest.importorskip("plotly", reason="jaxlake view needs plotly "
                                     "(pip install 'jaxlake[view]')")


def _page_data(path: Path) -> Dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="jaxlake-data">'
                  r'(.*?)</script>', text, re.S)
    assert m, "the page embeds its data"
    return json.loads(m.group(1))


def _write(path: Path, events: List[Tuple[Any, ...]], devices: int = 1,
           name: str = "t") -> Path:
    """events: ("a", id, size[, dev, stream, kind]) or ("f", id[, dev,
    stream])."""
    with TraceWriter(path, name, devices=devices) as w:
        for e in events:
            if e[0] == "a":
                _, i, size, *rest = e
                dev, stream, kind = (list(rest) + [0, 0, "temp"][len(rest):])
                w.alloc(i, size, dev=dev, stream=stream, kind=kind)
            else:
                _, i, *rest = e
                dev, stream = (list(rest) + [0, 0][len(rest):])
                w.free(i, dev=dev, stream=stream)
    return path


def _stitch_trace(path: Path) -> Path:
    """Three 4 MiB buffers, the outer two freed, then an 8 MiB one: the
    lake has no free block of four chunks and stitches the two holes."""
    return _write(path, [("a", 1, 4 * MIB), ("a", 2, 4 * MIB),
                         ("a", 3, 4 * MIB), ("f", 1), ("f", 3),
                         ("a", 4, 8 * MIB), ("f", 4), ("f", 2)])


def _lake_view(trace: tracefile.Trace, asked: List[int],
               stitch_snapshots: int = 0, capacity: Optional[int] = None,
               device: int = 0) -> Dict[str, Any]:
    size = capacity or device_bytes(int(trace.core.peak_live(device)))
    return dict(_core.lake_view(trace.core, _options(size, None), device,
                                asked, stitch_snapshots))


# -- the lake's snapshots -----------------------------------------------------


def test_snapshot_shows_a_stitch_over_the_chunks_it_borrows(
        tmp_path: Path) -> None:
    trace = tracefile.read_trace(_stitch_trace(tmp_path / "s.jsonl"))
    r = _lake_view(trace, asked=[4, 5, 7])
    served = list(r["served"])
    assert [STATES[s] if s != 255 else "-" for s in served] == \
        ["grow", "grow", "grow", "-", "-", "stitch", "-", "-"]
    assert r["stitches"] == 1 and r["oom_event"] is None
    snaps = {s["event"]: s for s in r["snapshots"]}
    assert sorted(snaps) == [4, 5, 7]
    before, after, end = snaps[4], snaps[5], snaps[7]
    # Before: three segments of two chunks, the outer two free: 8 MiB free
    # but no run longer than 4 MiB.
    assert [seg[2] for seg in before["segments"]] == [2, 2, 2]
    assert before["free_chunks"] == 4 and before["largest_free"] == 2
    assert before["stitched"] == []
    # After: one stitched range of two pieces over segments 1 and 3, its
    # chunks lent to it, nothing free.
    (rid, va, nchunks, used, cached, busy, pieces,
     address), = after["stitched"]
    assert address == va  # no free tail leads it
    assert (nchunks, used, cached, busy) == (4, 4, False, False)
    seg_ids = [seg[0] for seg in after["segments"]]
    assert sorted(p[0] for p in pieces) == [seg_ids[0], seg_ids[2]]
    assert all(p[1:] == (0, 2) for p in pieces)
    for seg in (after["segments"][0], after["segments"][2]):
        assert seg[3] == [(0, 2, LENT, rid, 0, False)]
    assert after["free_chunks"] == 0
    assert dict(after["live"])[va] == 5  # the stitched address is event 5's
    # The middle segment holds event 1's live allocation at its address.
    mid = after["segments"][1]
    (start, stop, state, _owner, address, _pending), = mid[3]
    assert state == LIVE and dict(after["live"])[address] == 1
    # At the end the range is cached (still mapped) and its chunks free.
    (_, _, _, used, cached, _, _, address), = end["stitched"]
    assert used == 0 and cached and address == 0
    assert end["free_chunks"] == 6 and end["live"] == []


def test_snapshots_agree_with_the_replay_of_the_jaxlake_policy() -> None:
    """Reserved bytes, states and counters of the snapshots match the
    replay engine's jaxlake policy run on the same trace."""
    trace = tracefile.read_trace(PER_TENSOR)
    n = len(trace)
    asked = list(range(0, n, 37))
    r = _lake_view(trace, asked=asked, stitch_snapshots=5)
    run = _core.replay(trace.core, "jaxlake",
                       _options(device_bytes(int(trace.core.peak_live(0))),
                                None), 0, n, False, 5)
    assert run.check_error == ""
    assert run.timeline_event == list(range(n))  # one point per event
    reserved = run.timeline_reserved
    counters = run.counters
    served = [STATES[s] for s in r["served"] if s != 255]
    for state in ("small", "fit", "split", "grow"):
        assert served.count(state) == counters[f"alloc_{state}"], state
    assert served.count("stitch_reuse") == counters["stitch_reuses"]
    assert r["stitches"] == counters["stitches"] > 0
    events = [s["event"] for s in r["snapshots"]]
    assert set(asked) <= set(events)
    stitch_snaps = [s for s in r["snapshots"] if s["stitch"]]
    assert 0 < len(stitch_snaps) <= 5
    for s in r["snapshots"]:
        gran = s["granularity"]
        segs = s["segments"]
        assert sum(seg[2] for seg in segs) * gran == reserved[s["event"]]
        free = largest = 0
        lent: Dict[int, int] = {}
        for (_sid, _va, nchunks, runs) in segs:
            at = 0
            for (start, stop, state, owner, _addr, _p) in runs:
                assert start == at and stop > start  # runs tile the segment
                at = stop
                if state == FREE:
                    free += stop - start
                    largest = max(largest, stop - start)
                elif state == LENT:
                    lent[owner] = lent.get(owner, 0) + stop - start
            assert at == nchunks
        assert (free, largest) == (s["free_chunks"], s["largest_free"])
        live_addrs = dict(s["live"])
        for (rid, _va, _n, used, cached, _busy, _pieces,
             address) in s["stitched"]:
            assert lent.get(rid, 0) == used and cached == (used == 0)
            # A range in use names its allocation's address, which is
            # live (also past a free tail that leads the range).
            assert (address in live_addrs) == (used > 0)
        for (_sid, _va, _n, runs) in segs:
            for (_a, _b, state, _o, addr, _p) in runs:
                if state == LIVE:
                    assert addr in live_addrs


def test_stitch_snapshots_are_thinned_to_the_budget(tmp_path: Path) -> None:
    events: List[Tuple[Any, ...]] = []
    ids = iter(range(1, 10**6))
    for _ in range(40):  # each round stitches two freed holes
        a, b, c = next(ids), next(ids), next(ids)
        events += [("a", a, 4 * MIB), ("a", b, 4 * MIB), ("a", c, 4 * MIB),
                   ("f", a), ("f", c)]
        d = next(ids)
        events += [("a", d, 8 * MIB + 4096 * (len(events) % 7 + 1))]
        # keep b and d live, so every round needs new holes
    trace = tracefile.read_trace(_write(tmp_path / "many.jsonl", events))
    full = _lake_view(trace, asked=[], stitch_snapshots=1000)
    assert full["stitches"] >= 30
    all_stitch = [s["event"] for s in full["snapshots"]]
    r = _lake_view(trace, asked=[0], stitch_snapshots=8)
    stitched = [s["event"] for s in r["snapshots"] if s["stitch"]]
    assert 4 <= len(stitched) <= 8
    assert set(stitched) <= set(all_stitch)
    # Spread over the run, not the first eight.
    assert stitched[0] == all_stitch[0]
    assert stitched[-1] > all_stitch[len(all_stitch) // 2]
    assert [s["event"] for s in r["snapshots"]][0] == 0  # asked kept


def test_snapshot_at_out_of_memory(tmp_path: Path) -> None:
    trace = tracefile.read_trace(_write(tmp_path / "oom.jsonl", [
        ("a", 1, 6 * MIB), ("a", 2, 6 * MIB), ("a", 3, 6 * MIB)]))
    r = _lake_view(trace, asked=[0], capacity=14 * MIB)
    assert r["oom_event"] == 2
    last = r["snapshots"][-1]
    assert last["event"] == 2 and last["oom"]
    assert sum(seg[2] for seg in last["segments"]) * GRAN == 12 * MIB
    assert list(r["served"])[2] == 255


# -- the page's data ----------------------------------------------------------


def test_view_writes_one_offline_page(tmp_path: Path) -> None:
    out = jaxlake.view(str(BUCKETS), tmp_path / "v.html")
    assert out == str(tmp_path / "v.html")
    text = Path(out).read_text(encoding="utf-8")
    # plotly.js is in the page; nothing is loaded from elsewhere.
    assert "plotly.js v" in text[:200_000] or "Plotly" in text
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)
    data = _page_data(Path(out))
    assert data["policies"] == ["jaxlake", "bfc", "torch", "torch-expandable",
                                "gmlake", "xla-vmm", "bfc-growth"]
    assert len(data["table"]["rows"]) == 7
    (dev,) = data["devices"]
    assert len(dev["timeline"]["policies"]) == 7
    assert dev["timeline"]["bucket"] == 1  # short: one point per event
    assert dev["bands"]["drawn"] == dev["bands"]["total"] > 100
    stitched = dev["served"]["stitch"] + dev["served"]["stitch-grow"]
    assert dev["stitches"] == stitched >= 1
    assert any(w.startswith("stitch") for s in dev["snapshots"]
               for w in s["why"])
    # The table is the one `jaxlake replay` prints.
    proc = _cli("replay", str(BUCKETS), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for row in data["table"]["rows"]:
        assert row[1] in proc.stdout and row[2] in proc.stdout


def test_bands_stack_to_the_live_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path / "b.jsonl", [
        ("a", 1, 3 * MIB, 0, 0, "param"), ("a", 2, 5 * MIB),
        ("a", 3, 7 * MIB), ("f", 2), ("a", 4, 1 * MIB), ("f", 1),
        ("f", 3)])
    data = model.build(tracefile.read_trace(path),
                       model.Settings(policies=["jaxlake"], capacity=None))
    dev = data["devices"][0]
    unit = dev["unit_bytes"]
    tops: Dict[int, float] = {}
    for k in dev["bands"]["kinds"]:
        for base, length, y, w in zip(k["base"], k["len"], k["y"], k["w"]):
            for x in range(base, base + length):
                tops[x] = max(tops.get(x, 0.0), (y + w / 2) * unit)
    live = [3, 8, 15, 10, 11, 8, 0]
    for x, want in enumerate(live[:-1]):
        assert abs(tops[x] - want * MIB) < 1024, (x, tops[x])
    # The 7 MiB allocation (event 2) moves down when the 5 MiB one below
    # it is freed (event 3), then again when the 3 MiB one is (event 5).
    temps = next(k for k in dev["bands"]["kinds"] if k["kind"] == "temp")
    pieces = [(b, n, y) for b, n, y, i in zip(temps["base"], temps["len"],
                                              temps["y"], temps["id"])
              if i == 2]
    assert [(b, n) for b, n, _ in pieces] == [(2, 1), (3, 2), (5, 1)]
    assert [y * unit / MIB for _, _, y in pieces] == [11.5, 6.5, 3.5]


def test_multi_device_and_policy_choice(tmp_path: Path) -> None:
    events: List[Tuple[Any, ...]] = []
    for dev in (0, 1):
        events += [("a", 1, (4 + dev) * MIB, dev), ("a", 2, 6 * MIB, dev),
                   ("f", 1, dev)]
    path = _write(tmp_path / "two.jsonl", events, devices=2)
    out = jaxlake.view(path, tmp_path / "two.html",
                       policies=["bfc", "jaxlake"], capacity="1.5x")
    data = _page_data(Path(out))
    assert data["policies"] == ["bfc", "jaxlake"]
    assert [d["device"] for d in data["devices"]] == [0, 1]
    assert data["devices"][1]["peak_live"] == 11 * MIB
    one = _page_data(Path(jaxlake.view(path, tmp_path / "one.html",
                                       device=1)))
    assert [d["device"] for d in one["devices"]] == [1]


def test_size_guard_on_a_million_events(tmp_path: Path,
                                        big_page: Path) -> None:
    size = big_page.stat().st_size
    assert size < 20_000_000, size
    data = _page_data(big_page)
    assert data["trace"]["events"] == 1_000_000
    text = " ".join(data["notes"] + data["devices"][0]["notes"])
    assert "the timeline shows the most of every 50 events" in text
    assert "bands: the" in text
    dev = data["devices"][0]
    assert len(dev["timeline"]["x"]) <= 20_000
    assert dev["stitches"] > 100
    assert any(w.startswith("stitch") for s in dev["snapshots"]
               for w in s["why"])


@pytest.fixture(scope="module")
def big_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page of a 10^6-event trace (synthetic, eager-like: many sizes,
    two streams)."""
    folder = tmp_path_factory.mktemp("big")
    path = folder / "eager-1m.jsonl.gz"
    with TraceWriter(path, "synthetic-eager-1m", source="synthetic") as w:
        suite._eager(w, random.Random(1), 1_000_000)
    return Path(jaxlake.view(path, folder / "eager-1m.html"))


# -- sources ------------------------------------------------------------------


def test_view_takes_a_lake_recording(tmp_path: Path) -> None:
    lake = jaxlake.Lake("sim", capacity=64 * MIB, record_trace=True)
    a = lake.allocate(4 * MIB)
    b = lake.allocate(4 * MIB)
    c = lake.allocate(4 * MIB)
    lake.free(a)
    lake.free(c)
    d = lake.allocate(8 * MIB)
    lake.free(d)
    lake.free(b)
    data = _page_data(Path(jaxlake.view(lake, tmp_path / "lake.html")))
    assert data["trace"]["events"] == 8
    assert data["devices"][0]["stitches"] == 1
    with pytest.raises(ValueError, match="record_trace=True"):
        jaxlake.view(jaxlake.Lake("sim", capacity=64 * MIB),
                     tmp_path / "x.html")


def test_view_takes_the_result_of_jaxlake_trace(tmp_path: Path) -> None:
    # jaxlake.trace() needs a GPU to record; the context manager it returns
    # names the file, which view() reads (here, one written beforehand).
    path = tmp_path / "run.jsonl"
    shutil.copyfile(_stitch_trace(tmp_path / "src.jsonl"), path)
    recording = jaxlake.trace(str(path))
    data = _page_data(Path(jaxlake.view(recording, tmp_path / "run.html")))
    assert data["trace"]["events"] == 8
    with pytest.raises(TypeError, match="jaxlake.Recorder"):
        jaxlake.view(42, tmp_path / "x.html")  # type: ignore[arg-type]


def test_view_takes_a_recorder_open_or_closed(tmp_path: Path) -> None:
    jax = pytest.importorskip(
        "jax", reason="the recorder needs jax (pip install 'jaxlake[test]', "
        "on Python 3.11 and newer)")
    from jax._src import xla_bridge
    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")
    import jax.numpy as jnp
    from jaxlake._src.trace import recorder
    try:
        recorder.gpu_devices(1)
    except recorder.RecorderError as e:
        pytest.skip(f"device-less CUDA compilation is not available: {e}")
    rec = jaxlake.Recorder(str(tmp_path / "rec.jsonl.gz"), "rec")
    step = rec.wrap(jax.jit(lambda x: jnp.tanh(x @ x) * 2), "step", "output")
    x = rec.device_put(jnp.ones((512, 512), jnp.float32))
    for _ in range(3):
        x = step(x)
    # Still recording: what is written so far.
    open_data = _page_data(Path(jaxlake.view(rec, tmp_path / "open.html")))
    assert open_data["trace"]["events"] > 3
    rec.close()
    closed = _page_data(Path(jaxlake.view(rec, tmp_path / "closed.html")))
    assert closed["trace"]["events"] >= open_data["trace"]["events"]


# -- bad input ----------------------------------------------------------------


def _bad(tmp_path: Path) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"format":"jaxlake-trace","version":1,"name":"bad",'
                    '"devices":1}\n{"t":0,"op":"alloc","id":1,"size":5}\n'
                    '{"t":1,"op":"alloc","id":2,"size":-3}\n')
    return path


def _cli(*args: str, cwd: Optional[Path] = None
         ) -> "subprocess.CompletedProcess[str]":
    # Not from the source folder: `python -m` puts the current folder
    # first on sys.path, and the tests use the installed package.
    return subprocess.run([sys.executable, "-m", "jaxlake", *args],
                          capture_output=True, text=True,
                          cwd=cwd or tempfile.gettempdir())


def test_bad_input(tmp_path: Path) -> None:
    bad = _bad(tmp_path)
    with pytest.raises(tracefile.TraceError, match=r"bad.jsonl:3: .*size"):
        jaxlake.view(bad, tmp_path / "v.html")
    view_run = _cli("view", str(bad), "-o", str(tmp_path / "v.html"))
    replay_run = _cli("replay", str(bad))
    assert view_run.returncode == replay_run.returncode == 1
    assert view_run.stderr.replace("jaxlake view", "jaxlake replay") == \
        replay_run.stderr
    assert "bad.jsonl:3:" in view_run.stderr
    assert not (tmp_path / "v.html").exists()

    with pytest.raises(PolicyError, match="did you mean 'torch'"):
        jaxlake.view(BUCKETS, tmp_path / "v.html", policies=["trch"])
    run = _cli("view", str(BUCKETS), "--policy", "jaxlake,gmlak",
               "-o", str(tmp_path / "v.html"))
    assert run.returncode == 2 and "did you mean 'gmlake'" in run.stderr

    missing = tmp_path / "no" / "such" / "v.html"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        jaxlake.view(BUCKETS, missing)
    run = _cli("view", str(BUCKETS), "-o", str(missing))
    assert run.returncode == 1
    assert f"the folder {missing.parent} does not exist" in run.stderr

    run = _cli("view", str(BUCKETS), "--device", "2", "-o",
               str(tmp_path / "v.html"))
    assert run.returncode == 2 and "device 2 is not in the trace" in \
        run.stderr


def test_a_trace_with_no_events_still_writes_a_page(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    with TraceWriter(path, "empty"):
        pass
    run = _cli("view", str(path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "wrote empty.html" in run.stdout
    data = _page_data(tmp_path / "empty.html")
    assert data["empty"] and "no events" in data["empty"]
    assert data["devices"] == []


def test_missing_plotly_is_named(monkeypatch: pytest.MonkeyPatch,
                                 tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    with pytest.raises(page.MissingPlotlyError, match=r"jaxlake\[view\]"):
        jaxlake.view(BUCKETS, tmp_path / "v.html")


# -- in a real browser --------------------------------------------------------


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium on PATH (Debian: apt-get install chromium; "
                ".ci/run installs it)")
    raise AssertionError  # unreachable


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api",
        reason="playwright is not installed (pip install 'jaxlake[test]')")
    executable = _chromium()
    with sync_api.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=executable,
                                  args=["--no-sandbox"])
        except Exception as e:  # a broken or incompatible chromium
            pytest.skip(f"chromium at {executable} did not start under "
                        f"playwright: {e}")
        yield b
        b.close()


class Page:
    """A page opened in the browser, with its console errors and any
    request that left the file."""

    def __init__(self, browser: Any, path: Path,
                 height: int = 1800) -> None:
        self.page = browser.new_page(viewport={"width": 1400,
                                               "height": height})
        self.errors: List[str] = []
        self.requests: List[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text)
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

        def route(r: Any) -> None:
            if not r.request.url.startswith("file:"):
                self.requests.append(r.request.url)
                r.abort()
            else:
                r.continue_()
        self.page.route("**/*", route)
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready='1']", timeout=120_000)

    def js(self, code: str) -> Any:
        return self.page.evaluate(code)

    def map_pixels(self) -> str:
        return str(self.js("document.getElementById('map-canvas')"
                           ".toDataURL()"))

    def shot(self, tmp_path: Path, name: str) -> Path:
        folder = Path(SHOTS) if SHOTS else tmp_path
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / name
        self.page.screenshot(path=str(out), full_page=True)
        assert out.stat().st_size > 20_000
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        return out

    def close(self) -> None:
        assert self.errors == [], self.errors
        assert self.requests == [], self.requests
        self.page.close()


def test_page_in_the_browser(browser: Any, tmp_path: Path) -> None:
    out = jaxlake.view(BUCKETS, tmp_path / "buckets.html")
    p = Page(browser, Path(out))
    # The four parts, with one row and one line per policy.
    assert p.js("document.querySelectorAll('#summary tr.policy-row')"
                ".length") == 7
    names = p.js("document.getElementById('timeline').data"
                 ".map(t => t.name)")
    assert names[0] == "live"
    assert [n for n in names if n.endswith(" reserved")] == [
        f"{x} reserved" for x in ("jaxlake", "bfc", "torch",
                                  "torch-expandable", "gmlake", "xla-vmm",
                                  "bfc-growth")]
    assert "jaxlake stitch" in names
    assert p.js("document.querySelectorAll('#timeline .scatterlayer .trace')"
                ".length") >= 6
    kinds = p.js("document.getElementById('bands').data.map(t => t.name)")
    assert {"param", "opt_state", "temp"} <= set(kinds)
    assert p.js("document.querySelectorAll('#bands .bars path').length") \
        > 100
    assert p.js("document.getElementById('device-box').hidden") is True
    assert p.js("document.getElementById('device').options.length") == 1
    # The memory map is drawn; moving the event selector changes it.
    assert int(p.js("document.getElementById('map-canvas').height")) > 50
    first_event = p.js("document.getElementById('map-canvas')"
                       ".dataset.event")
    first_pixels = p.map_pixels()
    stats = p.js("document.getElementById('map-stats').innerText")
    assert "largest free run" in stats and "stitched ranges" in stats
    p.shot(tmp_path, "view-buckets.png")
    slider = p.page.locator("#event-slider")
    slider.focus()
    for _ in range(60):
        p.page.keyboard.press("ArrowRight")
    assert p.js("document.getElementById('map-canvas').dataset.event") != \
        first_event
    assert p.map_pixels() != first_pixels
    assert p.js("document.getElementById('event-label').textContent") \
        .startswith("event ")
    # A hover on a chunk names what it holds.
    p.page.locator("#map-canvas").scroll_into_view_if_needed()
    box = p.page.locator("#map-canvas").bounding_box()
    cx, cy = p.js("(() => { const g = window.jaxlakeView.state.layout"
                  ".geometry; const r = g.rows[0]; return [r.x + g.cell / 2,"
                  " r.y + g.ch / 2]; })()")
    p.page.mouse.move(box["x"] + cx, box["y"] + cy)
    assert p.js("document.getElementById('tooltip').hidden") is False
    assert "segment" in p.js("document.getElementById('tooltip').innerText")
    # A click on the timeline picks the snapshot nearest that event.
    p.js("window.jaxlakeView.setSnapshot(0)")
    assert p.js("document.getElementById('map-canvas').dataset.event") == "0"
    p.page.locator("#timeline").scroll_into_view_if_needed()
    plot = p.page.locator("#timeline .nsewdrag").first.bounding_box()
    p.page.mouse.click(plot["x"] + plot["width"] * 0.6,
                       plot["y"] + plot["height"] * 0.5)
    clicked = int(p.js("document.getElementById('map-canvas')"
                       ".dataset.event"))
    assert 0.45 * 347 < clicked < 0.75 * 347
    p.close()


def test_multi_device_page_in_the_browser(browser: Any,
                                          tmp_path: Path) -> None:
    events: List[Tuple[Any, ...]] = []
    for dev in (0, 1):
        ids = iter(range(1, 1000))
        for _ in range(5 + 5 * dev):
            a, b = next(ids), next(ids)
            events += [("a", a, (3 + dev) * MIB, dev), ("a", b, 5 * MIB, dev),
                       ("f", a, dev)]
    path = _write(tmp_path / "two.jsonl", events, devices=2)
    out = jaxlake.view(path, tmp_path / "two.html",
                       policies=["jaxlake", "bfc"])
    p = Page(browser, Path(out))
    assert p.js("document.getElementById('device-box').hidden") is False
    assert p.js("document.getElementById('device').options.length") == 2
    assert p.js("document.querySelectorAll('#summary tr.policy-row')"
                ".length") == 2
    names = p.js("document.getElementById('timeline').data"
                 ".map(t => t.name)")
    assert [n for n in names if n.endswith(" reserved")] == [
        "jaxlake reserved", "bfc reserved"]
    before = p.js("document.getElementById('map-stats').innerText")
    p.page.select_option("#device", "1")
    after = p.js("document.getElementById('map-stats').innerText")
    assert before != after
    assert p.js("document.getElementById('device').value") == "1"
    p.shot(tmp_path, "view-two-devices.png")
    p.close()


def test_empty_page_in_the_browser(browser: Any, tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    with TraceWriter(path, "empty"):
        pass
    p = Page(browser, Path(jaxlake.view(path, tmp_path / "empty.html")))
    assert "no events" in p.js("document.getElementById('empty').innerText")
    assert p.js("document.getElementById('timeline-section').hidden") is True
    p.shot(tmp_path, "view-empty.png")
    p.close()


def test_large_page_in_the_browser(browser: Any, tmp_path: Path,
                                   big_page: Path) -> None:
    p = Page(browser, big_page, height=1400)
    notes = p.js("document.getElementById('notes').innerText")
    assert "1,000,000 events" in notes and "bands: the" in notes
    p.shot(tmp_path, "view-1m-events.png")
    before = p.map_pixels()
    p.js("window.jaxlakeView.setSnapshot(0)")
    assert p.map_pixels() != before
    p.close()
