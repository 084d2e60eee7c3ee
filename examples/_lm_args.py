"""The command line the LM examples share: the model, training and jaxlake
options (add_args), their checks (check_args), and what follows from them
(the model's configuration, the trace's name). Standard library and the
model's tables only: parsing starts no jax backend."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, List, Optional

from _model import ATTENTION, PRESETS, REMAT_POLICIES, ModelConfig

#: The file in a checkpoint folder that records the model it holds.
MODEL_FILE = "model.json"
DEFAULT_PRESET = "tiny"


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the module docstring's layout in --help."""



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


def writable(parser: argparse.ArgumentParser, flag: str, path: str) -> None:
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
        writable(parser, "--trace", args.trace)
        if args.attention == "cudnn" and not on_gpu():
            parser.error("--attention cudnn cannot be recorded without a "
                         "GPU: XLA needs the cuDNN library to compile it, "
                         "and the recorder compiles device-less; use "
                         "--attention xla (what auto picks here)")
    if args.log_json:
        writable(parser, "--log-json", args.log_json)


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
