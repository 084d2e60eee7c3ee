"""Rebuilds the bundled trace suite from the Flax examples.

    python benchmarks/traces/build.py            # every trace, here
    python benchmarks/traces/build.py --list     # what it would run
    python benchmarks/traces/build.py --only 1b --jobs 2
    python benchmarks/traces/build.py --workloads  # the workloads group

Each trace is one run of an example (examples/*.py) with --trace: run on
the CPU, sized by a device-less H100 compile (see jaxlake/_src/trace/recorder.py).
Models too big for the CPU (--compile-only) are compiled and not run. A
trace whose program the recorder cannot record (pinned host memory) is the
shim's trace of a run on the fake GPU (`jaxlake run --fake-gpu --trace`,
XLA's real GPU client, the lake serving it). Needs the `examples` extra
(pip install 'jaxlake[examples]'); no GPU. `--list` prints each trace's
command.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = ROOT / "examples"


#: How a trace is recorded: RECORDER, the example's own --trace on the CPU
#: (jaxlake.Recorder), or FAKE_GPU, the shim's trace of the example run by
#: XLA's GPU client on the fake GPU under the lake (`jaxlake run --fake-gpu
#: --trace`), for what the recorder cannot compile without a device.
RECORDER, FAKE_GPU = "recorder", "fake-gpu"
#: A pair's second job: the shim's trace of the example run on a fake
#: device shared (`--fake-gpu-shared`) with a first job that keeps running
#: its steps, untraced, from before the second starts to after it ends
#: (jaxlake/_src/fit/beside.py). Its meta names the first job's trace
#: (docs/traces.md, "Pairs").
FAKE_GPU_BESIDE = "fake-gpu-beside"

#: XLA's flags of a fake-GPU recording: autotuning off (on the fake it
#: times kernels that do not run, and its scratch follows its choices).
FAKE_GPU_XLA_FLAGS = "--xla_gpu_autotune_level=0"


class Spec(NamedTuple):
    name: str            # the trace's name and file stem
    script: str          # which example
    args: Sequence[str]  # its options (besides --trace)
    about: str           # one line for the README table
    engine: str = RECORDER  # RECORDER, FAKE_GPU or FAKE_GPU_BESIDE
    beside: Optional["Spec"] = None  # FAKE_GPU_BESIDE: the first job


_SMALL = ("--preset", "small", "--steps", "12", "--batch", "16",
          "--seq-len", "128", "--dtype", "bfloat16")
_BIG = ("--dtype", "bfloat16", "--compile-only", "--steps", "6")

SUITE: List[Spec] = [
    Spec("lm-tiny", "train_lm.py",
         ("--preset", "tiny", "--steps", "20", "--dtype", "bfloat16"),
         "the smallest LM (0.1M parameters), plain training"),
    Spec("lm-small", "train_lm.py", _SMALL,
         "3.2M parameters, layers scanned (nnx.scan), plain training"),
    Spec("lm-small-unrolled", "train_lm.py", _SMALL + ("--no-scan-layers",),
         "the same model with its layers unrolled"),
    Spec("lm-small-remat-full", "train_lm.py", _SMALL + ("--remat", "full"),
         "nnx.remat inside the scanned body, nothing saved"),
    Spec("lm-small-remat-dots-saveable", "train_lm.py",
         _SMALL + ("--remat", "dots-saveable"),
         "nnx.remat keeping matmul outputs"),
    Spec("lm-small-remat-dots-no-batch-saveable", "train_lm.py",
         _SMALL + ("--remat", "dots-no-batch-saveable"),
         "nnx.remat keeping matmuls without batch dimensions"),
    Spec("lm-small-remat-attn-mlp-out-saveable", "train_lm.py",
         _SMALL + ("--remat", "attn-mlp-out-saveable"),
         "nnx.remat keeping the attention and MLP outputs (by name)"),
    Spec("lm-small-unrolled-remat-full", "train_lm.py",
         _SMALL + ("--no-scan-layers", "--remat", "full"),
         "unrolled layers, each rematerialised"),
    Spec("lm-small-accum4", "train_lm.py", _SMALL + ("--grad-accum", "4"),
         "gradient accumulation over 4 micro-batches (optax.MultiSteps)"),
    Spec("lm-small-buckets-eval", "train_lm.py",
         _SMALL + ("--seq-buckets", "32,64,96,128", "--steps", "16",
                   "--eval-every", "4"),
         "variable sequence lengths (one executable per bucket) with "
         "evaluation every 4 steps"),
    Spec("lm-small-lora-r8", "finetune_lora.py", _SMALL + ("--rank", "8"),
         "LoRA fine-tuning: frozen base, rank-8 nnx.LoRALinear adapters"),
    Spec("lm-small-data-8dev", "train_sharded.py",
         _SMALL + ("--layout", "data"),
         "data parallel over 8 devices (device 0's allocations)"),
    Spec("lm-small-fsdp-8dev", "train_sharded.py",
         _SMALL + ("--layout", "fsdp"),
         "FSDP over 8 devices: parameters and optimizer state sharded"),
    Spec("lm-small-tp-8dev", "train_sharded.py",
         _SMALL + ("--layout", "tp", "--mesh", "2x4"),
         "tensor parallel, mesh data 2 x model 4"),
    Spec("lm-small-per-tensor", "train_lm.py",
         _SMALL + ("--steps", "4", "--no-scan-layers", "--trace-per-tensor"),
         "one allocation per XLA logical buffer (layers unrolled): an "
         "eager (PyTorch-like) workload"),
    Spec("lm-base", "train_lm.py", ("--preset", "base") + _BIG,
         "85M parameters, compile-only"),
    Spec("lm-1b", "train_lm.py", ("--preset", "1b") + _BIG,
         "1.0B parameters, compile-only"),
    Spec("lm-1b-unrolled-remat-full", "train_lm.py",
         ("--preset", "1b", "--no-scan-layers", "--remat", "full") + _BIG,
         "1.0B parameters, unrolled, every block rematerialised, "
         "compile-only"),
    Spec("lm-1b-remat-full-fsdp-8dev", "train_sharded.py",
         ("--preset", "1b", "--layout", "fsdp", "--remat", "full",
          "--batch", "16") + _BIG,
         "1.0B parameters, FSDP over 8 devices, remat, compile-only"),
    Spec("lm-7b-remat-full-fsdp-8dev", "train_sharded.py",
         ("--preset", "7b", "--layout", "fsdp", "--remat", "full",
          "--batch", "8") + _BIG,
         "6.4B parameters, scanned, FSDP over 8 devices (9.6 GB of "
         "parameters and adam state per device), compile-only"),
]

#: Per-tensor variants of the suite's small configurations, not bundled:
#: traces the policy was not tuned on, to check it against the other
#: allocators (docs/experiments/per_tensor.md). `--per-tensor`
#: builds these instead of SUITE, into a folder other than this one. (An
#: option given twice takes its last value.)
_PT = ("--preset", "small", "--steps", "4", "--batch", "16", "--seq-len",
       "128", "--dtype", "bfloat16", "--no-scan-layers", "--trace-per-tensor")
PER_TENSOR: List[Spec] = [
    Spec("pt-tiny", "train_lm.py",
         ("--preset", "tiny", "--steps", "6", "--dtype", "bfloat16",
          "--no-scan-layers", "--trace-per-tensor"),
         "lm-tiny, one allocation per logical buffer"),
    Spec("pt-small-remat-full", "train_lm.py", _PT + ("--remat", "full"),
         "lm-small-unrolled-remat-full, per logical buffer"),
    Spec("pt-small-accum4", "train_lm.py", _PT + ("--grad-accum", "4"),
         "lm-small-accum4 with unrolled layers, per logical buffer"),
    Spec("pt-small-dots", "train_lm.py", _PT + ("--remat", "dots-saveable"),
         "lm-small-remat-dots-saveable unrolled, per logical buffer"),
    Spec("pt-small-b8-s256", "train_lm.py",
         _PT + ("--batch", "8", "--seq-len", "256"),
         "lm-small-per-tensor at batch 8, sequence length 256"),
    Spec("pt-small-buckets-eval", "train_lm.py",
         _PT + ("--seq-buckets", "32,64,96,128", "--steps", "8",
                "--eval-every", "4"),
         "lm-small-buckets-eval unrolled, per logical buffer"),
    Spec("pt-small-lora-r8", "finetune_lora.py", _PT + ("--rank", "8"),
         "lm-small-lora-r8 unrolled, per logical buffer"),
    Spec("pt-small-f32", "train_lm.py", _PT + ("--dtype", "float32"),
         "lm-small-per-tensor in float32"),
]

#: The hold-out set: traces the lake's policy is never tuned on, kept apart
#: from the bundled suite and from PER_TENSOR (docs/benchmarks.md,
#: "Hold-out"). A policy change lands only if it holds on these as well as
#: on the bundled suite. `--holdout` builds these, into a folder other than
#: this one. They are per-buffer traces (one allocation per XLA logical
#: buffer) of the sharded layouts on 2, 4 and 8 devices and of the remat
#: policies at three model sizes (devices of 4 to 1,100 granules; most lie
#: between 15 and 80, where one granule decides U_fit), and the synthetic
#: traces at seeds no measurement used before (HOLDOUT_SEEDS, each in a
#: folder synthetic-seed<N>).
_HO = ("--steps", "3", "--batch", "16", "--seq-len", "128", "--dtype",
       "bfloat16", "--trace-per-tensor")
HOLDOUT: List[Spec] = [
    *[Spec(f"ho-{layout}-{n}dev", "train_sharded.py",
           ("--preset", "small", "--layout", layout, "--cpu-devices", str(n))
           + (("--mesh", mesh) if mesh else ())
           + _HO,
           f"the {layout} layout over {n} devices, per logical buffer")
      for layout, n, mesh in (
          ("data", 2, None), ("data", 4, None), ("data", 8, None),
          ("fsdp", 2, None), ("fsdp", 4, None), ("fsdp", 8, None),
          ("tp", 2, "1x2"), ("tp", 4, "2x2"), ("tp", 8, "2x4"))],
    *[Spec(f"ho-{preset}-remat-{remat}", "train_lm.py",
           ("--preset", preset, "--no-scan-layers", "--remat", remat)
           + _HO + extra,
           f"{preset} preset, layers unrolled, --remat {remat}, per "
           "logical buffer")
      for preset, extra in (("tiny", ()), ("small", ("--batch", "8")),
                            ("base", ("--batch", "4", "--compile-only")))
      for remat in ("full", "dots-saveable", "attn-mlp-out-saveable")],
]
HOLDOUT_SEEDS = (100, 101, 102, 103)

#: The workloads group (docs/benchmarks.md, "Workloads that fragment"):
#: programs beyond one jitted training step, bundled in a folder of their
#: own, WORKLOADS_DIR, so that the suite's figures stay those of the
#: training traces above; `jaxlake bench --workloads` replays them.
#: `--workloads` builds these. "{tmp}" in an option is the run's own empty
#: temporary folder (a checkpoint folder that must start empty).
_SERVE = ("--preset", "small", "--max-len", "1024", "--cache-block", "256",
          "--prompt-len", "64,512", "--new-tokens", "64,512",
          "--requests", "20", "--slots", "8", "--compile-only")
#: The shared GPU's first job (benchmarks/shared_gpu.py's): alone on a
#: shared fake device, 3 steps (it holds its peak from its first steps on).
_SHARED_FIRST = Spec(
    "shared-first-tiny", "train_lm.py",
    ("--preset", "tiny", "--batch", "32", "--attention", "xla", "--steps",
     "3"),
    "the first of two trainers sharing one GPU (a pair's first job: "
    "replayed only with the second)", FAKE_GPU)
WORKLOADS: List[Spec] = [
    Spec("serve-small-grow", "serve_lm.py", _SERVE,
         "serving 20 requests, 8 at a time, each with its own KV cache "
         "that grows by 256 positions and is freed when it finishes"),
    Spec("serve-small-slots", "serve_lm.py", _SERVE + ("--cache", "slots"),
         "the same requests over one fixed cache of 8 slots"),
    Spec("temp-arena-small", "train_lm.py",
         ("--preset", "small", "--no-scan-layers", "--batch", "64",
          "--seq-len", "256", "--steps", "6", "--dtype", "bfloat16",
          "--compile-only"),
         "one temp buffer per step, 97% of the peak, beside 108 separate "
         "parameter and optimizer-state buffers (the marin pattern)"),
    Spec("keep-outputs-small", "train_lm.py",
         ("--preset", "small", "--steps", "8", "--batch", "16",
          "--seq-buckets", "32,64,96,128", "--eval-every", "2",
          "--eval-batches", "1", "--keep-outputs", "--ckpt-dir", "{tmp}",
          "--ckpt-every", "4", "--restore-at", "6", "--dtype", "bfloat16"),
         "a train step per sequence length, evaluation every 2 steps, "
         "every output kept to the end, a checkpoint restored mid-run"),
    Spec("offload-small", "train_lm.py",
         ("--preset", "small", "--batch", "16", "--seq-len", "128",
          "--steps", "4", "--dtype", "bfloat16", "--attention", "xla",
          "--offload-opt-state", "--remat", "offload-dots"),
         "optimizer state held in pinned host memory and moved in and out "
         "each step, matmul outputs offloaded to it (fake GPU: the shim's "
         "trace of the device allocations)", FAKE_GPU),
    _SHARED_FIRST,
    Spec("shared-second-tiny", "train_lm.py",
         ("--preset", "tiny", "--batch", "128", "--attention", "xla",
          "--steps", "3"),
         "a second trainer at batch 128, run beside the first on one shared "
         "fake device; replayed as a pair with it", FAKE_GPU_BESIDE,
         beside=_SHARED_FIRST),
]
WORKLOADS_DIR = HERE / "workloads"

#: Traces recorded from earlier versions of the examples and kept because
#: they show what no trace above does; build.py does not remake them.
KEPT: Dict[str, str] = {
    "lm-1b-linen": "1.0B parameters from the Linen examples: unrolled "
                   "layers and attention written by hand in float32 "
                   "(O(L^2) scores per layer), compile-only",
}


def _jaxlake() -> List[str]:
    """This jaxlake's command: the script beside this interpreter, else
    `python -m jaxlake`."""
    script = Path(sys.executable).parent / "jaxlake"
    if os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "jaxlake"]


def command(spec: Spec, trace: str, scratch: str = "{tmp}",
            python: str = "python", shared_name: str = "NAME") -> List[str]:
    """The command line that records `spec` into the file `trace`; its
    environment is _env's (JAX_PLATFORMS=cpu for the recorder,
    XLA_FLAGS=FAKE_GPU_XLA_FLAGS on the fake GPU). A pair's second job
    runs on the shared fake device `shared_name`, beside first_command()."""
    args = [a.replace("{tmp}", scratch) for a in spec.args]
    example = os.path.join("examples", spec.script)
    if spec.engine in (FAKE_GPU, FAKE_GPU_BESIDE):
        shared = (["--fake-gpu-shared", shared_name]
                  if spec.engine == FAKE_GPU_BESIDE else [])
        return [*_jaxlake(), "run", "--quiet", "--fake-gpu", *shared,
                "--trace", trace, "--", python, example, "--no-progress",
                *args]
    if spec.engine != RECORDER:
        raise ValueError(f"{spec.name}: unknown engine {spec.engine!r}")
    return [python, example, "--no-progress", "--no-jaxlake", *args,
            "--trace", trace, "--trace-name", spec.name]


def first_command(spec: Spec, python: str = "python",
                  shared_name: str = "NAME") -> List[str]:
    """The command of a pair's first job while its second is recorded:
    untraced, on the shared fake device, running steps until it is
    stopped, one line a step in {READY} (beside.py)."""
    assert spec.beside is not None
    first = spec.beside
    args = [a for a in first.args]
    if "--steps" in args:
        args[args.index("--steps") + 1] = "100000"
    return [*_jaxlake(), "run", "--quiet", "--fake-gpu", "--fake-gpu-shared",
            shared_name, "--", python,
            os.path.join("examples", first.script), "--no-progress", *args,
            "--log-json", "{READY}"]


def shown(spec: Spec) -> str:
    """`spec`'s command as --list prints it: a shell line run from the
    repository's root, its environment first."""
    fake = spec.engine in (FAKE_GPU, FAKE_GPU_BESIDE)
    env = (f"XLA_FLAGS={FAKE_GPU_XLA_FLAGS}" if fake else "JAX_PLATFORMS=cpu")
    line = command(spec, f"{spec.name}.jsonl.gz")
    if fake:
        line[:len(_jaxlake())] = ["jaxlake"]
    text = f"{env} {shlex.join(line)}"
    if spec.engine == FAKE_GPU_BESIDE:
        first = first_command(spec)
        first[:len(_jaxlake())] = ["jaxlake"]
        text += (f"\n      beside (started first, under way after 2 steps "
                 f"logged, stopped after): {env} {shlex.join(first)}")
    return text


def _env(spec: Spec, cache: Optional[str]) -> Dict[str, str]:
    env = dict(os.environ)
    if spec.engine in (FAKE_GPU, FAKE_GPU_BESIDE):
        # XLA's GPU client on the fake device, every run compiled afresh.
        env.pop("JAX_PLATFORMS", None)
        env["XLA_FLAGS"] = FAKE_GPU_XLA_FLAGS
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
        return env
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    if cache and "--trace-per-tensor" not in spec.args:
        # Many traces share their CPU executables (init, optimizer init):
        # jax's persistent cache compiles them once. The per-tensor trace
        # needs XLA's dumps, which a cache hit would not write.
        env["JAX_COMPILATION_CACHE_DIR"] = cache
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return env


def build_one(spec: Spec, out: Path, verbose: bool,
              cache: Optional[str] = None) -> Dict[str, object]:
    """Runs one example; returns the trace's summary."""
    final = out / f"{spec.name}.jsonl.gz"
    with tempfile.TemporaryDirectory(prefix="jaxlake-suite-") as tmp:
        partial = Path(tmp) / final.name
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        started = time.perf_counter()
        if spec.engine == FAKE_GPU_BESIDE:
            _record_beside(spec, str(partial), str(scratch), tmp, cache)
        else:
            cmd = command(spec, str(partial), str(scratch), sys.executable)
            done = subprocess.run(cmd, env=_env(spec, cache),
                                  capture_output=True, text=True,
                                  cwd=str(ROOT))
            if done.returncode != 0:
                raise RuntimeError(
                    f"{spec.name}: {' '.join(cmd)} exited {done.returncode}"
                    f"\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
            if verbose:
                print(done.stdout.strip(), flush=True)
        seconds = time.perf_counter() - started
        if spec.engine in (FAKE_GPU, FAKE_GPU_BESIDE):
            _name_shim_trace(partial, final, spec)
        else:
            shutil.move(str(partial), final)
    events = 0
    with gzip.open(final, "rt", encoding="utf-8") as f:
        header = json.loads(f.readline())
        for _ in f:
            events += 1
    return {"name": spec.name, "file": final.name, "events": events,
            "bytes": final.stat().st_size, "seconds": round(seconds, 1),
            "params": header.get("meta", {}).get("params")}


def _record_beside(spec: Spec, trace: str, scratch: str, logs: str,
                   cache: Optional[str]) -> None:
    """Records a pair's second job beside its first on one shared fake
    device (jaxlake/_src/fit/beside.py)."""
    from jaxlake._src.fit import beside
    name = beside.shared_name("build")
    env = _env(spec, cache)
    try:
        r = beside.run_pair(
            first_command(spec, sys.executable, name), env,
            command(spec, trace, scratch, sys.executable, name), env,
            logs, spec.name, ready_lines=2, cwd=str(ROOT))
    except beside.FitError as e:
        raise RuntimeError(f"{spec.name}: {e}") from None
    finally:
        beside.remove_shared(name)
    if not r.fits:
        raise RuntimeError(f"{spec.name}: the pair did not run: {r.why()}"
                           f"\n{r.second_output[-3000:]}")


def _name_shim_trace(partial: Path, final: Path, spec: Spec) -> None:
    """Writes the shim's trace `partial` to `final` under the spec's name
    (the shim names every trace "shim"), its meta saying what ran; the
    events and the shim's own meta are kept."""
    from jaxlake._src.trace import tracefile
    trace = tracefile.read_trace(str(partial))
    if len(trace) == 0:
        raise RuntimeError(f"{spec.name}: the shim's trace holds no "
                           "allocation: the lake served nothing")
    trace.meta.update({"example": spec.script, "engine": spec.engine,
                       "args": list(spec.args),
                       "xla_flags": FAKE_GPU_XLA_FLAGS})
    if spec.beside is not None:
        # docs/traces.md, "Pairs": the first job's file, in this folder.
        trace.meta["beside"] = f"{spec.beside.name}.jsonl.gz"
        trace.meta["first_args"] = list(spec.beside.args)
    tracefile.write_jsonl(trace, str(final), name=spec.name)


def select(patterns: Optional[List[str]],
           specs: Sequence[Spec] = SUITE) -> List[Spec]:
    if not patterns:
        return list(specs)
    chosen = [s for s in specs if any(
        fnmatch.fnmatch(s.name, p) or p in s.name for p in patterns)]
    if not chosen:
        raise SystemExit(
            f"error: --only {' '.join(patterns)} matches no trace; the "
            f"traces are: {', '.join(s.name for s in specs)}")
    return chosen


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None,
                        help="folder for the traces (default: this one; "
                             "with --workloads, its workloads folder)")
    parser.add_argument("--only", nargs="+", metavar="PATTERN",
                        help="build only traces whose name matches")
    parser.add_argument("--jobs", type=int, default=1,
                        help="examples run at once (default 1)")
    parser.add_argument("--list", action="store_true",
                        help="list the traces and what they show")
    parser.add_argument("--verbose", action="store_true",
                        help="show each example's own output")
    parser.add_argument("--per-tensor", action="store_true",
                        help="build the per-tensor variants (not bundled) "
                             "instead of the suite; needs --out")
    parser.add_argument("--holdout", action="store_true",
                        help="build the hold-out set (not bundled, never "
                             "tuned on) instead of the suite; needs --out")
    parser.add_argument("--workloads", action="store_true",
                        help="build the workloads group (serving, kept "
                             "outputs, a temp arena, offloading, the shared "
                             "GPU's pair) instead of the suite, "
                             "into its own folder")
    args = parser.parse_args(argv)
    sets = [f for f, on in (("--per-tensor", args.per_tensor),
                            ("--holdout", args.holdout),
                            ("--workloads", args.workloads)) if on]
    if len(sets) > 1:
        parser.error(f"{' and '.join(sets)} build different sets: give one")
    apart = args.per_tensor or args.holdout
    specs = select(args.only, HOLDOUT if args.holdout else
                   PER_TENSOR if args.per_tensor else
                   WORKLOADS if args.workloads else SUITE)
    if args.list:
        for s in specs:
            print(f"{s.name:38} {s.script:18} {s.about}")
            print(f"    {shown(s)}")
        if not apart and not args.workloads:
            for name, about in KEPT.items():
                print(f"{name:38} {'(kept)':18} {about}")
        return 0
    out = Path(args.out if args.out is not None else
               WORKLOADS_DIR if args.workloads else HERE)
    if args.workloads and out.resolve() == HERE:
        parser.error("--workloads builds a group of its own: not into the "
                     "suite's folder, whose figures it would change (leave "
                     "out --out, or give another folder)")
    if apart and out.resolve() == HERE:
        parser.error(f"{'--holdout' if args.holdout else '--per-tensor'} "
                     "needs --out FOLDER: these traces are not part of the "
                     "bundled suite")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    failed = 0
    cache = tempfile.mkdtemp(prefix="jaxlake-suite-cache-")
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {pool.submit(build_one, s, out, args.verbose, cache): s
                   for s in specs}
        for future in concurrent.futures.as_completed(futures):
            try:
                r = future.result()
            except RuntimeError as e:
                failed += 1
                print(f"FAILED {e}", file=sys.stderr, flush=True)
                continue
            print(f"{r['name']:38} {r['events']:8} events "
                  f"{r['bytes'] / 1024:8.1f} KiB {r['seconds']:6.1f}s",
                  flush=True)
    shutil.rmtree(cache, ignore_errors=True)
    if args.holdout and not args.only:
        from jaxlake._src.bench.suite import write_synthetic
        for seed in HOLDOUT_SEEDS:
            folder = out / f"synthetic-seed{seed}"
            write_synthetic(str(folder), seed=seed)
            print(f"synthetic traces, seed {seed}: {folder}", flush=True)
    total = sum(f.stat().st_size for f in out.glob("*.jsonl.gz"))
    print(f"{len(specs) - failed} of {len(specs)} traces in "
          f"{time.perf_counter() - started:.0f}s; {out} holds "
          f"{total / 2**20:.2f} MiB of traces")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
