"""Replays of trace files through the policies.

The policy models themselves are pinned by tests/cc/replay_test.cc and
tests/cc/policy_conformance_test.cc; here the Python side: capacities, the
results and their figures, the driver-time model, lake options and the
preallocating policies. The trace file format is tested in
test_tracefile.py.
"""

from __future__ import annotations

import json
import pathlib
from typing import List

import pytest

from jaxlake import _core
from jaxlake._src.bench import suite as bench
from jaxlake._src.bench import replay
from jaxlake._src.trace import tracefile
from jaxlake._src.trace.tracefile import TraceWriter
from trace_util import MIB, alloc, free, write


# -- replay ------------------------------------------------------------------


def hand_trace(tmp_path: pathlib.Path) -> tracefile.Trace:
    # Live: 3 MiB; 3 MiB + 1000 B; 1000 B; 5 MiB + 1000 B.
    return tracefile.read_trace(write(tmp_path / "hand.jsonl", [
        alloc(1, 3 * MIB), alloc(2, 1000), free(1), alloc(3, 5 * MIB)]))


def test_replay_figures(tmp_path: pathlib.Path) -> None:
    trace = hand_trace(tmp_path)
    r = replay.replay(trace, "bfc")
    # BFC: regions of 4 MiB (3 MiB), 4 MiB (1000 B; 3 MiB held the whole
    # first one) and 8 MiB (5 MiB).
    assert r.peak_live == 5 * MIB + 1000
    assert r.peak_reserved == 16 * MIB
    assert r.waste == 16 * MIB - r.peak_live
    assert r.utilisation == pytest.approx(r.peak_live / (16 * MIB))
    # Each cudaMalloc: create, map and set_access (its memory is accessible).
    assert r.calls["create"] == 3 and r.calls["set_access"] == 3
    assert r.memory_calls == 9
    assert (r.events, r.allocs, r.frees) == (4, 3, 1)
    assert r.oom is None and r.capacity is None
    assert r.timeline_live == [3 * MIB, 3 * MIB + 1000, 1000, 5 * MIB + 1000]
    assert r.median_ns >= 0 and r.events_per_s > 0
    data = r.to_json()
    json.dumps(data)
    assert data["memory_calls"] == 9


def test_timing_rounds_pool_call_times(tmp_path: pathlib.Path) -> None:
    trace = hand_trace(tmp_path)
    once = replay.replay(trace, "jaxlake", rounds=1)
    pooled = replay.replay(trace, "jaxlake", rounds=4)
    assert (once.timing_rounds, pooled.timing_rounds) == (1, 4)
    # The figures other than times are those of one replay.
    assert (pooled.allocs, pooled.peak_reserved, pooled.calls) == \
        (once.allocs, once.peak_reserved, once.calls)
    assert pooled.to_json()["timing_rounds"] == 4
    # By default a short trace is timed over several replays, a long one
    # once.
    assert replay.replay(trace, "bfc").timing_rounds == \
        replay.MAX_TIMING_ROUNDS
    assert replay.timing_rounds(replay.TIMED_CALLS) == 1
    assert replay.timing_rounds(replay.TIMED_CALLS // 4) == 4
    assert replay.timing_rounds(0) == 1
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        replay.replay(trace, "bfc", rounds=0)


def test_granularity_bound_on_utilisation(tmp_path: pathlib.Path) -> None:
    # Peak live 5 MiB + 1000 B: no policy holds less than three 2 MiB
    # chunks.
    r = replay.replay(hand_trace(tmp_path), "jaxlake")
    assert r.min_reserved == 6 * MIB
    assert r.best_utilisation == pytest.approx((5 * MIB + 1000) / (6 * MIB))
    assert r.utilisation <= r.best_utilisation
    assert r.to_json()["min_reserved"] == 6 * MIB


def test_capacity_reports_the_failing_event(tmp_path: pathlib.Path) -> None:
    trace = hand_trace(tmp_path)
    capacity = replay.Capacity.parse("10MiB")
    results = {name: replay.replay(trace, name, capacity)
               for name in replay.policy_names()}
    bfc = results["bfc"]
    assert bfc.capacity == 10 * MIB
    assert bfc.oom is not None
    # 8 MiB held, 5 MiB more needed at the 4th event (line 5).
    assert (bfc.oom.event, bfc.oom.line, bfc.oom.size) == (3, 5, 5 * MIB)
    assert bfc.oom.reserved == 8 * MIB
    assert "line 5" in bfc.oom.describe()
    assert results["jaxlake"].oom is None
    # Policies that fit are not replayed again: same peaks.
    assert results["jaxlake"].capped_peak_reserved == \
        results["jaxlake"].peak_reserved


def test_capacity_parsing() -> None:
    parse = replay.Capacity.parse
    assert parse("none") is None and parse(None) is None and parse("") is None
    assert parse("16GiB") == replay.Capacity(nbytes=16 << 30)
    assert parse("1.25x") == replay.Capacity(factor=1.25)
    assert parse(4096) == replay.Capacity(nbytes=4096)
    assert parse("1.1x").bytes_for(100 * MIB) == 110 * MIB
    assert parse("1x").bytes_for(3 * MIB + 1) == 4 * MIB  # whole granules
    for bad in ("lots", "-1x", "12 parsecs"):
        with pytest.raises(ValueError, match="capacity"):
            parse(bad)


def test_unknown_policy() -> None:
    with pytest.raises(replay.PolicyError, match="did you mean 'gmlake'") as e:
        replay.check_policies(["gmlak"])
    assert ("jaxlake, bfc, torch, torch-expandable, gmlake, xla-vmm, "
            "bfc-growth") in str(e.value)
    assert replay.policy_names() == ("jaxlake", "bfc", "torch",
                                     "torch-expandable", "gmlake", "xla-vmm",
                                     "bfc-growth")


def test_two_devices_add_up(tmp_path: pathlib.Path) -> None:
    with TraceWriter(tmp_path / "two.jsonl", "two", devices=2) as w:
        w.alloc(1, 3 * MIB, dev=0)
        w.alloc(1, 5 * MIB, dev=1)
        w.free(1, dev=0)
        w.free(1, dev=1)
    trace = tracefile.read_trace(tmp_path / "two.jsonl")
    r = replay.replay(trace, "torch", capacity="1x")
    assert r.devices == 2
    assert r.peak_live == 8 * MIB
    assert r.peak_reserved == 40 * MIB  # a 20 MiB segment per device
    # Capacities of 4 and 6 MiB (1x the peak live, whole granules): each
    # first request wants a 20 MiB segment; device 0 fails first.
    assert r.oom is not None and (r.oom.event, r.oom.device) == (0, 0)
    assert r.capacity == 6 * MIB  # the larger device's


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> List[str]:
    return bench.write_synthetic(str(tmp_path_factory.mktemp("syn")),
                                 scale=0.05)


def test_capped_policies_that_fit_behave_as_uncapped(
        synthetic: List[str]) -> None:
    """replay() skips the capped run of a policy whose uncapped peak fits:
    replaying it under exactly its uncapped peak must change nothing."""
    for path in synthetic:
        trace = tracefile.read_trace(path)
        for policy in replay.policy_names():
            free_run = replay.replay(trace, policy, timing=False)
            options = _core.PolicyOptions()
            options.capacity = max(free_run.peak_reserved, 2 * MIB)
            capped = _core.replay(trace.core, policy, options, 0, 0, False,
                                  0)
            assert capped.oom is None, (path, policy)
            assert capped.peak_reserved == free_run.peak_reserved
            assert capped.calls == free_run.calls


def test_every_policy_keeps_its_invariants(synthetic: List[str]) -> None:
    for path in synthetic:
        trace = tracefile.read_trace(path)
        for policy in replay.policy_names():
            r = replay.replay(trace, policy, capacity="1.05x",
                              check_every=101)
            assert r.peak_reserved >= r.peak_live
            assert 0 < r.utilisation <= 1


def test_loads_and_replays_a_million_events_in_seconds(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "big.jsonl.gz"
    with TraceWriter(path, "big", source="synthetic") as w:
        rng = __import__("random").Random(3)
        live: List[int] = []
        nid = 0
        while w.events < 1_000_000:
            if live and (len(live) > 300 or rng.random() < 0.5):
                w.free(live.pop(rng.randrange(len(live))))
            else:
                nid += 1
                w.alloc(nid, rng.randrange(1, 64 * MIB))
                live.append(nid)
    # The speeds themselves are measured and reported by the benchmark
    # (docs/results/suite.md, "Speed": 0.27 s to load, millions of events per
    # second); the bounds here are ten times looser, so that a loaded
    # machine passes and only an order-of-magnitude regression fails.
    import time
    start = time.perf_counter()
    trace = tracefile.read_trace(path)
    load = time.perf_counter() - start
    assert len(trace) == 1_000_000
    assert load < 30
    for policy in ("bfc", "torch"):
        r = replay.replay(trace, policy, timing=True)
        assert r.events == 1_000_000 and r.allocs + r.frees == 1_000_000
        assert r.events_per_s > 1e5, (policy, r.events_per_s)


# -- driver time and the steady state ------------------------------------------


def latency_file(path: pathlib.Path, calls: object, **head: object) -> str:
    data = {"format": "jaxlake-driver-latency", "version": 1,
            "source": "test", "calls": calls, **head}
    path.write_text(json.dumps(data))
    return str(path)


def steps_trace(path: pathlib.Path, steps: int = 6) -> str:
    """Parameters made once, then identical steps: a temp buffer and
    mid-size outputs replacing the previous step's."""
    with TraceWriter(str(path), "steps") as w:
        ids = iter(range(1, 1 << 30))
        params = []
        for _ in range(8):
            i = next(ids)
            w.alloc(i, 2 * MIB + MIB // 4, kind="param")
            params.append(i)
        for _ in range(steps):
            temp = next(ids)
            w.alloc(temp, 96 * MIB + 4096, kind="temp")
            fresh = []
            for _ in params:
                i = next(ids)
                w.alloc(i, 2 * MIB + MIB // 4, kind="param")
                fresh.append(i)
            for i in params:
                w.free(i)
            params = fresh
            w.free(temp)
    return str(path)


def test_latency_file_replaces_the_model_kind_by_kind(
        tmp_path: pathlib.Path) -> None:
    trace = tracefile.read_trace(steps_trace(tmp_path / "s.jsonl"))
    plain = replay.replay(trace, "jaxlake")
    assert plain.latency_source == "defaults"
    assert plain.driver_ms > 0
    # map: 1000 us at any size; other kinds keep their defaults.
    lat = replay.Latency.load(latency_file(
        tmp_path / "l.json", {"map": [{"bytes": 2 * MIB, "us": 1000}]}))
    for policy in ("jaxlake", "gmlake", "torch-expandable"):
        r = replay.replay(trace, policy, latency=lat)
        assert r.driver_us["map"] == pytest.approx(1000 * r.calls["map"])
        base = replay.replay(trace, policy)
        assert r.driver_us["create"] == pytest.approx(
            base.driver_us["create"])
    assert lat.source == "test"
    # Interpolation between points, as the format says.
    m = replay.Latency.parse({
        "format": "jaxlake-driver-latency", "version": 1,
        "calls": {"create": [{"bytes": 2 * MIB, "us": 10},
                             {"bytes": 6 * MIB, "us": 30}]}}).model()
    assert m.us("create", 4 * MIB) == pytest.approx(20)
    assert m.us("create", 10 * MIB) == pytest.approx(50)


@pytest.mark.parametrize("calls, head, message", [
    ({"mmap": [{"bytes": 1, "us": 1}]}, {}, "unknown call kind 'mmap'"),
    ({"map": [{"bytes": 4, "us": 1}, {"bytes": 2, "us": 1}]}, {},
     "sorted by bytes"),
    ({"map": [{"bytes": 0, "us": 1}]}, {}, "calls.map[0].bytes"),
    ({"map": [{"bytes": 2, "us": -1}]}, {}, "calls.map[0].us"),
    ({"map": []}, {}, "non-empty list"),
    ({}, {"format": "other"}, '"format"'),
    ({}, {"version": 2}, '"version"'),
])
def test_bad_latency_files_are_refused_by_name(
        tmp_path: pathlib.Path, calls: object, head: object,
        message: str) -> None:
    path = latency_file(tmp_path / "l.json", calls, **head)  # type: ignore
    with pytest.raises(replay.LatencyError) as e:
        replay.Latency.load(path)
    assert message in str(e.value)
    assert path in str(e.value)


def test_steady_state_calls(tmp_path: pathlib.Path) -> None:
    trace = tracefile.read_trace(steps_trace(tmp_path / "s.jsonl"))
    lake = replay.replay(trace, "jaxlake")
    assert lake.memory_calls > 0
    assert lake.steady_calls == 0  # the second half reuses the first's
    assert lake.steady_driver_ms == 0
    gm = replay.replay(trace, "gmlake")
    assert gm.steady_calls <= gm.memory_calls
    data = lake.to_json(timeline=False)
    assert data["steady_calls"] == 0 and data["driver_ms"] > 0


def _cli(argv: List[str]) -> "tuple[int, str]":
    import argparse
    import io
    from jaxlake._src.bench import cli as bench_cli
    parser = argparse.ArgumentParser(prog="jaxlake")
    bench_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    out = io.StringIO()
    return args.func(args, out), out.getvalue()


def test_bench_and_replay_report_driver_time(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "suite"
    folder.mkdir()
    steps_trace(folder / "steps.jsonl")
    lat = latency_file(tmp_path / "l.json",
                       {"create": [{"bytes": 2 * MIB, "us": 100}]})
    code, out = _cli(["bench", "--suite", str(folder), "--no-plots",
                      "--no-progress", "--out", str(tmp_path / "out"),
                      "--latency", lat, "--wide"])
    assert code == 0
    head = out.splitlines()[2]
    for column in ("driver", "2nd calls", "2nd driver"):
        assert column in head
    assert "estimated driver time, suite total (ms): jaxlake" in out
    assert "(latency model: test)" in out
    assert ("jaxlake driver memory calls in the second half of each trace: "
            "0 on 1/1 traces") in out
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["latency"] == "test"
    r = data["traces"][0]["results"]["bfc"]
    assert r["driver_us"]["create"] == pytest.approx(
        100 * r["calls"]["create"])
    code, out = _cli(["replay", str(folder / "steps.jsonl"), "--latency",
                      lat, "-p", "jaxlake"])
    assert code == 0 and "2nd driver" in out
    bad = latency_file(tmp_path / "bad.json", {"maps": []})
    code, _ = _cli(["replay", str(folder / "steps.jsonl"), "--latency", bad])
    assert code == 1
    assert "unknown call kind 'maps'" in capsys.readouterr().err


def test_driver_model_items_scale_kinds_and_set_terms(
        tmp_path: pathlib.Path) -> None:
    defaults = replay._core().LatencyModel()
    lat = replay.Latency.from_spec(
        "create=8us,unmap=0.1ms,devices=8,peer=10us,first_set_access=1ms")
    m = lat.model()
    # A kind's points scale so that 2 MiB costs the time given.
    assert m.us("create", 2 * MIB) == pytest.approx(8)
    ratio = 8 / defaults.us("create", 2 * MIB)
    assert m.us("create", 1 << 30) == pytest.approx(
        defaults.us("create", 1 << 30) * ratio)
    assert m.us("unmap", 2 * MIB) == pytest.approx(100)
    assert m.us("map", 2 * MIB) == pytest.approx(defaults.us("map", 2 * MIB))
    assert (m.devices, m.peer_us, m.first_set_access_us) == (8, 10, 1000)
    assert m.call_us("set_access", 2 * MIB) == pytest.approx(
        defaults.us("set_access", 2 * MIB) + 7 * 10)
    assert "create=8us" in lat.source
    # A file (the GPU check's output, with its terms), then an item.
    path = latency_file(tmp_path / "l.json",
                        {"create": [{"bytes": 2 * MIB, "us": 50},
                                    {"bytes": 4 * MIB, "us": 60}]},
                        terms={"peer_us": 3, "devices": 2})
    both = replay.Latency.from_spec(f"{path},create=5us").model()
    assert both.us("create", 2 * MIB) == pytest.approx(5)
    assert both.us("create", 4 * MIB) == pytest.approx(6)
    assert (both.devices, both.peer_us) == (2, 3)
    # Each policy pays the terms: more devices, more access time.
    trace = tracefile.read_trace(steps_trace(tmp_path / "s.jsonl"))
    one = replay.replay(trace, "bfc")
    eight = replay.replay(trace, "bfc", latency=replay.Latency.from_spec(
        "devices=8,peer=10us"))
    assert eight.driver_us["set_access"] == pytest.approx(
        one.driver_us["set_access"] + 70 * one.calls["set_access"])


@pytest.mark.parametrize("spec, message", [
    ("create=8", "'8' is not a time"),
    ("crate=8us", "unknown name 'crate'"),
    ("devices=0", "devices must be a whole number"),
    ("devices=2.5", "not a whole number of devices"),
    ("peer=-1us", "is not a time"),
    ("create=8us,,map=1us", "an empty item"),
    ("", "empty"),
])
def test_bad_driver_model_items_are_usage_errors(
        tmp_path: pathlib.Path, spec: str, message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(replay.DriverModelError) as e:
        replay.Latency.from_spec(spec)
    assert message in str(e.value)
    trace = steps_trace(tmp_path / "s.jsonl")
    code, _ = _cli(["replay", trace, "-p", "bfc", "--driver-model", spec])
    assert code == 2
    assert message in capsys.readouterr().err


def test_driver_model_file_errors_are_input_errors(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = steps_trace(tmp_path / "s.jsonl")
    bad = latency_file(tmp_path / "bad.json", {"create": []})
    code, _ = _cli(["replay", trace, "-p", "bfc", "--driver-model",
                    f"create=8us,{bad}"])
    assert code == 1
    assert "calls.create must be a non-empty list" in capsys.readouterr().err
    terms = latency_file(tmp_path / "t.json", {}, terms={"devices": 0})
    code, _ = _cli(["replay", trace, "-p", "bfc", "--driver-model", terms])
    assert code == 1
    assert "terms.devices must be a whole number" in \
        capsys.readouterr().err
    code, _ = _cli(["replay", trace, "-p", "bfc", "--driver-model",
                    "create=8us", "--latency", terms])
    assert code == 2
    assert "give one of them" in capsys.readouterr().err


def test_reads_the_gpu_checks_latency_sample() -> None:
    """The file benchmarks/gpu/latency.py writes (a checked-in sample over
    the fake driver) is what --latency reads."""
    sample = (pathlib.Path(__file__).resolve().parents[1] / "benchmarks" /
              "gpu" / "latency-sample-fake.json")
    lat = replay.Latency.load(str(sample))
    assert {"create", "map", "set_access", "unmap", "release"} <= set(
        lat.calls)
    model = lat.model()
    first = lat.calls["map"][0]
    assert model.us("map", first[0]) == pytest.approx(first[1])


def test_a_gpu_check_file_feeds_the_model(
        tmp_path: pathlib.Path) -> None:
    """The GPU check's output, in the shape latency.py writes on a GPU of
    several devices (benchmarks/gpu/latency-sample-handwritten.json, a
    hand-written sample: no GPU here), sets the model's points and terms
    through --driver-model."""
    sample = (pathlib.Path(__file__).resolve().parents[1] / "benchmarks" /
              "gpu" / "latency-sample-handwritten.json")
    doc = json.loads(sample.read_text())
    assert "HAND-WRITTEN SAMPLE" in doc["source"]
    lat = replay.Latency.from_spec(str(sample))
    m = lat.model()
    for kind, points in doc["calls"].items():
        for p in points:
            assert m.us(kind, p["bytes"]) == pytest.approx(p["us"])
    assert m.peer_us == doc["terms"]["peer_us"]
    assert m.first_set_access_us == doc["terms"]["first_set_access_us"]
    # With eight devices the grant costs its points plus seven peers.
    eight = replay.Latency.from_spec(f"{sample},devices=8").model()
    assert eight.call_us("set_access", 2 * MIB) == pytest.approx(30 + 70)
    folder = tmp_path / "suite"
    folder.mkdir()
    steps_trace(folder / "steps.jsonl")
    code, out = _cli(["bench", "--suite", str(folder), "--no-plots",
                      "--no-progress", "--out", str(tmp_path / "out"),
                      "-p", "jaxlake,bfc", "--driver-model", str(sample)])
    assert code == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["latency"].startswith("HAND-WRITTEN SAMPLE")
    r = data["traces"][0]["results"]["bfc"]
    # bfc's first region is created at its size: the file's create curve.
    assert r["driver_us"]["create"] > 0


def test_lake_options_reach_the_replayed_lake(
        tmp_path: pathlib.Path) -> None:
    path = steps_trace(tmp_path / "s.jsonl")
    trace = tracefile.read_trace(path)
    plain = replay.replay(trace, "jaxlake", fit=True)
    step = replay.replay(trace, "jaxlake", fit=True,
                         options={"lake_grow_min": 256 * MIB})
    # One 256 MiB segment holds the whole trace (peak live 132 MiB).
    assert plain.peak_reserved < 160 * MIB
    assert step.peak_reserved == 256 * MIB
    out_json = tmp_path / "r.json"
    code, out = _cli(["replay", path, "-p", "jaxlake", "--json",
                      str(out_json), "--lake-option", "grow_min=256MiB",
                      "--lake-option", "stitch-cache=0"])
    assert code == 0
    assert "lake options grow_min=256MiB, stitch_cache=0" in out
    data = json.loads(out_json.read_text())
    assert data["lake_options"] == {"grow_min": "256MiB", "stitch_cache": "0"}
    r = data["results"]["jaxlake"]
    assert r["peak_reserved"] == step.peak_reserved
    assert r["fit_capacity"] == step.fit_capacity
    # bench passes them to every trace, and says so.
    folder = tmp_path / "suite"
    folder.mkdir()
    steps_trace(folder / "steps.jsonl")
    code, out = _cli(["bench", "--suite", str(folder), "--no-plots",
                      "--no-progress", "--out", str(tmp_path / "out"),
                      "-p", "jaxlake", "--lake-option", "grow_min=256MiB"])
    assert code == 0 and "lake options grow_min=256MiB" in out
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["lake_options"] == {"grow_min": "256MiB"}
    res = data["traces"][0]["results"]["jaxlake"]
    assert res["peak_reserved"] == 256 * MIB


@pytest.mark.parametrize("option, message", [
    ("grow_min", "expected NAME=VALUE"),
    ("backend=sim", "'backend' is not a lake option a replay can set"),
    ("capacity=1GiB", "the device size is --capacity"),
    ("grow_min=lots", "option --lake-option grow_min='lots' is invalid"),
    ("alignment=300", "not a power of two"),
])
def test_bad_lake_options_are_refused_by_name(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
        option: str, message: str) -> None:
    path = steps_trace(tmp_path / "s.jsonl", steps=1)
    with pytest.raises(SystemExit) as e:
        _cli(["replay", path, "-p", "jaxlake", "--lake-option", option])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_lake_options_the_lake_refuses_are_a_usage_error(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = steps_trace(tmp_path / "s.jsonl", steps=1)
    code, _ = _cli(["replay", path, "-p", "jaxlake",
                    "--lake-option", "small_limit=4MiB"])
    assert code == 2
    assert "is larger than one small slab" in capsys.readouterr().err


def hole_trace(path: pathlib.Path) -> str:
    """a and b of 6 MiB, a freed, then c of 8 MiB: c fits a's hole only
    if the allocator can join the hole to more memory."""
    with TraceWriter(str(path), "hole") as w:
        w.alloc(1, 6 * MIB)
        w.alloc(2, 6 * MIB)
        w.free(1)
        w.alloc(3, 8 * MIB)
        w.free(2)
        w.free(3)
    return str(path)


def test_preallocate_replays_the_preallocating_policies_so(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--preallocate makes jaxlake, bfc and bfc-growth take the whole
    device as their first region; worked out by hand on hole_trace (peak
    live 14 MiB, b and c):
    - bfc in one region of the capacity: a at 0, b at 6 MiB, a's 6 MiB
      hole is too small for c, which goes at 12 MiB: fit 20 MiB (U_fit
      0.7), one cudaMalloc (create, map, access). Growing, its second
      region holds b and c's hole, so it fits in 14 MiB;
    - jaxlake: one segment of 14 MiB (7 chunks), c stitched from a's
      three chunks and one more: fit 14 MiB, 1 create, and 3 maps (the
      segment, and the stitch's two pieces);
    - torch has no such mode: its figures do not change."""
    path = hole_trace(tmp_path / "hole.jsonl")
    out_json = tmp_path / "r.json"
    code, out = _cli(["replay", path, "--fit", "--preallocate", "--json",
                      str(out_json)])
    assert code == 0
    assert "preallocating: jaxlake, bfc, bfc-growth" in out
    data = json.loads(out_json.read_text())
    assert data["preallocate"] == ["jaxlake", "bfc", "bfc-growth"]
    res = data["results"]
    assert res["bfc"]["fit_capacity"] == 20 * MIB
    assert res["bfc"]["u_fit"] == pytest.approx(0.7)
    assert (res["bfc"]["fit_calls"]["create"], res["bfc"]["fit_calls"]["map"],
            res["bfc"]["fit_calls"]["set_access"]) == (1, 1, 1)
    assert res["bfc-growth"]["fit_capacity"] == 20 * MIB
    assert res["bfc-growth"]["fit_calls"]["create"] == 1
    assert res["jaxlake"]["fit_capacity"] == 14 * MIB
    assert res["jaxlake"]["u_fit"] == pytest.approx(1.0)
    assert (res["jaxlake"]["fit_calls"]["create"],
            res["jaxlake"]["fit_calls"]["map"]) == (1, 3)
    # Uncapped, each preallocating policy holds the whole device.
    for p in ("jaxlake", "bfc", "bfc-growth"):
        assert res[p]["peak_reserved"] == res[p]["device_memory"]
    code, _ = _cli(["replay", path, "--fit", "--json", str(out_json)])
    plain = json.loads(out_json.read_text())
    assert plain["preallocate"] == []
    grown = plain["results"]
    assert grown["bfc"]["fit_capacity"] == 14 * MIB
    assert grown["bfc"]["fit_calls"]["create"] == 2
    for key in ("fit_capacity", "fit_calls", "peak_reserved", "calls"):
        assert grown["torch"][key] == res["torch"][key]
    # A lake option that says otherwise is refused by name.
    code, _ = _cli(["replay", path, "--preallocate",
                    "--lake-option", "preallocate=false"])
    assert code == 2
    assert "--preallocate and --lake-option preallocate=false" in \
        capsys.readouterr().err


def test_bench_preallocate_says_which_policies_preallocate(
        tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "suite"
    folder.mkdir()
    hole_trace(folder / "hole.jsonl")
    code, out = _cli(["bench", "--suite", str(folder), "--no-plots",
                      "--no-progress", "--out", str(tmp_path / "out"),
                      "-p", "jaxlake,bfc,torch", "--preallocate",
                      "--wide"])  # the header whole, however long its path
    assert code == 0 and "preallocating: jaxlake, bfc, bfc-growth" in out
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["preallocate"] == ["jaxlake", "bfc", "bfc-growth"]
    res = data["traces"][0]["results"]
    assert res["bfc"]["fit_capacity"] == 20 * MIB
    assert res["torch"]["fit_capacity"] == 20 * MIB
    # Only the fit's claims are made: uncapped U says nothing there.
    claims = [c["claim"] for c in data["comparisons"]]
    assert "uncapped U and W" in claims
    assert not any(c.startswith("jaxlake U >=") for c in claims)
    assert "jaxlake U_fit >= every other policy's U_fit, per trace" in claims
    fit_claim = next(c for c in data["comparisons"]
                     if c["claim"].startswith("jaxlake U_fit"))
    assert fit_claim["ok"] is True  # 1.0 against 0.7 and 0.7


# -- the merge of a trace's devices (one core call) --------------------------


def _three_devices(tmp_path: pathlib.Path) -> tracefile.Trace:
    """Devices of different shapes: 0 grows to 12 MiB in steps, 1 holds
    one 14 MiB buffer late, 2 churns small buffers from the start."""
    path = tmp_path / "three.jsonl"
    with TraceWriter(path, "three", devices=3) as w:
        for i in range(6):
            w.alloc(i, 2 * MIB + 1000, dev=0)
            w.alloc(100 + i, 300 << 10, dev=2)
            w.free(100 + i, dev=2)
        for i in range(0, 6, 2):
            w.free(i, dev=0)
        w.alloc(50, 14 * MIB, dev=1)
        w.alloc(51, 6 * MIB, dev=0)
        w.free(50, dev=1)
        for i in (1, 3, 5, 51):
            w.free(i, dev=0)
    return tracefile.read_trace(path)


def test_a_trace_replay_merges_its_devices_as_their_sum(
        tmp_path: pathlib.Path) -> None:
    trace = _three_devices(tmp_path)
    for policy in replay.policy_names():
        merged = replay.replay(trace, policy, "10MiB", timing=False,
                               fit=True)
        parts = [_core.replay(trace.core, policy, replay._options(
            replay.device_bytes(trace.core.peak_live(d)), None), d, 1000,
            False, 0) for d in range(3)]
        assert merged.devices == 3
        for key in ("events", "allocs", "frees", "peak_live",
                    "peak_reserved"):
            assert getattr(merged, key) == \
                sum(getattr(p, key) for p in parts), (policy, key)
        assert merged.calls == {k: sum(p.calls[k] for p in parts)
                                for k in parts[0].calls}
        assert merged.counters == {k: sum(p.counters[k] for p in parts)
                                   for k in parts[0].counters}
        # the timelines on the union of their events, each device holding
        # its last point between its own
        keys = sorted({e for p in parts for e in p.timeline_event})
        reserved = [0] * len(keys)
        for p in parts:
            at = dict(zip(p.timeline_event, p.timeline_reserved))
            last = 0
            for i, k in enumerate(keys):
                last = at.get(k, last)
                reserved[i] += last
        assert merged.timeline_event == keys
        assert merged.timeline_reserved == reserved
        # under 10 MiB a device runs out: the earliest failure of all
        capped = [_core.replay(trace.core, policy,
                               replay._options(10 * MIB, None), d, 0, False,
                               0) for d in range(3)]
        ooms = [(p.oom[0], d) for d, p in enumerate(capped)
                if p.oom is not None]
        assert ooms and merged.oom is not None, policy
        assert (merged.oom.event, merged.oom.device) == min(ooms), policy
        assert merged.capped_peak_reserved == sum(
            c.peak_reserved if p.peak_reserved > 10 * MIB else p.peak_reserved
            for c, p in zip(capped, parts))
        # each device's fit, in the same call
        fits = [int(trace.core.peak_live(d)) for d in range(3)]
        assert merged.fit_capacity is not None and \
            merged.fit_capacity >= max(fits)
        assert merged.u_fit is not None and 0 < merged.u_fit <= 1


# -- a request larger than an expandable segment -------------------------------


@pytest.mark.parametrize("extra", [[], ["--fit"]])
def test_torch_expandable_request_larger_than_a_segment_is_out_of_memory(
        tmp_path: pathlib.Path, extra: List[str]) -> None:
    # An expandable segment spans 9/8 of the device; a request beyond that
    # is out of memory (it used to walk past the segment's last block and
    # die of a division by zero).
    import subprocess
    import sys
    path = tmp_path / "one.jsonl"
    with TraceWriter(path, "one") as w:
        w.alloc(1, 30 << 20)
        w.free(1)
    out = tmp_path / "r.json"
    result = subprocess.run(
        [sys.executable, "-m", "jaxlake", "replay", str(path), "-p",
         "torch-expandable", "--capacity", "24MiB", "--json", str(out),
         *extra], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    got = json.loads(out.read_text())["results"]["torch-expandable"]
    assert got["oom"]["size"] == 30 << 20
    assert got["capped_peak_reserved"] == 0   # nothing reserved for it
    if extra:
        assert got["fit_capacity"] >= 30 << 20
