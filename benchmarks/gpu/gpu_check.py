"""The GPU check of jaxlake: decides in about five minutes whether the lake
serves XLA on a real GPU. Run it through benchmarks/gpu/check.sh (which
installs the package first); see benchmarks/gpu/README.md.

    python benchmarks/gpu/gpu_check.py [--out DIR] [--budget SECONDS]
        [--only STEP,...] [--sanitizer] [--capacity-search]

Steps, in order; each one writes DIR/summary.json when it finishes, so a
run stopped by its time limit still reports the steps it finished:

  env       versions, the GPU, the driver's CUDA version against the
            plugin's minimum
  doctor    `jaxlake doctor` says the hooks are live
  fragment  a JAX program that fragments memory: the lake serves every
            allocation and free (forwarded 0), stitches, the bytes written
            through the stitched buffer read back equal, and both the shim
            and the real driver are loaded
  latency   each driver call's latency by size (benchmarks/gpu/latency.py):
            2 MiB, 32 MiB and 1 GiB handles, access for 1 and up to 8
            devices, the first grant, a mostly free and a mostly used
            device; the format `jaxlake bench --driver-model FILE` reads
  pool      the driver pool's granularity (benchmarks/gpu/pool_probe.py):
            its growth for single requests of 1 B to 33 MiB + 1, packing of
            small requests, whether small requests take a page's free end,
            and how much of the free memory it hands out in all
  train     20 training steps (examples/train_lm.py) with the lake and with
            cuda_async on the driver's pool (the shim loaded with
            JAXLAKE_SHIM_HOOKS=0), both with --xla_gpu_deterministic_ops:
            equal losses, the lake's allocation count, step-time ratio and
            peak reserved bytes
  sanitizer (--sanitizer) the stress program under compute-sanitizer
  capacity  (--capacity-search) the largest batch under a memory cap

Exit status: 0 all steps passed, 1 a step failed, 3 no GPU here, 4 out of
time (the steps not reached are listed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
TRAIN = REPO / "examples" / "train_lm.py"
# Programs run from here, not the checkout: from the repository root,
# `import jaxlake` would find the source folder instead of the installed
# package (which has the compiled module and the shim).
WORKDIR = "/"

EXIT_FAILED, EXIT_NO_GPU, EXIT_OUT_OF_TIME = 1, 3, 4
STEPS = ("env", "doctor", "fragment", "latency", "pool", "train")
OPT_IN = ("sanitizer", "capacity")

# The minimum driver API version of each CUDA plugin (its CUDA major).
PLUGIN_MIN_DRIVER = {"jax-cuda12-plugin": 12000, "jax-cuda13-plugin": 13000}

FRAGMENT = r"""
import json, os
import numpy as np
import jaxlake
from jaxlake._src.xla import integration as xla
status = jaxlake.configure(capacity="1GiB", required=True)
import jax, jax.numpy as jnp
gpu = jax.devices("gpu")[0]
MIB = 1 << 20
# Twenty 40 MiB buffers, then every other one freed: 400 MiB free in
# scattered 40 MiB blocks, 224 MiB of the capacity never reserved.
blocks = [jax.device_put(np.full(40 * MIB // 4, i, np.float32), gpu)
          for i in range(20)]
jax.block_until_ready(blocks)
for b in blocks[0::2]:
    b.delete()
before = jaxlake.stats()
host = np.arange(320 * MIB // 4, dtype=np.float32)
big = jax.device_put(host, gpu)      # 320 MiB: only a stitch can serve it
big.block_until_ready()
after = jaxlake.stats()
back = np.asarray(big)               # read back through the stitched range
for b in blocks[1::2]:               # room for the kernel's 320 MiB output
    b.delete()
doubled = np.asarray(big * 2.0)      # a kernel reads it too
stitches = lambda s: s.alloc_stitch + s.alloc_stitch_grow + s.alloc_stitch_reuse
result = {
    "stitches_for_big": stitches(after) - stitches(before),
    "stitches_total": stitches(after),
    "read_back_equal": bool(np.array_equal(back, host)),
    "kernel_equal": bool(np.array_equal(doubled, host * 2.0)),
    "checked_values": [float(back[0]), float(back[-1])],
}
del big, blocks
jax.block_until_ready(jnp.ones(8, device=gpu))
result["hooks"] = jaxlake.hook_counts()
result["stats"] = jaxlake.stats().as_dict()
result["loaded"] = xla.loaded_drivers()
result["shim"] = xla.shim_path()
print("FRAGMENT " + json.dumps(result, default=str), flush=True)
"""

ENV_PROBE = r"""
import ctypes, json, sys
cu = ctypes.CDLL(sys.argv[1])
v = ctypes.c_int()
rc = cu.cuDriverGetVersion(ctypes.byref(v))
print(json.dumps({"rc": rc, "driver_version": v.value}))
"""


class Summary:
    """summary.json, rewritten (atomically) as each step finishes."""

    def __init__(self, out: pathlib.Path) -> None:
        self.path = out / "summary.json"
        self.data: Dict[str, Any] = {
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "status": "running", "steps": {}, "failures": []}
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        os.replace(tmp, self.path)

    def step(self, name: str, result: Dict[str, Any],
             failures: Sequence[str] = ()) -> None:
        result["passed"] = not failures
        self.data["steps"][name] = result
        self.data["failures"] += [f"{name}: {f}" for f in failures]
        self.write()
        mark = "ok" if not failures else "FAILED: " + "; ".join(failures)
        print(f"[{name}] {mark}", flush=True)


class Budget:
    """The time left for the whole check."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self, step_limit: float) -> float:
        return max(1.0, min(step_limit, self.left() - 5.0))


def run(cmd: List[str], env: Dict[str, str], log: pathlib.Path,
        timeout: float) -> Tuple[int, float, str]:
    """Runs a command; returns (exit status, seconds, output). 124: timed
    out."""
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=WORKDIR)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        text = error.stdout or b""
        text = text.decode() if isinstance(text, bytes) else text
        code, out = 124, f"{text}\ntimed out after {timeout:.0f} s"
    log.write_text(out)
    return code, time.perf_counter() - start, out


def base_env() -> Dict[str, str]:
    # No jaxlake setting reaches the steps, but the fake GPU's own options
    # do (the tests run the steps that need no GPU over it).
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith("JAXLAKE") or
               k.startswith("JAXLAKE_FAKEGPU_")) and k not in (
               "JAX_PLATFORMS", "XLA_PYTHON_CLIENT_ALLOCATOR",
               "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def gpu_present() -> Tuple[bool, str]:
    """(True, GPU description) or (False, why not)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False, "nvidia-smi not found"
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader,nounits"], capture_output=True,
            text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return False, f"nvidia-smi failed: {error}"
    lines = [l for l in out.stdout.splitlines() if l.strip()]
    if out.returncode != 0 or not lines:
        return False, ("nvidia-smi lists no GPU: "
                       + (out.stderr or out.stdout).strip()[:200])
    return True, lines[0].strip()


def _versions() -> Dict[str, str]:
    from importlib import metadata
    out = {}
    for dist in ("jaxlake", "jax", "jaxlib", "jax-cuda12-plugin",
                 "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt",
                 "flax", "optax", "nanobind", "scikit-build-core"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


# -- the steps -----------------------------------------------------------------


def step_env(out: pathlib.Path, libcuda: Optional[str],
             gpu: str) -> Tuple[Dict[str, Any], List[str]]:
    versions = _versions()
    result: Dict[str, Any] = {"gpu": gpu, "python": sys.version.split()[0],
                              "versions": versions, "libcuda": libcuda}
    failures: List[str] = []
    if libcuda is None:
        return result, ["no CUDA driver library found"]
    code, _, text = run([sys.executable, "-c", ENV_PROBE, libcuda],
                        base_env(), out / "env.log", 60)
    probe = json.loads(text.strip().splitlines()[-1]) if code == 0 else {}
    version = int(probe.get("driver_version", 0))
    result["driver_version"] = version
    plugins = [d for d in PLUGIN_MIN_DRIVER if d in versions]
    minimum = max((PLUGIN_MIN_DRIVER[d] for d in plugins), default=0)
    result["plugin"] = plugins
    result["plugin_min_driver_version"] = minimum
    if code != 0 or probe.get("rc"):
        failures.append(f"cuDriverGetVersion failed ({text.strip()[-200:]})")
    if not plugins:
        failures.append("no jax CUDA plugin installed")
    elif version < minimum:
        failures.append(f"the driver's CUDA version {version} is older than "
                        f"the plugin's minimum {minimum}")
    for dist in ("jax", "jaxlib", "flax", "optax"):
        if dist not in versions:
            failures.append(f"{dist} is not installed")
    return result, failures


def step_doctor(out: pathlib.Path, budget: Budget
                ) -> Tuple[Dict[str, Any], List[str]]:
    code, seconds, text = run([sys.executable, "-m", "jaxlake", "doctor"],
                              base_env(), out / "doctor.log",
                              budget.timeout(120))
    lines = {l.split(":", 1)[0].strip(): l.split(":", 1)[1].strip()
             for l in text.splitlines() if ":" in l}
    result = {"exit": code, "seconds": round(seconds, 1),
              "lake": lines.get("lake"), "hooks_live": lines.get("hooks live"),
              "capacity": lines.get("capacity")}
    failures = []
    if code != 0:
        failures.append(f"doctor exited {code}")
    if not (result["hooks_live"] or "").startswith("yes"):
        failures.append(f"hooks not live: {result['hooks_live']}")
    return result, failures


def _sum(hooks: Dict[str, Dict[str, int]], prefix: str, field: str) -> int:
    return sum(v.get(field, 0) for k, v in hooks.items()
               if k == prefix or k == prefix + "_ptsz")


def step_fragment(out: pathlib.Path, budget: Budget, libcuda: Optional[str]
                  ) -> Tuple[Dict[str, Any], List[str]]:
    code, seconds, text = run([sys.executable, "-c", FRAGMENT], base_env(),
                              out / "fragment.log", budget.timeout(150))
    data: Dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("FRAGMENT "):
            data = json.loads(line[len("FRAGMENT "):])
    hooks = data.get("hooks", {})
    result: Dict[str, Any] = {
        "exit": code, "seconds": round(seconds, 1),
        "alloc_served": _sum(hooks, "cuMemAllocFromPoolAsync", "served"),
        "alloc_forwarded": _sum(hooks, "cuMemAllocFromPoolAsync",
                                "forwarded"),
        "free_served": _sum(hooks, "cuMemFreeAsync", "served"),
        "free_forwarded": _sum(hooks, "cuMemFreeAsync", "forwarded"),
        "captured": _sum(hooks, "cuMemAllocFromPoolAsync", "captured"),
        "stitches_for_big": data.get("stitches_for_big"),
        "stitches_total": data.get("stitches_total"),
        "read_back_equal": data.get("read_back_equal"),
        "kernel_equal": data.get("kernel_equal"),
        "loaded": data.get("loaded", [])}
    failures = []
    if code != 0 or not data:
        failures.append(f"the program failed (exit {code}): "
                        + text.strip()[-300:])
        return result, failures
    for kind in ("alloc", "free"):
        if result[f"{kind}_served"] <= 0:
            failures.append(f"no {kind} served by the lake")
        if result[f"{kind}_forwarded"] != 0:
            failures.append(f"{result[f'{kind}_forwarded']} {kind}s "
                            "forwarded to the driver")
    if not (data.get("stitches_for_big") or 0) > 0:
        failures.append("the 320 MiB buffer was not stitched")
    if not data.get("read_back_equal") or not data.get("kernel_equal"):
        failures.append("bytes read back through the stitched buffer differ")
    loaded = [os.path.realpath(p) for p in data.get("loaded", [])]
    shim = os.path.realpath(data.get("shim", ""))
    if shim not in loaded:
        failures.append("the shim is not loaded in the process")
    if not any(p != shim for p in loaded):
        failures.append("the real driver is not loaded in the process")
    return result, failures


def _train(out: pathlib.Path, name: str, lake: bool, steps: int,
           preset: str, timeout: float, batch: Optional[int] = None,
           cap: Optional[int] = None) -> Dict[str, Any]:
    """One training run under `jaxlake run`: with the lake, or with the
    shim forwarding everything (JAXLAKE_SHIM_HOOKS=0: cuda_async on the
    driver's pool). Step records arrive on stdout (--log-json /dev/stdout)
    and are timed as they arrive."""
    cmd = [sys.executable, "-m", "jaxlake", "run", "--", sys.executable,
           str(TRAIN), "--preset", preset, "--steps", str(steps), "--seed",
           "0", "--no-progress", "--log-json", "/dev/stdout",
           "--jaxlake" if lake else "--no-jaxlake"]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    env = base_env()
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_gpu_deterministic_ops=true").strip()
    if lake and cap is not None:
        env["JAXLAKE_CAPACITY"] = str(cap)
    if not lake:
        env["JAXLAKE_SHIM_HOOKS"] = "0"
        if cap is not None:
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{cap / DEVICE_BYTES:.4f}"
    start = time.monotonic()
    arrivals: Dict[int, float] = {}
    losses: Dict[int, float] = {}
    summary: Dict[str, Any] = {}
    lines: List[str] = []
    proc = subprocess.Popen(cmd, env=env, cwd=WORKDIR, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    timed_out = False
    for line in proc.stdout:
        now = time.monotonic()
        lines.append(line)
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                record = {}
            if "step" in record and "loss" in record:
                arrivals[int(record["step"])] = now
                losses[int(record["step"])] = float(record["loss"])
            if record.get("summary"):
                summary = record
        if now - start > timeout:
            proc.kill()
            timed_out = True
            break
    code = proc.wait()
    (out / f"{name}.log").write_text("".join(lines))
    ordered = sorted(arrivals)
    gaps = [arrivals[b] - arrivals[a] for a, b in zip(ordered, ordered[1:])
            if a >= 2]  # step 1 includes compilation
    text = "".join(lines)
    return {"exit": 124 if timed_out else code,
            "seconds": round(time.monotonic() - start, 1),
            "losses": losses,
            "step_seconds": statistics.median(gaps) if gaps else None,
            "summary": summary,
            "oom": "RESOURCE_EXHAUSTED" in text or
                   "out of memory" in text.lower()}


DEVICE_BYTES = 80 << 30  # set from nvidia-smi in main()


def step_train(out: pathlib.Path, budget: Budget, steps: int, preset: str
               ) -> Tuple[Dict[str, Any], List[str]]:
    lake = _train(out, "train-lake", True, steps, preset,
                  budget.timeout(200))
    base = _train(out, "train-cuda_async", False, steps, preset,
                  budget.timeout(200))
    common = sorted(set(lake["losses"]) & set(base["losses"]))
    diff = max((abs(lake["losses"][s] - base["losses"][s]) for s in common),
               default=math.inf)
    lake_stats = lake["summary"].get("jaxlake", {})
    lake_mem = lake["summary"].get("memory_stats") or {}
    base_mem = base["summary"].get("memory_stats") or {}
    ratio = (lake["step_seconds"] / base["step_seconds"]
             if lake["step_seconds"] and base["step_seconds"] else None)
    result = {
        "preset": preset, "steps": steps,
        "exit": {"lake": lake["exit"], "cuda_async": base["exit"]},
        "steps_compared": len(common),
        "losses_equal": bool(common) and diff == 0.0,
        "max_abs_loss_difference": diff,
        "final_loss": {"lake": lake["losses"].get(steps),
                       "cuda_async": base["losses"].get(steps)},
        "lake_allocations": lake_stats.get("allocs"),
        "lake_stitches": (lake_stats.get("alloc_stitch", 0) +
                          lake_stats.get("alloc_stitch_grow", 0)),
        "step_seconds": {"lake": lake["step_seconds"],
                         "cuda_async": base["step_seconds"]},
        "step_time_ratio_lake_over_cuda_async": ratio,
        "peak_reserved_bytes": {
            "lake": lake_stats.get("bytes_reserved_peak"),
            "lake_pool_attribute": lake_mem.get("peak_pool_bytes"),
            "cuda_async": base_mem.get("peak_pool_bytes")},
        "peak_in_use_bytes": {"lake": lake_mem.get("peak_bytes_in_use"),
                              "cuda_async": base_mem.get("peak_bytes_in_use")},
        "seconds": {"lake": lake["seconds"], "cuda_async": base["seconds"]}}
    failures = []
    if lake["exit"] or base["exit"]:
        failures.append(f"a training run failed (exit lake {lake['exit']}, "
                        f"cuda_async {base['exit']}; see train-*.log)")
    if len(common) < steps:
        failures.append(f"only {len(common)} of {steps} steps to compare")
    elif diff != 0.0:
        failures.append(f"losses differ (max |diff| {diff})")
    if not (lake_stats.get("allocs") or 0) > 0:
        failures.append("the lake made no allocation during training")
    return result, failures


def step_latency(out: pathlib.Path, budget: Budget, libcuda: Optional[str],
                 repeats: int, sizes: str, fill: float = 0.9
                 ) -> Tuple[Dict[str, Any], List[str]]:
    if libcuda is None:
        return {}, ["no CUDA driver library found"]
    target = out / "latency.json"
    cmd = [sys.executable, str(HERE / "latency.py"), "--libcuda", libcuda,
           "--out", str(target), "--repeats", str(repeats),
           "--fill", str(fill)]
    if sizes:
        cmd += ["--sizes", sizes]
    code, seconds, text = run(cmd, base_env(), out / "latency.log",
                              budget.timeout(120))
    result: Dict[str, Any] = {"exit": code, "seconds": round(seconds, 1),
                              "file": str(target)}
    if code != 0 or not target.is_file():
        return result, [f"latency.py failed (exit {code}): "
                        + text.strip()[-300:]]
    doc = json.loads(target.read_text())
    result["calls"] = doc["calls"]
    result["terms"] = doc.get("terms", {})
    result["measured"] = doc.get("measured", {})
    return result, []


def step_pool(out: pathlib.Path, budget: Budget, libcuda: Optional[str]
              ) -> Tuple[Dict[str, Any], List[str]]:
    if libcuda is None:
        return {}, ["no CUDA driver library found"]
    target = out / "pool_probe.json"
    code, seconds, text = run(
        [sys.executable, str(HERE / "pool_probe.py"), "--libcuda", libcuda,
         "--out", str(target)], base_env(), out / "pool.log",
        budget.timeout(60))
    result: Dict[str, Any] = {"exit": code, "seconds": round(seconds, 1),
                              "file": str(target)}
    if not target.is_file():
        return result, [f"pool_probe.py failed (exit {code}): "
                        + text.strip()[-300:]]
    doc = json.loads(target.read_text())
    single = doc.get("single", {})
    result["apparent_granularity"] = single.get("apparent_granularity")
    result["reserved_growth"] = {r["bytes"]: r["reserved_growth"]
                                 for r in single.get("rows", [])}
    result["tail_smalls_fit_in_reserved"] = doc.get("tail", {}).get(
        "smalls_fit_in_reserved")
    result["edge_shortfall"] = {r["x"]: r["shortfall"]
                                for r in doc.get("edge", [])}
    failures = []
    if code != 0 or doc.get("error") or doc.get("cleanup_error"):
        failures.append(f"pool_probe.py failed (exit {code}): "
                        + text.strip()[-300:])
    return result, failures


def step_sanitizer(out: pathlib.Path, budget: Budget
                   ) -> Tuple[Dict[str, Any], List[str]]:
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        return {"skipped": "compute-sanitizer not installed"}, [
            "compute-sanitizer not found (asked for with --sanitizer)"]
    code, seconds, text = run(
        [sanitizer, "--tool", "memcheck", sys.executable,
         str(HERE / "stress.py"), "--iterations", "60"], base_env(),
        out / "sanitizer.log", budget.timeout(400))
    clean = "ERROR SUMMARY: 0 errors" in text
    ok = "STRESS_OK" in text
    result = {"exit": code, "seconds": round(seconds, 1),
              "clean": clean, "finished": ok}
    failures = []
    if code != 0 or not ok:
        failures.append(f"the stress program failed (exit {code})")
    if not clean:
        failures.append("compute-sanitizer reported errors (sanitizer.log)")
    return result, failures


def step_capacity(out: pathlib.Path, budget: Budget, preset: str, cap: int,
                  start: int) -> Tuple[Dict[str, Any], List[str]]:
    def largest(lake: bool) -> int:
        tag = "lake" if lake else "cuda_async"
        ok, bad, batch = 0, 0, start
        while not bad and batch <= 1 << 14 and budget.left() > 60:
            r = _train(out, f"cap-{tag}-{batch}", lake, 3, preset,
                       budget.timeout(120), batch=batch, cap=cap)
            ok, bad, batch = ((batch, 0, batch * 2) if r["exit"] == 0
                              else (ok, batch, batch))
        while bad and bad - ok > max(1, ok // 16) and budget.left() > 60:
            mid = (ok + bad) // 2
            r = _train(out, f"cap-{tag}-{mid}", lake, 3, preset,
                       budget.timeout(120), batch=mid, cap=cap)
            ok, bad = (mid, bad) if r["exit"] == 0 else (ok, mid)
        return ok
    result = {"cap_bytes": cap, "largest_batch_lake": largest(True),
              "largest_batch_cuda_async": largest(False)}
    result.update(_fit_prediction(out, budget, preset, cap, start))
    real = result["largest_batch_lake"]
    predicted = result.get("predicted_largest_batch_lake")
    if real and predicted:
        # fit's grid is the powers of two; the real search bisects further
        result["predicted_over_real_lake"] = round(predicted / real, 3)
    return result, []


def _fit_prediction(out: pathlib.Path, budget: Budget, preset: str,
                    cap: int, start: int) -> Dict[str, Any]:
    """`jaxlake fit`'s prediction of the same search, with no GPU use: the
    recorder engine, a device of `cap` bytes wholly the pool's."""
    if budget.left() < 90:
        return {"prediction": "skipped: out of time"}
    report = out / "fit.json"
    cmd = [sys.executable, "-m", "jaxlake", "fit", "--gpu", str(cap),
           "--fraction", "1", "--vary", f"batch={start}..{1 << 14}",
           "--engine", "recorder", "--policies", "jaxlake,bfc",
           "--json", str(report), "--quiet", "--", sys.executable,
           str(TRAIN), "--preset", preset, "--batch", "{batch}", "--steps",
           "3", "--compile-only", "--no-progress"]
    code, seconds, _ = run(cmd, base_env(), out / "fit.log",
                           budget.timeout(300))
    if code != 0 or not report.is_file():
        return {"prediction": f"jaxlake fit failed (exit {code}, fit.log)"}
    policies = json.loads(report.read_text())["policies"]
    return {"prediction_seconds": round(seconds, 1),
            "predicted_largest_batch_lake": policies["jaxlake"]["largest"],
            "predicted_largest_batch_bfc": policies["bfc"]["largest"]}


# -- main -------------------------------------------------------------------------


def find_libcuda() -> Optional[str]:
    try:
        from jaxlake._src.xla import integration as xla
    except ImportError:
        return None
    return xla.find_real_driver()[0]


def main(argv: Sequence[str]) -> int:
    global DEVICE_BYTES
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check"))
    parser.add_argument("--budget", type=float, default=540.0,
                        help="seconds for the whole check (default 540)")
    parser.add_argument("--only", default="",
                        help="comma-separated steps to run (default: all "
                             f"of {', '.join(STEPS)} and the opt-in ones "
                             "asked for)")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--latency-repeats", type=int, default=10)
    parser.add_argument("--latency-sizes", default="")
    parser.add_argument("--latency-fill", type=float, default=0.9,
                        help="share of the free memory held during the "
                             "latency step's mostly-used pass (0 skips it)")
    parser.add_argument("--sanitizer", action="store_true")
    parser.add_argument("--capacity-search", action="store_true")
    parser.add_argument("--cap", default="8GiB")
    parser.add_argument("--batch-start", type=int, default=8)
    parser.add_argument("--libcuda", default=None,
                        help="driver library for env and latency (default: "
                             "the one jaxlake finds); with --no-gpu-ok the "
                             "steps that need no GPU run over it (tests)")
    parser.add_argument("--no-gpu-ok", action="store_true",
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    wanted = [s for s in args.only.split(",") if s] or (
        list(STEPS) + (["sanitizer"] if args.sanitizer else []) +
        (["capacity"] if args.capacity_search else []))
    for s in wanted:
        if s not in STEPS + OPT_IN:
            parser.error(f"unknown step {s!r}; steps: "
                         f"{', '.join(STEPS + OPT_IN)}")
    present, gpu = gpu_present()
    if not present and not args.no_gpu_ok:
        print(f"no GPU: {gpu}; the GPU check needs an NVIDIA GPU and its "
              "driver (the steps that can run without one run in the test "
              "suite)", file=sys.stderr)
        summary = Summary(out)
        summary.data["status"] = f"no GPU: {gpu}"
        summary.write()
        return EXIT_NO_GPU
    if present:
        try:
            DEVICE_BYTES = int(gpu.split(",")[1]) << 20
        except (IndexError, ValueError):
            pass
    libcuda = args.libcuda or find_libcuda()
    summary = Summary(out)
    summary.data.update({"gpu": gpu if present else None,
                         "budget_seconds": args.budget, "wanted": wanted})
    summary.write()
    for name in wanted:
        if budget.left() < 15:
            break
        print(f"[{name}] running ({budget.left():.0f} s left)", flush=True)
        t0 = time.monotonic()
        try:
            if name == "env":
                result, failures = step_env(out, libcuda, gpu)
            elif name == "doctor":
                result, failures = step_doctor(out, budget)
            elif name == "fragment":
                result, failures = step_fragment(out, budget, libcuda)
            elif name == "train":
                result, failures = step_train(out, budget, args.steps,
                                              args.preset)
            elif name == "latency":
                result, failures = step_latency(
                    out, budget, libcuda, args.latency_repeats,
                    args.latency_sizes, args.latency_fill)
            elif name == "pool":
                result, failures = step_pool(out, budget, libcuda)
            elif name == "sanitizer":
                result, failures = step_sanitizer(out, budget)
            else:
                import jaxlake
                result, failures = step_capacity(
                    out, budget, args.preset, jaxlake.parse_size(args.cap),
                    args.batch_start)
        except Exception as error:  # pylint: disable=broad-except
            result, failures = {}, [f"the step raised {error!r}"]
        result["step_seconds"] = round(time.monotonic() - t0, 1)
        summary.step(name, result, failures)
    missing = [s for s in wanted if s not in summary.data["steps"]]
    failed = bool(summary.data["failures"])
    summary.data["not_reached"] = missing
    summary.data["status"] = ("out of time" if missing else
                              "failed" if failed else "passed")
    summary.data["seconds"] = round(args.budget - budget.left(), 1)
    summary.write()
    print(json.dumps(summary.data, indent=2, default=str))
    if missing:
        return EXIT_OUT_OF_TIME
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
