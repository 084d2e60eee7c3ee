"""LoRA fine-tuning of the train_lm.py model: the base weights stay frozen,
low-rank adapters on every projection (q, k, v, out, up, down) are trained.

    python examples/train_lm.py --preset tiny --steps 50 \\
        --ckpt-dir /tmp/base --ckpt-every 50
    python examples/finetune_lora.py --preset tiny --base-ckpt /tmp/base \\
        --rank 8 --steps 30

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
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("LoRA")
    g.add_argument("--base-ckpt", default=None, metavar="DIR",
                   help="train_lm.py checkpoint folder of the base model "
                        "(default: a randomly initialised base)")
    g.add_argument("--base-step", type=int, default=None,
                   help="which saved step of the base (default: latest)")
    g.add_argument("--rank", type=_lm.positive_int, default=8,
                   help="rank of the adapters")
    g.add_argument("--alpha", type=float, default=16.0,
                   help="adapter scale (the update is alpha/rank * B A)")
    _lm.add_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    import _lm
    _lm.check_args(p, args)
    status = _common.start(args.jaxlake, args.jaxlake_option)
    if args.trace_per_tensor:
        from jaxlake._src.trace.recorder import enable_per_tensor_dumps
        enable_per_tensor_dumps()
    base = None
    if args.base_ckpt:
        base = _lm.load_params(args.base_ckpt, args.base_step)
    else:
        print("no --base-ckpt: fine-tuning adapters on a random base model")
    setup = _lm.Setup(lora_rank=args.rank, lora_alpha=args.alpha,
                      base_params=base, corpus="docstrings",
                      trace_extra=(f"lora-r{args.rank}",),
                      meta={"lora_rank": args.rank,
                            "base": "checkpoint" if base else "random"})
    summary = _lm.train(args, setup)
    if "trace" in summary:
        print(summary["trace"])
    trainable = sum(int(v.size) for v in summary["trainable"].values()
                    if hasattr(v, "size"))
    print(f"trained {trainable:,} adapter parameters of "
          f"{summary['params']:,} in the model")
    _common.finish(status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
