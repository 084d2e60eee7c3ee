"""The Flax examples, run as a user would, at the tiny preset on the CPU.

Each example runs in a subprocess (XLA reads its device count from XLA_FLAGS
once, at start): training makes the loss fall, a resumed checkpoint gives
bit-for-bit the losses of the straight run, the 8-device layouts and a
2-process run work, --trace writes a trace the trace reader accepts, and bad
input is refused with a message that names the value and what would work.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

_NEEDS = ("the examples need jax, flax, optax and orbax-checkpoint "
          "(pip install 'jaxlake[examples]')")
# Found, not imported: the examples run in subprocesses, and importing jax
# here would fix its platform choice for other test modules.
for _module in ("jax", "flax", "optax", "orbax"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is missing: {_NEEDS}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TIMEOUT = 240


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(script: str, *args: str, ok: bool = True
        ) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(EXAMPLES / script), "--no-progress", *args]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=str(ROOT))
    if ok and done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def log(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def train_losses(path: Path) -> Dict[int, float]:
    return {r["step"]: r["loss"] for r in log(path) if "loss" in r}


def eval_losses(path: Path) -> Dict[int, float]:
    return {r["step"]: r["eval_loss"] for r in log(path) if "eval_loss" in r}


def assert_falls(losses: Dict[int, float]) -> None:
    steps = sorted(losses)
    quarter = max(1, len(steps) // 4)
    first = sum(losses[s] for s in steps[:quarter]) / quarter
    last = sum(losses[s] for s in steps[-quarter:]) / quarter
    assert last < first - 0.1, losses


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """16 steps of train_lm.py with checkpoints at 8 and 16 and a trace."""
    d = tmp_path_factory.mktemp("lm")
    paths = {"ckpt": d / "ckpt", "log": d / "log.jsonl",
             "trace": d / "lm.jsonl.gz"}
    done = run("train_lm.py", "--steps", "16", "--ckpt-dir",
               str(paths["ckpt"]), "--ckpt-every", "8", "--eval-every", "8",
               "--log-json", str(paths["log"]), "--trace",
               str(paths["trace"]))
    paths["stdout"] = d / "stdout.txt"
    paths["stdout"].write_text(done.stdout)
    return paths


@pytest.mark.parametrize("script", ["train_lm.py", "train_sharded.py",
                                    "finetune_lora.py"])
def test_help(script: str) -> None:
    done = run(script, "--help")
    for flag in ("--preset", "--remat", "--grad-accum", "--seq-buckets",
                 "--eval-every", "--jaxlake", "--no-jaxlake", "--trace"):
        assert flag in done.stdout


def test_train_lm_loss_falls(trained: Dict[str, Path]) -> None:
    assert_falls(train_losses(trained["log"]))
    evals = eval_losses(trained["log"])
    assert evals[16] < evals[0] - 0.5, evals
    # The lake is off the GPU here: the --jaxlake path says why.
    assert "jaxlake: lake inactive: " in trained["stdout"].read_text()


def test_resume_reproduces_the_loss(trained: Dict[str, Path],
                                    tmp_path: Path) -> None:
    resumed = tmp_path / "resumed.jsonl"
    done = run("train_lm.py", "--steps", "16", "--ckpt-dir",
               str(trained["ckpt"]), "--resume-step", "8", "--eval-every",
               "8", "--log-json", str(resumed))
    assert "resumed from step 8" in done.stdout
    straight = train_losses(trained["log"])
    again = train_losses(resumed)
    assert sorted(again) == list(range(9, 17))
    assert again == {s: straight[s] for s in again}
    assert eval_losses(resumed)[16] == eval_losses(trained["log"])[16]


def test_trace_is_what_replay_reads(trained: Dict[str, Path]) -> None:
    from jaxlake._src.trace.tracefile import read_trace
    trace = read_trace(trained["trace"])
    assert trace.source == "recorder"
    assert trace.meta["preset"] == "tiny"
    assert trace.meta["target"] == "h100_sxm"
    events = trace.events()
    kinds = {e.kind for e in events if e.op == "alloc"}
    assert {"param", "opt_state", "input", "temp", "output"} <= kinds
    # Parameters and optimizer state are donated: one allocation each for
    # the whole run, not one per step.
    params = [e for e in events if e.op == "alloc" and e.kind == "param"]
    assert len(params) == 19  # 8 tensors per block, 2 blocks, 3 more
    temps = [e for e in events if e.op == "alloc" and e.kind == "temp"]
    assert len(temps) >= 16


def test_jaxlake_replay_reads_the_trace(trained: Dict[str, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jaxlake", "replay", str(trained["trace"]),
         "--policy", "jaxlake,bfc"], capture_output=True, text=True,
        timeout=TIMEOUT, cwd=str(trained["trace"].parent))
    if "invalid choice: 'replay'" in done.stderr:
        pytest.skip("this jaxlake has no `replay` command yet")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lm-tiny" in done.stdout and "bfc" in done.stdout


def test_remat_accumulation_buckets_eval(tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    run("train_lm.py", "--steps", "12", "--remat", "dots-saveable",
        "--grad-accum", "2", "--seq-buckets", "32,64", "--eval-every", "6",
        "--log-json", str(out))
    assert_falls(train_losses(out))
    assert sorted(eval_losses(out)) == [0, 6, 12]


def test_lora_finetune(trained: Dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    done = run("finetune_lora.py", "--base-ckpt", str(trained["ckpt"]),
               "--steps", "12", "--lr", "3e-2", "--eval-every", "6",
               "--log-json", str(out))
    evals = eval_losses(out)
    assert evals[12] < evals[0], evals
    losses = train_losses(out)
    assert sum(losses[s] for s in range(7, 13)) < sum(
        losses[s] for s in range(1, 7)), losses
    assert "adapter parameters" in done.stdout


@pytest.mark.parametrize("layout", ["fsdp", "tp"])
def test_sharded_on_8_cpu_devices(layout: str, tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    done = run("train_sharded.py", "--layout", layout, "--steps", "10",
               "--batch", "16", "--log-json", str(out))
    assert "over 8 cpu devices" in done.stdout
    assert_falls(train_losses(out))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_processes(tmp_path: Path) -> None:
    port = _free_port()
    out = tmp_path / "log.jsonl"
    procs = []
    for pid in (0, 1):
        cmd = [sys.executable, str(EXAMPLES / "train_sharded.py"),
               "--no-progress", "--layout", "fsdp", "--cpu-devices", "2",
               "--num-processes", "2", "--process-id", str(pid),
               "--coordinator", f"127.0.0.1:{port}", "--steps", "6",
               "--batch", "8"]
        if pid == 0:
            cmd += ["--log-json", str(out)]
        procs.append(subprocess.Popen(
            cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, cwd=str(ROOT)))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-3000:]
    assert "over 4 cpu devices in 2 process(es)" in outputs[0]
    assert_falls(train_losses(out))


# -- bad input ---------------------------------------------------------------


def test_unknown_preset() -> None:
    done = run("train_lm.py", "--preset", "huge", ok=False)
    assert done.returncode == 2
    assert "'huge'" in done.stderr and "tiny" in done.stderr \
        and "1b" in done.stderr


def test_unknown_remat_policy() -> None:
    done = run("finetune_lora.py", "--remat", "sometimes", ok=False)
    assert done.returncode == 2
    assert "'sometimes'" in done.stderr and "dots-saveable" in done.stderr


def test_mesh_that_does_not_divide_the_devices() -> None:
    done = run("train_sharded.py", "--mesh", "3x2", ok=False)
    assert done.returncode == 2
    assert "--mesh 3x2" in done.stderr and "there are 8" in done.stderr
    assert "4x2" in done.stderr


def test_batch_that_does_not_divide_the_data_axis() -> None:
    done = run("train_sharded.py", "--layout", "data", "--batch", "12",
               ok=False)
    assert done.returncode != 0
    text = done.stderr + done.stdout
    assert "--batch 12" in text and "data axis of size 8" in text
    assert "multiple of 8" in text
