"""Fit capacity and the models of XLA's own allocators, from Python and the
CLI, on small hand-made traces whose answers are worked out here."""

from __future__ import annotations

import json
import pathlib

from jaxlake._src.bench import replay
from jaxlake._src.trace import tracefile
from jaxlake._src.trace.tracefile import TraceWriter
from bench_util import run

MIB = 1 << 20


def reuse_trace(tmp_path: pathlib.Path) -> pathlib.Path:
    """x = 3 MiB, y = 3 MiB, free x, z = 5 MiB (peak live 8 MiB)."""
    path = tmp_path / "reuse.jsonl"
    with TraceWriter(path, "reuse") as w:
        w.alloc(1, 3 * MIB)
        w.alloc(2, 3 * MIB)
        w.free(1)
        w.alloc(3, 5 * MIB)
    return path


def test_xla_vmm_fit_worked_by_hand(tmp_path: pathlib.Path) -> None:
    trace = tracefile.read_trace(str(reuse_trace(tmp_path)))
    # Uncapped: x, y are 4 MiB each; x stays pending (no exact match for
    # z's 6 MiB), so 4 + 4 + 6 = 14 MiB are held at the end.
    r = replay.replay(trace, "xla-vmm", fit=True)
    assert r.peak_reserved == 14 * MIB
    assert r.calls["create"] == 3 and r.calls.get("release", 0) == 0
    # Under less than 14 MiB, x is torn down for z: 4 + 6 = 10 MiB fits,
    # 8 MiB cannot hold y and z. U_fit = 8 / 10.
    assert r.fit_capacity == 10 * MIB
    assert r.u_fit == 0.8
    assert r.fit_calls["release"] == 1 and r.fit_calls["create"] == 3
    assert r.fit_driver_ms > 0 and not r.fit_nonmonotone
    # bfc-growth: one 64 MiB extension uncapped. Under a cap the first
    # extension is cut to the cap C, and BFC splits a chunk only when it is
    # at least twice the request. C = 8: x splits [0,3); y takes the 5 MiB
    # rest whole; z finds no room. C = 10: y splits the 7 MiB rest, leaving
    # [6,10); z (5) fits neither [0,3) nor [6,10), and growing needs 2 MiB
    # more. C = 12: the rest [6,12) holds z. U_fit = 8 / 12.
    g = replay.replay(trace, "bfc-growth", fit=True)
    assert g.peak_reserved == 64 * MIB
    assert g.fit_capacity == 12 * MIB and g.u_fit == 8 / 12
    # Without fit=True nothing is searched.
    assert replay.replay(trace, "bfc").u_fit is None


def test_replay_fit_prints_and_json_has_the_fields(
        tmp_path: pathlib.Path) -> None:
    path = reuse_trace(tmp_path)
    out_json = tmp_path / "r.json"
    code, out = run(["replay", str(path), "--fit", "--json", str(out_json)])
    assert code == 0, out
    assert "xla-vmm: fit capacity 10.0 MiB, U_fit 0.800" in out
    data = json.loads(out_json.read_text())
    results = data["results"]
    assert set(results) == set(replay.policy_names())
    for name, r in results.items():
        assert r["fit_capacity"] % (2 * MIB) == 0, name
        assert r["fit_capacity"] >= r["peak_live"], name
        assert r["u_fit"] == r["peak_live"] / r["fit_capacity"], name
    assert results["xla-vmm"]["fit_capacity"] == 10 * MIB
    # The lake stitches: no worse than the exact-size reuse.
    assert results["jaxlake"]["u_fit"] >= results["xla-vmm"]["u_fit"]
