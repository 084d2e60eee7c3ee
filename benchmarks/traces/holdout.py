"""The hold-out table: jaxlake against the stitching limit and its peers on
the hold-out set (docs/benchmarks.md, "Hold-out").

    python benchmarks/traces/build.py --holdout --out HOLDOUT --jobs 2
    python benchmarks/traces/holdout.py HOLDOUT [--out DIR] [--bundled]
        [--also DIR ...]

Runs `jaxlake bench` on HOLDOUT and on each HOLDOUT/synthetic-seed<N>
(and, with --bundled, on the bundled suite), then prints one markdown row
per trace: the stitching limit (peak live bytes in whole granules, as a
U), jaxlake's U_fit and uncapped U, how many granules its fit capacity
lies above the limit (summed over devices), the best peer's U_fit, and
which of the three goals it misses: `<peer` (a peer's U_fit above
jaxlake's), `far` (more than one granule per device above the limit),
`lowU` (uncapped U below 0.98 x the limit). `--results DIR` reads the
results.json files an earlier run wrote there instead of running.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from typing import Dict, List, Sequence, Tuple

GRANULE = 2 << 20


def bench(suite: str, out: str) -> str:
    """Runs jaxlake bench on a folder (None: the bundled suite); returns
    its results.json."""
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    cmd = [sys.executable, "-m", "jaxlake", "bench", "--no-plots",
           "--no-progress", "--out", out]
    if suite:
        cmd += ["--suite", os.path.abspath(suite)]
    # Outside the source tree, whose jaxlake/ has no compiled module.
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=out)
    if done.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n"
                         f"{done.stderr[-2000:]}")
    return os.path.join(out, "results.json")


def rows(path: str) -> List[Dict[str, object]]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out = []
    for t in data["traces"]:
        r = t["results"]
        lake = r["jaxlake"]
        peers = [(v["u_fit"], k) for k, v in r.items() if k != "jaxlake"]
        best, who = max(peers) if peers else (0.0, "-")
        limit = lake["peak_live"] / lake["min_reserved"]
        over = (lake["peak_live"] / lake["u_fit"] - lake["min_reserved"]) \
            / GRANULE
        misses = []
        if lake["u_fit"] < best - 1e-12:
            misses.append("<peer")
        if over > lake["devices"] + 1e-9:
            misses.append("far")
        if lake["utilisation"] < 0.98 * limit - 1e-12:
            misses.append("lowU")
        out.append({"name": t["name"], "limit": limit,
                    "u_fit": lake["u_fit"], "u": lake["utilisation"],
                    "over": over, "devices": lake["devices"],
                    "granules": lake["min_reserved"] / GRANULE,
                    "best": best, "who": who, "misses": misses,
                    "fit_ms": lake["fit_driver_ms"]})
    return out


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("holdout", help="the folder build.py --holdout "
                                        "wrote")
    parser.add_argument("--out", default="jaxlake-holdout")
    parser.add_argument("--bundled", action="store_true",
                        help="the bundled suite too")
    parser.add_argument("--also", action="append", default=[],
                        metavar="DIR",
                        help="another folder of traces benched as a set of "
                             "its own (repeatable; e.g. the synthetic "
                             "traces at seeds 0-7)")
    parser.add_argument("--results", action="store_true",
                        help="read the results.json files under --out "
                             "instead of running the bench")
    parser.add_argument("--reuse", action="store_true",
                        help="read a set's results.json when --out already "
                             "holds one, bench the others")
    args = parser.parse_args(argv)
    parts: List[Tuple[str, str]] = [("holdout", args.holdout)]
    for name in sorted(os.listdir(args.holdout)):
        if name.startswith("synthetic-seed"):
            parts.append((name, os.path.join(args.holdout, name)))
    for folder in args.also:
        parts.append((os.path.basename(os.path.normpath(folder)), folder))
    if args.bundled:
        parts.append(("bundled", ""))
    print("| set | trace | limit (granules) | limit U | U_fit | U | "
          "granules over | best peer U_fit | misses |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    summary = []
    for label, folder in parts:
        out = os.path.join(args.out, label)
        path = os.path.join(out, "results.json")
        if not (args.results or (args.reuse and os.path.exists(path))):
            path = bench(folder, out)
        rs = rows(path)
        for r in rs:
            print(f"| {label} | `{r['name']}` | {r['granules']:.0f} | "
                  f"{r['limit']:.3f} | {r['u_fit']:.3f} | {r['u']:.3f} | "
                  f"{r['over']:.0f} | {r['best']:.3f} ({r['who']}) | "
                  f"{' '.join(r['misses']) or '-'} |")
        summary.append(
            f"{label}: {len(rs)} traces, U_fit geomean "
            f"{geomean([r['u_fit'] for r in rs]):.4f} (min "
            f"{min(r['u_fit'] for r in rs):.3f}), U geomean "
            f"{geomean([r['u'] for r in rs]):.4f} (min "
            f"{min(r['u'] for r in rs):.3f}), driver time at the fit "
            f"{sum(r['fit_ms'] for r in rs):.1f} ms; misses: <peer "
            f"{sum('<peer' in r['misses'] for r in rs)}, far "
            f"{sum('far' in r['misses'] for r in rs)}, lowU "
            f"{sum('lowU' in r['misses'] for r in rs)}")
    print()
    for line in summary:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
