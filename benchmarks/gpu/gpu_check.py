"""The GPU check of jaxlake: run where an NVIDIA GPU and its driver exist.

    python benchmarks/gpu/gpu_check.py [--out DIR] [--steps N] [--preset P]

1. Hooks: with jaxlake.configure(), jnp.ones on the GPU must reach the lake
   (hook counters above zero).
2. Training: examples/train_lm.py for N steps with the lake and with XLA's
   default allocator, same seed: the loss curves, the step-time ratio and
   the peak memory of each (the lake's physical reservation; XLA's own
   peak for the default allocator).
3. Capacity: the largest batch that trains under the same memory cap with
   each allocator (the lake's `capacity`; XLA_PYTHON_CLIENT_MEM_FRACTION for
   the default).
4. Sanitizer: free-then-reuse stress under compute-sanitizer, when it is
   installed.

Writes summary.json to --out and prints it. Exit
status 1 when a check fails (hooks not live, diverging losses, a failed
run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train_lm.py"

HOOKS = r"""
import json, jaxlake
status = jaxlake.configure()
import jax, jax.numpy as jnp
x = jnp.ones((4096, 4096), device=jax.devices("gpu")[0]); x.block_until_ready()
y = (x @ x).block_until_ready()
print(json.dumps({"active": status.active, "reason": status.reason,
                  "hooks": jaxlake.hook_counts(),
                  "stats": jaxlake.stats().as_dict()}))
"""

STRESS = r"""
import jaxlake
status = jaxlake.configure(capacity="2GiB")
assert status.active, status.reason
import jax, jax.numpy as jnp
keys = jax.random.split(jax.random.PRNGKey(0), 64)
@jax.jit
def step(k):
    a = jax.random.normal(k, (1024, 1024 + int(k[0]) % 7))
    return (a @ a.T).sum()
total = 0.0
for i in range(400):
    total += float(step(keys[i % 64]))
print("STRESS_OK", total, jaxlake.stats().allocs)
"""


def run(cmd: List[str], env: Dict[str, str], log: pathlib.Path,
        timeout: int = 900) -> Tuple[int, float, str]:
    """Runs a command; returns (exit status, seconds, output)."""
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        code, out = 124, f"timed out: {error}"
    seconds = time.perf_counter() - start
    log.write_text(out)
    return code, seconds, out


def base_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAXLAKE") and k != "JAX_PLATFORMS"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def train(out: pathlib.Path, name: str, lake: bool, args: argparse.Namespace,
          batch: Optional[int] = None, cap: Optional[int] = None,
          steps: Optional[int] = None) -> Dict[str, Any]:
    """One training run; its per-step log and summary record."""
    log_json = out / f"{name}.jsonl"
    if log_json.exists():
        log_json.unlink()
    cmd = [sys.executable, str(TRAIN), "--preset", args.preset,
           "--steps", str(steps or args.steps), "--seed", "0",
           "--no-progress", "--log-json", str(log_json)]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    env = base_env()
    if lake:
        cmd.append("--jaxlake")
        if cap is not None:
            cmd += ["--jaxlake-option", f"capacity={cap}"]
    else:
        cmd.append("--no-jaxlake")
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        if cap is not None:
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{cap / args.device_bytes:.4f}"
    code, seconds, text = run(cmd, env, out / f"{name}.log")
    records = []
    if log_json.exists():
        records = [json.loads(l) for l in log_json.read_text().splitlines()
                   if l.strip()]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    summary = next((r for r in records if r.get("summary")), {})
    return {"code": code, "seconds": seconds, "losses": losses,
            "summary": summary, "oom": "RESOURCE_EXHAUSTED" in text
            or "out of memory" in text.lower()}


def largest_batch(out: pathlib.Path, lake: bool, args: argparse.Namespace,
                  cap: int) -> int:
    """Doubling, then bisection, over the batch size under `cap` bytes."""
    tag = "lake" if lake else "xla"
    ok, bad, batch = 0, 0, args.batch_start
    while bad == 0 and batch <= 1 << 14:
        r = train(out, f"cap-{tag}-{batch}", lake, args, batch=batch, cap=cap,
                  steps=3)
        if r["code"] == 0:
            ok, batch = batch, batch * 2
        else:
            bad = batch
    while bad and bad - ok > max(1, ok // 16):
        mid = (ok + bad) // 2
        r = train(out, f"cap-{tag}-{mid}", lake, args, batch=mid, cap=cap,
                  steps=3)
        ok, bad = (mid, bad) if r["code"] == 0 else (ok, mid)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check"))
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--cap", default="8GiB",
                        help="memory cap of the largest-batch search")
    parser.add_argument("--batch-start", type=int, default=8)
    parser.add_argument("--skip-capacity", action="store_true")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import jaxlake  # the installed package
    cap = jaxlake.parse_size(args.cap)
    result: Dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "jaxlake": jaxlake.__version__}
    failures: List[str] = []

    smi = shutil.which("nvidia-smi")
    if smi:
        gpu = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout.strip()
        result["gpu"] = gpu
        args.device_bytes = int(gpu.split(",")[1]) << 20
    else:
        args.device_bytes = 80 << 30
    try:
        from importlib import metadata
        result["jax"] = metadata.version("jax")
    except Exception:  # pylint: disable=broad-except
        result["jax"] = "unknown"

    # 1. Hooks.
    code, _, text = run([sys.executable, "-c", HOOKS], base_env(),
                        out / "hooks.log")
    hooks: Dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("{"):
            hooks = json.loads(line)
    served = sum(v.get("served", 0) for k, v in hooks.get("hooks", {}).items()
                 if k.startswith("cuMemAllocFromPoolAsync"))
    result["hooks"] = {"exit": code, "active": hooks.get("active"),
                       "reason": hooks.get("reason"),
                       "allocations_served": served}
    if code != 0 or served == 0:
        failures.append(f"hooks not live (exit {code}, served {served})")

    # 2. Training with and without the lake.
    lake = train(out, "train-lake", True, args)
    xla_run = train(out, "train-xla", False, args)
    steps = sorted(set(lake["losses"]) & set(xla_run["losses"]))
    diff = max((abs(lake["losses"][s] - xla_run["losses"][s]) for s in steps),
               default=math.inf)
    result["training"] = {
        "preset": args.preset, "steps": args.steps,
        "exit": [lake["code"], xla_run["code"]],
        "max_abs_loss_difference": diff,
        "final_loss": [lake["losses"].get(args.steps),
                       xla_run["losses"].get(args.steps)],
        "wall_seconds": [lake["seconds"], xla_run["seconds"]],
        "time_ratio_lake_over_xla": lake["seconds"] / xla_run["seconds"],
        "lake_summary": lake["summary"], "xla_summary": xla_run["summary"]}
    if lake["code"] or xla_run["code"]:
        failures.append("a training run failed")
    if not steps or diff > 1e-3:
        failures.append(f"loss curves differ (max |diff| {diff})")

    # 3. Largest batch under the cap.
    if not args.skip_capacity:
        result["capacity"] = {
            "cap_bytes": cap,
            "largest_batch_lake": largest_batch(out, True, args, cap),
            "largest_batch_xla": largest_batch(out, False, args, cap)}

    # 4. compute-sanitizer.
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer:
        code, _, text = run([sanitizer, "--tool", "memcheck", sys.executable,
                             "-c", STRESS], base_env(), out / "sanitizer.log",
                            timeout=600)
        errors = "ERROR SUMMARY: 0 errors" in text
        result["sanitizer"] = {"exit": code, "clean": errors}
        if code != 0 or not errors:
            failures.append("compute-sanitizer reported errors")
    else:
        result["sanitizer"] = "compute-sanitizer not installed: skipped"

    result["failures"] = failures
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
