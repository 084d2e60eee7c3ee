"""`jaxlake fit`: the largest batch (or any integer parameter) each
allocator fits on a named GPU, without a GPU."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, List, Optional

from jaxlake._src.fit import engine as _engine
from jaxlake._src.fit import run as _run
from jaxlake._src.fit.search import FitError, Vary, grid, parse_step

DESCRIPTION = (
    "Runs COMMAND with {NAME} replaced by candidate values, records each "
    "run's allocation trace, replays it under the GPU's capacity (device "
    "memory x XLA's 0.75, or --fraction; jaxlake's the lake's own capacity "
    "option when set, JAXLAKE_CAPACITY, else the fraction when one is "
    "given, else the whole device, as the lake runs then) through every "
    "policy, and reports "
    "each policy's largest value that fits and why the next one fails "
    "(shortage: the live bytes alone exceed the capacity; fragmentation: "
    "they fit but the policy could not serve a request). Real policies "
    "(real:*) run the command itself on one of XLA's own allocators over "
    "a fake device of the GPU's memory (`jaxlake run --fake-gpu "
    "--no-lake`): XLA's own out-of-memory error is the verdict, one run per "
    "value, shared by policies of the same settings. JAX's default for the "
    "installed jax is marked in the table, and jaxlake's gain is given "
    "against it first. The search is exponential, then binary, and each "
    "value's trace serves every model. "
    "Engines: fake-gpu (the default) runs the unmodified command under "
    "`jaxlake run --fake-gpu`; recorder runs a command that uses "
    "jaxlake.Recorder, with the trace path at {TRACE} in the command or "
    "else appended as --trace PATH (the examples' flag). A short run of a "
    "few steps is enough.")


def register(commands: Any) -> None:
    f = commands.add_parser(
        "fit", help="the largest batch each allocator fits on a named GPU, "
                    "without a GPU",
        description=DESCRIPTION,
        epilog="example: jaxlake fit --gpu h100 --vary batch=1..128 "
               "--engine recorder -- python examples/train_lm.py --preset "
               "1b --dtype bfloat16 --batch {batch} --steps 2 "
               "--compile-only")
    f.add_argument("--gpu", required=True, metavar="GPU",
                   help="h100, h200, a100-80gb or a device size such as "
                        "256MiB")
    f.add_argument("--devices", type=int, default=1, metavar="N",
                   help="GPUs each run of the program has (default 1; "
                        "fake-gpu engine): the fake GPU gives it N devices "
                        "of the GPU's memory, and a value fits when every "
                        "device fits (the figures are the fullest "
                        "device's)")
    f.add_argument("--vary", required=True, metavar="NAME=LO..HI",
                   help="the placeholder {NAME} of COMMAND and its range")
    f.add_argument("--step", default="pow2", metavar="STEP",
                   help="candidate values: pow2 (powers of two, the "
                        "default), linear (every value) or N (LO, LO+N, "
                        "...)")
    f.add_argument("--policies", "--policy", "-p", action="append",
                   metavar="NAME",
                   help="policies to fit (repeat, or separate with commas): "
                        "models (replays of the recorded traces: jaxlake, "
                        "bfc, bfc-prealloc, ...), real runs (real:jax-"
                        "default, real:bfc-growth, real:vmm, ...: the "
                        "program on XLA's own allocator over a fake device "
                        "of the GPU's memory, one run per value), or the "
                        "groups models, real, all; default: every model, "
                        "real:jaxlake and real:jax-default")
    f.add_argument("--engine", default="fake-gpu", choices=_engine.ENGINES,
                   help="how traces are made (default: fake-gpu)")
    f.add_argument("--fraction", type=float, default=None, metavar="F",
                   help="share of the device memory XLA's pool may take "
                        "(default: XLA_CLIENT_MEM_FRACTION, or the "
                        "deprecated XLA_PYTHON_CLIENT_MEM_FRACTION, else "
                        "0.75); also the lake's, which without it may "
                        "take the whole device")
    f.add_argument("--reserve", default="0", metavar="SIZE",
                   help="device memory to keep outside the pool besides "
                        "what the traces report (e.g. a cuBLAS workspace)")
    f.add_argument("--traces", default=None, metavar="DIR",
                   help="keep the traces in DIR and reuse those of the same "
                        "command (e.g. across --gpu)")
    f.add_argument("--json", default=None, metavar="OUT",
                   help="write the report as JSON")
    f.add_argument("--plot", default=None, metavar="OUT",
                   help="draw the value against each policy's peak "
                        "reserved bytes (.png, .svg, .pdf)")
    f.add_argument("--beside", default=None, metavar="FIRST",
                   help="run each value beside a first job on one shared "
                        "fake device (one GPU shared by two processes): "
                        "FIRST is its command line, one string, that "
                        "keeps running until it is stopped; {READY} in it "
                        "names a file it writes a line to per step (e.g. "
                        "--log-json {READY}). Real runs start FIRST, run "
                        "the command once FIRST is under way, then stop "
                        "it; a value fits when the command ends well and "
                        "FIRST has not failed. Models replay each value's "
                        "trace beside FIRST's (recorded once) on the "
                        "GPU's memory")
    f.add_argument("--beside-steps", type=int, default=2, metavar="N",
                   help="FIRST is under way once its {READY} file holds N "
                        "lines (default 2)")
    f.add_argument("--beside-wait", type=float, default=30.0,
                   metavar="SECONDS",
                   help="without {READY} in FIRST: it is under way after "
                        "this many seconds (default 30)")
    f.add_argument("--quiet", action="store_true",
                   help="no progress lines")
    f.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="the program and its arguments (after --)")
    f.set_defaults(func=main)


def _error(message: str) -> int:
    sys.stderr.write(f"jaxlake fit: error: {message}\n")
    return 2


def _fraction(args: argparse.Namespace) -> Optional[float]:
    if args.fraction is not None:
        if not 0.0 < args.fraction <= 1.0:
            raise FitError(f"--fraction {args.fraction:g}: expected a "
                           "fraction in (0, 1]")
        return float(args.fraction)
    from jaxlake._src.errors import ConfigurationError
    from jaxlake._src.xla.integration import xla_fraction
    try:
        given = xla_fraction(os.environ)
    except ConfigurationError as e:
        raise FitError(str(e)) from None
    return given[0] if given is not None else None


def _lake_capacity() -> Any:
    """The lake's `capacity` option from the environment (bytes, a
    fraction, or None); XLA's 0.75 for a lake that preallocates without
    one (integration.capacity_rule())."""
    from jaxlake._src import options as _options
    try:
        resolved = _options.resolve_options({}, os.environ)
    except Exception as e:  # a bad JAXLAKE_* value
        raise FitError(str(e)) from None
    cap = resolved.get("capacity")
    if cap is None and resolved.get("preallocate"):
        return _run.XLA_FRACTION
    return cap


#: --policies groups.
GROUPS = ("models", "real", "all")


def _policies(given: Optional[List[str]], engine: str) -> List[str]:
    """The policies named (or a group: models, real, all); by default every
    model and, with the fake-GPU engine, a real run of JAX's default."""
    from jaxlake._src.fit import real as _real
    if not given:
        names = _run.model_names() + (
            [_real.LAKE, _real.jax_default().real]
            if engine == "fake-gpu" else [])
    else:
        names = []
        for g in given:
            for n in (t.strip() for t in g.split(",")):
                if n in ("models", "all"):
                    names += _run.model_names()
                if n in ("real", "all"):
                    names += _real.available_names()
                if n and n not in GROUPS:
                    names.append(n)
    try:
        return _run.check_policies(names)
    except FitError as e:
        raise FitError(f"--policies: {e}") from None


def main(args: argparse.Namespace) -> int:
    from jaxlake._src.options import parse_size
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    try:
        if not argv:
            raise FitError("give the command after --, e.g. `jaxlake fit "
                           "--gpu h100 --vary batch=1..64 -- python "
                           "train.py --batch {batch}`")
        gpu = _engine.Gpu.parse(args.gpu)
        if not 1 <= args.devices <= _engine.MAX_DEVICES:
            raise FitError(f"--devices {args.devices}: give a number of "
                           f"devices from 1 to {_engine.MAX_DEVICES}")
        if args.devices != 1 and args.engine != "fake-gpu":
            raise FitError(f"--devices {args.devices}: the {args.engine} "
                           "engine runs the program on no device; devices "
                           "are the fake-gpu engine's (the default)")
        gpu = dataclasses.replace(gpu, count=args.devices)
        vary = Vary.parse(args.vary)
        step, increment = parse_step(args.step)
        values = grid(vary, step, increment)
        try:
            reserve = parse_size(args.reserve)
        except ValueError as e:
            raise FitError(f"--reserve {args.reserve!r}: {e}") from None
        if reserve < 0:
            raise FitError(f"--reserve {args.reserve!r}: must not be "
                           "negative")
        fraction = _fraction(args)
        policies = _policies(args.policies, args.engine)
        lake_capacity = _lake_capacity()
        if args.plot:
            from jaxlake._src.bench.plot import PlotError, image_format
            try:
                image_format(args.plot)
            except PlotError as e:
                raise FitError(f"--plot: {e}") from None
        beside = None
        if args.beside is not None:
            import shlex
            try:
                beside = shlex.split(args.beside)
            except ValueError as e:
                raise FitError(f"--beside {args.beside!r}: {e}") from None
            _run.check_beside(beside, args.engine, gpu, args.beside_steps,
                              args.beside_wait)
        progress = None if args.quiet else sys.stderr
        if progress is not None:
            progress.write(
                f"jaxlake fit: {len(values)} candidate values of "
                f"{vary.name} ({', '.join(map(str, values))}), engine "
                f"{args.engine}"
                + (f", {gpu.count} devices a run" if gpu.count > 1 else "")
                + f", {len(policies)} policies\n")
        report = _run.fit(argv, vary, values, gpu, policies, args.engine,
                          fraction, lake_capacity, reserve, args.traces,
                          progress, beside=beside,
                          beside_ready=args.beside_steps,
                          beside_wait=args.beside_wait)
    except _engine.FakeGpuUnavailable as e:
        sys.stderr.write(f"jaxlake fit: error: {e}\n")
        return 1
    except FitError as e:
        return _error(str(e))
    print(_run.format_report(report))
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as out:
                json.dump(report.to_json(), out, indent=1)
                out.write("\n")
        except OSError as e:
            return _error(f"--json {args.json}: {e.strerror or e}")
    if args.plot:
        from jaxlake._src.bench.plot import PlotError
        try:
            _run.plot(report, args.plot)
        except PlotError as e:
            return _error(f"--plot: {e}")
    return 0
