"""Two JAX processes on one GPU: how large a second job fits beside the first,
under each of XLA's allocators and under the lake.

Both processes run XLA's real GPU client on one shared fake device
(`jaxlake run --fake-gpu --fake-gpu-shared NAME`, cc/fakegpu/shared.cc):
`cuMemGetInfo` and every creation of device memory count both processes'
bytes, as on one GPU. The first job (a trainer, examples/train_lm.py) starts
and runs its first steps; then the second job (another trainer, at a batch
size from --sizes) runs to its end beside it, and the first is stopped. A
size fits when both exit cleanly (the first stopped by us, not by an error).
Sizes are tried in rising order and the sweep of an allocator stops at its
first size that does not fit.

While the pair runs, each process's device bytes (what it holds from the
device, whatever it uses of them) are sampled from the shared accounting.

    .venv/bin/python benchmarks/shared_gpu.py             # every allocator
    .venv/bin/python benchmarks/shared_gpu.py --allocators lake,default \\
        --sizes 16,64 --memory 512MiB

The pair runs are jaxlake/_src/fit/beside.py's, which `jaxlake fit
--beside` runs too. The figures are those of the fake device: XLA's allocators and the lake run
as they do on a GPU, but kernels do not run (README, "No GPU?").
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
if sys.path and pathlib.Path(sys.path[0]).resolve() == ROOT:
    del sys.path[0]  # the installed jaxlake, not the source tree
BIN = pathlib.Path(sys.executable).parent
MiB = 1 << 20

from jaxlake._src.fit import beside  # noqa: E402

#: Each row: the environment that picks XLA's allocator (None: the lake,
#: under plain `jaxlake run`), and what it is.
ALLOCATORS: Dict[str, Tuple[Optional[Dict[str, str]], str]] = {
    "default": ({}, "JAX's default: BFC, preallocating 0.75 of the device"),
    "prealloc-off": ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
                     "BFC growing on demand"),
    "cuda_async": ({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"},
                   "the driver's pool, XLA preallocating 0.75"),
    "cuda_async-off": ({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async",
                        "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
                       "the driver's pool, no preallocation"),
    "platform": ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
                 "XLA's platform allocator"),
    "lake": (None, "jaxlake run: the lake, growing as needed"),
}


def parse_size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    low = text.strip().lower()
    for unit, factor in units.items():
        if low.endswith(unit):
            return int(float(low[:-len(unit)]) * factor)
    return int(low)


def command(allocator: str, name: str, memory: int, argv: List[str]
            ) -> Tuple[List[str], Dict[str, str]]:
    env_extra, _ = ALLOCATORS[allocator]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAXLAKE", "XLA_PYTHON_CLIENT"))
           and k not in ("JAX_PLATFORMS", "LD_PRELOAD")}
    env["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
    run = [str(BIN / "jaxlake"), "run", "--fake-gpu",
           f"--fake-gpu-memory={memory}", "--fake-gpu-shared", name]
    if env_extra is None:
        run.append("--quiet")
    else:
        run.append("--no-lake")
        env.update(env_extra)
    return run + ["--", sys.executable, *argv], env


def job(preset: str, batch: Optional[int], steps: int,
        seq_len: Optional[int], log_json: Optional[str] = None) -> List[str]:
    argv = [str(ROOT / "examples" / "train_lm.py"), "--preset", preset,
            "--steps", str(steps), "--no-progress", "--attention", "xla"]
    if seq_len is not None:
        argv += ["--seq-len", str(seq_len)]
    if log_json is not None:
        argv += ["--log-json", log_json]
    if batch is not None:
        argv += ["--batch", str(batch)]
    return argv


def run_pair(args: argparse.Namespace, allocator: str, size: int,
             monitor: beside.Monitor, logdir: str) -> Dict[str, object]:
    # The first job is under way once it has logged --warm-steps steps
    # (its --log-json file, {READY}: one line a step).
    first_cmd, env = command(allocator, args.name, args.memory,
                             job(args.preset, args.first_batch, 100000,
                                 args.seq_len, beside.READY_PLACEHOLDER))
    second_cmd, env2 = command(allocator, args.name, args.memory,
                               job(args.preset, size, args.steps,
                                   args.seq_len))
    r = beside.run_pair(first_cmd, env, second_cmd, env2, logdir,
                        f"{allocator}-{size}", monitor,
                        ready_lines=args.warm_steps, timeout=args.timeout,
                        cwd=str(ROOT))
    return {
        "allocator": allocator, "size": size, "fits": r.fits,
        "first_ok": r.first_ok, "second_ok": r.second_code == 0,
        "first_alone": r.first_alone, "first_peak": r.first_peak,
        "second_peak": r.second_peak, "total_peak": r.total_peak,
        "why": r.why(),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--allocators", default=",".join(ALLOCATORS),
                        help="rows, from: " + ", ".join(ALLOCATORS))
    parser.add_argument("--memory", default="256MiB",
                        help="the shared device's memory (default 256MiB)")
    parser.add_argument("--preset", default="tiny",
                        help="both jobs' model preset (default tiny)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="both jobs' sequence length (default: the "
                             "preset's)")
    parser.add_argument("--first-batch", type=int, default=32,
                        help="the first job's batch (default 32)")
    parser.add_argument("--sizes", default="32,64,96,128,160,192,224",
                        help="the second job's batches, rising (default "
                             "32,64,96,128,160,192,224)")
    parser.add_argument("--steps", type=int, default=3,
                        help="the second job's steps (default 3)")
    parser.add_argument("--warm-steps", type=int, default=2,
                        help="steps the first job runs before the second "
                             "starts (default 2)")
    parser.add_argument("--timeout", type=int, default=600,
                        help="seconds a job may take (default 600)")
    parser.add_argument("--logs", default=None,
                        help="folder for each job's output (default: a "
                             "temporary folder, printed)")
    args = parser.parse_args(argv)
    args.memory = parse_size(args.memory)
    rows = [a.strip() for a in args.allocators.split(",") if a.strip()]
    for row in rows:
        if row not in ALLOCATORS:
            parser.error(f"--allocators: {row!r} is none of "
                         f"{', '.join(ALLOCATORS)}")
    sizes = sorted(int(s) for s in args.sizes.split(","))
    args.name = beside.shared_name("bench")
    logdir = args.logs or tempfile.mkdtemp(prefix="jaxlake-shared-gpu-")
    os.makedirs(logdir, exist_ok=True)
    # The monitor joins the shared accounting under the same name and
    # device, before any job starts.
    monitor = beside.Monitor.join(args.name, args.memory)
    print(f"shared fake device: {args.memory / MiB:.0f} MiB; first job: "
          f"train_lm.py --preset {args.preset} --batch {args.first_batch} "
          f"--seq-len {args.seq_len or 'preset'}; second job: the same at --batch "
          f"{','.join(map(str, sizes))}, {args.steps} steps; logs in "
          f"{logdir}", flush=True)
    results: List[Dict[str, object]] = []
    try:
        for row in rows:
            for size in sizes:
                r = run_pair(args, row, size, monitor, logdir)
                results.append(r)
                print(f"  {row:15s} batch {size:5d}: "
                      f"{'fits' if r['fits'] else 'does not fit'}; first "
                      f"holds {int(r['first_peak']) / MiB:.1f} MiB, second "
                      f"{int(r['second_peak']) / MiB:.1f} MiB"
                      + (f"  ({r['why']})" if not r["fits"] else ""),
                      flush=True)
                if not r["fits"]:
                    break
    finally:
        beside.remove_shared(args.name)
    print()
    print("| allocator | largest second batch that fits | first job holds "
          "(alone / peak) | second job's peak | both, peak | the next size |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        mine = [r for r in results if r["allocator"] == row]
        fit = [r for r in mine if r["fits"]]
        best = fit[-1] if fit else (mine[0] if mine else None)
        fail = [r for r in mine if not r["fits"]]
        if best is None:
            continue
        largest = str(best["size"]) if fit else "none"
        nxt = (f"{fail[0]['size']}: {fail[0]['why']}" if fail
               else "all fit")
        print(f"| {row} | {largest} | "
              f"{int(best['first_alone']) / MiB:.1f} / "
              f"{int(best['first_peak']) / MiB:.1f} MiB | "
              f"{int(best['second_peak']) / MiB:.1f} MiB | "
              f"{int(best['total_peak']) / MiB:.1f} MiB | {nxt} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
