"""Which driver-time conclusions of `jaxlake bench` hold as the driver
model's constants change (docs/benchmarks.md, "Driver time").

    python benchmarks/driver_sensitivity.py [--suite DIR] [--out DIR]
        [--model create=8us --model create=40us ...]

Runs `jaxlake bench --driver-model SPEC` once per model (default: cuMemCreate
at 8, 40 and 200 us at 2 MiB, each on one device and on eight) and prints,
per model and peer policy, a markdown table of the two driver-time
conclusions the bench draws:

- total: jaxlake's driver time at the fit capacity, summed over the suite,
  against the peer's;
- per trace: on how many traces where the peer's U_fit is within 0.01 of
  jaxlake's, jaxlake's driver time at the fit is below the peer's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Dict, List, Sequence

DEFAULT_MODELS = ("create=8us", "create=40us", "create=200us",
                  "create=8us,devices=8", "create=40us,devices=8",
                  "create=200us,devices=8")


def bench(spec: str, suite: str, out: str) -> Dict[str, object]:
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    # Files named in the spec, relative to here (the bench runs in `out`).
    spec = ",".join(i if "=" in i else os.path.abspath(i.strip())
                    for i in spec.split(","))
    cmd = [sys.executable, "-m", "jaxlake", "bench", "--no-plots",
           "--no-progress", "--out", out, "--driver-model", spec]
    if suite:
        cmd += ["--suite", os.path.abspath(suite)]
    # Run outside the source tree, whose jaxlake/ has no compiled module.
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=out)
    if done.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n"
                         f"{done.stderr[-2000:]}")
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        return json.load(f)


def conclusions(data: Dict[str, object]) -> Dict[str, str]:
    traces = data["traces"]
    assert isinstance(traces, list)
    policies = [p for p in traces[0]["results"] if p != "jaxlake"]
    out: Dict[str, str] = {}
    for peer in policies:
        lake_ms = sum(t["results"]["jaxlake"]["fit_driver_ms"]
                      for t in traces)
        peer_ms = sum(t["results"][peer]["fit_driver_ms"] for t in traces)
        close = below = 0
        for t in traces:
            mine, theirs = t["results"]["jaxlake"], t["results"][peer]
            if theirs["u_fit"] < mine["u_fit"] - 0.01:
                continue
            close += 1
            below += mine["fit_driver_ms"] < theirs["fit_driver_ms"]
        verdict = "below" if lake_ms < peer_ms else "ABOVE"
        out[peer] = (f"{verdict}: {lake_ms:.1f} vs {peer_ms:.1f} ms; "
                     f"below on {below}/{close}")
    return out


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="",
                        help="a folder of traces (default: the bundled "
                             "suite)")
    parser.add_argument("--out", default="jaxlake-sensitivity")
    parser.add_argument("--model", action="append", metavar="SPEC",
                        help="a --driver-model SPEC (repeat); default: "
                             + "; ".join(DEFAULT_MODELS))
    args = parser.parse_args(argv)
    models: List[str] = args.model or list(DEFAULT_MODELS)
    rows = []
    for i, spec in enumerate(models):
        rows.append((spec, conclusions(
            bench(spec, args.suite, os.path.join(args.out, str(i))))))
    peers = list(rows[0][1])
    print("| model | " + " | ".join(peers) + " |")
    print("| --- |" + " --- |" * len(peers))
    for spec, cells in rows:
        print(f"| `{spec}` | " + " | ".join(cells[p] for p in peers) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
