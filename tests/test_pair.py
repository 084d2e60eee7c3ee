"""Two processes on one device: the pair replay (jaxlake/_src/bench/pair.py)
on small synthetic pairs, the pair's storage (the second trace's meta names
the first), and the bench's row for a pair."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import List, Tuple

import pytest

from jaxlake._src.bench import pair
from jaxlake._src.bench.replay import Capacity, replay
from jaxlake._src.trace import tracefile
from jaxlake._src.trace.tracefile import TraceWriter

MiB = 1 << 20
PRE = {"lake_preallocate": True, "bfc_initial_region": 1 << 60,
       "bfc_growth_increment": 1 << 60}


def write(path: Path, name: str, sizes: List[Tuple[str, int]],
          meta: dict = {}) -> str:
    """A trace of allocs ("a", bytes) and frees ("f", index of the alloc)."""
    with TraceWriter(str(path), name, meta=dict(meta)) as w:
        n = 0
        for op, value in sizes:
            if op == "a":
                n += 1
                w.alloc(n, value)
            else:
                w.free(value)
    return str(path)


def steps(persistent: int, temp: int, count: int = 3) -> List[Tuple[str, int]]:
    """One persistent buffer, then `count` steps of one temp buffer."""
    out: List[Tuple[str, int]] = [("a", persistent)]
    for i in range(count):
        out += [("a", temp), ("f", i + 2)]
    return out


@pytest.fixture
def small_pair(tmp_path: Path) -> Tuple[tracefile.Trace, tracefile.Trace]:
    first = write(tmp_path / "first.jsonl", "first", steps(3 * MiB, 9 * MiB))
    second = write(tmp_path / "second.jsonl", "second",
                   steps(5 * MiB, 21 * MiB),
                   meta={pair.BESIDE: "first.jsonl"})
    return pair.read_pair(second)


def test_backoff_matches_the_real_second_default(tmp_path: Path) -> None:
    # The second of two JAX defaults on a 256 MiB device asked for 192 MiB
    # with 64 MiB left and got 62 MiB (docs/results/workloads.md): its
    # limit is 0.75 of the whole device, and the refused region backs off
    # by 10% steps, 192 MiB x 0.9^11 = 60.25 MiB in whole granules.
    small = tracefile.read_trace(write(tmp_path / "s.jsonl", "s",
                                       [("a", 1024)]))
    pre = {"bfc_initial_region": 1 << 60}
    second = pair.second_options("bfc", pre, 192 * MiB)
    r = replay(small, "bfc", 64 * MiB, options=second)
    assert r.oom is None
    assert r.capped_peak_reserved == 62 * MiB
    # Alone, its limit the device's, it takes the whole 64 MiB.
    alone = replay(small, "bfc", 64 * MiB, options=pre)
    assert alone.capped_peak_reserved == 64 * MiB
    # Growing, a limit above the room makes a region the device refuses:
    # 40 MiB asked under a 64 MiB limit with 40 MiB of room backs off to
    # 36 MiB, too small for the request; with the limit the room's, the
    # region is cut to it and fits.
    big = tracefile.read_trace(write(tmp_path / "b.jsonl", "b",
                                     [("a", 39 * MiB)]))
    refused = replay(big, "bfc", 40 * MiB,
                     options=pair.second_options("bfc", None, 64 * MiB))
    assert refused.oom is not None
    assert replay(big, "bfc", 40 * MiB).oom is None


@pytest.mark.parametrize("policy", ["jaxlake", "bfc", "torch",
                                    "torch-expandable", "gmlake", "xla-vmm",
                                    "bfc-growth"])
def test_growing_pair_fit_is_the_first_hold_plus_the_second_fit(
        small_pair: Tuple[tracefile.Trace, tracefile.Trace],
        policy: str) -> None:
    first, second = small_pair
    alone_a = replay(first, policy, None)
    alone_b = replay(second, policy, None, fit=True)
    hold = pair.up(alone_a.peak_reserved)
    assert alone_b.fit_capacity is not None
    r = pair.replay_pair(first, second, policy)
    # The first holds its peak reserved; the second fits in what is left
    # (XLA's BFC may need more: its limit is the whole device's, and a
    # region the room refuses backs off by 10%).
    assert r.fit_capacity is not None
    if policy == "bfc":
        assert r.fit_capacity >= hold + alone_b.fit_capacity
    else:
        assert r.fit_capacity == hold + alone_b.fit_capacity, (
            r.fit_capacity, hold, alone_b.fit_capacity)
    assert r.peak_live == 3 * MiB + 9 * MiB + 5 * MiB + 21 * MiB
    assert r.u_fit == pytest.approx(r.peak_live / r.fit_capacity)
    assert r.peak_reserved == hold + alone_b.peak_reserved
    # One granule less does not fit, whoever places what.
    below = pair.check(first, second, policy, r.fit_capacity - 2 * MiB)
    assert not below.fits and below.failed == "second"


def test_the_first_hold_counts(
        small_pair: Tuple[tracefile.Trace, tracefile.Trace]) -> None:
    # 12 MiB of the first job (6 granules) and 26 MiB of the second (13):
    # the pair needs both, where the second alone fits in 26 MiB.
    first, second = small_pair
    r = pair.replay_pair(first, second, "jaxlake")
    assert r.fit_capacity == 38 * MiB
    assert replay(second, "jaxlake", None, fit=True).fit_capacity == 26 * MiB
    c = pair.check(first, second, "jaxlake", 38 * MiB)
    assert c.fits and c.first_hold == 12 * MiB and c.room == 26 * MiB


def test_preallocated_first_holds_three_quarters(tmp_path: Path) -> None:
    # The first preallocates 0.75 of the device; the second's BFC backs off
    # from its own 0.75 to what is left. A 30 MiB second needs 128 MiB:
    # 96 MiB for the first, and 96 MiB x 0.9^11 = 30.1 MiB (32 MiB in
    # whole granules) for the second. At 126 MiB the room is 30 MiB, and
    # the region that fits it, 27.1 MiB, is too small.
    write(tmp_path / "a.jsonl", "a", [("a", 10 * MiB)])
    b = write(tmp_path / "b.jsonl", "b", [("a", 30 * MiB)],
              meta={pair.BESIDE: "a.jsonl"})
    first, second = pair.read_pair(b)
    options = {"bfc_initial_region": 1 << 60}
    r = pair.replay_pair(first, second, "bfc", options=options)
    assert r.fit_capacity == 128 * MiB
    assert r.u_fit == pytest.approx(40 / 128)
    at = pair.check(first, second, "bfc", 126 * MiB, options)
    assert not at.fits and at.first_hold == 96 * MiB and at.room == 30 * MiB
    # Growing, the first's BFC region doubled from 2 MiB to 16 MiB to hold
    # its 10 MiB; the second's doubles to 32 MiB for its 30 MiB, which a
    # room of 30 MiB refuses (and 28.8 MiB is too small): 48 MiB.
    grow = pair.replay_pair(first, second, "bfc")
    assert grow.fit_capacity == 16 * MiB + 32 * MiB
    # A first job that does not fit in its 0.75 fails alone.
    big = pair.check(second, first, "bfc", 32 * MiB, options)
    assert not big.fits and big.failed == "first"


def test_capacity_column_of_a_pair(
        small_pair: Tuple[tracefile.Trace, tracefile.Trace]) -> None:
    first, second = small_pair
    ok = pair.replay_pair(first, second, "jaxlake",
                          capacity=Capacity(nbytes=38 * MiB))
    assert ok.capacity == 38 * MiB and ok.oom is None
    short = pair.replay_pair(first, second, "jaxlake",
                             capacity=Capacity(nbytes=36 * MiB))
    assert short.oom is not None


def test_pair_storage_and_reading(tmp_path: Path) -> None:
    first = write(tmp_path / "one.jsonl.gz", "one", steps(MiB, 2 * MiB))
    second = write(tmp_path / "two.jsonl.gz", "two", steps(MiB, 4 * MiB),
                   meta={pair.BESIDE: "one.jsonl.gz", "note": "kept"})
    # The header is an ordinary version-1 header: readers that know no
    # pairs read each trace alone.
    with gzip.open(second, "rt") as f:
        header = json.loads(f.readline())
    assert header["version"] == tracefile.VERSION == 1
    assert tracefile.read_trace(second).meta["note"] == "kept"
    assert pair.beside_name(second) == "one.jsonl.gz"
    assert pair.beside_name(first) is None
    a, b = pair.read_pair(second)
    assert (a.name, b.name) == ("one", "two")
    with pytest.raises(pair.PairError, match="names no first job"):
        pair.read_pair(first)
    os.unlink(first)
    with pytest.raises(pair.PairError, match="not in the second's folder"):
        pair.read_pair(second)
    bad = write(tmp_path / "three.jsonl", "three", steps(MiB, MiB),
                meta={pair.BESIDE: "../one.jsonl.gz"})
    with pytest.raises(pair.PairError, match="file name"):
        pair.read_pair(bad)


def test_bench_replays_a_pair_as_one_row(tmp_path: Path) -> None:
    from jaxlake._src.bench import suite
    write(tmp_path / "first.jsonl", "first", steps(3 * MiB, 9 * MiB))
    write(tmp_path / "second.jsonl", "second", steps(5 * MiB, 21 * MiB),
          meta={pair.BESIDE: "first.jsonl"})
    write(tmp_path / "solo.jsonl", "solo", steps(MiB, 3 * MiB))
    results = suite.run_suite(suite.suite_files(str(tmp_path)),
                              ["jaxlake", "bfc"], Capacity(factor=1.1),
                              fit=True, timeline_points=50)
    assert [t.name for t in results] == ["second", "solo"]
    row = results[0].by_policy()["jaxlake"]
    assert row.fit_capacity == 38 * MiB
    assert results[0].peak_live == 38 * MiB
    claims = suite.comparisons(results)
    assert any("U_fit >= every other" in c.claim for c in claims)


def test_replay_pair_command(tmp_path: Path) -> None:
    import subprocess
    from jaxlake._src.fit import engine
    write(tmp_path / "first.jsonl", "first", steps(3 * MiB, 9 * MiB))
    second = write(tmp_path / "second.jsonl", "second",
                   steps(5 * MiB, 21 * MiB),
                   meta={pair.BESIDE: "first.jsonl"})
    out = tmp_path / "r.json"

    def jaxlake(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*engine.jaxlake_command(), *args],
                              capture_output=True, text=True, timeout=120)
    done = jaxlake("replay", second, "--pair", "-p", "jaxlake",
                   "--capacity", "36MiB", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "jaxlake: the pair fits 38.0 MiB, U_fit 1.000" in done.stdout
    assert "jaxlake: under 36.0 MiB: out of memory" in done.stdout
    data = json.loads(out.read_text())
    assert data["results"]["jaxlake"]["fit_capacity"] == 38 * MiB
    # A trace that names no first job is bad input.
    done = jaxlake("replay", str(tmp_path / "first.jsonl"), "--pair")
    assert done.returncode == 1 and "names no first job" in done.stderr
