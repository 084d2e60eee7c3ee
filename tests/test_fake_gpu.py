"""XLA's real GPU client over the fake GPU (`jaxlake run --fake-gpu`).

These run unmodified JAX programs on the CUDA plugin the test extra installs
(jax[cuda12-local]: no NVIDIA libraries; with NVIDIA's wheels installed, as
jax[cuda12] does, the fake's loader guard keeps them out, and
test_fake_gpu_wheels.py checks that), on a machine with no GPU, with the
shipped shim and lake serving XLA's pool. Kernels do not run, so only buffer
bytes that copies write are checked. They are CPU tests of the integration,
never a stand-in for a GPU figure (benchmarks/gpu/check.sh is that).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Dict, List, Optional

import pytest

from fakegpu_util import (JAXLAKE, PRELUDE, ROOT, fake_run, jax_reason,
                          result)

pytestmark = pytest.mark.skipif(jax_reason() is not None,
                                reason=str(jax_reason()))


def test_devices_round_trip_and_jit_output_from_the_lake() -> None:
    proc = fake_run(PRELUDE + """
x = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32)
y = jax.device_put(x)
same = bool(np.array_equal(np.asarray(y), x))
z = jax.jit(lambda a: a + 1)(y)
z.block_until_ready()
ptr = z.unsafe_buffer_pointer()
del z, y
import gc; gc.collect()
jnp.zeros(8).block_until_ready()
report(devices=[d.platform for d in jax.devices()],
       kind=jax.devices()[0].device_kind, same=same,
       alloc=served("cuMemAllocFromPoolAsync"),
       free=served("cuMemFreeAsync"))
""")
    out = result(proc)
    assert out["devices"] == ["gpu"]
    assert "H100" in out["kind"]
    assert out["same"]
    assert out["alloc"]["served"] >= 2 and out["alloc"]["forwarded"] == 0
    assert out["free"]["served"] >= 1 and out["free"]["forwarded"] == 0
    assert "Kernels do not run" in proc.stderr


def test_fragmented_free_memory_is_stitched_for_a_large_array() -> None:
    proc = fake_run(PRELUDE + """
bufs = [jax.device_put(np.full(10 << 20, i, np.float32)) for i in range(20)]
for b in bufs: b.block_until_ready()
for i in range(0, 20, 2): bufs[i].delete()
data = np.random.default_rng(0).integers(0, 255, 320 << 20, dtype=np.uint8)
big = jax.device_put(data); big.block_until_ready()
same = bool(np.array_equal(np.asarray(big), data))
s = jaxlake.stats(0)
report(same=same, stitch=int(s.alloc_stitch) + int(s.alloc_stitch_reuse),
       reserved_peak=int(s.bytes_reserved_peak),
       odd_intact=all(float(np.asarray(bufs[i])[-1]) == i
                      for i in range(1, 20, 2)))
""", env={"JAXLAKE_CAPACITY": "1GiB"})
    out = result(proc)
    assert out["same"] and out["odd_intact"]
    assert out["stitch"] >= 1
    assert out["reserved_peak"] <= 1 << 30


def test_request_over_capacity_raises_and_the_program_goes_on() -> None:
    proc = fake_run(PRELUDE + """
a = jax.device_put(np.ones(64 << 20, np.uint8)); a.block_until_ready()
try:
    jax.device_put(np.zeros(600 << 20, np.uint8)).block_until_ready()
    raised = ""
except Exception as e:
    raised = str(e)
del a
b = jax.device_put(np.arange(256, dtype=np.uint8)); b.block_until_ready()
jaxlake.check()
s = jaxlake.stats(0)
report(raised=raised[:300], ooms=int(s.ooms), b=np.asarray(b).tolist()[:4],
       in_use=int(s.bytes_in_use), live=int(s.live_allocations))
""", env={"JAXLAKE_CAPACITY": "512MiB"})
    out = result(proc)
    assert "RESOURCE_EXHAUSTED" in out["raised"]
    assert out["ooms"] >= 1
    assert out["b"] == [0, 1, 2, 3]
    assert out["live"] >= 1 and out["in_use"] < 512 << 20
    assert "out of memory allocating" in proc.stderr  # the lake's summary


@pytest.mark.parametrize("fault", ["cuMemCreate:2:999", "cuMemMap:2:999"])
def test_injected_driver_fault_reaches_the_program_cleanly(fault: str) -> None:
    proc = fake_run(PRELUDE + """
errors = []
kept = []
for i in range(4):
    try:
        x = jax.device_put(np.full(4 << 20, i, np.uint8)); x.block_until_ready()
        kept.append(x)
    except Exception as e:
        errors.append(str(e)[:200])
jaxlake.check()
s = jaxlake.stats(0)
report(errors=errors, values=[int(np.asarray(k)[0]) for k in kept],
       driver_errors=int(s.driver_errors))
""", env={"JAXLAKE_FAKEGPU_FAIL": fault, "JAXLAKE_CAPACITY": "256MiB"})
    out = result(proc)
    assert "injected fault" in proc.stderr
    assert out["driver_errors"] >= 1, out
    assert len(out["errors"]) + len(out["values"]) == 4
    assert len(out["values"]) >= 3  # the lake recovered after the fault


def test_hooks_off_gives_xla_the_fake_drivers_own_pool() -> None:
    proc = fake_run(PRELUDE + """
x = jax.device_put(np.ones(1 << 20, np.float32)); x.block_until_ready()
report(alloc=served("cuMemAllocFromPoolAsync"))
""", env={"JAXLAKE_SHIM_HOOKS": "0"})
    out = result(proc)
    assert out["alloc"]["served"] == 0 and out["alloc"]["forwarded"] >= 1


def _checked_trace(path: pathlib.Path, devices: int) -> int:
    """Reads the shim's trace strictly (a valid jaxlake trace); returns its
    event count."""
    from jaxlake._src.trace import tracefile
    trace = tracefile.read_trace(str(path))
    assert trace.source == "shim" and trace.devices == devices
    assert not trace.skipped
    return len(trace)


def _pool_calls_reaching_the_fake(stats: pathlib.Path) -> Dict[str, int]:
    calls = json.loads(stats.read_text())["calls"]
    return {name: int(calls.get(name, 0)) for name in (
        "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuMemCreate")}


def test_train_lm_tiny_every_pool_buffer_served(tmp_path: pathlib.Path
                                                ) -> None:
    trace, stats = tmp_path / "tiny.jsonl", tmp_path / "fake.json"
    proc = fake_run([
        sys.executable, str(ROOT / "examples" / "train_lm.py"), "--preset",
        "tiny", "--steps", "3", "--attention", "xla"],
        args=["--trace", str(trace)],
        env={"JAXLAKE_FAKEGPU_STATS": str(stats)}, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _checked_trace(trace, 1) > 20
    calls = _pool_calls_reaching_the_fake(stats)
    # The lake served every pool call: none reached the driver's own pool,
    # and the lake's memory came from the VMM calls.
    assert calls["cuMemAllocFromPoolAsync"] == 0
    assert calls["cuMemFreeAsync"] == 0
    assert calls["cuMemCreate"] >= 1
    # The recorder against the real client (docs/traces.md): the same
    # command's device-less trace has the real client's buffers, size for
    # size, and its peak; the real client adds only a few small buffers of
    # its own (4-byte scalars and the like).
    recorded = tmp_path / "recorded.jsonl"
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "JAXLAKE")}
    env["JAX_PLATFORMS"] = "cpu"
    rec = subprocess.run([sys.executable, str(ROOT / "examples" /
                                              "train_lm.py"), "--preset",
                          "tiny", "--steps", "3", "--attention", "xla",
                          "--trace", str(recorded), "--compile-only",
                          "--no-progress"], env=env, capture_output=True,
                         text=True, timeout=300, cwd=str(tmp_path))
    assert rec.returncode == 0, rec.stderr[-4000:]
    real_sizes, real_peak = _sizes_and_peak(trace)
    rec_sizes, rec_peak = _sizes_and_peak(recorded)
    assert not rec_sizes - real_sizes, rec_sizes - real_sizes
    extra = real_sizes - rec_sizes
    assert sum(extra.values()) <= 4 and \
        sum(k * v for k, v in extra.items()) < 4096, extra
    assert abs(real_peak - rec_peak) < 4096, (real_peak, rec_peak)


def _sizes_and_peak(path: pathlib.Path) -> "tuple[collections.Counter[int], int]":
    """The multiset of allocation sizes of a trace, and its peak live
    bytes."""
    sizes: "collections.Counter[int]" = collections.Counter()
    live = peak = 0
    by_id: Dict[int, int] = {}
    with open(path) as f:
        next(f)
        for line in f:
            event = json.loads(line)
            if event["op"] == "alloc":
                by_id[event["id"]] = event["size"]
                sizes[event["size"]] += 1
                live += event["size"]
            else:
                live -= by_id.pop(event["id"])
            peak = max(peak, live)
    return sizes, peak


def test_train_sharded_two_fake_devices(tmp_path: pathlib.Path) -> None:
    trace, stats = tmp_path / "sharded.jsonl", tmp_path / "fake.json"
    proc = fake_run([
        sys.executable, str(ROOT / "examples" / "train_sharded.py"),
        "--layout", "data", "--preset", "tiny", "--steps", "2",
        "--attention", "xla"],
        args=["--fake-gpu-count", "2", "--trace", str(trace)],
        env={"JAXLAKE_FAKEGPU_STATS": str(stats)}, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _checked_trace(trace, 2) > 20
    calls = _pool_calls_reaching_the_fake(stats)
    assert calls["cuMemAllocFromPoolAsync"] == 0
    assert calls["cuMemCreate"] >= 2


# A typical user program: it replaces XLA_FLAGS itself before importing jax
# (as Flax's multi-device examples do), so XLA runs with its default flags,
# command buffers on, and it jits a training-like step with a loop and
# several fusions over 2 devices.
REPLACES_XLA_FLAGS = """
import os
os.environ["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jaxlake
mesh = Mesh(np.array(jax.devices()), ("data",))
rows = NamedSharding(mesh, P("data", None))
@jax.jit
def step(w, x):
    def body(i, w):
        for _ in range(3):
            h = jnp.tanh(x @ w) * 0.5 + jnp.sin(w[:1])
            g = x.T @ h / x.shape[0]
            w = jnp.cos(w[::-1]) - 0.1 * g * i
        return w
    w = jax.lax.fori_loop(0, 4, body, w)
    return w, jnp.mean(jnp.abs(w))
w = jnp.ones((128, 128), jnp.float32)
x = jax.device_put(np.ones((256, 128), np.float32), rows)
for _ in range(3):
    w, loss = step(w, x)
loss.block_until_ready()
counts = jaxlake.hook_counts()
print("RESULT " + json.dumps({
    "devices": len(jax.devices()), "platform": jax.devices()[0].platform,
    "flags": os.environ["XLA_FLAGS"],
    "served": counts.get("cuMemAllocFromPoolAsync", {}).get("served", 0),
    "forwarded": counts.get("cuMemAllocFromPoolAsync", {}).get(
        "forwarded", 0)}), flush=True)
"""


def test_program_replacing_xla_flags_runs_command_buffers_on_two_devices(
        tmp_path: pathlib.Path) -> None:
    stats = tmp_path / "fake.json"
    proc = fake_run(REPLACES_XLA_FLAGS, args=["--fake-gpu-count", "2"],
                    env={"JAXLAKE_FAKEGPU_STATS": str(stats)})
    out = result(proc)
    assert out["devices"] == 2 and out["platform"] == "gpu"
    assert out["flags"] == "--xla_gpu_autotune_level=0"
    assert out["served"] >= 2 and out["forwarded"] == 0
    data = json.loads(stats.read_text())
    calls = data["calls"]
    # XLA built its command buffers as CUDA graphs and launched them.
    assert calls.get("cuGraphCreate", 0) >= 1
    assert calls.get("cuGraphLaunch", 0) >= 1
    assert not [n for n in data["unsupported"] if "Graph" in n or
                "Capture" in n], data["unsupported"]


def test_a_run_logs_no_xla_error_and_calls_no_stub() -> None:
    # XLA's start-up asks NVML for fabric info, NVLink and confidential
    # computing state, the driver for multicast and the runtime for stream
    # priorities; the fake answers each as a GPU without the feature would,
    # so XLA logs no error (glog's "E" lines) and no stub names itself.
    proc = fake_run("""
import jax, jax.numpy as jnp
@jax.jit
def f(x):
    return jax.lax.fori_loop(0, 3, lambda i, x: jnp.tanh(x @ x) + i, x)
print("RESULT", float(f(jnp.ones((64, 64))).sum()))
""", env={"JAXLAKE_FAKEGPU_LOG": "stderr"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    errors = [l for l in proc.stderr.splitlines()
              if re.match(r"E\d{4} \d\d:\d\d:\d\d", l)]
    assert not errors, errors
    assert "not supported by the fake" not in proc.stderr, proc.stderr


def test_doctor_fake_gpu_shows_the_hooks_live() -> None:
    proc = subprocess.run([JAXLAKE, "doctor", "--fake-gpu"],
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("JAX_PLATFORMS", "XLA_FLAGS")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hooks live:" in proc.stdout
    assert "yes (" in proc.stdout.split("hooks live:")[1].splitlines()[0]


@pytest.mark.parametrize("args, message", [
    (["--fake-gpu=a100"], "h100 or h200"),
    (["--fake-gpu", "--fake-gpu-memory", "banana"], "--fake-gpu-memory"),
    (["--fake-gpu", "--fake-gpu-count", "0"], "--fake-gpu-count"),
])
def test_bad_fake_gpu_options_are_named(args: List[str], message: str) -> None:
    proc = subprocess.run([JAXLAKE, "run", *args, "--", sys.executable, "-c",
                           "print('ran')"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert "ran" not in proc.stdout


# cudnn-frontend, compiled into XLA, deserializes each plan before it runs
# and then warms it up under a stream capture (graph_interface.h,
# warmup()): cuDNN's fused attention runs only on a fake GPU with stream
# capture.
NO_CAPTURE = "cudaStreamBeginCapture is not supported by the fake"


def _skip_without_capture(proc: subprocess.CompletedProcess) -> None:
    if proc.returncode != 0 and NO_CAPTURE in proc.stderr:
        pytest.skip("this build's fake GPU has no stream capture, which "
                    "cudnn-frontend's plan warm-up needs")


def _calls(stats: pathlib.Path) -> Dict[str, int]:
    return {k: int(v) for k, v in json.loads(stats.read_text())["calls"]
            .items()}


def test_cudnn_fused_attention_compiles_and_runs(tmp_path: pathlib.Path
                                                 ) -> None:
    stats = tmp_path / "fake.json"
    proc = fake_run(PRELUDE + """
b, s, h, d = 2, 256, 4, 64
k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
q, k, v = (jax.random.normal(key, (b, s, h, d), jnp.bfloat16)
           for key in (k1, k2, k3))
def loss(q, k, v):
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                       implementation="cudnn")
    return out.astype(jnp.float32).sum()
step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
text = step.lower(q, k, v).compile().as_text()
value, grads = step(q, k, v)
jax.block_until_ready(grads)
report(custom_calls=sorted(set(
    w.strip('",') for w in text.split() if "__cudnn$fmha" in w)),
    shapes=[list(g.shape) for g in grads])
""", env={"JAXLAKE_FAKEGPU_STATS": str(stats)})
    _skip_without_capture(proc)
    out = result(proc)
    assert out["shapes"] == [[2, 256, 4, 64]] * 3
    # XLA lowered the attention, forward and backward, to cuDNN's graphs
    assert any("Backward" in c for c in out["custom_calls"]), out
    calls = _calls(stats)
    assert calls.get("cudnnBackendExecute", 0) >= 2
    # every cuDNN call XLA made is one the fake implements
    assert "cudnn entry point" not in proc.stderr, proc.stderr[-3000:]


def test_train_lm_default_flags_picks_cudnn_and_runs(tmp_path: pathlib.Path
                                                     ) -> None:
    stats = tmp_path / "fake.json"
    proc = fake_run([
        sys.executable, str(ROOT / "examples" / "train_lm.py"), "--preset",
        "tiny", "--steps", "2"],
        env={"JAXLAKE_FAKEGPU_STATS": str(stats)}, timeout=400)
    _skip_without_capture(proc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    calls = _calls(stats)
    assert calls.get("cudnnBackendExecute", 0) >= 1  # --attention auto: cudnn
    assert calls.get("cuMemAllocFromPoolAsync", 0) == 0


def test_all_to_all_over_two_fake_devices_moves_the_blocks() -> None:
    # A typical sharded program: it assigns XLA_FLAGS itself (replacing
    # what was there, as Flax's examples do), then shards a jitted step
    # over both devices with an all-to-all (NCCL's ncclAlltoAll), whose
    # blocks the fake moves as NCCL defines them.
    proc = fake_run("""
import os
os.environ["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
import json, numpy as np, jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
try:
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map
mesh = Mesh(np.array(jax.devices()), ("x",))
n = len(jax.devices())
step = jax.jit(shard_map(
    lambda a: jax.lax.all_to_all(a, "x", 0, 0, tiled=True),
    mesh=mesh, in_specs=P("x"), out_specs=P("x")))
x = np.arange(n * n * 4 * 3, dtype=np.float32).reshape(n * n * 4, 3)
y = np.asarray(step(jax.device_put(x, NamedSharding(mesh, P("x")))))
expected = x.reshape(n, n, 4, 3).transpose(1, 0, 2, 3).reshape(-1, 3)
print("RESULT " + json.dumps({"n": n, "same": bool(np.array_equal(
    y, expected)), "text": step.lower(x).as_text().count("all_to_all")}))
""", args=["--fake-gpu-count", "2"])
    out = result(proc)
    assert out["n"] == 2 and out["text"] >= 1
    assert out["same"], proc.stdout[-2000:]



DISTRIBUTED = """
import json, os, subprocess, sys
port = sys.argv[1]
rank = int(sys.argv[2]) if len(sys.argv) > 2 else 0
if rank == 0:  # it inherits the run's fake GPU
    child = subprocess.Popen([sys.executable, __file__, port, "1"])
import numpy as np, jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2,
                           process_id=rank, initialization_timeout=60)
mesh = Mesh(np.array(jax.devices()), ("p",))
x = jax.make_array_from_single_device_arrays(
    (8,), NamedSharding(mesh, P("p")),
    [jax.device_put(np.full((4,), rank + 1, np.float32),
                    jax.local_devices()[0])])
gather = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, P()))
got = np.asarray(gather(x).addressable_data(0))
total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))
total(x).block_until_ready()  # an all-reduce: its value is meaningless
try:
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map
swap = jax.jit(shard_map(lambda a: jax.lax.ppermute(a, "p", [(0, 1), (1, 0)]),
                         mesh=mesh, in_specs=P("p"), out_specs=P("p")))
swapped = np.asarray(swap(x).addressable_data(0))  # a send and a receive
# one write of the whole line: the two processes share the run's stdout
sys.stdout.flush()
os.write(1, (f"RANK{rank} " + json.dumps({
    "processes": jax.process_count(), "devices": jax.device_count(),
    "local": [d.id for d in jax.local_devices()],
    "gathered": got.tolist(), "swapped": swapped.tolist()}) + "\\n").encode())
jax.distributed.shutdown()
if rank == 0:
    print("RESULT " + json.dumps({"child": child.wait(timeout=60)}))
"""


def test_jax_distributed_two_processes_all_gather(tmp_path: pathlib.Path
                                                  ) -> None:
    # One process a GPU: rank 0 starts rank 1 (both on the run's fake GPU,
    # one device each), both join at a local coordinator, and jits over the
    # global mesh all-gather, all-reduce and swap halves (ppermute: a send
    # and a receive) across them, through NCCL communicators whose ranks
    # live in two processes.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "distributed.py"
    script.write_text(DISTRIBUTED)
    proc = fake_run([sys.executable, str(script), str(port)],
                    args=["--fake-gpu-count", "1"], timeout=110)
    assert result(proc) == {"child": 0}, proc.stderr[-4000:]
    ranks = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RANK"):
            rank, text = line[len("RANK"):].split(" ", 1)
            ranks[int(rank)] = json.loads(text)
    assert sorted(ranks) == [0, 1], proc.stdout[-2000:]
    for rank in (0, 1):
        assert ranks[rank]["processes"] == 2
        assert ranks[rank]["devices"] == 2
        assert ranks[rank]["gathered"] == [1.0] * 4 + [2.0] * 4
        assert ranks[rank]["swapped"] == [2.0 - rank] * 4  # the other's
    # each process's device is its own (global ids 0 and 1)
    assert ranks[0]["local"] != ranks[1]["local"]
    assert "waited" not in proc.stderr, proc.stderr[-4000:]


# -- --no-lake: the fake GPU under XLA's own allocator ---------------------------

NO_LAKE = """
import json, os, jax, jax.numpy as jnp
x = jnp.ones((1 << 20,), jnp.float32); x.block_until_ready()
print("RESULT " + json.dumps({
    "stats": jax.devices()[0].memory_stats(),
    "allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR"),
    "flags": os.environ.get("XLA_FLAGS", "")}), flush=True)
"""


@pytest.mark.parametrize("env, pool", [
    # JAX's default (jax 0.10 to 0.12): BFC preallocated at 0.75, which
    # the user's JAXLAKE=1 and --jaxlake entries do not change here
    ({"JAXLAKE": "1", "XLA_FLAGS": "--xla_gpu_autotune_level=0 "
      "--jaxlake_capacity=64MiB"}, 0.75),
    # the user's own settings are kept: preallocation off, the fraction
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
      "XLA_CLIENT_MEM_FRACTION": "0.5"}, None),
])
def test_no_lake_keeps_xlas_own_allocator(env: Dict[str, str],
                                          pool: Optional[float]) -> None:
    """`jaxlake run --fake-gpu --no-lake`: memory_stats() reports what
    JAX's default (or the user's setting) reports on a GPU, not the lake's
    forced cuda_async (bytes_limit 0)."""
    device = 1 << 30
    proc = fake_run(NO_LAKE, args=["--no-lake", "--fake-gpu-memory=1GiB"],
                    env=env)
    out = result(proc)
    stats = out["stats"]
    assert out["allocator"] is None   # nothing forced
    assert "--jaxlake" not in out["flags"]
    if pool is not None:
        assert stats["bytes_limit"] == int(device * pool)
        assert stats["pool_bytes"] == stats["bytes_limit"]
    else:
        assert stats["bytes_limit"] == device // 2
        assert stats["pool_bytes"] < stats["bytes_limit"]  # grows on demand
    assert "no lake: XLA's own allocator" in proc.stderr


def test_no_lake_needs_the_fake_gpu_and_no_trace() -> None:
    for args, message in ((["--no-lake"], "--no-lake needs --fake-gpu"),
                          (["--fake-gpu", "--no-lake", "--trace", "t.jsonl"],
                           "--trace needs the lake")):
        proc = subprocess.run([JAXLAKE, "run", *args, "--", sys.executable,
                               "-c", "print('ran')"], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and "ran" not in proc.stdout
