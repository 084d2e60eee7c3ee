"""The command line and the training loop the examples share.

The model is in _model.py, the text in _data.py. optax adamw with warm-up
plus cosine decay and gradient clipping, gradient accumulation, sequence
buckets, interleaved evaluation, orbax checkpoints, and the trace recorder
(jaxlake/_src/trace/recorder.py) behind --trace.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Optional, Tuple

# Without a GPU, stop jax from trying (and loudly failing) to load CUDA.
if "JAX_PLATFORMS" not in os.environ and not os.path.exists("/dev/nvidiactl"):
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from _data import Batches, corpus  # noqa: E402
from _model import (LAYOUTS, LM, PRESETS, REMAT_POLICIES,  # noqa: E402
                    ModelConfig, flatten, is_lora, loss_fn, param_spec)

#: What the example scripts use.
__all__ = ["LAYOUTS", "PRESETS", "Setup", "add_args", "check_args",
           "load_params", "positive_int", "train"]


# -- command line ------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return value


def int_list(text: str) -> List[int]:
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of lengths, "
            "e.g. 64,128,256") from None
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give lengths of 2 or more, e.g. 64,128,256")
    return values


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options every example shares."""
    m = parser.add_argument_group("model")
    m.add_argument("--preset", default="tiny", choices=list(PRESETS),
                   help="model size (default: tiny, for CPU tests)")
    m.add_argument("--remat", default="none", choices=list(REMAT_POLICIES),
                   help="rematerialisation policy of each block")
    m.add_argument("--dtype", default="float32",
                   choices=["float32", "bfloat16"],
                   help="compute dtype (parameters stay float32)")
    t = parser.add_argument_group("training")
    t.add_argument("--steps", type=positive_int, default=20)
    t.add_argument("--batch", type=positive_int, default=None,
                   help="sequences per optimizer step (default: preset's)")
    t.add_argument("--seq-len", type=positive_int, default=None,
                   help="sequence length (default: preset's)")
    t.add_argument("--seq-buckets", type=int_list, default=None,
                   metavar="L1,L2,...",
                   help="draw each step's sequence length from these")
    t.add_argument("--grad-accum", type=positive_int, default=1,
                   help="micro-batches per optimizer step")
    t.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: preset's)")
    t.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps (default: a tenth of --steps)")
    t.add_argument("--clip", type=float, default=1.0,
                   help="gradient clipping by global norm")
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N steps (0: never)")
    t.add_argument("--eval-batches", type=positive_int, default=2)
    t.add_argument("--seed", type=int, default=0)
    c = parser.add_argument_group("checkpoints")
    c.add_argument("--ckpt-dir", default=None,
                   help="orbax checkpoint folder; a run resumes from it")
    c.add_argument("--ckpt-every", type=int, default=0,
                   help="save every N steps (and at the end)")
    c.add_argument("--resume-step", type=int, default=None,
                   help="resume from this saved step (default: the latest)")
    r = parser.add_argument_group("jaxlake")
    r.add_argument("--jaxlake", action=argparse.BooleanOptionalAction,
                   default=True,
                   help="serve device memory from the lake (GPU only)")
    r.add_argument("--jaxlake-option", action="append", default=[],
                   metavar="NAME=VALUE",
                   help="option for jaxlake.configure (repeatable)")
    r.add_argument("--trace", default=None, metavar="OUT",
                   help="record the allocation trace (GPU-faithful, made "
                        "without a GPU) to OUT (.jsonl or .jsonl.gz)")
    r.add_argument("--trace-per-tensor", action="store_true",
                   help="record every XLA logical buffer as its own "
                        "allocation (an eager-like trace)")
    r.add_argument("--compile-only", action="store_true",
                   help="with --trace: compile for the GPU, run nothing "
                        "(for models too big for the CPU)")
    r.add_argument("--trace-name", default=None,
                   help="the trace's name (default: from the options)")
    o = parser.add_argument_group("output")
    o.add_argument("--log-json", default=None, metavar="PATH",
                   help="write one JSON line per step (loss, eval loss)")
    o.add_argument("--no-progress", action="store_true",
                   help="no progress bar")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace
               ) -> None:
    """Checks that need no devices; errors name the value and what works."""
    preset = PRESETS[args.preset]
    args.batch = args.batch or preset.batch
    args.seq_len = args.seq_len or preset.seq_len
    args.lr = args.lr if args.lr is not None else preset.lr
    if args.warmup is None:
        args.warmup = max(1, args.steps // 10)
    if args.batch % args.grad_accum:
        divisors = [d for d in range(1, args.batch + 1) if args.batch % d == 0]
        parser.error(f"--batch {args.batch} does not split into "
                     f"--grad-accum {args.grad_accum} micro-batches: use a "
                     f"--grad-accum that divides it ({divisors}) or a "
                     f"multiple of {args.grad_accum} as --batch")
    if args.compile_only and not args.trace:
        parser.error("--compile-only records a trace without running: it "
                     "needs --trace OUT")
    if args.trace_per_tensor and not args.trace:
        parser.error("--trace-per-tensor needs --trace OUT")
    if args.resume_step is not None and not args.ckpt_dir:
        parser.error("--resume-step needs --ckpt-dir")
    if args.compile_only and args.ckpt_dir:
        parser.error("--compile-only runs nothing, so it has nothing to "
                     "checkpoint: drop --ckpt-dir")


def seq_lens(args: argparse.Namespace) -> List[int]:
    return list(args.seq_buckets) if args.seq_buckets else [args.seq_len]


def model_config(args: argparse.Namespace, shard: bool = False,
                 lora_rank: int = 0, lora_alpha: float = 16.0
                 ) -> ModelConfig:
    p = PRESETS[args.preset]
    return ModelConfig(d_model=p.d_model, layers=p.layers, heads=p.heads,
                       d_ff=p.d_ff, max_len=max(seq_lens(args)),
                       remat=args.remat, dtype=args.dtype, shard=shard,
                       lora_rank=lora_rank, lora_alpha=lora_alpha)


def trace_name(args: argparse.Namespace, *extra: str) -> str:
    parts = ["lm", args.preset]
    if args.remat != "none":
        parts.append("remat-" + args.remat)
    if args.grad_accum > 1:
        parts.append(f"accum{args.grad_accum}")
    if args.seq_buckets:
        parts.append("buckets")
    if args.eval_every:
        parts.append("eval")
    parts.extend(extra)
    if args.trace_per_tensor:
        parts.append("per-tensor")
    return args.trace_name or "-".join(parts)


# -- training ----------------------------------------------------------------


@dataclasses.dataclass
class Setup:
    """What a run needs beyond the options."""

    mesh: Any = None                  # jax.sharding.Mesh, or None
    layout: str = "data"
    is_main: bool = True              # prints, writes the trace
    lora_rank: int = 0
    lora_alpha: float = 16.0
    base_params: Optional[Dict[str, Any]] = None   # numpy, LoRA's base
    corpus: str = "source"
    trace_extra: Tuple[str, ...] = ()
    meta: Dict[str, Any] = dataclasses.field(default_factory=dict)


def make_optimizer(args: argparse.Namespace) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=args.lr, warmup_steps=args.warmup,
        decay_steps=max(args.steps, args.warmup + 1), end_value=args.lr / 10)
    return optax.chain(optax.clip_by_global_norm(args.clip),
                       optax.adamw(schedule, b1=0.9, b2=0.95,
                                   weight_decay=args.weight_decay))


def _float(x: Any) -> float:
    if isinstance(x, jax.Array):
        return float(jax.device_get(x))
    return float("nan")  # compile-only placeholders carry no value


class _Progress:
    """A tqdm bar with loss and tokens/s; plain lines when tqdm is absent."""

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

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(args: argparse.Namespace, setup: Setup) -> Dict[str, Any]:
    """Trains (or fine-tunes) and returns a summary: losses per step, the
    last eval loss, the trace written."""
    mesh = setup.mesh
    cfg = model_config(args, shard=mesh is not None, lora_rank=setup.lora_rank,
                       lora_alpha=setup.lora_alpha)
    model = LM(cfg)
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
        from jaxlake._src.trace.recorder import Recorder
        meta = {"example": os.path.basename(sys.argv[0]), "preset":
                args.preset, "params": cfg.params(), "remat": args.remat,
                "dtype": args.dtype, "batch": args.batch, "seq_lens":
                seq_lens(args), "grad_accum": args.grad_accum, "eval_every":
                args.eval_every, "steps": args.steps}
        meta.update(setup.meta)
        rec = Recorder(args.trace, trace_name(args, *setup.trace_extra),
                       mesh=mesh, compile_only=args.compile_only,
                       per_tensor=args.trace_per_tensor, meta=meta)

    def wrap(fn: Any, name: str, kinds: Any) -> Any:
        return rec.wrap(fn, name, kinds) if rec is not None else fn

    batch_spec = P("data", None) if mesh is not None else None

    def put(batch: np.ndarray) -> Any:
        if rec is not None:
            return rec.device_put(batch, batch_spec)
        if mesh is None:
            return jax.device_put(batch)
        sharding = jax.sharding.NamedSharding(mesh, batch_spec)
        return jax.make_array_from_callback(batch.shape, sharding,
                                            lambda index: batch[index])

    ctx = jax.set_mesh(mesh) if mesh is not None else nullcontext()
    with ctx:
        summary = _train(args, setup, model, cfg, mesh_shape, rec, wrap, put)
    if rec is not None:
        summary["trace"] = rec.summary()
        rec.close()
    return summary


def _train(args: argparse.Namespace, setup: Setup, model: LM,
           cfg: ModelConfig, mesh_shape: Dict[str, int], rec: Any,
           wrap: Callable[..., Any], put: Callable[[np.ndarray], Any]
           ) -> Dict[str, Any]:
    mesh = setup.mesh
    lora = cfg.lora_rank > 0
    sharded = mesh is not None

    def init(rng: jax.Array) -> Dict[str, Any]:
        tokens = jnp.zeros((1, cfg.max_len), jnp.int32)
        return flatten(model.init(rng, tokens)["params"])

    shapes = jax.eval_shape(init, jax.random.PRNGKey(0))
    specs = {k: param_spec(k, v.shape, setup.layout, mesh_shape)
             for k, v in shapes.items()}
    train_names = sorted(k for k in shapes if is_lora(k) == lora)
    frozen_names = sorted(k for k in shapes if k not in train_names)
    t_specs = {k: specs[k] for k in train_names}
    f_specs = {k: specs[k] for k in frozen_names}

    def pick(tree: Dict[str, Any], names: List[str]) -> Dict[str, Any]:
        return {k: tree[k] for k in names}

    def jit(fn: Any, out: Any = None, donate: Tuple[int, ...] = ()) -> Any:
        if sharded and out is not None:
            return jax.jit(fn, out_shardings=out, donate_argnums=donate)
        return jax.jit(fn, donate_argnums=donate)

    init_train = wrap(jit(lambda r: pick(init(r), train_names), t_specs),
                      "init", "param")
    init_frozen = wrap(jit(lambda r: pick(init(r), frozen_names), f_specs),
                       "init_frozen", "param")

    tx = make_optimizer(args)
    opt_shapes = jax.eval_shape(tx.init, pick(shapes, train_names))
    opt_specs = optax.tree_map_params(
        tx, lambda _, spec: spec, opt_shapes, t_specs,
        transform_non_params=lambda _: P(),
        is_leaf=lambda x: isinstance(x, P))
    opt_init = wrap(jit(tx.init, opt_specs), "opt_init", "opt_state")

    def full(trainable: Dict[str, Any], frozen: Dict[str, Any]
             ) -> Dict[str, Any]:
        return {**frozen, **trainable}

    def loss(trainable: Any, frozen: Any, batch: jax.Array) -> jax.Array:
        return loss_fn(model, full(trainable, frozen), batch)

    def train_step(trainable: Any, opt_state: Any, frozen: Any,
                   batch: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss)(trainable, frozen, batch)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), opt_state,
                {"loss": value, "grad_norm": optax.global_norm(grads)})

    def grad_step(trainable: Any, frozen: Any, batch: jax.Array) -> Any:
        return jax.value_and_grad(loss)(trainable, frozen, batch)[::-1]

    def accum_step(acc: Any, trainable: Any, frozen: Any, batch: jax.Array
                   ) -> Any:
        grads, value = grad_step(trainable, frozen, batch)
        return jax.tree.map(jnp.add, acc, grads), value

    def apply_step(trainable: Any, opt_state: Any, acc: Any) -> Any:
        grads = jax.tree.map(lambda g: g / args.grad_accum, acc)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), opt_state,
                optax.global_norm(grads))

    def eval_step(trainable: Any, frozen: Any, batch: jax.Array) -> Any:
        return loss(trainable, frozen, batch)

    step_fn = wrap(jit(train_step, (t_specs, opt_specs, P()), (0, 1)),
                   "train_step", ("param", "opt_state", "output"))
    grad_fn = wrap(jit(grad_step, (t_specs, P())), "grad_step",
                   ("grad", "output"))
    accum_fn = wrap(jit(accum_step, (t_specs, P()), (0,)), "accum_step",
                    ("grad", "output"))
    apply_fn = wrap(jit(apply_step, (t_specs, opt_specs, P()), (0, 1, 2)),
                    "apply_step", ("param", "opt_state", "output"))
    eval_fn = wrap(jit(eval_step, P()), "eval_step", "output")

    # -- state: fresh, restored, or (LoRA) a base model plus new adapters --
    key = jax.random.PRNGKey(args.seed)
    if setup.base_params is not None:
        frozen = _load_base(pick(shapes, frozen_names), setup.base_params,
                            mesh, f_specs, rec)
    else:
        frozen = init_frozen(key)
    start = 0
    manager = None
    restore_step = None
    if args.ckpt_dir:
        manager = _checkpoints(args.ckpt_dir, args.ckpt_every)
        restore_step = args.resume_step
        if restore_step is None:
            restore_step = manager.latest_step()
        elif restore_step not in manager.all_steps():
            raise SystemExit(
                f"error: --resume-step {restore_step} is not in "
                f"{args.ckpt_dir}: saved steps are "
                f"{sorted(manager.all_steps()) or 'none'}")
    if restore_step is None:
        trainable = init_train(key)
        opt_state = opt_init(trainable)
    else:
        # Restored straight into place: nothing is initialised first.
        def target(shapes_tree: Any, specs_tree: Any) -> Any:
            def one(spec: Any, s: Any) -> Any:
                sharding = (jax.sharding.NamedSharding(mesh, spec)
                            if mesh is not None else
                            jax.sharding.SingleDeviceSharding(
                                jax.devices()[0]))
                return jax.ShapeDtypeStruct(s.shape, s.dtype,
                                            sharding=sharding)
            return jax.tree.map(one, specs_tree, shapes_tree,
                                is_leaf=lambda x: isinstance(x, P))
        trainable, opt_state = _restore(
            manager, restore_step, target(pick(shapes, train_names), t_specs),
            target(opt_shapes, opt_specs), rec)
        start = restore_step
        if setup.is_main:
            print(f"resumed from step {start} in {args.ckpt_dir}")

    data = corpus(setup.corpus)
    split = int(len(data) * 0.95)
    lens = seq_lens(args)
    train_batches = Batches(data[:split], args.batch, lens, args.seed)
    eval_batches = Batches(data[split:], args.batch // args.grad_accum,
                           [max(lens)], args.seed + 1)
    if max(lens) + 2 > len(eval_batches.data):
        raise SystemExit("error: the text found is too short for "
                         f"--seq-len {max(lens)}")
    micro_rows = args.batch // args.grad_accum
    log = open(args.log_json, "a") if args.log_json and setup.is_main \
        else None
    progress = _Progress(args.steps, start,
                         setup.is_main and not args.no_progress)
    losses: Dict[int, float] = {}
    eval_loss = float("nan")
    tokens_done, t0 = 0, time.perf_counter()

    def evaluate() -> float:
        values = []
        for i in range(args.eval_batches):
            value = eval_fn(trainable, frozen, put(eval_batches.get(i)))
            values.append(_float(value))
            del value
        return float(np.mean(values))

    try:
        if args.eval_every and start < args.steps:
            eval_loss = evaluate()  # the baseline, before any update
            if log is not None:
                log.write(json.dumps({"step": start,
                                      "eval_loss": eval_loss}) + "\n")
        for step in range(start + 1, args.steps + 1):
            batch = train_batches.get(step)
            if args.grad_accum == 1:
                trainable, opt_state, metrics = step_fn(
                    trainable, opt_state, frozen, put(batch))
                loss_value = _float(metrics["loss"])
                del metrics
            else:
                acc = None
                total = 0.0
                for micro in range(args.grad_accum):
                    rows = batch[micro * micro_rows:(micro + 1) * micro_rows]
                    if acc is None:
                        acc, value = grad_fn(trainable, frozen, put(rows))
                    else:
                        acc, value = accum_fn(acc, trainable, frozen,
                                              put(rows))
                    total += _float(value)
                    del value
                trainable, opt_state, _ = apply_fn(trainable, opt_state, acc)
                del acc, _
                loss_value = total / args.grad_accum
            losses[step] = loss_value
            tokens_done += batch.shape[0] * (batch.shape[1] - 1)
            record: Dict[str, Any] = {"step": step, "loss": loss_value}
            if args.eval_every and step % args.eval_every == 0:
                eval_loss = evaluate()
                record["eval_loss"] = eval_loss
            if manager is not None and args.ckpt_every and (
                    step % args.ckpt_every == 0 or step == args.steps):
                _save(manager, step, trainable, opt_state)
            elapsed = max(time.perf_counter() - t0, 1e-9)
            text = {"loss": "n/a" if args.compile_only
                    else f"{loss_value:.3f}",
                    "tok/s": f"{tokens_done / elapsed:,.0f}"}
            if "eval_loss" in record:
                text["eval"] = f"{eval_loss:.3f}"
            progress.update(step, text)
            if log is not None:
                log.write(json.dumps(record) + "\n")
                log.flush()
    finally:
        progress.close()
        if log is not None:
            log.close()
        if manager is not None:
            manager.wait_until_finished()
            manager.close()
    if setup.is_main and losses and not args.compile_only:
        first, last = losses[min(losses)], losses[max(losses)]
        print(f"loss {first:.4f} -> {last:.4f} over steps "
              f"{min(losses)}..{max(losses)}; {tokens_done} tokens in "
              f"{time.perf_counter() - t0:.1f}s")
    return {"losses": losses, "eval_loss": eval_loss,
            "params": cfg.params(), "trainable": trainable}


# -- checkpoints (orbax) -----------------------------------------------------


def _checkpoints(folder: str, every: int) -> Any:
    import orbax.checkpoint as ocp
    options = ocp.CheckpointManagerOptions(max_to_keep=3, create=True)
    return ocp.CheckpointManager(os.path.abspath(folder), options=options)


def _save(manager: Any, step: int, trainable: Any, opt_state: Any) -> None:
    import orbax.checkpoint as ocp
    manager.save(step, args=ocp.args.StandardSave(
        {"params": trainable, "opt_state": opt_state}))


def _restore(manager: Any, step: int, params: Any, opt_state: Any,
             rec: Any) -> Tuple[Any, Any]:
    """Restores a step into arrays of the given shapes and shardings."""
    import orbax.checkpoint as ocp
    target = {"params": params, "opt_state": opt_state}
    state = manager.restore(step, args=ocp.args.StandardRestore(target))
    if rec is not None:
        rec.register(state["params"], "param")
        rec.register(state["opt_state"], "opt_state")
    return state["params"], state["opt_state"]


def _load_base(frozen: Dict[str, Any], base: Dict[str, Any], mesh: Any,
               specs: Dict[str, Any], rec: Any) -> Dict[str, Any]:
    """LoRA's frozen weights from a pre-trained parameter dict."""
    missing = sorted(set(frozen) - set(base))
    if missing:
        raise SystemExit(
            "error: the base checkpoint does not match this preset: it lacks "
            f"{missing[:3]}{' ...' if len(missing) > 3 else ''}; give the "
            "--preset the base model was trained with")
    out = {}
    for k, v in frozen.items():
        value = np.asarray(base[k])
        if value.shape != tuple(v.shape):
            raise SystemExit(
                f"error: base parameter {k} has shape {value.shape}, this "
                f"preset wants {tuple(v.shape)}: give the --preset the base "
                "model was trained with")
        if rec is not None:
            out[k] = rec.device_put(value, specs[k] if mesh is not None
                                    else None, kind="param")
        elif mesh is not None:
            sharding = jax.sharding.NamedSharding(mesh, specs[k])
            out[k] = jax.make_array_from_callback(
                value.shape, sharding, lambda index, value=value: value[index])
        else:
            out[k] = jax.device_put(value)
    return out


def load_params(folder: str, step: Optional[int] = None) -> Dict[str, Any]:
    """The parameters of a train_lm.py checkpoint, as numpy arrays."""
    import orbax.checkpoint as ocp
    manager = ocp.CheckpointManager(os.path.abspath(folder))
    step = manager.latest_step() if step is None else step
    if step is None:
        raise SystemExit(f"error: no checkpoint in {folder}: train one with "
                         "examples/train_lm.py --ckpt-dir DIR --ckpt-every N")
    state = manager.restore(step, args=ocp.args.StandardRestore())
    manager.close()
    params = state["params"] if "params" in state else state
    return {k: np.asarray(v) for k, v in flatten(params).items()}
