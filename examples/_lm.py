"""The training loop the LM examples share, and what they import.

The model is in _model.py, the text in _data.py, the command line in
_lm_args.py and the checkpoints in _lm_ckpt.py. The loop follows Flax's
functional NNX pattern: the model and its nnx.Optimizer are split once into
a graph definition and State pytrees, and each step is a jax.jit function
State -> State that merges them back (nnx.merge), takes nnx.value_and_grad
and calls optimizer.update. States are donated and carry NamedShardings on
a mesh. optax adamw with warm-up plus cosine decay and gradient clipping;
gradient accumulation with optax.MultiSteps; sequence buckets; interleaved
evaluation; orbax checkpoints that record their model; and jaxlake.Recorder
behind --trace.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

# Without a GPU, stop jax from trying (and loudly failing) to load CUDA.
if "JAX_PLATFORMS" not in os.environ and not os.path.exists("/dev/nvidiactl"):
    os.environ["JAX_PLATFORMS"] = "cpu"

#: What JAX's CUDA plugin logs, from C++ static initialisers, each time one
#: of its libraries loads on a machine without a driver (three times at
#: `import jax`, once more when the backends start), whatever JAX_PLATFORMS
#: or TF_CPP_MIN_LOG_LEVEL say (jax 0.10.2 with jax-cuda12-plugin).
_CUDA_STUB_NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called "
    r"are written to STDERR$|cudart_stub\.cc:\d+\] Could not find cuda "
    r"drivers on your machine")


@contextmanager
def quiet_cuda_stub() -> Iterator[None]:
    """Runs its body with file descriptor 2 sent to a temporary file, then
    writes everything back to stderr but the CUDA plugin's "Could not find
    cuda drivers" lines (and absl's preamble to them). Anything else the
    body prints to stderr comes through, in order, when it ends."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter
        yield
        return
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            text = log.read().decode("utf-8", errors="replace")
            sys.stderr.write("".join(
                line for line in text.splitlines(keepends=True)
                if not _CUDA_STUB_NOISE.search(line.rstrip("\n"))))
            sys.stderr.flush()


def start_backends() -> List[Any]:
    """jax.devices(), the CUDA plugin's driver search kept quiet: call it
    once, after jaxlake.configure(), before anything else starts jax."""
    with quiet_cuda_stub():
        return list(jax.devices())


with quiet_cuda_stub():
    import jax  # noqa: E402
    import numpy as np  # noqa: E402
    import optax  # noqa: E402
    from flax import nnx  # noqa: E402
    from jax.sharding import NamedSharding  # noqa: E402
    from jax.sharding import PartitionSpec as P  # noqa: E402

from _data import Batches, corpus  # noqa: E402
from _lm_args import (Formatter, add_args, add_jaxlake_args,  # noqa: E402
                      check_args, model_config, positive_int, seq_lens,
                      trace_name, writable)
from _lm_ckpt import (checkpoints, load_base, restore,  # noqa: E402
                      save, write_model)
from _model import (ATTENTION, LAYOUTS, LM, PRESETS,  # noqa: E402
                    ModelConfig, loss_fn, state_specs)

#: What the example scripts use.
__all__ = ["ATTENTION", "LAYOUTS", "PRESETS", "Formatter", "Setup",
           "add_args", "add_jaxlake_args", "check_args", "model_config",
           "positive_int", "quiet_cuda_stub", "start_backends", "train",
           "writable"]


# -- training ----------------------------------------------------------------


@dataclasses.dataclass
class Setup:
    """What a run needs beyond the options."""

    mesh: Any = None                  # jax.sharding.Mesh, or None
    layout: str = "data"
    is_main: bool = True              # prints, writes the trace
    lora_rank: int = 0
    lora_alpha: float = 16.0
    base_ckpt: Optional[str] = None   # LoRA's base: a train_lm.py checkpoint
    base_step: Optional[int] = None
    corpus: str = "source"
    trace_extra: Tuple[str, ...] = ()
    meta: Dict[str, Any] = dataclasses.field(default_factory=dict)


def make_optimizer(args: argparse.Namespace) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=args.lr, warmup_steps=args.warmup,
        decay_steps=max(args.steps, args.warmup + 1), end_value=args.lr / 10)
    tx = optax.chain(optax.clip_by_global_norm(args.clip),
                     optax.adamw(schedule, b1=0.9, b2=0.95,
                                 weight_decay=args.weight_decay))
    if args.grad_accum > 1:
        # Applies the mean gradient every grad_accum micro-steps; the
        # micro-steps between leave the parameters as they are.
        tx = optax.MultiSteps(tx, every_k_schedule=args.grad_accum)
    return tx


def _float(x: Any) -> float:
    if isinstance(x, jax.Array):
        return float(jax.device_get(x))
    return float("nan")  # compile-only placeholders carry no value


class _Progress:
    """A tqdm bar (plain lines when tqdm is absent); in compile-only mode,
    a line with the elapsed time while a launch compiles for the GPU."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.bar = None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, initial=initial, unit="step",
                                dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                pass

    def update(self, step: int, text: Dict[str, str]) -> None:
        if self.bar is not None:
            self.bar.set_postfix(text, refresh=False)
            self.bar.update(1)
        elif self.enabled:
            print(f"step {step}: " + " ".join(f"{k} {v}"
                                              for k, v in text.items()),
                  file=sys.stderr)

    def compiling(self, fn: Callable[..., Any], name: str
                  ) -> Callable[..., Any]:
        """`fn`, showing "compiling NAME: 12s" while a call takes over a
        second (a GPU compile; the replayed launches take no time)."""
        if not self.enabled:
            return fn

        def call(*args: Any, **kwargs: Any) -> Any:
            done = threading.Event()
            started = time.perf_counter()
            tty = sys.stderr.isatty()

            def show() -> None:
                shown = False
                while not done.wait(1.0):
                    seconds = time.perf_counter() - started
                    line = f"compiling {name} for the GPU: {seconds:.0f}s"
                    if self.bar is not None:
                        self.bar.set_description_str(line)
                    elif tty:
                        sys.stderr.write("\r" + line)
                    elif not shown or round(seconds) % 10 == 0:
                        sys.stderr.write(line + "\n")  # a log: fewer lines
                    shown = True
                    sys.stderr.flush()
                if not shown:
                    return
                line = (f"compiled {name} in "
                        f"{time.perf_counter() - started:.1f}s")
                if self.bar is not None:
                    self.bar.set_description_str("")
                    self.bar.write(line, file=sys.stderr)
                else:
                    sys.stderr.write(("\r" if tty else "") + line + "\n")

            ticker = threading.Thread(target=show, daemon=True)
            ticker.start()
            try:
                return fn(*args, **kwargs)
            finally:
                done.set()
                ticker.join()
        return call

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(args: argparse.Namespace, setup: Setup) -> Dict[str, Any]:
    """Trains (or fine-tunes) and returns a summary: losses per step, the
    last eval loss, the trace written."""
    mesh = setup.mesh
    cfg = model_config(args, shard=mesh is not None, lora_rank=setup.lora_rank,
                       lora_alpha=setup.lora_alpha)
    mesh_shape = dict(mesh.shape) if mesh is not None else {}
    data_parts = mesh_shape.get("data", 1)
    micro_rows = args.batch // args.grad_accum
    if micro_rows % data_parts:
        raise SystemExit(
            f"error: a micro-batch of {micro_rows} sequences (--batch "
            f"{args.batch} / --grad-accum {args.grad_accum}) does not divide "
            f"over the data axis of size {data_parts}: use a --batch that is "
            f"a multiple of {data_parts * args.grad_accum}, e.g. "
            f"{data_parts * args.grad_accum} or "
            f"{2 * data_parts * args.grad_accum}")

    rec = None
    if args.trace and setup.is_main:
        import jaxlake
        meta = {"example": os.path.basename(sys.argv[0]), "preset":
                args.preset, "params": cfg.params(), "remat": args.remat,
                "scan_layers": cfg.scan_layers, "attention": cfg.attention,
                "dtype": cfg.dtype, "batch": args.batch, "seq_lens":
                seq_lens(args), "grad_accum": args.grad_accum, "eval_every":
                args.eval_every, "steps": args.steps, "keep_outputs":
                args.keep_outputs, "restore_at": args.restore_at}
        meta.update(setup.meta)
        try:
            rec = jaxlake.Recorder(
                args.trace, trace_name(args, *setup.trace_extra), mesh=mesh,
                compile_only=args.compile_only,
                per_tensor=args.trace_per_tensor, meta=meta)
        except (OSError, jaxlake.JaxlakeError) as e:
            raise SystemExit(f"error: --trace {args.trace}: {e}") from None
    start_backends()  # after the recorder, which may set XLA's dump flags

    batch_spec = P("data", None) if mesh is not None else None

    def put(batch: np.ndarray) -> Any:
        if rec is not None:
            return rec.device_put(batch, batch_spec)
        if mesh is None:
            return jax.device_put(batch)
        sharding = NamedSharding(mesh, batch_spec)
        return jax.make_array_from_callback(batch.shape, sharding,
                                            lambda index: batch[index])

    ctx = jax.set_mesh(mesh) if mesh is not None else nullcontext()
    with ctx:
        summary = _train(args, setup, cfg, mesh_shape, rec, put)
    if rec is not None:
        summary["trace"] = rec.summary()
        rec.close()
    return summary


def _train(args: argparse.Namespace, setup: Setup, cfg: ModelConfig,
           mesh_shape: Dict[str, int], rec: Any,
           put: Callable[[np.ndarray], Any]) -> Dict[str, Any]:
    mesh = setup.mesh
    lora = cfg.lora_rank > 0
    # What the optimizer trains: every parameter, or only the adapters.
    wrt = nnx.LoRAParam if lora else nnx.Param
    tx = make_optimizer(args)

    # Shapes first (nothing allocated), to derive every state's sharding.
    abstract = nnx.eval_shape(lambda: LM(cfg, nnx.Rngs(0)))
    graphdef, abs_train, abs_frozen = nnx.split(abstract, wrt, ...)
    abs_opt = nnx.eval_shape(lambda: nnx.Optimizer(
        LM(cfg, nnx.Rngs(0)), tx, wrt=wrt))
    opt_def, abs_opt_state = nnx.split(abs_opt)

    def specs(state: Any) -> Any:
        return state_specs(state, setup.layout, mesh_shape, cfg.scan_layers)

    t_specs, f_specs, o_specs = (specs(abs_train), specs(abs_frozen),
                                 specs(abs_opt_state))

    def jit(fn: Any, out: Any, donate: Tuple[int, ...] = ()) -> Any:
        if mesh is not None:
            return jax.jit(fn, out_shardings=out, donate_argnums=donate)
        return jax.jit(fn, donate_argnums=donate)

    def wrap(fn: Any, name: str, kinds: Any) -> Any:
        if rec is None:
            return fn
        fn = rec.wrap(fn, name, kinds)
        return progress.compiling(fn, name) if args.compile_only else fn

    def init_params(key: jax.Array) -> Any:
        return nnx.split(LM(cfg, nnx.Rngs(key)), wrt, ...)[1]

    def init_frozen(key: jax.Array) -> Any:
        return nnx.split(LM(cfg, nnx.Rngs(key)), wrt, ...)[2]

    host = _host_memory(args, mesh)
    # Offloading of either kind: the pinned_host bytes are reported.
    offload = host is not None or getattr(args, "remat", "none").startswith(
        "offload")

    def to_host(tree: Any) -> Any:
        return jax.device_put(tree, jax.memory.Space.Host) if host else tree

    def opt_init(trainable: Any, frozen: Any) -> Any:
        model = nnx.merge(graphdef, trainable, frozen)
        return to_host(nnx.state(nnx.Optimizer(model, tx, wrt=wrt)))

    def train_step(trainable: Any, opt_state: Any, frozen: Any,
                   batch: jax.Array) -> Any:
        model = nnx.merge(graphdef, trainable, frozen)
        if host:  # in from the host for this step
            opt_state = jax.device_put(opt_state, jax.memory.Space.Device)
        optimizer = nnx.merge(opt_def, opt_state)
        grad_fn = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, wrt))
        loss, grads = grad_fn(model, batch)
        optimizer.update(model, grads)
        return (nnx.state(model, wrt), to_host(nnx.state(optimizer)),
                {"loss": loss, "grad_norm": optax.global_norm(grads)})

    def eval_step(trainable: Any, frozen: Any, batch: jax.Array) -> Any:
        model = nnx.merge(graphdef, trainable, frozen)
        if not args.keep_outputs:
            return loss_fn(model, batch)
        logits = model(batch[:, :-1])
        loss = optax.softmax_cross_entropy_with_integer_labels(
            logits, batch[:, 1:]).mean()
        return loss, logits[:, -1]  # the logits a sampler would draw from

    progress = _Progress(args.steps, 0, setup.is_main and not args.no_progress)
    init_params_fn = wrap(jit(init_params, t_specs), "init", "param")
    init_frozen_fn = wrap(jit(init_frozen, f_specs), "init_frozen", "param")
    opt_init_fn = wrap(jit(opt_init, o_specs), "opt_init", "opt_state")
    step_fn = wrap(jit(train_step, (t_specs, o_specs, P()), (0, 1)),
                   "train_step", ("param", "opt_state", "output"))
    eval_fn = wrap(jit(eval_step, (P(), P()) if args.keep_outputs else P()),
                   "eval_step", "output")

    def target(abs_state: Any, spec_tree: Any) -> Any:
        """Abstract arrays with the shardings a restore should give."""
        def one(x: Any, spec: P) -> Any:
            sharding = (NamedSharding(mesh, spec) if mesh is not None else
                        jax.sharding.SingleDeviceSharding(jax.devices()[0]))
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        return jax.tree.map(one, abs_state, spec_tree)

    # -- state: fresh, restored, or (LoRA) a base model plus new adapters --
    key = jax.random.key(args.seed)
    if setup.base_ckpt is not None:
        frozen = load_base(setup.base_ckpt, setup.base_step,
                            target(abs_frozen, f_specs), rec)
    else:
        frozen = init_frozen_fn(key)
    start = 0
    manager = None
    restore_step = None
    if args.ckpt_dir:
        manager = checkpoints(args.ckpt_dir)
        restore_step = args.resume_step
        if restore_step is None:
            restore_step = manager.latest_step()
        elif restore_step not in manager.all_steps():
            raise SystemExit(
                f"error: --resume-step {restore_step} is not in "
                f"{args.ckpt_dir}: saved steps are "
                f"{sorted(manager.all_steps()) or 'none'}")
    if restore_step is None:
        trainable = init_params_fn(key)
        opt_state = opt_init_fn(trainable, frozen)
    else:
        # Restored straight into place: nothing is initialised first.
        trainable, opt_state = restore(
            manager, restore_step, target(abs_train, t_specs),
            target(abs_opt_state, o_specs), rec)
        opt_state = jax.device_put(opt_state, host) if host else opt_state
        start = restore_step
        if setup.is_main:
            print(f"resumed from step {start} in {args.ckpt_dir}")
    if manager is not None and setup.is_main:
        write_model(args)

    data = corpus(setup.corpus)
    split = int(len(data) * 0.95)
    lens = seq_lens(args)
    train_batches = Batches(data[:split], args.batch, lens, args.seed)
    micro_rows = args.batch // args.grad_accum
    eval_batches = Batches(data[split:], micro_rows, [max(lens)],
                           args.seed + 1)
    if max(lens) + 2 > len(eval_batches.data):
        raise SystemExit("error: the text found is too short for "
                         f"--seq-len {max(lens)}")
    log = open(args.log_json, "a") if args.log_json and setup.is_main \
        else None
    if progress.bar is not None:
        progress.bar.reset(total=args.steps)
        progress.bar.update(start)
    losses: Dict[int, float] = {}
    eval_loss = float("nan")
    tokens_done, t0 = 0, time.perf_counter()
    kept: List[Any] = []  # --keep-outputs: every result, for the whole run
    restored = False
    pinned_peak = 0  # offloading: the most pinned_host bytes live after a step
    step_args: Any = None  # the last step's arguments, for its executable

    def evaluate() -> float:
        values = []
        for i in range(args.eval_batches):
            value = eval_fn(trainable, frozen, put(eval_batches.get(i)))
            if args.keep_outputs:
                kept.append(value)
                value = value[0]
            values.append(_float(value))
            del value
        return float(np.mean(values))

    try:
        if args.eval_every and start < args.steps:
            eval_loss = evaluate()  # the baseline, before any update
            if log is not None:
                log.write(json.dumps({"step": start,
                                      "eval_loss": eval_loss}) + "\n")
        steps = _Steps(start + 1, args.steps)
        for step in steps:
            batch = train_batches.get(step)
            total = 0.0
            for micro in range(args.grad_accum):
                rows = batch[micro * micro_rows:(micro + 1) * micro_rows]
                if offload and not args.compile_only:
                    step_args = jax.ShapeDtypeStruct(rows.shape, rows.dtype)
                trainable, opt_state, metrics = step_fn(
                    trainable, opt_state, frozen, put(rows))
                total += _float(metrics["loss"])
                if args.keep_outputs:
                    kept.append(metrics)
                del metrics
            loss_value = total / args.grad_accum
            losses[step] = loss_value
            tokens_done += batch.shape[0] * (batch.shape[1] - 1)
            record: Dict[str, Any] = {"step": step, "loss": loss_value}
            if offload and not args.compile_only:
                record["pinned_host_bytes"] = pinned = _pinned_host_bytes()
                pinned_peak = max(pinned_peak, pinned)
            if args.eval_every and step % args.eval_every == 0:
                eval_loss = evaluate()
                record["eval_loss"] = eval_loss
            if manager is not None and args.ckpt_every and (
                    step % args.ckpt_every == 0 or step == args.steps):
                save(manager, step, trainable, opt_state)
            if step == args.restore_at and not restored:
                # Read back into new arrays; the live ones go when the
                # names are rebound.
                manager.wait_until_finished()
                back = manager.latest_step()
                trainable, opt_state = restore(
                    manager, back, target(abs_train, t_specs),
                    target(abs_opt_state, o_specs), rec)
                if host:
                    opt_state = jax.device_put(opt_state, host)
                restored = True
                record["restored_from"] = back
                steps.rewind(back + 1)
                if setup.is_main:
                    print(f"step {step}: restored step {back} from "
                          f"{args.ckpt_dir}")
            if args.compile_only:
                text = {"seq": str(batch.shape[1] - 1)}
            else:
                elapsed = max(time.perf_counter() - t0, 1e-9)
                text = {"loss": f"{loss_value:.3f}",
                        "tok/s": f"{tokens_done / elapsed:,.0f}"}
                if "eval_loss" in record:
                    text["eval"] = f"{eval_loss:.3f}"
            progress.update(step, text)
            if log is not None and not args.compile_only:
                log.write(json.dumps(record) + "\n")
                log.flush()
    finally:
        progress.close()
        if log is not None:
            log.close()
        if manager is not None:
            manager.wait_until_finished()
            manager.close()
    if setup.is_main and losses and args.compile_only:
        print(f"compile-only: drove {len(losses)} steps; nothing ran, so "
              "there is no loss")
    elif setup.is_main and losses:
        first, last = losses[min(losses)], losses[max(losses)]
        print(f"loss {first:.4f} -> {last:.4f} over steps "
              f"{min(losses)}..{max(losses)}; {tokens_done} tokens in "
              f"{time.perf_counter() - t0:.1f}s")
    if setup.is_main and host is not None and not args.compile_only:
        kinds = sorted({str(x.sharding.memory_kind)
                        for x in jax.tree.leaves(opt_state)})
        print(f"optimizer state held in {', '.join(kinds)} memory")
    host_step: Dict[str, int] = {}
    if setup.is_main and offload and losses and step_args is not None:
        host_step = _host_memory_of(step_fn, trainable, opt_state, frozen,
                                    step_args)
        print(f"pinned_host: at most {_mib(pinned_peak)} in arrays after a "
              "step; the train step's executable: host arguments "
              f"{_mib(host_step['arguments'])}, outputs "
              f"{_mib(host_step['outputs'])} (aliased "
              f"{_mib(host_step['aliased'])}), temporaries "
              f"{_mib(host_step['temporaries'])}")
        if args.log_json:
            with open(args.log_json, "a") as f:
                f.write(json.dumps({"pinned_host": {
                    "arrays_peak": pinned_peak, "step": host_step}}) + "\n")
    if setup.is_main and args.keep_outputs:
        print(f"kept {len(kept)} outputs on the device to the end")
    return {"losses": losses, "eval_loss": eval_loss,
            "params": cfg.params(), "trainable": trainable,
            "opt_state": opt_state, "frozen": frozen, "kept": kept,
            "pinned_host_peak": pinned_peak, "host_step": host_step}


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _pinned_host_bytes() -> int:
    """The bytes of every live array held in pinned_host memory."""
    return sum(x.nbytes for x in jax.live_arrays()
               if x.sharding.memory_kind == "pinned_host")


def _host_memory_of(step_fn: Any, *args: Any) -> Dict[str, int]:
    """The host memory of the train step's executable for these
    arguments (XLA's memory analysis of what it compiled; the compile is
    the one the steps ran, found in jax's cache): its pinned_host
    arguments, outputs, outputs aliased to arguments, and temporaries
    (the offloaded activations)."""
    stats = step_fn.lower(*args).compile().memory_analysis()
    return {"arguments": int(stats.host_argument_size_in_bytes),
            "outputs": int(stats.host_output_size_in_bytes),
            "aliased": int(stats.host_alias_size_in_bytes),
            "temporaries": int(stats.host_temp_size_in_bytes)}


def _host_memory(args: argparse.Namespace, mesh: Any) -> Any:
    """--offload-opt-state: the pinned host memory of the one device, as
    a sharding (None without the flag); a clear error where there is
    none."""
    if not getattr(args, "offload_opt_state", False):
        return None
    if mesh is not None:
        raise SystemExit("error: --offload-opt-state works on one device "
                         "(train_lm.py), not over a mesh")
    device = jax.devices()[0]
    kinds = sorted(m.kind for m in device.addressable_memories())
    if "pinned_host" not in kinds:
        raise SystemExit(
            f"error: --offload-opt-state: {device.platform} device "
            f"{device.id} has no pinned_host memory (its memories: "
            f"{', '.join(kinds)}), so the optimizer state cannot be held "
            "there: drop the flag")
    return jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")


class _Steps:
    """The step numbers first..last, in order; rewind(n) makes n the next
    one (a restored checkpoint takes the run back)."""

    def __init__(self, first: int, last: int) -> None:
        self.next, self.last = first, last

    def __iter__(self) -> Iterator[int]:
        while self.next <= self.last:
            step = self.next
            self.next += 1
            yield step

    def rewind(self, step: int) -> None:
        self.next = step
