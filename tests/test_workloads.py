"""The workload examples that stress an allocator beyond one jitted step,
run as a user would, at the tiny preset on the CPU and under `jaxlake run
--fake-gpu`: serving with KV caches that grow and are freed (serve_lm.py);
train and eval executables over several sequence lengths with every output
kept and a mid-run restore; offloading to pinned host memory (train_lm.py
flags).

Each example runs in a subprocess (jax fixes its platform once per
process). The serving engine's two cache layouts decode the same requests
to the same tokens, each checked against the uncached model (--verify); its
trace shows the caches growing and freed; kept outputs are live at the end
of the trace; offloading leaves the losses as they were; bad input gets a
one-line error.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from fakegpu_util import NEEDS_JAX, ROOT, fake_run

from example_util import (EXAMPLES, example_help, require_examples,
                          run_example)

require_examples()

TIMEOUT = 300

#: A short request stream: 6 requests, prompts of 4 to 30 tokens (up to two
#: cache blocks of 16), outputs of 2 to 30 (so caches grow), 3 at once.
SERVE = ["--requests", "6", "--max-len", "64", "--prompt-len", "4,30",
         "--new-tokens", "2,30", "--slots", "3", "--cache-block", "16",
         "--dtype", "float32", "--no-progress"]


def run(script: str, *args: str, ok: bool = True
        ) -> subprocess.CompletedProcess:
    return run_example(script, *args, timeout=TIMEOUT, ok=ok)


def requests_log(path: Path) -> Dict[int, dict]:
    return {r["request"]: r for r in map(json.loads,
                                         path.read_text().splitlines())
            if "request" in r}


def read_trace(path: Path) -> List[dict]:
    from jaxlake._src.trace import tracefile
    trace = tracefile.read_trace(str(path))
    assert not trace.skipped
    with open(path) as f:
        next(f)
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """serve_lm.py over the same requests with each cache layout, verified;
    the grow run records a trace."""
    d = tmp_path_factory.mktemp("serve")
    out = {"grow": d / "grow.jsonl", "slots": d / "slots.jsonl",
           "trace": d / "serve.jsonl"}
    done = run("serve_lm.py", *SERVE, "--cache", "grow", "--verify",
               "--log-json", str(out["grow"]), "--trace", str(out["trace"]))
    (d / "grow.out").write_text(done.stdout)
    out["grow_out"] = d / "grow.out"
    done = run("serve_lm.py", *SERVE, "--cache", "slots", "--verify",
               "--log-json", str(out["slots"]))
    (d / "slots.out").write_text(done.stdout)
    out["slots_out"] = d / "slots.out"
    return out


def test_serve_both_cache_layouts_match_the_uncached_model(
        served: Dict[str, Path]) -> None:
    for mode in ("grow", "slots"):
        text = served[f"{mode}_out"].read_text()
        assert "verified: all 6 requests match the uncached model" in text
    grow, slots = requests_log(served["grow"]), requests_log(served["slots"])
    assert sorted(grow) == list(range(6))
    # The same requests, greedy, the same weights: the same tokens.
    for i, r in grow.items():
        assert len(r["tokens"]) == r["new_tokens"]
        assert r["tokens"] == slots[i]["tokens"], i
    # Requests overlapped (continuous batching) and some waited for a slot.
    spans = [(r["started"], r["finished"]) for r in grow.values()]
    assert any(a[0] < b[0] < a[1] for a in spans for b in spans)


def test_serve_trace_shows_caches_grow_and_go(served: Dict[str, Path]
                                              ) -> None:
    out = served["grow_out"].read_text()
    growths = int(out.split(" cache growths")[0].rsplit(" ", 1)[1])
    assert growths >= 1, out
    events = read_trace(served["trace"])
    live: Dict[int, str] = {}
    caches: "collections.Counter[int]" = collections.Counter()
    for e in events:
        if e["op"] == "alloc":
            live[e["id"]] = e.get("kind", "")
            if e.get("kind") == "activation":
                caches[e["size"]] += 1
        else:
            live.pop(e["id"])
    # Caches of at least three capacities, each a whole number of 16-position
    # blocks of the tiny model (2 layers x keys and values x 64 float32
    # values a position), and all of them freed by the end: what is left
    # is the weights.
    assert len(caches) >= 3, caches
    block = 16 * 2 * 2 * 64 * 4
    assert all(size % block == 0 for size in caches), caches
    assert live and set(live.values()) == {"param"}, live
    trace_line = [l for l in out.splitlines() if l.startswith("trace ")]
    assert trace_line and "launches" in trace_line[0]


def test_serve_help_gives_every_default() -> None:
    help_text, options = example_help("serve_lm", TIMEOUT)
    assert "usage: serve_lm.py" in help_text
    for flag in ("--requests", "--max-len", "--prompt-len", "--new-tokens",
                 "--cache", "--slots", "--verify", "--trace"):
        assert flag in help_text
    lines = options.strip().splitlines()
    lacking = [line for line in lines if "default" not in line]
    assert len(lines) > 15 and not lacking, lacking


def test_serve_refuses_bad_input() -> None:
    cases = [
        (["--prompt-len", "40,60", "--new-tokens", "10,20", "--max-len",
          "64"], "over --max-len 64"),
        (["--prompt-len", "banana"], "--prompt-len"),
        (["--prompt-len", "9,3"], "MIN <= MAX"),
        (["--compile-only"], "needs --trace"),
        (["--arrival-every", "-1"], "--arrival-every"),
    ]
    for argv, words in cases:
        done = run("serve_lm.py", *argv, ok=False)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert words in done.stderr, (argv, done.stderr)
        assert "Traceback" not in done.stderr


# -- under the fake GPU ----------------------------------------------------


@NEEDS_JAX
def test_serve_under_the_fake_gpu_with_the_lake(tmp_path: Path) -> None:
    trace, stats = tmp_path / "lake.jsonl", tmp_path / "fake.json"
    proc = fake_run([sys.executable, str(EXAMPLES / "serve_lm.py"),
                     "--requests", "4", "--max-len", "64", "--prompt-len",
                     "4,20", "--new-tokens", "2,20", "--slots", "2",
                     "--no-progress"], args=["--trace", str(trace)],
                    env={"JAXLAKE_FAKEGPU_STATS": str(stats)},
                    timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "served 4 requests" in proc.stdout
    events = read_trace(trace)
    assert len(events) > 50
    calls = json.loads(stats.read_text())["calls"]
    # The lake served XLA's pool: no buffer came from the driver's pool.
    assert int(calls.get("cuMemAllocFromPoolAsync", 0)) == 0
    assert int(calls.get("cuMemCreate", 0)) >= 1


# -- many executables, long-lived outputs (train_lm.py) --------------------


def test_train_eval_outputs_kept_restore_and_a_compile_per_length(
        tmp_path: Path) -> None:
    """Train and eval alternate, every result stays on the device, the run
    rolls back to a checkpoint mid-way, and three sequence lengths each get
    their own train step."""
    logf, trace = tmp_path / "log.jsonl", tmp_path / "keep.jsonl"
    done = run("train_lm.py", "--no-progress", "--steps", "6",
               "--seq-buckets", "16,32,48", "--eval-every", "2",
               "--eval-batches", "1", "--keep-outputs", "--ckpt-dir",
               str(tmp_path / "ckpt"), "--ckpt-every", "2", "--restore-at",
               "3", "--log-json", str(logf), "--trace", str(trace))
    records = [json.loads(l) for l in logf.read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    # Steps 1..3, back to the checkpoint of step 2, then 3..6 again.
    assert steps == [1, 2, 3, 3, 4, 5, 6], steps
    assert [r.get("restored_from") for r in records
            if r.get("step") == 3 and "loss" in r] == [2, None]
    again = [r["loss"] for r in records if r.get("step") == 3 and "loss" in r]
    assert again[0] == again[1]  # the same state, the same batch
    launches = len(steps) + sum("eval_loss" in r for r in records)
    assert f"kept {launches} outputs on the device to the end" in done.stdout
    # Every kept output (a train step's loss and gradient norm, an eval's
    # loss and logits: two arrays each) is still live when the trace ends.
    live: Dict[int, str] = {}
    for e in read_trace(trace):
        if e["op"] == "alloc":
            live[e["id"]] = e.get("kind", "")
        else:
            live.pop(e["id"])
    outputs = sum(kind == "output" for kind in live.values())
    assert outputs == 2 * launches, (outputs, launches)
    line = [l for l in done.stdout.splitlines() if l.startswith("trace ")][0]
    compiles = int(line.split(" GPU compiles")[0].rsplit(" ", 1)[1])
    # init, init_frozen, opt_init, eval, and a train step per length.
    assert compiles == 4 + 3, line


def test_restore_at_needs_checkpoints() -> None:
    for argv, words in (
            (["--restore-at", "3"], "needs --ckpt-dir and --ckpt-every"),
            (["--restore-at", "1", "--ckpt-dir", "/tmp/x", "--ckpt-every",
              "2"], "before the first save"),
            (["--restore-at", "20", "--steps", "20", "--ckpt-dir", "/tmp/x",
              "--ckpt-every", "2"], "not before the last step")):
        done = run("train_lm.py", *argv, ok=False)
        assert done.returncode == 2, (argv, done.stderr)
        assert words in done.stderr, (argv, done.stderr)


# -- offloading (train_lm.py) ----------------------------------------------


def test_offloaded_activations_and_optimizer_state_train_the_same(
        tmp_path: Path) -> None:
    """Offloading moves bytes, not values: the losses of a run with its
    saved activations and its optimizer state in pinned host memory are
    those of a plain run, and the optimizer state ends in pinned_host."""
    plain, offloaded = tmp_path / "plain.jsonl", tmp_path / "off.jsonl"
    run("train_lm.py", "--no-progress", "--steps", "3", "--log-json",
        str(plain))
    done = run("train_lm.py", "--no-progress", "--steps", "3",
               "--offload-opt-state", "--remat", "offload-attn-mlp-out",
               "--log-json", str(offloaded))
    assert "optimizer state held in pinned_host memory" in done.stdout
    a = {r["step"]: r["loss"] for r in map(
        json.loads, plain.read_text().splitlines()) if "loss" in r}
    b = {r["step"]: r["loss"] for r in map(
        json.loads, offloaded.read_text().splitlines()) if "loss" in r}
    assert sorted(a) == sorted(b) == [1, 2, 3]
    assert all(abs(a[s] - b[s]) < 1e-5 for s in a), (a, b)


def test_offload_opt_state_refuses_the_recorder(tmp_path: Path) -> None:
    done = run("train_lm.py", "--offload-opt-state", "--trace",
               str(tmp_path / "t.jsonl"), ok=False)
    assert done.returncode == 2
    assert "jaxlake run --fake-gpu --trace" in done.stderr, done.stderr


@NEEDS_JAX
def test_offload_under_the_fake_gpu_uses_pinned_host_memory(
        tmp_path: Path) -> None:
    """XLA's GPU client holds pinned_host arrays in page-locked host memory
    of its own (cuMemHostAlloc), beside the device pool the lake serves.
    The example reports the pinned_host bytes it keeps (its arrays after
    each step, in --log-json too, and the train step's host temporaries,
    the offloaded activations), and XLA's host allocator holds at least
    that much (the fake's stats)."""
    counts, held = {}, {}
    for name, extra in (("plain", []), ("offload", [
            "--offload-opt-state", "--remat", "offload-dots"])):
        trace, stats = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.json"
        log = tmp_path / f"{name}-log.jsonl"
        proc = fake_run([sys.executable, str(EXAMPLES / "train_lm.py"),
                         "--no-progress", "--steps", "2", "--attention",
                         "xla", "--log-json", str(log), *extra],
                        args=["--trace", str(trace)],
                        env={"JAXLAKE_FAKEGPU_STATS": str(stats)},
                        timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert len(read_trace(trace)) > 20
        report = json.loads(stats.read_text())
        calls = report["calls"]
        assert int(calls.get("cuMemAllocFromPoolAsync", 0)) == 0
        counts[name] = int(calls.get("cuMemHostAlloc", 0))
        held[name] = report["host"]["bytes_peak"]
        steps = [r for r in map(json.loads, log.read_text().splitlines())
                 if "step" in r]
        if not extra:
            assert "pinned_host:" not in proc.stdout
            assert all("pinned_host_bytes" not in r for r in steps)
            continue
        assert "optimizer state held in pinned_host memory" in proc.stdout
        # The optimizer state, the same bytes after every step.
        pinned = {r["pinned_host_bytes"] for r in steps}
        assert len(steps) == 2 and len(pinned) == 1 and min(pinned) > 0
        line = next(x for x in proc.stdout.splitlines()
                    if x.startswith("pinned_host: "))
        mib = [float(x) for x in re.findall(r"([0-9.]+) MiB", line)]
        arrays, arguments, temporaries = mib[0], mib[1], mib[4]
        assert abs(arrays - min(pinned) / 2**20) < 0.01, line
        assert arguments == arrays and temporaries > 0, line
        assert held[name] >= (arrays + temporaries) * 2**20 - 2**16, (
            held, line)
    assert counts["offload"] > counts["plain"], counts
    assert held["offload"] > held["plain"], held


# -- one GPU shared by two JAX processes (--fake-gpu-shared) ---------------


@NEEDS_JAX
def test_two_jax_processes_share_one_fake_device(tmp_path: Path) -> None:
    # The first process preallocates JAX's default 0.75 of a shared 256 MiB
    # device and waits; the second, on the same device, can only have what
    # is left, as on one GPU (alone it would hold 100 MiB easily).
    import uuid
    name = f"test-{uuid.uuid4().hex[:10]}"
    memory = 256 << 20
    args = ["--no-lake", f"--fake-gpu-memory={memory}",
            "--fake-gpu-shared", name]
    holder_code = (
        "import sys, jax, jax.numpy as jnp\n"
        "x = jnp.ones(1024); x.block_until_ready()\n"
        "print('READY', flush=True)\n"
        "sys.stdin.readline()\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAXLAKE") and k not in (
               "JAX_PLATFORMS", "XLA_FLAGS", "LD_PRELOAD")}
    env["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
    jaxlake = str(Path(sys.executable).with_name("jaxlake"))
    holder = subprocess.Popen(
        [jaxlake, "run", "--fake-gpu", *args, "--", sys.executable, "-c",
         holder_code], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=str(ROOT))
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "READY", \
            holder.communicate(timeout=60)[1][-3000:]
        # The second can hold a small array but not 100 MiB more.
        second = fake_run(
            "import json, jax, jax.numpy as jnp\n"
            "x = jnp.ones(1024); x.block_until_ready()\n"
            "try:\n"
            "    y = jnp.ones((100 << 20) // 4, jnp.float32)\n"
            "    y.block_until_ready()\n"
            "    err = ''\n"
            "except Exception as e:\n"
            "    err = str(e)\n"
            "print('RESULT ' + json.dumps({'error': err}))",
            args=args, timeout=TIMEOUT)
        assert second.returncode == 0, second.stderr[-3000:]
        line = [l for l in second.stdout.splitlines()
                if l.startswith("RESULT ")][-1]
        error = json.loads(line[len("RESULT "):])["error"]
        assert "RESOURCE_EXHAUSTED" in error, error
    finally:
        holder.kill()
        holder.communicate(timeout=60)
        shm = Path(f"/dev/shm/jaxlake-fakegpu-{os.getuid()}-{name}")
        if shm.exists():
            shm.unlink()
