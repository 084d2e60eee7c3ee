"""What the tests of the replay commands (bench, replay, plot, trace)
share: running one in this process."""

from __future__ import annotations

import argparse
import io
from typing import List, Tuple

from jaxlake._src.bench import cli as bench_cli


def run(argv: List[str]) -> Tuple[int, str]:
    """Runs `jaxlake ARGV` (a bench/replay/plot/trace command); returns its
    exit status and what it wrote to its output."""
    parser = argparse.ArgumentParser(prog="jaxlake")
    bench_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    out = io.StringIO()
    return args.func(args, out), out.getvalue()
