"""JAX's GPU allocator settings, run on the fake GPU: docs/xla_defaults.md.

    python benchmarks/xla_defaults.py [--python PY] [--memory SIZE] [--json OUT]

For each setting (nothing set, each XLA_PYTHON_CLIENT_* variable, the flags
and create options of the installed CUDA plugin that shape the allocator)
it runs one small program under `jaxlake run --fake-gpu --no-lake` (XLA's
own allocator, nothing forced) on a fake device of SIZE (default 1 GiB) and
prints a row: memory_stats()'s bytes_limit and pool_bytes as fractions of
the device after a first 4 MiB array, whether a further request of 0.85 of
the device fits (only growth past 0.75, or no limit, fits it), the pool
then, and the calls that allocate device memory XLA made on the driver
(JAXLAKE_FAKEGPU_STATS counts). --python runs the program with another
interpreter (a jax 0.12 venv, say); the fake GPU and `jaxlake run` are this
jaxlake's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

#: The program: starts JAX on the fake device, allocates 4 MiB, then asks
#: for BIG of the device while holding it; reports memory_stats() each time.
PROGRAM = r"""
import json, os, sys
try:  # the fake GPU's devices, for an interpreter without jaxlake's hook
    import jax._src.hardware_utils as _hw
    if hasattr(_hw, "has_visible_nvidia_gpu"):
        _hw.has_visible_nvidia_gpu = lambda: True
except ImportError:
    pass
try:
    import jax, jax.numpy as jnp
    d = jax.devices()[0]
    x = jnp.ones((1 << 20,), jnp.float32); x.block_until_ready()
    first = d.memory_stats()
    big = None
    try:
        n = int(int(os.environ["DEFAULTS_BIG"]) // 4)
        big = jnp.ones((n,), jnp.float32); big.block_until_ready()
        grew = "fits"
    except Exception as e:  # out of memory
        grew = "OOM" if "RESOURCE_EXHAUSTED" in str(e) else repr(e)[:200]
    second = d.memory_stats()
    print("RESULT " + json.dumps({"jax": jax.__version__, "first": first,
                                  "second": second, "big": grew}))
except Exception as e:
    print("RESULT " + json.dumps({"error": repr(e)[:400]}))
"""

#: (name, environment, XLA flags, what the plugin must know: an XLA flag
#: or a PJRT create option, found in its binary). JAX_PJRT_CLIENT_CREATE_
#: OPTIONS (jax's jax_pjrt_client_create_options, "key:value;...") passes
#: a create option that jaxlib's variables do not.
SETTINGS: List[Tuple[str, Dict[str, str], List[str], Optional[str]]] = [
    ("nothing set (JAX's default)", {}, [], None),
    ("XLA_PYTHON_CLIENT_ALLOCATOR=bfc",
     {"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc"}, [], None),
    ("XLA_PYTHON_CLIENT_PREALLOCATE=false",
     {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, [], None),
    ("XLA_CLIENT_MEM_FRACTION=0.5", {"XLA_CLIENT_MEM_FRACTION": "0.5"}, [],
     None),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION=0.5",
     {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}, [], None),
    ("both fractions set", {"XLA_CLIENT_MEM_FRACTION": "0.5",
                            "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}, [],
     None),
    ("XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async",
     {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"}, [], None),
    ("XLA_PYTHON_CLIENT_ALLOCATOR=vmm",
     {"XLA_PYTHON_CLIENT_ALLOCATOR": "vmm"}, [], None),
    ("XLA_PYTHON_CLIENT_ALLOCATOR=platform",
     {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, [], None),
    ("XLA_PYTHON_CLIENT_ALLOCATOR=address",
     {"XLA_PYTHON_CLIENT_ALLOCATOR": "address"}, [], None),
    ("--xla_gpu_enable_allocator_spatial_partitioning", {},
     ["--xla_gpu_enable_allocator_spatial_partitioning=true"],
     "xla_gpu_enable_allocator_spatial_partitioning"),
    ("spatial + memory_fraction_policy 0.75+",
     {"JAX_PJRT_CLIENT_CREATE_OPTIONS": "memory_fraction_policy:0.75+"},
     ["--xla_gpu_enable_allocator_spatial_partitioning=true"],
     "memory_fraction_policy"),
    ("memory_fraction_policy 0.75+ alone",
     {"JAX_PJRT_CLIENT_CREATE_OPTIONS": "memory_fraction_policy:0.75+"},
     [], "memory_fraction_policy"),
    ("--xla_gpu_memory_fraction_policy=0.75+", {},
     ["--xla_gpu_memory_fraction_policy=0.75+"],
     "xla_gpu_memory_fraction_policy"),
]

#: The second request, as a share of the device: more than JAX's default
#: 0.75 holds, so only a pool that grows past it (or has no limit) fits it.
BIG = 0.85

#: Driver calls that allocate device memory.
CALLS = ("cuMemAlloc_v2", "cuMemCreate", "cuMemMap", "cuMemAddressReserve",
         "cuMemAllocFromPoolAsync", "cuMemAllocAsync", "cuMemPoolCreate")

ALLOCATOR_VARIABLES = ("XLA_PYTHON_CLIENT_ALLOCATOR",
                       "XLA_PYTHON_CLIENT_PREALLOCATE",
                       "JAX_PJRT_CLIENT_CREATE_OPTIONS",
                       "XLA_CLIENT_MEM_FRACTION",
                       "XLA_PYTHON_CLIENT_MEM_FRACTION", "TF_GPU_ALLOCATOR",
                       "JAXLAKE", "JAX_PLATFORMS")


def plugin_names(python: str) -> frozenset:
    """The XLA flags, and the create options of SETTINGS, that the CUDA
    plugin `python`'s jax loads knows."""
    code = ("import importlib.util, os\n"
            "for m in ('jax_plugins.xla_cuda12', 'jax_plugins.xla_cuda13'):\n"
            "    s = importlib.util.find_spec(m)\n"
            "    if s: print(os.path.join(os.path.dirname(s.origin), "
            "'xla_cuda_plugin.so')); break\n")
    path = subprocess.run([python, "-c", code], capture_output=True,
                          text=True, check=False).stdout.strip()
    if not path:
        return frozenset()
    from jaxlake._src.xla import plugin
    with open(path, "rb") as f:
        data = f.read()
    options = {s[3] for s in SETTINGS if s[3] and not s[3].startswith(
        "xla_") and s[3].encode() in data}
    return plugin.read_plugin(path).flags | options


def run(python: str, memory: int, env_add: Dict[str, str],
        flags: List[str], folder: str) -> Dict:
    script = os.path.join(folder, "program.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(PROGRAM)
    stats = os.path.join(folder, "stats.json")
    env = {k: v for k, v in os.environ.items()
           if k not in ALLOCATOR_VARIABLES}
    env.update(env_add)
    env["XLA_FLAGS"] = " ".join(["--xla_gpu_autotune_level=0", *flags])
    env["JAXLAKE_FAKEGPU_STATS"] = stats
    env["DEFAULTS_BIG"] = str(int(memory * BIG))
    jaxlake = [os.path.join(os.path.dirname(sys.executable), "jaxlake")]
    proc = subprocess.run(
        [*jaxlake, "run", "--fake-gpu", f"--fake-gpu-memory={memory}",
         "--no-lake", "--", python, script], env=env, capture_output=True,
        text=True, timeout=300, check=False)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    out: Dict = json.loads(lines[-1][7:]) if lines else {
        "error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    try:
        with open(stats, encoding="utf-8") as f:
            calls = json.load(f)["calls"]
        out["calls"] = {c: int(calls.get(c, 0)) for c in CALLS
                        if calls.get(c)}
    except (OSError, ValueError):
        out["calls"] = {}
    return out


def fraction(stats: Optional[Dict], key: str, memory: int) -> str:
    if not stats or key not in stats:
        return "-"
    return f"{stats[key] / memory:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--memory", default="1GiB")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from jaxlake._src.options import parse_size
    memory = parse_size(args.memory)
    known = plugin_names(args.python)
    rows = []
    with tempfile.TemporaryDirectory(prefix="jaxlake-defaults-") as folder:
        for name, env_add, flags, needs in SETTINGS:
            if needs is not None and needs not in known:
                rows.append({"setting": name,
                             "error": f"the plugin has no {needs}"})
                continue
            out = run(args.python, memory, env_add, flags, folder)
            out["setting"] = name
            rows.append(out)
            print(json.dumps(out), file=sys.stderr)
    print(f"| setting | jax | bytes_limit | pool_bytes | {BIG:g} of the "
          "device more | pool after | driver calls |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['setting']} | - | {r['error']} | | | | |")
            continue
        calls = ", ".join(f"{k} {v}" for k, v in r["calls"].items())
        print(f"| {r['setting']} | {r['jax']} | "
              f"{fraction(r['first'], 'bytes_limit', memory)} | "
              f"{fraction(r['first'], 'pool_bytes', memory)} | {r['big']} | "
              f"{fraction(r['second'], 'pool_bytes', memory)} | {calls} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"memory": memory, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
