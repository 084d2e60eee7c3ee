"""The trace subcommands of `jaxlake`: bench, replay, plot, trace convert.

cli.py calls register(commands) with its argparse subparsers object; each
subcommand sets `func`, a handler taking the parsed arguments and returning
the exit status: 0 done, 1 bad input (a malformed trace, a missing file),
2 bad usage (argparse's own errors, an unknown policy). With `bench
--check`, 3 when a tracked claim fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from jaxlake._src.bench import columns
from jaxlake._src.bench import suite as bench
from jaxlake._src.trace import tracefile
from jaxlake._src.errors import ConfigurationError
from jaxlake._src.options import format_bytes, option_table, parse_text
from jaxlake._src.bench.replay import (Capacity, DriverModelError, Latency,
                                       LatencyError,
                                       PolicyError, ReplayResult,
                                       check_policies, empty_trace_problem,
                                       policy_names, replay)

EXIT_INPUT = 1
EXIT_USAGE = 2
EXIT_CLAIM = 3


def _capacity(text: str) -> Optional[Capacity]:
    try:
        return Capacity.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# Lake options the replay cannot take: the device size is --capacity, and
# an in-memory trace of the replay is of no use there.
_NOT_REPLAY_OPTIONS = ("capacity", "record_trace")


def _replay_lake_options() -> List[str]:
    return [o.name for o in option_table()
            if o.lake and o.name not in _NOT_REPLAY_OPTIONS]


def _lake_option(text: str) -> Tuple[str, object, str]:
    """A --lake-option NAME=VALUE argument, checked against the option
    table: (name, value, the text as given)."""
    name, sep, value = text.partition("=")
    name = name.strip().replace("-", "_")
    value = value.strip()
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=VALUE, e.g. grow_min=64MiB")
    if name not in _replay_lake_options():
        raise argparse.ArgumentTypeError(
            f"{name!r} is not a lake option a replay can set; one of: "
            f"{', '.join(_replay_lake_options())} (the device size is "
            f"--capacity)")
    try:
        parsed = parse_text(name, value, f"--lake-option {name}")
    except ConfigurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name, parsed, value


def _add_lake_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lake-option", type=_lake_option, action="append", default=[],
        metavar="NAME=VALUE",
        help="replay jaxlake with this lake option instead of its default "
             "(repeat for more), e.g. grow_min=64MiB or stitch=false; the "
             "names are those of `jaxlake options` that a replay can set")


# --preallocate: the policies that have a preallocating mode, as JAX's
# default (XLA_PYTHON_CLIENT_PREALLOCATE=true) runs them, and the
# PolicyOptions that select it. Every first region is cut to the device, so
# a size past any device's means "the whole device":
# - jaxlake: its preallocate option (docs/design.md, "Preallocation");
# - bfc: allow_growth = !preallocate, and without growth the first region
#   is the whole memory limit (xla/pjrt/gpu/gpu_helpers.cc
#   CreateBFCAllocator; xla/tsl/framework/bfc_allocator.cc, the
#   BFCAllocator constructor);
# - bfc-growth: its initial region set to the whole memory fraction, so its
#   first extension is the whole device.
# torch, torch-expandable, gmlake and xla-vmm have no such mode.
_WHOLE_DEVICE = 1 << 60
PREALLOCATING = ("jaxlake", "bfc", "bfc-growth")
_PREALLOCATE_OPTIONS: Dict[str, object] = {
    "lake_preallocate": True,
    "bfc_initial_region": _WHOLE_DEVICE,
    "bfc_growth_increment": _WHOLE_DEVICE,
}


def _add_preallocate(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preallocate", action="store_true",
        help="replay jaxlake, bfc and bfc-growth as preallocating, as JAX "
             "runs by default: each takes the whole device (the fit "
             "capacity, at the fit) as its first region; the other "
             "policies have no such mode. Uncapped U then means nothing "
             "for those three; U_fit and the fit's driver figures are "
             "what compares")


def _overrides(args: argparse.Namespace) -> Dict[str, object]:
    """The replay's policy overrides from --lake-option and
    --preallocate."""
    out: Dict[str, object] = {f"lake_{name}": value
                              for name, value, _ in args.lake_option}
    if args.preallocate:
        if out.get("lake_preallocate", True) is not True:
            raise PolicyError("--preallocate and --lake-option "
                              "preallocate=false contradict each other")
        out.update(_PREALLOCATE_OPTIONS)
    return out


def _checked_overrides(command: str, args: argparse.Namespace
                       ) -> Optional[Dict[str, object]]:
    """_overrides(args), or None after saying why they contradict."""
    try:
        return _overrides(args)
    except PolicyError as e:
        _error(command, str(e))
        return None


def _lake_note(args: argparse.Namespace) -> str:
    chosen = args.lake_option
    note = ("; lake options " + ", ".join(f"{n}={t}" for n, _, t in chosen)
            if chosen else "")
    if args.preallocate:
        note += "; preallocating: " + ", ".join(PREALLOCATING)
    return note


def _policies(values: Optional[Sequence[str]]) -> List[str]:
    """--policy values, each possibly comma-separated; all when none."""
    if not values:
        return list(policy_names())
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    return check_policies(names)


def _add_latency(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--driver-model", metavar="SPEC",
        help="change the driver-time model: comma-separated items applied "
             "over the defaults, each a latency JSON file (written by the "
             "GPU check), KIND=TIME (a call kind's time at 2 MiB, e.g. "
             "create=8us), devices=N, peer=TIME or first_set_access=TIME; "
             "see docs/benchmarks.md, Driver time")
    p.add_argument(
        "--latency", metavar="FILE",
        help="a driver latency JSON file; the same as --driver-model FILE")


def _latency(command: str, args: argparse.Namespace) -> Any:
    """The model --latency and --driver-model describe, None without
    either, or the exit status (reported) when one is bad: usage for a
    malformed item, input for a file that cannot be read or used."""
    path = getattr(args, "latency", None)
    spec = getattr(args, "driver_model", None)
    if not path and spec is None:
        return None
    if path and spec is not None:
        _error(command, "--latency FILE is --driver-model FILE: give one "
                        "of them (--driver-model FILE,create=8us combines)")
        return EXIT_USAGE
    try:
        if path:
            return Latency.load(path)
        return Latency.from_spec(str(spec))
    except DriverModelError as e:
        _error(command, str(e))
        return EXIT_USAGE
    except LatencyError as e:
        _error(command, f"--latency {e}" if path else f"--driver-model {e}")
        return EXIT_INPUT


def _error(command: str, message: str) -> None:
    sys.stderr.write(f"jaxlake {command}: error: {message}\n")


def _policies_and_latency(command: str, args: argparse.Namespace) -> Any:
    """(policies, latency model or None) from --policy and --latency, or
    the exit status after an error message naming the bad value."""
    try:
        policies = _policies(args.policy)
    except PolicyError as e:
        _error(command, str(e))
        return EXIT_USAGE
    latency = _latency(command, args)
    if isinstance(latency, int):
        return latency
    return policies, latency


def _add_policy(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy", "-p", action="append", metavar="NAME",
        help="a policy to replay (repeat, or separate with commas); "
             "default: all of " + ", ".join(
                 name for name, _ in columns.POLICY_DOCS))


def _add_wide(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wide", action="store_true",
        help="print every column and unwrapped lines, whatever the "
             "terminal's width (by default a table wider than the terminal "
             "is printed in a narrow layout that names the columns it "
             "leaves out, and long lines are wrapped)")


def register(commands: Any) -> None:
    """Adds bench, replay, plot and trace to `jaxlake`'s subcommands."""
    b = commands.add_parser(
        "bench", help="replay the bundled trace suite through every policy "
                      "and compare them",
        description="Replays every trace of the suite through jaxlake and "
                    "the modelled baselines (" + ", ".join(
                        name for name, _ in columns.POLICY_DOCS
                        if name != "jaxlake") + "; the table's notes say "
                    "what each models), prints a table of trace x policy "
                    "with geometric means and the tracked comparisons, and "
                    "writes results.json and memory plots. See "
                    "docs/benchmarks.md.")
    b.add_argument("--suite", metavar="DIR",
                   help="a folder of traces (*.jsonl.gz, *.jsonl, RMM "
                        "*.csv); default: the traces installed with jaxlake")
    b.add_argument("--synthetic", action="store_true",
                   help="bench synthetic traces (written under OUT/"
                        "synthetic/) instead of the suite")
    b.add_argument("--workloads", action="store_true",
                   help="bench the bundled workloads group (serving with "
                        "growing or slotted KV caches, kept outputs, a "
                        "temp arena, offloading, and two trainers sharing "
                        "one GPU, replayed as a pair) instead of the suite")
    _add_policy(b)
    b.add_argument("--capacity", type=_capacity, default=Capacity(factor=1.1),
                   metavar="SIZE",
                   help="device memory for the out-of-memory column: a size "
                        "('16GiB', '16G', '1e9'), a multiple of each trace's "
                        "peak live bytes ('1.1x', the default) or 'none'")
    b.add_argument("--out", default="jaxlake-bench", metavar="DIR",
                   help="where results.json and the plots go "
                        "(default: ./jaxlake-bench)")
    b.add_argument("--no-plots", action="store_true",
                   help="skip the plots (matplotlib not needed)")
    b.add_argument("--no-progress", action="store_true",
                   help="no progress bar")
    b.add_argument("--lenient", action="store_true",
                   help="skip malformed lines of damaged traces")
    _add_latency(b)
    _add_lake_option(b)
    _add_preallocate(b)
    _add_wide(b)
    b.add_argument("--check", action="store_true",
                   help="exit with status 3 when a PASS/FAIL claim fails")
    b.set_defaults(func=bench_command)

    r = commands.add_parser(
        "replay", help="replay a trace through the policies",
        description="Replays a trace (JSON lines, optionally gzip, or RMM "
                    "memory-event CSV) through each policy and prints the "
                    "figures; with --capacity, which policies run out of "
                    "memory and at which event.")
    r.add_argument("trace", metavar="TRACE",
                   help="the trace file, or - for standard input")
    _add_policy(r)
    r.add_argument("--capacity", type=_capacity, default=None,
                   metavar="SIZE",
                   help="device memory: a size ('16GiB', '16G', '1e9'), a "
                        "multiple of the peak live bytes ('1.1x'), or "
                        "'none' (default)")
    r.add_argument("--fit", action="store_true",
                   help="also find each policy's fit capacity: the "
                        "smallest device, in whole 2 MiB granules, that "
                        "runs the trace with no out-of-memory, with U_fit "
                        "and the driver calls and time there (always in "
                        "--json)")
    r.add_argument("--json", metavar="OUT",
                   help="also write the results as JSON to OUT (folders "
                        "are created); - writes them to standard output "
                        "and the table to standard error")
    r.add_argument("--plot", metavar="IMAGE",
                   help="also draw memory over the replay to IMAGE (.png, "
                        ".pdf, .svg: the suffix picks the format; folders "
                        "are created)")
    r.add_argument("--lenient", action="store_true",
                   help="skip malformed lines, unknown frees and bad sizes, "
                        "and report what was skipped")
    r.add_argument("--pair", action="store_true",
                   help="TRACE is a pair's second job: replay it beside the "
                        "first job its header names (meta.beside), two "
                        "processes on one device; --capacity and --fit "
                        "are the pair's device (docs/traces.md, Pairs)")
    _add_latency(r)
    _add_lake_option(r)
    _add_preallocate(r)
    _add_wide(r)
    r.set_defaults(func=replay_command)

    pl = commands.add_parser(
        "plot", help="draw live vs reserved memory of a trace per policy",
        description="Replays a trace and draws live bytes and each "
                    "policy's reserved bytes over the events; with "
                    "--by-kind, also the live bytes by kind (params, "
                    "optimizer state, activations, temporaries...) under "
                    "one policy's reserved bytes. The output's suffix picks "
                    "the format (.png, .pdf, .svg).")
    pl.add_argument("trace", metavar="TRACE",
                    help="the trace file, or - for standard input")
    _add_policy(pl)
    pl.add_argument("--output", "-o", metavar="IMAGE",
                    help="the image to write: .png, .pdf, .svg... "
                         "(default: <trace name>.png)")
    pl.add_argument("--by-kind", metavar="POLICY", nargs="?",
                    const="jaxlake",
                    help="add a panel of live bytes by kind under POLICY's "
                         "reserved bytes (default policy: jaxlake)")
    pl.add_argument("--lenient", action="store_true",
                    help="skip malformed lines")
    pl.set_defaults(func=plot_command)

    t = commands.add_parser(
        "trace", help="trace file tools (convert, info)",
        description="Trace file tools. The format is in docs/traces.md.")
    tsub = t.add_subparsers(dest="trace_command", metavar="ACTION")
    c = tsub.add_parser(
        "convert", help="convert between JSON lines and RMM's CSV",
        description="Converts a trace; the output format follows OUT's "
                    "name: .csv or .csv.gz is RMM's memory-event CSV, "
                    "anything else JSON lines (.gz: compressed); the "
                    "suffix in any case.")
    c.add_argument("input", metavar="IN",
                   help="the trace to read, or - for standard input")
    c.add_argument("output", metavar="OUT",
                   help="the file to write (.csv, .csv.gz, .jsonl, "
                        ".jsonl.gz, in any case; folders are created)")
    c.add_argument("--lenient", action="store_true",
                   help="skip malformed lines of IN and report them")
    c.set_defaults(func=convert_command)
    i = tsub.add_parser("info", help="summarise a trace",
                        description="Prints a trace's header, event counts "
                                    "and peak live bytes.")
    i.add_argument("trace", metavar="TRACE")
    i.add_argument("--lenient", action="store_true",
                   help="skip malformed lines")
    i.set_defaults(func=info_command)
    def trace_help(args: argparse.Namespace,
                   out: Optional[TextIO] = None) -> int:
        t.print_help(out if out is not None else sys.stdout)
        return EXIT_USAGE

    t.set_defaults(func=trace_help)


# -- handlers ------------------------------------------------------------------


def _read(command: str, path: str, lenient: bool,
          out: TextIO) -> Optional[tracefile.Trace]:
    try:
        trace = tracefile.read_trace(path, lenient=lenient)
    except tracefile.TraceError as e:
        _error(command, str(e) +
               (" (--lenient skips such lines)"
                if e.skippable and not lenient else ""))
        return None
    _report_skipped(trace, out)
    return trace


def _report_skipped(trace: tracefile.Trace, out: TextIO,
                    limit: int = 20) -> None:
    count = int(trace.core.skipped_count)
    if not count:
        return
    out.write(f"{trace.path}: skipped {count} line(s):\n")
    for s in trace.skipped[:limit]:
        out.write(f"  line {s.line}: {s.reason}\n")
    if count > limit:
        out.write(f"  ... and {count - limit} more\n")


def _one_trace(name: str, results: Sequence[ReplayResult]
               ) -> bench.TraceResults:
    return bench.TraceResults(name=name, path="", events=0, devices=1,
                              peak_live=0, load_s=0.0, results=list(results))


def bench_command(args: argparse.Namespace,
                  out: Optional[TextIO] = None) -> int:
    out = out if out is not None else sys.stdout
    chosen = _policies_and_latency("bench", args)
    if isinstance(chosen, int):
        return chosen
    policies, latency = chosen
    start = time.perf_counter()
    if args.workloads and (args.suite or args.synthetic):
        _error("bench", "--workloads is a bundled group of its own: give "
                        "it without --suite and --synthetic")
        return EXIT_USAGE
    if args.synthetic:
        folder = os.path.join(args.out, "synthetic")
        paths = bench.write_synthetic(folder)
        source = f"synthetic traces in {folder}"
    else:
        found: Optional[str] = args.suite or bench.installed_suite_dir()
        if found is not None and args.workloads:
            group = os.path.join(found, bench.WORKLOADS_GROUP)
            if not os.path.isdir(group):
                _error("bench", f"no workloads group ({bench.WORKLOADS_GROUP}"
                                f"/) in the bundled traces at {found}")
                return EXIT_INPUT
            found = group
        if found is None:
            _error("bench", "no bundled traces found (jaxlake/traces is "
                            "empty); pass --suite DIR, or --synthetic to try "
                            "synthetic traces")
            return EXIT_INPUT
        folder = found
        if not os.path.isdir(folder):
            _error("bench", f"--suite {folder}: not a folder")
            return EXIT_INPUT
        paths = bench.suite_files(folder)
        if not paths:
            _error("bench", f"no traces (*.jsonl.gz, *.jsonl, *.csv) in "
                            f"{folder}")
            return EXIT_INPUT
        source = folder
    options = _checked_overrides("bench", args)
    if options is None:
        return EXIT_USAGE
    progress = bench.Progress(len(paths) * len(policies),
                              enabled=False if args.no_progress else None)
    try:
        suite = bench.run_suite(paths, policies, args.capacity, progress,
                                lenient=args.lenient, latency=latency,
                                fit=True, options=options)
    except tracefile.TraceError as e:
        progress.close()
        _error("bench", str(e))
        return EXIT_INPUT
    except PolicyError as e:
        progress.close()
        _error("bench", f"--lake-option: {e}")
        return EXIT_USAGE
    progress.close()
    empty = [t.path for t in suite if t.events == 0]
    if empty:
        _error("bench", f"{', '.join(empty)}: no allocation events, so "
                        "nothing to replay (`jaxlake replay` on one of them "
                        "says what the likely causes are)")
        return EXIT_USAGE
    cap = f"; capacity {args.capacity}" if args.capacity else ""
    cap += _lake_note(args)
    def wrap(text: str, hang: int = 4) -> str:  # --wide: lines as they are
        return text if args.wide else columns.wrap_lines(text, hang=hang)
    out.write(wrap(f"jaxlake bench: {len(suite)} trace(s) from {source}, "
                   f"{len(policies)} policies{cap}") + "\n\n")
    out.write(columns.render(suite, wide=args.wide) + "\n\n")
    claims = bench.comparisons(suite, preallocated=args.preallocate)
    # (continuation lines under the claim, past its PASS/FAIL mark)
    out.write(wrap("comparisons:\n" + bench.format_comparisons(claims),
                   hang=6) + "\n")
    out.write(wrap(bench.speed_lines(suite)) + "\n")
    elapsed = time.perf_counter() - start
    try:
        written = bench.write_outputs(
            suite, args.out, args.capacity, plots=not args.no_plots,
            extra={"elapsed_s": elapsed, "source": source,
                   "latency": latency.source if latency else "defaults",
                   "lake_options": {n: t for n, _, t in args.lake_option},
                   "preallocate": list(PREALLOCATING) if args.preallocate
                   else []})
    except Exception as e:  # a plot error must not lose the table
        _error("bench", f"writing outputs failed: {e}")
        return EXIT_INPUT
    out.write("wrote " + ", ".join(written) + "\n")
    out.write(f"done in {time.perf_counter() - start:.1f}s\n")
    if args.check and any(c.ok is False for c in claims):
        return EXIT_CLAIM
    return 0


def _write_json(command: str, path: str, data: Any, out: TextIO) -> bool:
    """Writes `data` to `path` (- : standard output), creating its folder
    as the plots do. Says what went wrong and returns False on failure."""
    text = json.dumps(data, indent=1) + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return True
    try:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        _error(command, f"cannot write {path}: {e.strerror or e}")
        return False
    out.write(f"wrote {path}\n")
    return True


def _check_image(command: str, path: Optional[str]) -> bool:
    """Whether `path` (if given) names an image format, said before any
    replay runs."""
    if path is None:
        return True
    from jaxlake._src.bench import plot
    try:
        plot.image_format(path)
    except plot.PlotError as e:
        _error(command, str(e))
        return False
    return True


def replay_command(args: argparse.Namespace,
                   out: Optional[TextIO] = None) -> int:
    out = out if out is not None else sys.stdout
    if args.json == "-":  # standard output is the JSON's
        out = sys.stderr
    chosen = _policies_and_latency("replay", args)
    if isinstance(chosen, int):
        return chosen
    policies, latency = chosen
    if not _check_image("replay", args.plot):
        return EXIT_USAGE
    if args.pair:
        return _replay_pair(args, out, policies, latency)
    trace = _read("replay", args.trace, args.lenient, out)
    if trace is None:
        return EXIT_INPUT
    empty = empty_trace_problem(trace)
    if empty is not None:
        _error("replay", empty)
        return EXIT_USAGE
    # Under a capacity every figure shown (table, lines, plot) is of the run
    # under that capacity; --json keeps the uncapped figures and adds them.
    fit = bool(args.fit or args.json)
    options = _checked_overrides("replay", args)
    if options is None:
        return EXIT_USAGE
    try:
        replayed = [replay(trace, p, args.capacity, latency=latency, fit=fit,
                           capped_figures=args.capacity is not None,
                           options=options)
                    for p in policies]
    except PolicyError as e:
        _error("replay", f"--lake-option: {e}")
        return EXIT_USAGE
    results = [r.capped or r for r in replayed]
    first = results[0]
    out.write(f"{trace.name}: {len(trace)} events, {first.devices} "
              f"device(s), peak live {format_bytes(first.peak_live)}"
              f"{_lake_note(args)}")
    if args.capacity:
        out.write(f", capacity {args.capacity} = "
                  f"{format_bytes(first.capacity or 0)} per device")
    if args.capacity:
        out.write("\nevery figure below is of the replay under the "
                  "capacity")
    out.write("\n\n" + columns.render([_one_trace(trace.name, results)],
                                       wide=args.wide, summary=False)
              + "\n\n")
    for r in results:
        if r.oom is not None:
            line = f"{r.policy}: {r.oom.describe()}"
            out.write((line if args.wide else columns.wrap_lines(line))
                      + "\n")
        elif r.capacity is not None:
            out.write(f"{r.policy}: fits the capacity (peak reserved "
                      f"{format_bytes(r.peak_reserved)})\n")
    if args.fit:
        out.write("\n")
        for r in results:
            if r.fit_capacity is None:
                out.write(f"{r.policy}: no fit capacity up to the device "
                          f"({format_bytes(r.device_memory)})\n")
                continue
            odd = (" (not monotone: a smaller capacity ran where a larger "
                   "one failed)") if r.fit_nonmonotone else ""
            per = " per device (the largest)" if r.devices > 1 else ""
            out.write(f"{r.policy}: fit capacity "
                      f"{format_bytes(r.fit_capacity)}{per}, U_fit "
                      f"{r.u_fit or 0:.3f}; there {r.fit_memory_calls} "
                      f"driver calls, "
                      f"{columns.format_ns(r.fit_driver_ms * 1e6)}"
                      f" modelled driver time, {r.fit_steady_calls} in the "
                      f"second half{odd}\n")
    if args.json:
        data = {"format": "jaxlake-replay", "version": 1,
                "trace": {"name": trace.name, "path": trace.path,
                          "events": len(trace), "devices": trace.devices,
                          "skipped": [list(s) for s in trace.skipped],
                          "skipped_count": int(trace.core.skipped_count)},
                "capacity": str(args.capacity) if args.capacity else None,
                "lake_options": {n: t for n, _, t in args.lake_option},
                "preallocate": list(PREALLOCATING) if args.preallocate
                else [],
                "results": {r.policy: r.to_json() for r in replayed}}
        if not _write_json("replay", args.json, data, out):
            return EXIT_INPUT
    if args.plot:
        from jaxlake._src.bench import plot
        try:
            written = plot.plot_trace(trace.name, results, args.plot,
                                      limits=args.capacity is not None)
            out.write(f"wrote {written}\n")
        except plot.PlotError as e:
            _error("replay", str(e))
            return EXIT_INPUT
    return 0


def _replay_pair(args: argparse.Namespace, out: TextIO,
                 policies: Sequence[str], latency: Any) -> int:
    """`jaxlake replay --pair`: the pair whose second job is TRACE."""
    from jaxlake._src.bench import pair
    if args.trace == "-":
        _error("replay", "--pair reads the first job's file beside TRACE: "
                         "give TRACE as a file, not -")
        return EXIT_USAGE
    try:
        first, second = pair.read_pair(args.trace, lenient=args.lenient)
    except tracefile.TraceError as e:
        _error("replay", str(e))
        return EXIT_INPUT
    for t in (first, second):
        empty = empty_trace_problem(t)
        if empty is not None:
            _error("replay", empty)
            return EXIT_USAGE
    options = _checked_overrides("replay", args)
    if options is None:
        return EXIT_USAGE
    try:
        results = [pair.replay_pair(first, second, p, args.capacity,
                                    options=options or None,
                                    latency=latency)
                   for p in policies]
    except PolicyError as e:
        _error("replay", f"--lake-option: {e}")
        return EXIT_USAGE
    head = results[0]
    out.write(f"{second.name} beside {first.name}: {len(second)} + "
              f"{len(first)} events, two processes on one device, peak "
              f"live {format_bytes(head.peak_live)} (both jobs' peaks)"
              f"{_lake_note(args)}\n")
    out.write("each job through its own policy; the first holds its peak "
              "reserved (preallocating: 0.75 of the device), the second "
              "fits in what is left; fit capacity: the smallest device "
              "for both\n\n")
    out.write(columns.render([_one_trace(second.name, results)],
                             wide=args.wide, summary=False) + "\n\n")
    for r in results:
        if r.capacity is not None:
            line = (f"{r.policy}: under {format_bytes(r.capacity)}: "
                    + (r.oom.describe() if r.oom is not None else "fits"))
            out.write((line if args.wide else columns.wrap_lines(line))
                      + "\n")
    for r in results:
        if r.fit_capacity is None:
            out.write(f"{r.policy}: no device up to "
                      f"{format_bytes(r.device_memory)} fits the pair\n")
        else:
            out.write(f"{r.policy}: the pair fits {format_bytes(r.fit_capacity)}"
                      f", U_fit {r.u_fit or 0:.3f}\n")
    if args.json:
        data = {"format": "jaxlake-replay", "version": 1,
                "pair": {"first": first.path, "second": second.path},
                "capacity": str(args.capacity) if args.capacity else None,
                "preallocate": list(PREALLOCATING) if args.preallocate
                else [],
                "results": {r.policy: r.to_json() for r in results}}
        if not _write_json("replay", args.json, data, out):
            return EXIT_INPUT
    if args.plot:
        from jaxlake._src.bench import plot
        try:
            out.write(f"wrote {plot.plot_trace(second.name, results, args.plot)}\n")
        except plot.PlotError as e:
            _error("replay", str(e))
            return EXIT_INPUT
    return 0


def plot_command(args: argparse.Namespace,
                 out: Optional[TextIO] = None) -> int:
    out = out if out is not None else sys.stdout
    from jaxlake._src.bench import plot
    try:
        policies = _policies(args.policy)
        if args.by_kind is not None:
            check_policies([args.by_kind])
            if args.by_kind not in policies:
                policies.append(args.by_kind)
    except PolicyError as e:
        _error("plot", str(e))
        return EXIT_USAGE
    if not _check_image("plot", args.output):
        return EXIT_USAGE
    trace = _read("plot", args.trace, args.lenient, out)
    if trace is None:
        return EXIT_INPUT
    results = [replay(trace, p, None) for p in policies]
    path = args.output or f"{plot.safe_name(trace.name)}.png"
    try:
        plot.plot_trace(trace.name, results, path, trace=trace,
                        by_kind=args.by_kind)
    except plot.PlotError as e:
        _error("plot", str(e))
        return EXIT_INPUT
    out.write(f"wrote {path}\n")
    return 0


def convert_command(args: argparse.Namespace,
                    out: Optional[TextIO] = None) -> int:
    out = out if out is not None else sys.stdout
    if os.path.abspath(args.input) == os.path.abspath(args.output):
        _error("trace convert", "IN and OUT are the same file")
        return EXIT_USAGE
    try:
        # folders are created, as for --plot and --json
        os.makedirs(os.path.dirname(os.path.abspath(args.output)),
                    exist_ok=True)
        trace = tracefile.convert(args.input, args.output,
                                  lenient=args.lenient)
    except tracefile.TraceError as e:
        _error("trace convert", str(e) +
               (" (--lenient skips such lines)"
                if e.skippable and not args.lenient else ""))
        return EXIT_INPUT
    except (OSError, ValueError) as e:
        _error("trace convert", str(e))
        return EXIT_INPUT
    _report_skipped(trace, out)
    out.write(f"wrote {args.output}: {len(trace)} events "
              f"({tracefile.output_format(args.output)})\n")
    return 0


def info_command(args: argparse.Namespace,
                 out: Optional[TextIO] = None) -> int:
    out = out if out is not None else sys.stdout
    trace = _read("trace info", args.trace, args.lenient, out)
    if trace is None:
        return EXIT_INPUT
    counts = list(trace.core.device_events())
    out.write(f"{trace.path}\n  format   {trace.format}\n"
              f"  name     {trace.name}\n  source   {trace.source}\n"
              f"  devices  {trace.devices}\n  events   {len(trace)}\n")
    for d, n in enumerate(counts):
        if n:
            out.write(f"  device {d}: {n} events, peak live "
                      f"{format_bytes(int(trace.core.peak_live(d)))}\n")
    if trace.meta:
        out.write(f"  meta     {json.dumps(trace.meta, sort_keys=True)}\n")
    return 0
