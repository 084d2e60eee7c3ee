"""The Flax examples, run as a user would, at the tiny preset on the CPU.

Each example runs in a subprocess (XLA reads its device count from XLA_FLAGS
once, at start): training makes the loss fall (scanned and unrolled layers),
a resumed checkpoint gives bit-for-bit the losses of the straight run and
records its model, each 8-device layout gives parameters and optimizer
state the NamedSharding it promises, a 2-process run works, --trace and
--compile-only write a trace the trace reader accepts, and bad input is
refused with a one-line message that names the value and what would work.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from example_util import (EXAMPLES, ROOT, example_help, require_examples,
                          run_example)
from example_util import cpu_env as _env

require_examples()

TIMEOUT = 240


def run(script: str, *args: str, ok: bool = True
        ) -> subprocess.CompletedProcess:
    return run_example(script, "--no-progress", *args, timeout=TIMEOUT,
                       ok=ok)


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
    """16 steps of train_lm.py with checkpoints at 8 and 16."""
    d = tmp_path_factory.mktemp("lm")
    paths = {"ckpt": d / "ckpt", "log": d / "log.jsonl"}
    done = run("train_lm.py", "--steps", "16", "--ckpt-dir",
               str(paths["ckpt"]), "--ckpt-every", "8", "--eval-every", "8",
               "--log-json", str(paths["log"]))
    paths["stdout"] = d / "stdout.txt"
    paths["stdout"].write_text(done.stdout)
    paths["stderr"] = d / "stderr.txt"
    paths["stderr"].write_text(done.stderr)
    return paths


# What JAX's CUDA plugin logs at every start on a machine without a driver.
CUDA_STUB_NOISE = ("cudart_stub", "Could not find cuda drivers",
                   "before absl::InitializeLog")


def _cuda_plugin_makes_noise() -> bool:
    """Whether `import jax` here logs the plugin's driver search (the CUDA
    plugin installed, no driver): the case the examples must keep quiet."""
    done = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"],
                          env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    return any(n in done.stderr for n in CUDA_STUB_NOISE)


def test_examples_start_quietly(trained: Dict[str, Path]) -> None:
    if not _cuda_plugin_makes_noise():
        pytest.skip("import jax logs no CUDA driver search here (no CUDA "
                    "plugin, or a driver): nothing to keep quiet")
    for script in ("train_lm.py", "train_sharded.py", "finetune_lora.py"):
        done = subprocess.run([sys.executable, str(EXAMPLES / script),
                               "--help"], env=_env(), capture_output=True,
                              text=True, timeout=TIMEOUT, cwd=str(ROOT))
        assert done.returncode == 0 and "usage:" in done.stdout
        assert not [n for n in CUDA_STUB_NOISE if n in done.stderr], \
            done.stderr
    # A whole run, backends started and all.
    err = trained["stderr"].read_text()
    assert not [n for n in CUDA_STUB_NOISE if n in err], err


@pytest.mark.parametrize("script", ["train_lm.py", "train_sharded.py",
                                    "finetune_lora.py"])
def test_help(script: str) -> None:
    # One process: --help as a user sees it, then every option's help.
    help_text, options = example_help(script[:-3], TIMEOUT)
    assert f"usage: {script}" in help_text
    for flag in ("--preset", "--remat", "--grad-accum", "--seq-buckets",
                 "--eval-every", "--jaxlake", "--no-jaxlake", "--trace",
                 "--scan-layers", "--no-scan-layers", "--attention",
                 "--steps", "--seed", "--weight-decay"):
        assert flag in help_text
    # Every option has help that says its default.
    lines = options.strip().splitlines()
    assert len(lines) > 20
    lacking = [line for line in lines if "default" not in line]
    assert not lacking, lacking


def test_train_lm_loss_falls(trained: Dict[str, Path]) -> None:
    assert_falls(train_losses(trained["log"]))
    evals = eval_losses(trained["log"])
    assert evals[16] < evals[0] - 0.5, evals
    # The lake is off the GPU here: the --jaxlake path says why, in a line.
    notice = [line for line in trained["stdout"].read_text().splitlines()
              if line.startswith("jaxlake: lake inactive: ")]
    assert len(notice) == 1 and len(notice[0]) < 120, notice
    # The checkpoint records its model.
    assert json.loads((trained["ckpt"] / "model.json").read_text()) == {
        "preset": "tiny", "scan_layers": True}


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


def test_resume_refuses_another_preset(trained: Dict[str, Path]) -> None:
    done = run("train_lm.py", "--preset", "small", "--ckpt-dir",
               str(trained["ckpt"]), ok=False)
    assert done.returncode == 2
    assert "--preset small" in done.stderr and "tiny" in done.stderr


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory
             ) -> subprocess.CompletedProcess:
    """16 steps of train_lm.py --compile-only --trace, with its progress
    shown (no --no-progress): the H100 compiles, nothing run."""
    trace = tmp_path_factory.mktemp("co") / "lm.jsonl.gz"
    cmd = [sys.executable, str(EXAMPLES / "train_lm.py"), "--compile-only",
           "--trace", str(trace), "--steps", "16"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=str(ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    done.trace = trace  # type: ignore[attr-defined]
    return done


def test_compile_only_shows_compiles_and_no_loss(
        compiled: subprocess.CompletedProcess) -> None:
    # The train step's GPU compile takes seconds: it is shown, with time.
    assert re.search(r"compiled train_step in [0-9.]+s", compiled.stderr), \
        compiled.stderr[-3000:]
    assert "loss" not in compiled.stderr and "tok/s" not in compiled.stderr
    assert "nothing ran, so there is no loss" in compiled.stdout


def test_trace_is_what_replay_reads(
        compiled: subprocess.CompletedProcess) -> None:
    from jaxlake._src.trace.tracefile import read_trace
    trace = read_trace(compiled.trace)  # type: ignore[attr-defined]
    assert trace.source == "recorder"
    assert trace.meta["mode"] == "compile-only"
    assert trace.meta["preset"] == "tiny"
    assert trace.meta["target"] == "h100_sxm"
    assert trace.meta["scan_layers"] is True
    assert trace.meta["attention"] == "xla"
    events = trace.events()
    kinds = {e.kind for e in events if e.op == "alloc"}
    assert {"param", "opt_state", "input", "temp", "output"} <= kinds
    # Parameters and optimizer state are donated: one allocation each for
    # the whole run, not one per step. The blocks are scanned: each of
    # their 8 tensors holds every layer; 3 more outside the blocks.
    params = [e for e in events if e.op == "alloc" and e.kind == "param"]
    assert len(params) == 11
    temps = [e for e in events if e.op == "alloc" and e.kind == "temp"]
    assert len(temps) >= 16


def test_sharded_per_tensor_trace(tmp_path: Path) -> None:
    """train_sharded.py builds its mesh (so starts jax) before the recorder
    exists; it turns XLA's dumps on first, and the per-tensor variant
    records each tensor of the sharded program."""
    from jaxlake._src.trace.tracefile import read_trace
    trace = tmp_path / "sharded.jsonl.gz"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_sharded.py"), "--layout",
         "fsdp", "--compile-only", "--steps", "2", "--no-progress",
         "--trace", str(trace), "--trace-per-tensor"],
        env=_env(), capture_output=True, text=True, timeout=TIMEOUT,
        cwd=str(ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    read = read_trace(trace)
    assert read.meta["variant"] == "per-tensor"
    assert read.name.endswith("-per-tensor")
    kinds = [e.kind for e in read.events() if e.op == "alloc"]
    assert "temp" not in kinds  # temps are split into their tensors
    assert kinds.count("activation") > 100


def test_jaxlake_replay_reads_the_trace(
        compiled: subprocess.CompletedProcess) -> None:
    trace = compiled.trace  # type: ignore[attr-defined]
    done = subprocess.run(
        [sys.executable, "-m", "jaxlake", "replay", str(trace),
         "--policy", "jaxlake,bfc"], capture_output=True, text=True,
        timeout=TIMEOUT, cwd=str(trace.parent))
    if "invalid choice: 'replay'" in done.stderr:
        pytest.skip("this jaxlake has no `replay` command yet")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lm-tiny" in done.stdout and "bfc" in done.stdout


def test_unrolled_remat_accumulation_buckets_eval(tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    run("train_lm.py", "--steps", "12", "--no-scan-layers", "--remat",
        "dots-saveable", "--grad-accum", "2", "--seq-buckets", "32,64",
        "--eval-every", "6", "--log-json", str(out))
    assert_falls(train_losses(out))
    assert sorted(eval_losses(out)) == [0, 6, 12]


def test_lora_finetune(trained: Dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    # No --preset: the model is the base checkpoint's.
    done = run("finetune_lora.py", "--base-ckpt", str(trained["ckpt"]),
               "--steps", "12", "--lr", "3e-2", "--eval-every", "6",
               "--log-json", str(out))
    evals = eval_losses(out)
    assert evals[12] < evals[0], evals
    losses = train_losses(out)
    assert sum(losses[s] for s in range(7, 13)) < sum(
        losses[s] for s in range(1, 7)), losses
    assert "adapter parameters" in done.stdout
    assert log(out)[-1]["summary"] is True  # --log-json's memory summary


#: Runs train_sharded.py and prints the sharding of every array of the
#: trained state: {part: {path: [mesh axes, spec]}}.
_SHARDINGS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import jax, _lm, train_sharded
got = {}
def train(args, setup, _train=_lm.train):
    got.update(_train(args, setup))
    return got
_lm.train = train
train_sharded.main(sys.argv[2:])
print("SHARDINGS", json.dumps({part: {
    jax.tree_util.keystr(p, simple=True, separator="/"):
        [dict(x.sharding.mesh.shape), list(x.sharding.spec)]
    for p, x in jax.tree_util.tree_leaves_with_path(got[part])}
    for part in ("trainable", "opt_state")}))
"""

#: layout -> (mesh, {path suffix: spec of a parameter and its adam moments}).
#: Scanned blocks: a leading layer axis that stays whole.
_EXPECTED = {
    "data": ({"data": 8, "model": 1}, {
        "blocks/attn/q/kernel": [], "blocks/mlp/up/kernel": [],
        "embed/embedding": []}),
    "fsdp": ({"data": 8, "model": 1}, {
        "blocks/attn/q/kernel": [None, "data", None],
        "blocks/mlp/up/kernel": [None, None, "data"],
        "blocks/mlp/down/kernel": [None, "data", None],
        "embed/embedding": ["data", None], "pos_embed": ["data", None],
        "blocks/norm_attn/scale": [None, "data"]}),
    "tp": ({"data": 2, "model": 4}, {
        "blocks/attn/q/kernel": [None, None, "model"],
        "blocks/attn/out/kernel": [None, "model", None],
        "blocks/mlp/up/kernel": [None, None, "model"],
        "blocks/mlp/down/kernel": [None, "model", None],
        "embed/embedding": [], "blocks/norm_mlp/scale": []}),
}


@pytest.mark.parametrize("layout", list(_EXPECTED))
def test_sharded_on_8_cpu_devices(layout: str, tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _SHARDINGS, str(EXAMPLES), "--no-progress",
         "--layout", layout, "--steps", "8", "--batch", "16", "--log-json",
         str(out)], env=_env(), capture_output=True, text=True,
        timeout=TIMEOUT, cwd=str(tmp_path))  # not ROOT: the installed jaxlake
    assert done.returncode == 0, done.stderr[-3000:]
    assert "over 8 cpu devices" in done.stdout
    assert_falls(train_losses(out))
    line = next(x for x in done.stdout.splitlines()
                if x.startswith("SHARDINGS "))
    got = json.loads(line[len("SHARDINGS "):])
    mesh, expected = _EXPECTED[layout]
    params = {k.removesuffix("/value"): v for k, v in got["trainable"].items()}
    moments = {k.removesuffix("/value"): v for k, v in got["opt_state"].items()
               if "/mu/" in k or "/nu/" in k}
    assert len(params) == 11 and len(moments) == 22
    for path, spec in expected.items():
        assert params[path] == [mesh, spec], (path, params[path])
        for moment in ("mu", "nu"):
            key = next(k for k in moments if k.endswith(f"/{moment}/{path}"))
            assert moments[key] == [mesh, spec], (key, moments[key])
    # Every state array is on the whole mesh; only the layout's axes split.
    used = {a for _, spec in [*params.values(), *moments.values()]
            for a in spec if a is not None}
    assert used == {"data": set(), "fsdp": {"data"}, "tp": {"model"}}[layout]


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


def test_tp_with_a_model_axis_of_one_is_refused() -> None:
    done = run("train_sharded.py", "--layout", "tp", "--mesh", "8x1",
               ok=False)
    assert done.returncode == 2
    assert "--layout tp --mesh 8x1" in done.stderr
    assert "--mesh 4x2" in done.stderr and "--layout data" in done.stderr


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines()
              if "error" in line]
    assert len(errors) == 1, done.stderr[-3000:]
    return errors[0]


def test_misspelt_jaxlake_option() -> None:
    line = _one_line_error(run("train_lm.py", "--jaxlake-option",
                               "capactiy=1", ok=False))
    assert "capactiy" in line and "capacity" in line


def test_trace_into_a_missing_folder() -> None:
    line = _one_line_error(run("train_lm.py", "--trace",
                               "/nonexistent2/x.jsonl", ok=False))
    assert "--trace /nonexistent2/x.jsonl" in line
    assert "does not exist" in line


def test_resume_step_that_was_not_saved(trained: Dict[str, Path]) -> None:
    line = _one_line_error(run("train_lm.py", "--ckpt-dir",
                               str(trained["ckpt"]), "--resume-step", "5",
                               ok=False))
    assert "--resume-step 5" in line and "[8, 16]" in line
