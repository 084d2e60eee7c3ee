"""Train a decoder-only transformer LM (Flax NNX) on the Python standard
library's own source, tokenised at byte level.

    python examples/train_lm.py --preset tiny --steps 50
    python examples/train_lm.py --preset small --remat full --grad-accum 2 \\
        --seq-buckets 64,128 --eval-every 10 --ckpt-dir /tmp/lm --ckpt-every 10
    python examples/train_lm.py --preset tiny --trace lm.jsonl.gz   # no GPU
    python examples/train_lm.py --preset 7b --dtype bfloat16 --compile-only \\
        --trace lm7b.jsonl.gz

The blocks run as one nnx.scan over stacked layers (--no-scan-layers
unrolls them), each under nnx.remat with --remat's policy; attention is
jax.nn.dot_product_attention (cuDNN on a GPU). optax adamw with warm-up plus
cosine decay and gradient clipping, optax.MultiSteps for --grad-accum;
orbax checkpoints (a run with --ckpt-dir resumes from the latest one, and
the folder records the preset). --trace records the GPU-faithful allocation
trace that `jaxlake replay` reads.
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
        prog="train_lm.py", description=__doc__,
        formatter_class=_lm.Formatter)
    _lm.add_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    # Only the standard library runs before the lake is configured; the
    # option table lives in _lm, whose jax import does not start a backend.
    p = parser()
    args = p.parse_args(argv)
    import _lm
    _lm.check_args(p, args)
    status = _common.start(args.jaxlake, args.jaxlake_option)
    summary = _lm.train(args, _lm.Setup())
    if "trace" in summary:
        print(summary["trace"])
    _common.finish(status, args.log_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
