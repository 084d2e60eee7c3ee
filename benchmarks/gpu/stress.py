"""Free-then-reuse stress of the lake under JAX, for compute-sanitizer.

    python benchmarks/gpu/stress.py [--iterations N] [--no-lake]

Matrices of seven widths are made, multiplied and dropped in turn, so
buffers of changing sizes are freed and their memory reused (and stitched)
at once; run under `compute-sanitizer --tool memcheck` it shows whether any
kernel touches memory the lake has unmapped or handed to another buffer.
The widths are chosen on the host (a static argument of the jitted step),
never from a traced value. --no-lake runs the same program on JAX's
default device without the lake (the test suite does, on the CPU).
Prints "STRESS_OK <checksum> <lake allocations>" at the end.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Sequence


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=120)
    parser.add_argument("--capacity", default="2GiB")
    parser.add_argument("--no-lake", action="store_true")
    args = parser.parse_args(argv)
    if not args.no_lake:
        import jaxlake
        status = jaxlake.configure(capacity=args.capacity, required=True)
        print(status, flush=True)
    import jax
    import numpy as np

    @functools.partial(jax.jit, static_argnums=1)
    def step(key: jax.Array, width: int) -> jax.Array:
        a = jax.random.normal(key, (512, width))
        return (a @ a.T).sum()

    keys = jax.random.split(jax.random.PRNGKey(0), 64)
    widths = [512 + 64 * int(w) for w in
              np.random.default_rng(0).integers(0, 7, args.iterations)]
    total = 0.0
    for i, width in enumerate(widths):
        total += float(step(keys[i % 64], width))
    allocs = -1
    if not args.no_lake:
        import jaxlake
        allocs = jaxlake.stats().allocs
    print("STRESS_OK", total, allocs, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
