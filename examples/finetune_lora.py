"""LoRA fine-tuning of the train_lm.py model: the base weights stay frozen,
low-rank adapters (nnx.LoRALinear) on every projection (q, k, v, out, up,
down) are trained: the nnx.Optimizer and the gradients cover nnx.LoRAParam
only.

    python examples/train_lm.py --preset tiny --steps 50 \\
        --ckpt-dir /tmp/base --ckpt-every 50
    python examples/finetune_lora.py --base-ckpt /tmp/base --rank 8 --steps 30

The model (preset, scanned or unrolled layers) is the base checkpoint's.

The base model learns from the standard library's source; fine-tuning
adapts it to the standard library's docstrings (prose rather than code).
Only the adapters get gradients and optimizer state, which is what makes
LoRA cheap in memory: --trace shows it.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402


def parser() -> argparse.ArgumentParser:
    import _lm
    p = argparse.ArgumentParser(
        prog="finetune_lora.py", description=__doc__,
        formatter_class=_lm.Formatter)
    g = p.add_argument_group("LoRA")
    g.add_argument("--base-ckpt", default=None, metavar="DIR",
                   help="train_lm.py checkpoint folder of the base model "
                        "(default: a randomly initialised base)")
    g.add_argument("--base-step", type=int, default=None,
                   help="which saved step of the base (default: latest)")
    g.add_argument("--rank", type=_lm.positive_int, default=8,
                   help="rank of the adapters (default: 8)")
    g.add_argument("--alpha", type=float, default=16.0,
                   help="adapter scale: the update is alpha/rank * x A B "
                        "(default: 16)")
    _lm.add_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    import _lm
    if args.base_step is not None and not args.base_ckpt:
        p.error("--base-step needs --base-ckpt")
    if args.base_ckpt and not os.path.isdir(args.base_ckpt):
        p.error(f"--base-ckpt {args.base_ckpt} is not a folder: give a "
                "train_lm.py --ckpt-dir")
    _lm.check_args(p, args, model_from=args.base_ckpt)
    status = _common.start(args.jaxlake, args.jaxlake_option)
    if not args.base_ckpt:
        print("no --base-ckpt: fine-tuning adapters on a random base model")
    setup = _lm.Setup(lora_rank=args.rank, lora_alpha=args.alpha,
                      base_ckpt=args.base_ckpt, base_step=args.base_step,
                      corpus="docstrings",
                      trace_extra=(f"lora-r{args.rank}",),
                      meta={"lora_rank": args.rank, "base": "checkpoint"
                            if args.base_ckpt else "random"})
    summary = _lm.train(args, setup)
    if "trace" in summary:
        print(summary["trace"])
    import jax
    trainable = sum(int(v.size) for v in jax.tree.leaves(summary["trainable"])
                    if hasattr(v, "size"))
    print(f"trained {trainable:,} adapter parameters of "
          f"{summary['params']:,} in the model")
    _common.finish(status, args.log_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
