"""Every XLA model of the replay against XLA's real allocator.

For each case (a program at a fixed batch) the program is recorded once as
`jaxlake fit`'s fake-GPU engine records it (`jaxlake run --fake-gpu`, the
lake serving XLA's pool, on a fake device of 256 GiB:
engine.fake_gpu_memory()). For each XLA model of cc/replay/ the trace's
fit capacity C is found (the smallest pool, in whole 2 MiB granules, under
which the replay fits; the largest device's, for a sharded case). Then the
program itself runs under the model's real allocator (`jaxlake run
--fake-gpu --no-lake`, XLA's own allocator, as `jaxlake fit`'s real
policies run it) on a fake device whose XLA pool (0.75 of the device) is
C less one granule (the model says out of memory) and C (the model says it
fits): the device holds ceil(pool * 4 / 3) bytes, so that XLA's pool,
total x 0.75 rounded down, is exactly the model's capacity. The device
size varies; the batch is fixed.

The models and the real allocators they stand for:

  bfc-prealloc  JAX's default: nothing set (real:jax-default)
  bfc           XLA_PYTHON_CLIENT_PREALLOCATE=false (real:bfc-growth)
  xla-vmm       XLA_PYTHON_CLIENT_ALLOCATOR=vmm (real:vmm)
  bfc-growth    XLA_PJRT_GPU_BFC_ALLOW_GROWTH=true: no installed jaxlib
                has it (docs/xla_defaults.md), so it is listed, not run

Each real run prints XLA's memory_stats() at its end
(benchmarks/memory_stats_run.py): its peak in use at the target size is
set beside the trace's peak live at 256 GiB, which is how much the program
XLA compiles for the small device differs from the recorded one.

    XLA_FLAGS=--xla_gpu_autotune_level=0 \\
        .venv/bin/python benchmarks/validate_models.py --out /tmp/validate
    ... --cases tiny,small --repeats 3       # repeat each verdict
    ... --table                              # the table of what is there

Results go to OUT/results.json (runs are kept and reused: a rerun runs only
what is missing); logs and traces beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from jaxlake._src.bench import replay as _replay
from jaxlake._src.fit import engine as _engine
from jaxlake._src.fit import real as _real
from jaxlake._src.options import format_size
from jaxlake._src.trace import tracefile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLES = os.path.join(REPO, "examples")
STATS_RUN = os.path.join(HERE, "memory_stats_run.py")
MIB = 1 << 20
GRANULE = _replay.GRANULARITY
RECORD_MEMORY = 256 << 30

#: model -> (replayed policy, its options, the real policy it models)
MODELS: Dict[str, Tuple[str, Dict[str, Any], Optional[str]]] = {
    "bfc-prealloc": ("bfc", {"bfc_initial_region": 1 << 60},
                     "real:jax-default"),
    "bfc": ("bfc", {}, "real:bfc-growth"),
    "xla-vmm": ("xla-vmm", {}, "real:vmm"),
    "bfc-growth": ("bfc-growth", {}, None),
}
NO_REAL = {"bfc-growth": "XLA_PJRT_GPU_BFC_ALLOW_GROWTH is in no installed "
                         "jaxlib's plugin (docs/xla_defaults.md)"}

_LM = ["--dtype", "float32", "--attention", "xla", "--steps", "2",
       "--no-progress"]


def cases(equinox_python: str) -> Dict[str, Tuple[int, List[str]]]:
    """name -> (fake devices, the program's command line)."""
    py = sys.executable
    lm = [py, os.path.join(EXAMPLES, "train_lm.py")]
    return {
        "tiny": (1, lm + ["--preset", "tiny", "--batch", "64"] + _LM),
        "small": (1, lm + ["--preset", "small", "--batch", "16"] + _LM),
        "tiny-remat-full": (1, lm + ["--preset", "tiny", "--batch", "256",
                                     "--remat", "full"] + _LM),
        "tiny-remat-dots": (1, lm + ["--preset", "tiny", "--batch", "128",
                                     "--remat", "dots-saveable"] + _LM),
        "buckets-eval": (1, lm + ["--preset", "tiny", "--batch", "256",
                                  "--remat", "full", "--seq-buckets",
                                  "32,64", "--eval-every", "1"] + _LM),
        "lora": (1, [py, os.path.join(EXAMPLES, "finetune_lora.py"),
                     "--preset", "tiny", "--batch", "128"] + _LM),
        "sharded-fsdp-2dev": (2, [py, os.path.join(EXAMPLES,
                                                   "train_sharded.py"),
                                  "--layout", "fsdp", "--preset", "tiny",
                                  "--batch", "128"] + _LM),
        "1b": (1, lm + ["--preset", "1b", "--batch", "1", "--dtype",
                        "bfloat16", "--attention", "xla", "--steps", "2",
                        "--no-progress"]),
        "equinox-cnn": (1, [equinox_python,
                            os.path.join(HERE, "compat", "equinox_cnn.py"),
                            "--steps", "2", "--batch", "2048"]),
    }


#: The fake GPU's smallest device (jaxlake run --fake-gpu-memory).
MIN_DEVICE = 64 * MIB


def device_for(pool: int) -> int:
    """The device whose XLA pool (total x 0.75, rounded down) is `pool`."""
    return math.ceil(pool * 4 / 3)


def run(cmd: Sequence[str], env: Dict[str, str], log: str) -> Tuple[int,
                                                                     str,
                                                                     float]:
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        code = subprocess.run(list(cmd), stdout=out, stderr=subprocess.STDOUT,
                              env=env, check=False).returncode
    with open(log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return code, text, time.monotonic() - start


def fake_env() -> Dict[str, str]:
    env = dict(os.environ)
    if env.get("JAX_PLATFORMS", "") not in ("", "cuda", "gpu"):
        env.pop("JAX_PLATFORMS")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def record(name: str, count: int, argv: Sequence[str], out: str,
           results: Dict[str, Any],
           trace_from: Optional[str] = None) -> Optional[str]:
    trace = os.path.join(out, f"{name}.jsonl")
    if os.path.isfile(trace) and os.path.getsize(trace) > 0:
        return trace
    if trace_from:
        other = os.path.join(trace_from, f"{name}.jsonl")
        if os.path.isfile(other) and os.path.getsize(other) > 0:
            return other
    cmd = [*_engine.jaxlake_command(), "run", "--fake-gpu=h100",
           f"--fake-gpu-memory={RECORD_MEMORY}", f"--fake-gpu-count={count}",
           "--trace", trace, "--", *argv]
    code, text, secs = run(cmd, fake_env(), trace + ".log")
    print(f"  recorded {name} on {format_size(RECORD_MEMORY)}: exit {code}, "
          f"{secs:.0f} s", flush=True)
    results.setdefault("cases", {}).setdefault(name, {})["record_s"] = secs
    if code != 0 or not os.path.isfile(trace):
        results["cases"][name]["error"] = text.splitlines()[-5:]
        return None
    return trace


def peak_rounded(trace: tracefile.Trace) -> int:
    """The largest device's peak live bytes, each request rounded up to
    256 bytes as BFC counts it (its bytes in use)."""
    live: Dict[int, int] = {}
    best = 0
    sizes: Dict[Tuple[int, int], int] = {}
    for e in trace.events():
        key = (e.dev, e.id)
        if e.op == "alloc":
            n = max(256, -(-e.size // 256) * 256)
            sizes[key] = n
            live[e.dev] = live.get(e.dev, 0) + n
            best = max(best, live[e.dev])
        else:
            live[e.dev] = live.get(e.dev, 0) - sizes.pop(key, 0)
    return best


def model_fit(trace: tracefile.Trace, model: str) -> Dict[str, Any]:
    policy, options, _ = MODELS[model]
    r = _replay.replay(trace, policy, fit=True, options=options,
                       timeline_points=0, timing=False)
    cap = int(r.fit_capacity or 0)
    below = _replay.replay(trace, policy, capacity=cap - GRANULE,
                           options=options, timeline_points=0, timing=False)
    at = _replay.replay(trace, policy, capacity=cap, options=options,
                        timeline_points=0, timing=False)
    return {"capacity": cap, "nonmonotone": bool(r.fit_nonmonotone),
            "below_fits": below.oom is None, "at_fits": at.oom is None,
            "below_oom": below.oom.describe() if below.oom else None}


def real_run(name: str, count: int, argv: Sequence[str], policy: str,
             pool: int, rep: int, out: str,
             extra_flags: Sequence[str] = ()) -> Dict[str, Any]:
    device = device_for(pool)
    p = _real.BY_NAME[policy]
    cmd = [*_engine.jaxlake_command(), "run", "--fake-gpu=h100",
           f"--fake-gpu-memory={device}", f"--fake-gpu-count={count}",
           "--no-lake", "--", argv[0], STATS_RUN, *argv[1:]]
    env = _real.run_environment(fake_env(), p, None)
    if extra_flags:
        env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""),
                                     *extra_flags]).strip()
    log = os.path.join(out, f"{name}.{policy[5:]}.{device}.{rep}.log")
    code, text, secs = run(cmd, env, log)
    stats = []
    for line in text.splitlines():
        if line.startswith("MEMORY_STATS "):
            stats.append(json.loads(line[len("MEMORY_STATS "):])["stats"])
    oom = _real.out_of_memory(text) if code != 0 else None
    verdict = "fits" if code == 0 else ("oom" if oom else "error")
    peaks = [s.get("peak_bytes_in_use") for s in stats if s]
    limits = [s.get("bytes_limit") for s in stats if s]
    remat = "Can't reduce memory use below" in text
    return {"device": device, "pool": pool, "verdict": verdict,
            "seconds": round(secs, 1), "message": oom or (
                "" if code == 0 else text.splitlines()[-1:][0][:300]
                if text else ""),
            "peak_in_use": max(peaks) if peaks and None not in peaks
            else None,
            "bytes_limit": max(limits) if limits and None not in limits
            else None, "remat_logged": remat, "log": log}


_SIZE = r"([0-9.]+)([MG])iB(?: \(([0-9]+) bytes\))?"
_REMAT = re.compile(r"only reduced to " + _SIZE + r".*down from " + _SIZE)


def remat_mib(text: str) -> Optional[Tuple[float, float]]:
    """XLA's rematerialisation in a log, (from, to) in MiB: the bytes
    where XLA gives them (it does beside GiB figures), else its MiB or GiB
    figure."""
    m = _REMAT.search(text)
    if not m:
        return None

    def mib(value: str, unit: str, nbytes: Optional[str]) -> float:
        if nbytes:
            return int(nbytes) / MIB
        return float(value) * (1024.0 if unit == "G" else 1.0)

    return mib(*m.group(4, 5, 6)), mib(*m.group(1, 2, 3))


def target_trace(name: str, count: int, argv: Sequence[str],
                 case: Dict[str, Any], out: str) -> None:
    """The program recorded again, on the device whose pool is JAX's
    default's fit capacity (the lake serving XLA's pool, as when
    recording; `jaxlake run` sets XLA's memory limit for the lake's
    capacity as for JAX's pool): how much the trace `jaxlake fit` replays
    differs from the program at the GPU's size."""
    if "target" in case:
        return
    pool = case["models"]["bfc-prealloc"]["capacity"]
    device = device_for(pool)
    trace = os.path.join(out, f"{name}.at-{device}.jsonl")
    cmd = [*_engine.jaxlake_command(), "run", "--fake-gpu=h100",
           f"--fake-gpu-memory={device}", f"--fake-gpu-count={count}",
           "--trace", trace, "--", *argv]
    code, text, secs = run(cmd, fake_env(), trace + ".log")
    entry: Dict[str, Any] = {"device": device, "exit": code,
                             "seconds": round(secs, 1)}
    if os.path.isfile(trace) and os.path.getsize(trace) > 0:
        t = tracefile.read_trace(trace)
        entry["peak_live"] = max(int(t.core.peak_live(d))
                                 for d in range(max(1, count)))
        entry["events"] = len(t)
    m = remat_mib(text)
    if m:
        entry["remat_mib"] = list(m)
    case["target"] = entry
    print(f"  recorded {name} on {format_size(device)}: exit {code}, "
          f"peak live {_mib(entry.get('peak_live'))} MiB", flush=True)


def adaptation(results: Dict[str, Any]) -> str:
    """How the trace recorded on 256 GiB differs from the program at the
    GPU's size: peak live of both recordings, and XLA's
    rematerialisation in the real runs at that size."""
    lines = ["| case | events / peak live on 256 GiB | device | events / "
             "peak live there (lake) | XLA's remat. there (JAX's default, "
             "from -> to MiB) |", "|---|---|---|---|---|"]
    for name, case in results.get("cases", {}).items():
        t = case.get("target")
        if t is None:
            continue
        remat = []
        for r in case.get("runs", {}).values():
            m = remat_mib(_read(r["log"]))
            if m and r["pool"] in (t["device"] * 3 // 4,
                                   t["device"] * 3 // 4 - GRANULE):
                remat.append(f"{m[0]:.1f} -> {m[1]:.1f}")
        lines.append(
            f"| {name} | {case.get('trace_events', '-')} / "
            f"{_mib(case['trace_peak_live'])} | {_mib(t['device'])} | "
            f"{t.get('events', '-')} / {_mib(t.get('peak_live'))} | "
            f"{'; '.join(sorted(set(remat))) or 'none logged'} |")
    return "\n".join(lines)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def validate(args: argparse.Namespace) -> None:
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    results: Dict[str, Any] = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    results["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    results["real_flags"] = list(args.real_flag)

    def save() -> None:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
        os.replace(path + ".tmp", path)

    all_cases = cases(args.equinox_python)
    names = args.cases.split(",") if args.cases else list(all_cases)
    models = args.models.split(",") if args.models else list(MODELS)
    for name in names:
        if name not in all_cases:
            sys.exit(f"unknown case {name!r}: one of " + ", ".join(all_cases))
        count, argv = all_cases[name]
        print(f"== {name}", flush=True)
        trace_path = record(name, count, argv, args.out, results,
                            args.trace_from)
        save()
        if trace_path is None:
            print(f"  {name}: the recording failed", flush=True)
            continue
        trace = tracefile.read_trace(trace_path)
        case = results.setdefault("cases", {}).setdefault(name, {})
        case["argv"] = [os.path.relpath(a, REPO) if a.startswith(REPO)
                        else a for a in argv]
        case["devices"] = count
        case["trace_peak_live"] = max(int(trace.core.peak_live(d))
                                      for d in range(max(1, count)))
        case["trace_peak_rounded"] = peak_rounded(trace)
        case["trace_events"] = len(trace)
        runs = case.setdefault("runs", {})
        for model in models:
            fit = model_fit(trace, model)
            entry = case.setdefault("models", {}).setdefault(model, {})
            entry.update(fit)
            real_name = MODELS[model][2]
            if real_name is None:
                entry["real"] = None
                entry["why_not"] = NO_REAL.get(model, "")
                continue
            entry["real"] = real_name
            cap = fit["capacity"]
            if device_for(cap - GRANULE) < MIN_DEVICE:
                entry["why_not"] = ("the fit capacity is below the fake "
                                    "GPU's smallest device's pool (48 MiB)")
                continue
            for pool in (cap - GRANULE, cap):
                for rep in range(args.repeats):
                    key = f"{real_name}@{pool}#{rep}"
                    if key in runs:
                        continue
                    r = real_run(name, count, argv, real_name, pool, rep,
                                 args.out, args.real_flag)
                    runs[key] = r
                    print(f"  {model} -> {real_name} on "
                          f"{format_size(r['device'])} (pool "
                          f"{format_size(pool)}): {r['verdict']} "
                          f"({r['seconds']:.0f} s)", flush=True)
                    save()
        if args.target_trace and "bfc-prealloc" in case.get("models", {}):
            target_trace(name, count, argv, case, args.out)
        save()
    print(table(results))
    print()
    print(adaptation(results))


def _mib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / MIB:.1f}"


def table(results: Dict[str, Any]) -> str:
    """The markdown validation table of results.json: for each case and
    model, the model's fit capacity C (MiB of pool), then the real
    allocator's verdicts at a pool of C - 2 MiB and of C (the model's are
    out of memory and fits), and whether they agree."""
    models = [m for m in MODELS if any(
        m in c.get("models", {}) for c in results.get("cases", {}).values())]
    head = []
    for m in models:
        real = MODELS[m][2]
        head.append(f"{m}" + (f" / {real}" if real else " (no real run)")
                    + (" (JAX's default)" if m == "bfc-prealloc" else ""))
    lines = ["| case | trace peak live | " + " | ".join(head) + " |",
             "|---|---|" + "---|" * len(models)]
    agreed = total = errors = 0
    for name, case in results.get("cases", {}).items():
        cells = []
        for model in models:
            m = case.get("models", {}).get(model)
            if m is None:
                cells.append("-")
                continue
            cap = m["capacity"]
            expect = ("fits" if m["below_fits"] else "oom",
                      "fits" if m["at_fits"] else "oom")
            text = f"C {_mib(cap)}"
            if m["below_fits"] or not m["at_fits"]:
                text += f" (model {expect[0]} / {expect[1]})"
            if m.get("real") is None or m.get("why_not"):
                cells.append(text + ": not run")
                continue
            runs = case.get("runs", {})
            got = []
            ok = True
            for pool, want in ((cap - GRANULE, expect[0]), (cap, expect[1])):
                v = [r["verdict"] for k, r in sorted(runs.items())
                     if k.startswith(f"{m['real']}@{pool}#")]
                got.append(",".join(v) or "-")
                ok &= bool(v) and all(x == want for x in v)
            if any("error" in g for g in got):
                errors += 1
                cells.append(f"{text}: real {' / '.join(got)} (not "
                             "checked)")
                continue
            total += 1
            agreed += ok
            cells.append(f"{text}: real {' / '.join(got)} "
                         + ("agrees" if ok else "**differs**"))
        lines.append(f"| {name} | {_mib(case.get('trace_peak_live'))} | "
                     + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"(MiB; real: the real allocator's verdicts at a pool of "
                 f"C - 2 MiB and of C, where the model says oom / fits; "
                 f"{agreed} of {total} agree; {errors} not checked: a real "
                 "run failed for another reason than memory)")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.
                                RawDescriptionHelpFormatter)
    p.add_argument("--out", default="validate-models")
    p.add_argument("--cases", default="", help="comma-separated (default: "
                   "all)")
    p.add_argument("--models", default="", help="comma-separated (default: "
                   + ", ".join(MODELS) + ")")
    p.add_argument("--repeats", type=int, default=1,
                   help="real runs per device size (default: 1)")
    p.add_argument("--equinox-python", default=sys.executable,
                   help="a Python with equinox and optax, for the "
                   "equinox-cnn case (default: this one)")
    p.add_argument("--real-flag", action="append", default=[],
                   metavar="FLAG", help="an XLA flag added to the real runs "
                   "only, e.g. --real-flag=--xla_gpu_memory_limit_slop_"
                   "factor=10000 (XLA compiles as for an unlimited device, "
                   "as the recording did)")
    p.add_argument("--trace-from", default=None, metavar="DIR",
                   help="reuse the traces recorded in another OUT")
    p.add_argument("--target-trace", action="store_true",
                   help="also record each case on the device whose pool "
                   "is JAX's default's fit capacity (how the trace differs "
                   "there)")
    p.add_argument("--table", action="store_true",
                   help="print the table of OUT/results.json and stop")
    args = p.parse_args(argv)
    if args.table:
        with open(os.path.join(args.out, "results.json"),
                  encoding="utf-8") as f:
            data = json.load(f)
        print(table(data))
        print()
        print(adaptation(data))
        return 0
    if "xla_gpu_autotune_level=0" not in os.environ.get("XLA_FLAGS", ""):
        print("note: XLA_FLAGS has no --xla_gpu_autotune_level=0; on the "
              "fake GPU the autotuner's choices (and scratch) vary from run "
              "to run", file=sys.stderr)
    validate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
