"""The trace recorder: device-less CUDA compilation for GPU buffer sizes,
the per-execution model, compile-only and per-tensor variants.

Runs on the CPU; needs jax with jax-cuda12-plugin and jax-cuda12-pjrt of the
same version (the `test` extra installs them), but no GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, List

import pytest

jax = pytest.importorskip(
    "jax", reason="the recorder needs jax (pip install 'jaxlake[examples]', "
    "on Python 3.11 and newer)")
import jax.numpy as jnp  # noqa: E402
from jax._src import xla_bridge  # noqa: E402

# On the CPU: the CUDA plugin then skips its driver checks and stays
# registered for device-less compilation (jax may have been imported by
# another test module already, so the variable alone can come too late).
if not xla_bridge.backends_are_initialized():
    jax.config.update("jax_platforms", "cpu")
import numpy as np  # noqa: E402

from jaxlake._src.trace import gpu, recorder  # noqa: E402
from jaxlake._src.trace.tracefile import read_trace  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _device_less() -> None:
    try:
        recorder.gpu_devices(1)
    except recorder.RecorderError as e:
        pytest.fail(f"device-less CUDA compilation must work here: {e}")


def _step(params: Any, x: Any, remat: bool = False) -> Any:
    def layer(h: Any, w: Any) -> Any:
        return jnp.tanh(jnp.tanh(h @ w) @ w)

    def loss(p: Any) -> Any:
        h = x
        for w in p:
            h = (jax.checkpoint(layer) if remat else layer)(h, w)
        return jnp.mean(h ** 2)
    value, grads = jax.value_and_grad(loss)(params)
    return [w - 0.1 * g for w, g in zip(params, grads)], value


def _program(rec: recorder.Recorder, steps: int = 3,
             remat: bool = False) -> List[Any]:
    def body(params: Any, x: Any) -> Any:
        return _step(params, x, remat)
    init = rec.wrap(jax.jit(lambda k: [
        jax.random.normal(jax.random.fold_in(k, i), (256, 256)) / 16
        for i in range(4)]), "init", "param")
    step = rec.wrap(jax.jit(body, donate_argnums=0), "step",
                    ("param", "output"))
    params = init(jax.random.PRNGKey(0))
    losses = []
    for i in range(steps):
        x = rec.device_put(np.full((128, 256), 0.01 * (i + 1), np.float32))
        params, value = step(params, x)
        losses.append(value)
    return losses


def _events(path: Path) -> List[tuple]:
    return [(e.op, e.size, e.kind) for e in read_trace(path).events()]


def test_devices_are_compile_only_h100s() -> None:
    devices = recorder.gpu_devices(2)
    assert len(devices) == 2
    assert "H100" in devices[0].device_kind


def test_target_configs() -> None:
    assert recorder.DEFAULT_TARGET in recorder.target_names()
    assert "H100" in recorder.target_config()
    with pytest.raises(recorder.RecorderError, match="h100_sxm"):
        recorder.target_config("b300")


def test_per_execution_model(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    with recorder.Recorder(str(path), "mlp") as rec:
        losses = _program(rec)
    assert all(isinstance(v, jax.Array) for v in losses)
    trace = read_trace(path)
    assert trace.name == "mlp" and trace.meta["target"] == "h100_sxm"
    events = trace.events()
    allocs = [e for e in events if e.op == "alloc"]
    # The four parameters: allocated once by init, then donated and
    # aliased by every step, so never allocated again.
    assert [e.size for e in allocs if e.kind == "param"] == [256 * 256 * 4] * 4
    # Each step: its input, a loss output, the tuple table, one temp.
    assert [e.size for e in allocs if e.kind == "input"][1:] == \
        [128 * 256 * 4] * 3
    temps = [e for e in allocs if e.kind == "temp"][1:]  # init's first
    assert len(temps) == 3 and len({e.size for e in temps}) == 1
    # The temp is freed at the end of its launch, right after the table.
    for e in temps:
        i = events.index(e)
        assert events[i + 1].op == "free" and events[i + 1].id == e.id
    # What the program dropped was freed where it dropped it: the
    # parameters and the last batch when _program returned. The losses it
    # still held at close() stay live.
    live = {e.id for e in allocs} - {e.id for e in events if e.op == "free"}
    assert len(live) == len(losses) == 3


def test_compile_only_matches_a_real_run(tmp_path: Path) -> None:
    run, dry = tmp_path / "run.jsonl", tmp_path / "dry.jsonl"
    with recorder.Recorder(str(run), "a") as rec:
        real = _program(rec)
    assert all(isinstance(v, jax.Array) for v in real)
    with recorder.Recorder(str(dry), "a", compile_only=True) as rec:
        losses = _program(rec)
    assert all(isinstance(v, recorder.Abstract) for v in losses)
    assert _events(run) == _events(dry)
    assert read_trace(dry).meta["mode"] == "compile-only"


def test_gpu_temp_shows_rematerialisation(tmp_path: Path) -> None:
    peaks = {}
    for remat in (False, True):
        path = tmp_path / f"{remat}.jsonl"
        with recorder.Recorder(str(path), "m", compile_only=True) as rec:
            _program(rec, steps=1, remat=remat)
        peaks[remat] = max(e.size for e in read_trace(path).events()
                           if e.kind == "temp")
    assert peaks[True] < peaks[False]


def test_sharded_sizes_are_one_devices_shard(tmp_path: Path) -> None:
    from jax.sharding import Mesh, PartitionSpec as P
    cpu = np.array(jax.devices()[:1]).reshape(1, 1)
    mesh = Mesh(cpu, ("data", "model"))
    path = tmp_path / "s.jsonl"
    # A 1x1 program mesh recorded as such; shard sizes of a 4-device GPU
    # mesh are checked directly.
    with recorder.Recorder(str(path), "s", mesh=mesh, compile_only=True) as rec:
        x = rec.device_put(np.zeros((64, 32), np.float32), P("data", None))
        assert rec._size_of(x) == 64 * 32 * 4
    big = recorder.gpu_devices(4)
    gmesh = Mesh(np.array(big).reshape(4, 1), ("data", "model"))
    s = jax.sharding.NamedSharding(gmesh, P("data", None))
    assert recorder.shard_bytes((64, 32), np.float32, s) == 16 * 32 * 4
    assert recorder.shard_bytes((64, 32), jnp.bfloat16, s) == 16 * 32 * 2


ASSIGNMENT = """\
BufferAssignment:
allocation 0: size 2097152, parameter 0, shape |f32[512,1024]| at ShapeIndex {}, maybe-live-out:
 value: <38 w.1 @0> (size=2097152,offset=0): f32[512,1024]{1,0}
 value: <44 gemm_fusion_dot @0> (size=2097152,offset=0): f32[512,1024]{1,0}
allocation 1: size 131072, maybe-live-out:
 value: <42 input_add_reduce_fusion{0} @0> (size=1024,offset=0): f32[256]{0}
 value: <47 copy.3 @0> (size=131072,offset=0): f32[64,512]{1,0}
allocation 3: size 24, output shape is |(f32[512,1024], f32[])|, maybe-live-out:
 value: <48 tuple.4{} @0> (size=24,offset=0): (f32[512,1024]{1,0}, f32[])
allocation 4: size 4, thread-local:
 value: <2 reduce_sum.5.0 @0> (size=4,offset=0): f32[]
allocation 11: size 1311000, preallocated-temp:
 value: <39 gemm_fusion_dot.1 @0> (size=1048576,offset=0): f32[4,64,1024]{2,1,0}
 value: <40 loop_reduce_fusion @0> (size=262144,offset=1048576): f32[64,1024]{1,0}
 value: <41 input_add_reduce_fusion{} @0> (size=16,offset=1310720): (f32[256]{0}, f32[64,1024]{1,0})
 value: <43 input_add_reduce_fusion{1} @0> (size=262144,offset=1048576): f32[64,1024]{1,0}
"""

LIVE_RANGE = """\
HloLiveRange (max 17):
  InstructionSequence:
    0:x.1
  BufferLiveRange:
    w.1{}:0-8
    gemm_fusion_dot.1{}:4-5
    loop_reduce_fusion{}:5-6
    input_add_reduce_fusion{}:6-9
    input_add_reduce_fusion{0}:6-10
    input_add_reduce_fusion{1}:6-8
    gemm_fusion_dot{}:8-17
    copy.3{}:15-17
    tuple.4{}:16-17
  Live ranges at 8 (peak):
    gemm_fusion_dot{}: 2097152 bytes (cumulative: 2097152 bytes)
"""


def test_parse_buffer_assignment() -> None:
    buffers = recorder.parse_buffer_assignment(ASSIGNMENT, LIVE_RANGE)
    got = sorted((b.name, b.size, b.start, b.end) for b in buffers)
    assert got == [
        ("gemm_fusion_dot.1", 1048576, 4, 5),
        ("input_add_reduce_fusion{0}", 1024, 6, 10),  # dies before the end
        ("input_add_reduce_fusion{1}", 262144, 6, 8),
        ("loop_reduce_fusion", 262144, 5, 6),
    ]


def test_per_tensor_variant(tmp_path: Path) -> None:
    # XLA reads XLA_FLAGS once per process: a fresh interpreter.
    path = tmp_path / "pt.jsonl"
    script = textwrap.dedent(f"""
        import jax, jax.numpy as jnp, numpy as np
        from jaxlake._src.trace.recorder import Recorder
        rec = Recorder({str(path)!r}, "pt", per_tensor=True)
        def step(w, x):
            g = jax.grad(lambda w: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))(w)
            return w - 0.1 * g
        f = rec.wrap(jax.jit(step, donate_argnums=0), "step", "param")
        w = rec.device_put(np.ones((256, 256), np.float32), kind="param")
        for _ in range(2):
            w = f(w, rec.device_put(np.ones((64, 256), np.float32)))
        rec.close()
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, timeout=180,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    events = read_trace(path).events()
    tensors = [e for e in events if e.op == "alloc" and e.kind == "activation"]
    assert not [e for e in events if e.kind == "temp"]
    assert len(tensors) >= 6 and len({e.size for e in tensors}) >= 2
    assert read_trace(path).meta["variant"] == "per-tensor"


def test_per_tensor_needs_flags_before_jax_starts(tmp_path: Path) -> None:
    jax.devices()  # the backend is up in this process
    if gpu._DUMP_DIR is not None:
        pytest.skip("dumps were turned on earlier in this process")
    with pytest.raises(recorder.RecorderError, match="before the first jax"):
        recorder.Recorder(str(tmp_path / "x.jsonl"), "x", per_tensor=True)


_SUITE_FOLDER = Path(__file__).resolve().parents[1] / "benchmarks" / "traces"


def _build_py() -> Any:
    """benchmarks/traces/build.py, loaded as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "suite_build", _SUITE_FOLDER / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def test_bundled_suite_is_what_build_py_lists() -> None:
    folder = _SUITE_FOLDER
    build = _build_py()
    # Built by build.py, or kept from earlier examples (build.KEPT).
    names = {s.name for s in build.SUITE} | set(build.KEPT)
    files = {p.name[:-len(".jsonl.gz")] for p in folder.glob("*.jsonl.gz")}
    assert names == files
    total = 0
    for name in sorted(names):
        path = folder / f"{name}.jsonl.gz"
        total += path.stat().st_size
        trace = read_trace(path)
        assert trace.name == name and trace.source == "recorder"
        assert trace.meta["target"] == "h100_sxm"
    assert total < 4 << 20  # the suite stays a few MB at most
    big = [read_trace(folder / f"{n}.jsonl.gz").meta for n in names]
    assert max(m["params"] for m in big) >= 10**9


def test_per_tensor_variants_are_apart_from_the_suite(
        capsys: pytest.CaptureFixture[str]) -> None:
    """build.py --per-tensor lists its own traces, each recorded per
    logical buffer, and refuses to write them into the bundled folder."""
    build = _build_py()
    names = [s.name for s in build.PER_TENSOR]
    assert len(names) == len(set(names)) == 8
    assert not set(names) & ({s.name for s in build.SUITE} | set(build.KEPT))
    assert all("--trace-per-tensor" in s.args for s in build.PER_TENSOR)
    assert build.main(["--per-tensor", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()
              if not line.startswith(" ")]
    assert listed == names
    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("--per-tensor began building into the suite")
    build.build_one = no_build  # a regression must not write here
    with pytest.raises(SystemExit) as e:
        build.main(["--per-tensor"])
    assert e.value.code == 2
    assert "--per-tensor needs --out" in capsys.readouterr().err


def test_holdout_set_is_apart_from_the_suite_and_the_variants(
        capsys: pytest.CaptureFixture[str]) -> None:
    """build.py --holdout lists traces that are neither bundled nor
    per-tensor variants, each per logical buffer: the three layouts on 2, 4
    and 8 devices and the three remat policies at three sizes; it refuses
    the bundled folder and --per-tensor with it."""
    build = _build_py()
    names = [s.name for s in build.HOLDOUT]
    assert len(names) == len(set(names)) == 18
    others = {s.name for s in build.SUITE} | set(build.KEPT) | {
        s.name for s in build.PER_TENSOR}
    assert not set(names) & others
    assert all("--trace-per-tensor" in s.args for s in build.HOLDOUT)
    sharded = {(s.args[s.args.index("--layout") + 1],
                s.args[s.args.index("--cpu-devices") + 1])
               for s in build.HOLDOUT if "--layout" in s.args}
    assert sharded == {(layout, n) for layout in ("data", "fsdp", "tp")
                       for n in ("2", "4", "8")}
    remat = {(s.args[s.args.index("--preset") + 1],
              s.args[s.args.index("--remat") + 1])
             for s in build.HOLDOUT if "--remat" in s.args}
    assert len(remat) == 9
    assert build.HOLDOUT_SEEDS and 0 not in build.HOLDOUT_SEEDS
    assert build.main(["--holdout", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()
              if not line.startswith(" ")]
    assert listed == names

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("--holdout began building into the suite")
    build.build_one = no_build
    with pytest.raises(SystemExit) as e:
        build.main(["--holdout"])
    assert e.value.code == 2
    assert "--holdout needs --out" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        build.main(["--holdout", "--per-tensor", "--out", "/nonexistent"])
    assert e.value.code == 2
    assert "give one" in capsys.readouterr().err


def test_workloads_group_is_apart_from_the_suite(
        capsys: pytest.CaptureFixture[str]) -> None:
    """build.py --workloads lists the workload traces (serving, a temp
    arena, kept outputs), whose files lie in their own folder, the one
    `jaxlake bench --workloads` reads, and never in the suite's."""
    from jaxlake._src.bench import suite as bench
    build = _build_py()
    names = [s.name for s in build.WORKLOADS]
    assert len(names) == len(set(names)) == 7  # 5 workloads, a pair
    assert not set(names) & ({s.name for s in build.SUITE} | set(build.KEPT))
    assert build.WORKLOADS_DIR == _SUITE_FOLDER / bench.WORKLOADS_GROUP
    files = {p.name[:-len(".jsonl.gz")]
             for p in build.WORKLOADS_DIR.glob("*.jsonl.gz")}
    assert files == set(names)
    total = 0
    for name in names:
        path = build.WORKLOADS_DIR / f"{name}.jsonl.gz"
        total += path.stat().st_size
        trace = read_trace(path)
        spec = next(s for s in build.WORKLOADS if s.name == name)
        # The recorder's traces, or the shim's of a fake-GPU run, renamed.
        assert trace.name == name and trace.source == {
            build.RECORDER: "recorder", build.FAKE_GPU: "shim",
            build.FAKE_GPU_BESIDE: "shim"}[spec.engine]
        if spec.engine in (build.FAKE_GPU, build.FAKE_GPU_BESIDE):
            assert trace.meta["args"] == list(spec.args)
        if spec.engine == build.FAKE_GPU_BESIDE:
            # The pair's second names its first, a trace of the group.
            assert spec.beside is not None and spec.beside.name in names
            assert spec.beside.name in str(trace.meta["beside"])
    assert total < 2 << 20
    assert build.main(["--workloads", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # One line a trace, its command (and a pair's first job) indented.
    assert [line.split()[0] for line in lines
            if not line.startswith(" ")] == names
    # Each trace's command, under its line: the fake GPU's through
    # `jaxlake run`, the recorder's with the example's --trace.
    for spec, line in zip(build.WORKLOADS, lines[1::2]):
        assert line.startswith("    ") and spec.script in line, line
        assert ("jaxlake run --quiet --fake-gpu --trace" in line) == (
            spec.engine == build.FAKE_GPU), line

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("--workloads began building into the suite")
    build.build_one = no_build
    with pytest.raises(SystemExit) as e:
        build.main(["--workloads", "--out", str(_SUITE_FOLDER)])
    assert e.value.code == 2
    assert "not into the suite's folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        build.main(["--workloads", "--holdout", "--out", "/nonexistent"])
    assert e.value.code == 2
    assert "give one" in capsys.readouterr().err


def test_device_less_compile_keeps_the_plugin_quiet(tmp_path: Path) -> None:
    """The plugin's "Could not find cuda drivers" lines, logged when the
    recorder loads it, are filtered out; other stderr output is kept."""
    code = textwrap.dedent("""
        import os, sys
        import jax
        jax.config.update("jax_platforms", "cpu")
        sys.stderr.write("BEFORE\\n"); sys.stderr.flush()
        from jaxlake._src.trace import recorder
        recorder.gpu_devices(1)
        from jaxlake._src.quiet import quiet_cuda_stub
        with quiet_cuda_stub():
            os.write(2, b"KEPT\\n")
            os.write(2, b"I0000 cudart_stub.cc:31] Could not find cuda "
                        b"drivers on your machine, GPU will not be used.\\n")
        print("OK")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAKE")}
    done = subprocess.run([sys.executable, "-c", code], env=env,
                          cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)  # (cwd: not the source tree)
    assert "OK" in done.stdout, done.stderr
    err = done.stderr.split("BEFORE\n", 1)[1]  # what import jax said aside
    assert "cudart_stub" not in err and "cuda drivers" not in err, err
    assert "KEPT" in err
