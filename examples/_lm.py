"""The command line and the training loop the examples share.

The model is in _model.py, the text in _data.py. The loop follows Flax's
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
    from flax import nnx, traverse_util  # noqa: E402
    from jax.sharding import NamedSharding  # noqa: E402
    from jax.sharding import PartitionSpec as P  # noqa: E402

from _data import Batches, corpus  # noqa: E402
from _model import (ATTENTION, LAYOUTS, LM, PRESETS,  # noqa: E402
                    REMAT_POLICIES, ModelConfig, loss_fn, state_specs)

#: What the example scripts use.
__all__ = ["ATTENTION", "LAYOUTS", "PRESETS", "Formatter", "Setup",
           "add_args", "check_args", "positive_int", "quiet_cuda_stub",
           "start_backends", "train"]

#: The file in a checkpoint folder that records the model it holds.
MODEL_FILE = "model.json"
DEFAULT_PRESET = "tiny"


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the module docstring's layout in --help."""


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


def add_jaxlake_args(parser: argparse.ArgumentParser
                     ) -> "argparse._ArgumentGroup":
    """The "jaxlake" option group every example has: --jaxlake,
    --jaxlake-option and --trace. Returns the group for more options."""
    r = parser.add_argument_group("jaxlake")
    r.add_argument("--jaxlake", action=argparse.BooleanOptionalAction,
                   default=True,
                   help="serve device memory from the lake, GPU only "
                        "(default: on)")
    r.add_argument("--jaxlake-option", action="append", default=[],
                   metavar="NAME=VALUE",
                   help="option for jaxlake.configure, repeatable; see "
                        "`jaxlake options` (default: none)")
    r.add_argument("--trace", default=None, metavar="OUT",
                   help="record the allocation trace (GPU-faithful, made "
                        "without a GPU) to OUT, .jsonl or .jsonl.gz "
                        "(default: none)")
    return r


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options every example shares. Every help says its default."""
    m = parser.add_argument_group("model")
    m.add_argument("--preset", default=None, choices=list(PRESETS),
                   help="model size (default: the checkpoint's when "
                        f"resuming or fine-tuning, else {DEFAULT_PRESET})")
    m.add_argument("--scan-layers", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="run the blocks as one nnx.scan over stacked "
                        "layers, or unrolled (default: the checkpoint's, "
                        "else scanned)")
    m.add_argument("--remat", default="none", choices=list(REMAT_POLICIES),
                   help="nnx.remat policy of each block (default: none)")
    m.add_argument("--attention", default="auto", choices=list(ATTENTION),
                   help="jax.nn.dot_product_attention implementation "
                        "(default: auto: cudnn on a GPU, xla elsewhere)")
    m.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="compute dtype; parameters stay float32 (default: "
                        "bfloat16 on a GPU or when recording a --trace, "
                        "float32 elsewhere)")
    t = parser.add_argument_group("training")
    t.add_argument("--steps", type=positive_int, default=20,
                   help="optimizer steps to train to (default: 20)")
    t.add_argument("--batch", type=positive_int, default=None,
                   help="sequences per optimizer step (default: preset's)")
    t.add_argument("--seq-len", type=positive_int, default=None,
                   help="sequence length (default: preset's)")
    t.add_argument("--seq-buckets", type=int_list, default=None,
                   metavar="L1,L2,...",
                   help="draw each step's sequence length from these "
                        "(default: --seq-len only)")
    t.add_argument("--grad-accum", type=positive_int, default=1,
                   help="micro-batches per optimizer step, accumulated by "
                        "optax.MultiSteps (default: 1)")
    t.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: preset's)")
    t.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps (default: a tenth of --steps)")
    t.add_argument("--clip", type=float, default=1.0,
                   help="gradient clipping by global norm (default: 1.0)")
    t.add_argument("--weight-decay", type=float, default=0.1,
                   help="adamw weight decay (default: 0.1)")
    t.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N steps (default: 0, never)")
    t.add_argument("--eval-batches", type=positive_int, default=2,
                   help="batches per evaluation (default: 2)")
    t.add_argument("--offload-opt-state", action="store_true",
                   help="hold the optimizer state in the host's pinned "
                        "memory (memory kind pinned_host) between steps; "
                        "each step moves it to the device and back; one "
                        "device only (default: off, on the device)")
    t.add_argument("--keep-outputs", action="store_true",
                   help="keep every step's metrics and every evaluation's "
                        "last-position logits on the device for the whole "
                        "run, as a program that collects its results in a "
                        "list does (default: off, each is dropped once "
                        "read)")
    t.add_argument("--seed", type=int, default=0,
                   help="seed of the initial weights and of the batches "
                        "(default: 0)")
    c = parser.add_argument_group("checkpoints")
    c.add_argument("--ckpt-dir", default=None,
                   help="orbax checkpoint folder; a run resumes from it "
                        "(default: none, no checkpoints)")
    c.add_argument("--ckpt-every", type=int, default=0,
                   help="save every N steps and at the end (default: 0, "
                        "never)")
    c.add_argument("--resume-step", type=int, default=None,
                   help="resume from this saved step (default: the latest)")
    c.add_argument("--restore-at", type=positive_int, default=None,
                   metavar="STEP",
                   help="after STEP, once, restore the latest checkpoint "
                        "saved and train on from it, as a run that rolls "
                        "back does (default: never)")
    r = add_jaxlake_args(parser)
    r.add_argument("--trace-per-tensor", action="store_true",
                   help="record every XLA logical buffer as its own "
                        "allocation, an eager-like trace (default: off)")
    r.add_argument("--compile-only", action="store_true",
                   help="with --trace: compile for the GPU, run nothing, "
                        "for models too big for the CPU (default: off)")
    r.add_argument("--trace-name", default=None,
                   help="the trace's name (default: from the options)")
    o = parser.add_argument_group("output")
    o.add_argument("--log-json", default=None, metavar="PATH",
                   help="append one JSON line per step (loss, eval loss) "
                        "and a memory summary (default: none)")
    o.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: a bar on stderr)")


def _writable(parser: argparse.ArgumentParser, flag: str, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        parser.error(f"{flag} {path}: the folder {folder} does not exist: "
                     "create it or give a path in an existing folder")
    if not os.access(folder, os.W_OK):
        parser.error(f"{flag} {path}: the folder {folder} is not writable")


def saved_model(folder: Optional[str]) -> Dict[str, Any]:
    """The model a checkpoint folder records ({} when it records none)."""
    if not folder:
        return {}
    path = os.path.join(folder, MODEL_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return dict(json.load(f))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: cannot read {path}: {e}") from None


def resolve_model(parser: argparse.ArgumentParser, args: argparse.Namespace,
                  folder: Optional[str], flag: str) -> None:
    """--preset and --scan-layers: given, else the checkpoint's, else the
    defaults; a given value that contradicts the checkpoint is refused."""
    saved = saved_model(folder)
    for name, option, default in (("preset", "--preset", DEFAULT_PRESET),
                                  ("scan_layers", "--scan-layers", True)):
        given, stored = getattr(args, name), saved.get(name)
        if given is not None and stored is not None and given != stored:
            shown = (lambda v: v) if name == "preset" else (
                lambda v: "on" if v else "off")
            parser.error(f"{option} {shown(given)} does not match the "
                         f"checkpoint in {folder}, which holds "
                         f"{name.replace('_', ' ')} {shown(stored)}: drop "
                         f"{option} (it is read from the checkpoint)")
        if given is None:
            setattr(args, name, stored if stored is not None else default)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
               model_from: Optional[str] = None) -> None:
    """Checks that need no devices; errors name the value and what works.
    `model_from`: a base checkpoint whose model a fine-tune adopts."""
    if args.resume_step is not None and not args.ckpt_dir:
        parser.error("--resume-step needs --ckpt-dir")
    resolve_model(parser, args, model_from or args.ckpt_dir,
                  "--base-ckpt" if model_from else "--ckpt-dir")
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
    if args.restore_at is not None:
        if not args.ckpt_dir or not args.ckpt_every:
            parser.error("--restore-at restores a checkpoint saved earlier "
                         "in the run: it needs --ckpt-dir and --ckpt-every")
        if args.ckpt_every > args.restore_at:
            parser.error(f"--restore-at {args.restore_at} comes before the "
                         f"first save (--ckpt-every {args.ckpt_every}): use "
                         f"a --restore-at of {args.ckpt_every} or more")
        if args.restore_at >= args.steps:
            parser.error(f"--restore-at {args.restore_at} is not before the "
                         f"last step ({args.steps}): give a step between "
                         f"{args.ckpt_every} and {args.steps - 1}")
    if getattr(args, "offload_opt_state", False) and args.trace:
        parser.error("--offload-opt-state cannot be recorded with --trace: "
                     "the recorder's device-less compile places every "
                     "array on the device; record the device's allocations "
                     "with `jaxlake run --fake-gpu --trace OUT -- python "
                     "examples/train_lm.py --offload-opt-state` instead")
    if args.compile_only and args.ckpt_dir:
        parser.error("--compile-only runs nothing, so it has nothing to "
                     "checkpoint: drop --ckpt-dir")
    if args.trace:
        _writable(parser, "--trace", args.trace)
        if args.attention == "cudnn" and not on_gpu():
            parser.error("--attention cudnn cannot be recorded without a "
                         "GPU: XLA needs the cuDNN library to compile it, "
                         "and the recorder compiles device-less; use "
                         "--attention xla (what auto picks here)")
    if args.log_json:
        _writable(parser, "--log-json", args.log_json)


def seq_lens(args: argparse.Namespace) -> List[int]:
    return list(args.seq_buckets) if args.seq_buckets else [args.seq_len]


def on_gpu() -> bool:
    """Whether jax will run on a GPU, told without starting it (a
    per-tensor trace must set XLA's flags before jax starts)."""
    platforms = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip()
    if platforms:
        return platforms in ("cuda", "gpu", "rocm")
    return os.path.exists("/dev/nvidiactl")


def model_config(args: argparse.Namespace, shard: bool = False,
                 lora_rank: int = 0, lora_alpha: float = 16.0
                 ) -> ModelConfig:
    """The model of the options; --dtype and --attention resolved against
    the backend jax runs on. A recorded trace (--trace) is a GPU's: its
    step is compiled for an H100 wherever it runs, so the dtype is the
    GPU's (bfloat16) there too. Attention stays xla without a GPU, as
    compiling cuDNN's needs the cuDNN library."""
    p = PRESETS[args.preset]
    gpu = on_gpu()
    recording = bool(getattr(args, "trace", None))
    dtype = args.dtype or ("bfloat16" if gpu or recording else "float32")
    attention = args.attention
    if attention == "auto":
        attention = "cudnn" if gpu else "xla"
    return ModelConfig(d_model=p.d_model, layers=p.layers, heads=p.heads,
                       d_ff=p.d_ff, max_len=max(seq_lens(args)),
                       remat=args.remat, dtype=dtype, attention=attention,
                       scan_layers=args.scan_layers, shard=shard,
                       lora_rank=lora_rank, lora_alpha=lora_alpha)


def trace_name(args: argparse.Namespace, *extra: str) -> str:
    parts = ["lm", args.preset]
    if not args.scan_layers:
        parts.append("unrolled")
    if args.remat != "none":
        parts.append("remat-" + args.remat)
    if args.grad_accum > 1:
        parts.append(f"accum{args.grad_accum}")
    if args.seq_buckets:
        parts.append("buckets")
    if args.eval_every:
        parts.append("eval")
    if getattr(args, "keep_outputs", False):
        parts.append("keep")
    if getattr(args, "restore_at", None):
        parts.append("restore")
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
        frozen = _load_base(setup.base_ckpt, setup.base_step,
                            target(abs_frozen, f_specs), rec)
    else:
        frozen = init_frozen_fn(key)
    start = 0
    manager = None
    restore_step = None
    if args.ckpt_dir:
        manager = _checkpoints(args.ckpt_dir)
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
        trainable, opt_state = _restore(
            manager, restore_step, target(abs_train, t_specs),
            target(abs_opt_state, o_specs), rec)
        opt_state = jax.device_put(opt_state, host) if host else opt_state
        start = restore_step
        if setup.is_main:
            print(f"resumed from step {start} in {args.ckpt_dir}")
    if manager is not None and setup.is_main:
        _write_model(args)

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
            if args.eval_every and step % args.eval_every == 0:
                eval_loss = evaluate()
                record["eval_loss"] = eval_loss
            if manager is not None and args.ckpt_every and (
                    step % args.ckpt_every == 0 or step == args.steps):
                _save(manager, step, trainable, opt_state)
            if step == args.restore_at and not restored:
                # Read back into new arrays; the live ones go when the
                # names are rebound.
                manager.wait_until_finished()
                back = manager.latest_step()
                trainable, opt_state = _restore(
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
    if setup.is_main and args.keep_outputs:
        print(f"kept {len(kept)} outputs on the device to the end")
    return {"losses": losses, "eval_loss": eval_loss,
            "params": cfg.params(), "trainable": trainable,
            "opt_state": opt_state, "frozen": frozen, "kept": kept}


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


# -- checkpoints (orbax) -----------------------------------------------------


def _checkpoints(folder: str) -> Any:
    import orbax.checkpoint as ocp
    options = ocp.CheckpointManagerOptions(max_to_keep=3, create=True)
    return ocp.CheckpointManager(os.path.abspath(folder), options=options)


def _write_model(args: argparse.Namespace) -> None:
    """Records the model in the checkpoint folder, so that a resume or a
    fine-tune need not repeat --preset and --scan-layers."""
    with open(os.path.join(args.ckpt_dir, MODEL_FILE), "w",
              encoding="utf-8") as f:
        json.dump({"preset": args.preset, "scan_layers": args.scan_layers},
                  f)
        f.write("\n")


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


def _load_base(folder: str, step: Optional[int], target: Any, rec: Any
               ) -> Any:
    """LoRA's frozen weights: the parameters of a train_lm.py checkpoint,
    placed with the shardings of `target` (abstract arrays)."""
    import orbax.checkpoint as ocp
    manager = ocp.CheckpointManager(os.path.abspath(folder))
    step = manager.latest_step() if step is None else step
    if step is None:
        raise SystemExit(f"error: no checkpoint in {folder}: train one with "
                         "examples/train_lm.py --ckpt-dir DIR --ckpt-every N")
    state = manager.restore(step, args=ocp.args.StandardRestore())
    manager.close()
    sep = "/"
    base = traverse_util.flatten_dict(state["params"], sep=sep)
    base = {k.removesuffix(sep + "value"): v for k, v in base.items()}
    wanted = traverse_util.flatten_dict(nnx.to_pure_dict(target))
    missing = [k for k in wanted if sep.join(map(str, k)) not in base]
    if missing:
        names = [sep.join(map(str, k)) for k in missing[:3]]
        raise SystemExit(
            f"error: the base checkpoint in {folder} does not match this "
            f"model: it lacks {names}{' ...' if len(missing) > 3 else ''}")
    values = {}
    for k, abstract in wanted.items():
        value = np.asarray(base[sep.join(map(str, k))])
        if value.shape != tuple(abstract.shape):
            raise SystemExit(
                f"error: base parameter {sep.join(map(str, k))} has shape "
                f"{value.shape}, this model wants {tuple(abstract.shape)}")
        if rec is not None:
            values[k] = rec.device_put(value, abstract.sharding, kind="param")
        else:
            values[k] = jax.make_array_from_callback(
                value.shape, abstract.sharding,
                lambda index, value=value: value[index])
    frozen = jax.tree.map(lambda x: x, target)  # a copy to fill in
    nnx.replace_by_pure_dict(frozen, traverse_util.unflatten_dict(values))
    return frozen
