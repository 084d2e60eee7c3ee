"""Pinned host memory: what XLA's host allocator holds against what the
program keeps there.

XLA's GPU client carves `pinned_host` buffers (arrays in that memory kind,
and an executable's host temporaries: the activations an offload policy
moves out) from page-locked regions of its own host allocator, which it asks
the driver for with `cuMemHostAlloc`. Each case runs examples/train_lm.py
on the fake GPU (`jaxlake run --fake-gpu`, autotuning off) and sets beside
each other:

- in use: the most pinned_host bytes the program needs at once, the larger
  of its pinned_host arrays after a step (the example's --log-json) and the
  train step's host arguments, outputs not aliased to them, and
  temporaries (XLA's memory analysis of the compiled step);
- held: the peak bytes of the page-locked regions the driver gave out
  (`cuMemHostAlloc`; the fake's JAXLAKE_FAKEGPU_STATS, `host`), and how
  many regions.

    .venv/bin/python benchmarks/pinned_host.py
    .venv/bin/python benchmarks/pinned_host.py --cases small-b16 --no-lake

The figures are those of the fake GPU: XLA's allocators run as on a GPU,
kernels do not run (README, "No GPU?").
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
MIB = 1 << 20
OFFLOAD = ("--offload-opt-state", "--remat", "offload-dots")


class Case(NamedTuple):
    name: str
    args: Sequence[str]  # train_lm.py's options besides the common ones


def _small(batch: int, *extra: str) -> List[str]:
    return ["--preset", "small", "--batch", str(batch), "--seq-len", "128",
            *extra]


CASES: List[Case] = [
    Case("small-b16-plain", _small(16)),
    Case("small-b16-opt-state", _small(16, "--offload-opt-state")),
    Case("small-b16-dots", _small(16, "--remat", "offload-dots")),
    *[Case(f"small-b{b}", _small(b, *OFFLOAD)) for b in (8, 16, 32, 64)],
    Case("tiny-b32", ["--preset", "tiny", "--batch", "32", *OFFLOAD]),
    Case("base-b8", ["--preset", "base", "--batch", "8", "--seq-len", "128",
                     *OFFLOAD]),
]
COMMON = ("--steps", "3", "--dtype", "bfloat16", "--attention", "xla",
          "--no-progress")


def jaxlake() -> List[str]:
    script = pathlib.Path(sys.executable).parent / "jaxlake"
    if os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "jaxlake"]


def run_case(case: Case, folder: str, no_lake: bool) -> Dict[str, object]:
    """Runs one case; its figures, in bytes."""
    stats = os.path.join(folder, f"{case.name}.stats.json")
    log = os.path.join(folder, f"{case.name}.log.jsonl")
    cmd = [*jaxlake(), "run", "--quiet", "--fake-gpu",
           *(["--no-lake"] if no_lake else []), "--",
           sys.executable, str(ROOT / "examples" / "train_lm.py"),
           *case.args, *COMMON, "--log-json", log]
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    env["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
    env["JAXLAKE_FAKEGPU_STATS"] = stats
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          cwd=str(ROOT))
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{case.name}: {' '.join(cmd)} exited "
                           f"{done.returncode}\n{done.stderr[-3000:]}")
    with open(stats, encoding="utf-8") as f:
        report = json.load(f)
    arrays, step = 0, {"arguments": 0, "outputs": 0, "aliased": 0,
                       "temporaries": 0}
    with open(log, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "pinned_host" in record:
                arrays = record["pinned_host"]["arrays_peak"]
                step = record["pinned_host"]["step"]
    during = (step["arguments"] + step["outputs"] - step["aliased"]
              + step["temporaries"])
    host = report["host"]
    return {"case": case.name, "args": " ".join(case.args),
            "arrays": arrays, "temporaries": step["temporaries"],
            "in_use": max(arrays, during), "held": host["bytes_peak"],
            "regions": host["regions_peak"],
            "calls": report["calls"].get("cuMemHostAlloc", 0),
            "seconds": round(seconds, 1)}


def table(rows: Sequence[Dict[str, object]]) -> str:
    out = ["| case | train_lm.py options | pinned_host arrays | step's host "
           "temporaries | in use at most | XLA holds (regions) | holds / "
           "in use |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        in_use, held = int(r["in_use"]), int(r["held"])  # type: ignore
        ratio = f"{held / in_use:.2f}" if in_use else "-"
        out.append(
            f"| {r['case']} | `{r['args']}` | "
            f"{int(r['arrays']) / MIB:.2f} MiB | "  # type: ignore
            f"{int(r['temporaries']) / MIB:.2f} MiB | "  # type: ignore
            f"{in_use / MIB:.2f} MiB | {held / MIB:.2f} MiB "
            f"({r['regions']}) | {ratio} |")
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [c.name for c in CASES]
    parser.add_argument("--cases", default=",".join(names),
                        help="comma-separated cases (default: all of "
                             f"{', '.join(names)})")
    parser.add_argument("--no-lake", action="store_true",
                        help="device memory from XLA's own allocator as JAX "
                             "sets it up by default, not the lake")
    parser.add_argument("--json", default=None, metavar="OUT",
                        help="also write the rows as JSON")
    args = parser.parse_args(argv)
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in names]
    if unknown or not chosen:
        parser.error(f"unknown case {', '.join(unknown) or '(none)'}: the "
                     f"cases are {', '.join(names)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="jaxlake-pinned-") as folder:
        for case in CASES:
            if case.name not in chosen:
                continue
            try:
                row = run_case(case, folder, args.no_lake)
            except RuntimeError as e:
                print(f"FAILED {e}", file=sys.stderr, flush=True)
                return 1
            print(f"{case.name}: held {int(row['held']) / MIB:.2f} MiB, "  # type: ignore
                  f"in use {int(row['in_use']) / MIB:.2f} MiB "  # type: ignore
                  f"({row['seconds']}s)", file=sys.stderr, flush=True)
            rows.append(row)
    print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
