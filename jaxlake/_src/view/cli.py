"""`jaxlake view TRACE -o view.html`: the memory of a run as one page.

Exit statuses as for the other trace commands (bench/cli.py): 0 done,
1 bad input (a malformed trace, a missing file or folder, plotly missing),
2 bad usage (argparse's own errors, an unknown policy).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional, TextIO

from jaxlake._src.bench.cli import (EXIT_INPUT, EXIT_USAGE, _add_policy,
                                    _capacity, _policies, _read)
from jaxlake._src.bench.replay import PolicyError
from jaxlake._src.options import format_size
from jaxlake._src.view import api, model, page


def _error(message: str) -> None:
    sys.stderr.write(f"jaxlake view: error: {message}\n")


def register(commands: Any) -> None:
    """Adds `view` to `jaxlake`'s subcommands."""
    v = commands.add_parser(
        "view", help="write an HTML page showing a trace's memory: "
                     "timeline, allocations, the lake's memory map",
        description="Replays a trace (JSON lines, optionally gzip, or RMM "
                    "memory-event CSV) and writes one self-contained HTML "
                    "page: live and reserved bytes per policy over the "
                    "events, every allocation as a band over its lifetime, "
                    "the jaxlake lake's memory map at chosen events "
                    "(segments, free chunks, stitched ranges) and the "
                    "summary table of `jaxlake replay`. Nothing is fetched "
                    "when the page is opened. See docs/view.md.")
    v.add_argument("trace", metavar="TRACE")
    _add_policy(v)
    v.add_argument("--capacity", type=_capacity, default=None,
                   metavar="SIZE",
                   help="device memory: a size ('16GiB'), a multiple of the "
                        "peak live bytes ('1.1x'), or 'none' (default)")
    v.add_argument("--device", type=int, default=None, metavar="N",
                   help="only device N (default: every device, with a "
                        "selector on the page)")
    v.add_argument("--output", "-o", metavar="HTML",
                   help="the page to write (default: <trace name>.html)")
    v.add_argument("--snapshots", type=int, default=model.SNAPSHOTS,
                   metavar="N",
                   help="evenly spread events the memory map can show "
                        f"(default {model.SNAPSHOTS}; stitches, the peak "
                        "and an out-of-memory stop come on top)")
    v.add_argument("--lenient", action="store_true",
                   help="skip malformed lines and report them")
    v.set_defaults(func=view_command)


def view_command(args: argparse.Namespace,
                 out: Optional[TextIO] = None) -> int:
    out = out if out is not None else sys.stdout
    start = time.perf_counter()
    try:
        policies = _policies(args.policy)
    except PolicyError as e:
        _error(str(e))
        return EXIT_USAGE
    if args.snapshots < 0:
        _error(f"--snapshots must be 0 or more, got {args.snapshots}")
        return EXIT_USAGE
    if args.output is not None:
        try:
            api.check_output(args.output)
        except OSError as e:
            _error(str(e))
            return EXIT_INPUT
    try:
        page.plotly_js()
    except page.MissingPlotlyError as e:
        _error(str(e))
        return EXIT_INPUT
    trace = _read("view", args.trace, args.lenient, out)
    if trace is None:
        return EXIT_INPUT
    output = args.output or api.default_output(trace)
    try:
        path = api.view(trace, output, policies=policies,
                        capacity=args.capacity, device=args.device,
                        snapshots=args.snapshots)
    except model.ViewError as e:
        _error(str(e))
        return EXIT_USAGE
    except OSError as e:
        _error(str(e))
        return EXIT_INPUT
    size = os.path.getsize(path)
    out.write(f"wrote {path} ({format_size(size)}; {len(trace):,} events, "
              f"{len(policies)} policies) in "
              f"{time.perf_counter() - start:.1f}s\n")
    return 0
