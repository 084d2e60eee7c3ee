"""The `jaxlake` command (also `python -m jaxlake`)."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import textwrap
from typing import Callable, List, Optional, Sequence

from jaxlake._src.bench import cli as bench_cli
from jaxlake._src.fit import cli as fit_cli
from jaxlake._src.view import cli as view_cli
from jaxlake._src.lake import demo
from jaxlake._src.xla import cli as xla_cli
from jaxlake._src.options import OPTIONS, Option, format_size
from jaxlake._src.version import version


def _default(option: Option) -> str:
    value = option.default
    if isinstance(value, int) and not isinstance(value, bool) and value \
            and option.kind.endswith("size"):
        return f"{value} ({format_size(value)})"
    return str(value)


def format_options() -> str:
    """The option table as text: name, variable, default, doc."""
    lines: List[str] = [
        "jaxlake options: Lake(backend, **options) keyword arguments, or "
        "JAXLAKE_<NAME> environment",
        "variables (keyword arguments win; sizes take K/M/G or KiB/MiB/GiB "
        "(powers of 1024),",
        "KB/MB/GB (powers of 1000), e.g. 16G, 512MiB, 1e9; booleans "
        "1/0/true/false/on/off/yes/no).", ""]
    for option in OPTIONS:
        current = os.environ.get(option.env)
        now = f"  [set: {current}]" if current is not None else ""
        lines.append(f"{option.name}  ({option.env})  default "
                     f"{_default(option)}{now}")
        lines.extend(textwrap.wrap(option.doc, 76, initial_indent="    ",
                                   subsequent_indent="    "))
    return "\n".join(lines)


#: Options whose value may start with "-" (a negative size is still a
#: value, to be refused with a message, not an unknown option to argparse).
VALUE_OPTIONS = ("--capacity", "--gpu")


def attach_values(argv: Sequence[str],
                  options: Sequence[str] = VALUE_OPTIONS) -> List[str]:
    """`--capacity -1GiB` as `--capacity=-1GiB`: argparse takes any word
    that starts with "-" and is not a plain negative number for an option,
    and would say only "expected one argument"."""
    out: List[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        if args[i] == "--":  # the rest belongs to a program (jaxlake run)
            out.extend(args[i:])
            break
        if args[i] in options and i + 1 < len(args) \
                and args[i + 1].startswith("-") and args[i + 1] != "--":
            out.append(f"{args[i]}={args[i + 1]}")
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def build_parser() -> argparse.ArgumentParser:
    """The `jaxlake` parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="jaxlake",
        description="jaxlake: a GPU memory allocator that stitches free "
                    "memory together (GMLake-style virtual memory stitching).")
    parser.add_argument("--version", action="version",
                        version=f"jaxlake {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Each module adds its subcommands with a handler: args -> exit status.
    bench_cli.register(commands)
    view_cli.register(commands)
    fit_cli.register(commands)
    commands.add_parser(
        "demo", help="show stitching with real bytes on the host backend",
        description="Shows stitching on the host backend, with real memory "
                    "and no GPU: fills a small lake with blocks, frees every "
                    "other one, then asks for more than any free block. The "
                    "lake maps the scattered free chunks into one new "
                    "virtual range, writes and reads the bytes back, and "
                    "prints its figures before and after."
    ).set_defaults(func=lambda args: demo.run(sys.stdout))
    commands.add_parser(
        "options", help="list the options, their environment variables, "
                        "defaults and docs",
        description="Lists every lake option: its name (a keyword argument "
                    "of jaxlake.Lake and jaxlake.configure), its environment "
                    "variable JAXLAKE_<NAME>, its default and what it does, "
                    "with the value set in this environment, if any."
    ).set_defaults(func=_print_options)
    xla_cli.register(commands)
    return parser


def chosen_parser(parser: argparse.ArgumentParser,
                  args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the subcommand `args` chose: `replay`'s for
    `jaxlake replay ...`, `trace convert`'s for `jaxlake trace convert`."""
    for action in parser._actions:  # pylint: disable=protected-access
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            name = getattr(args, action.dest, None)
            if name is not None and name in action.choices:
                return chosen_parser(action.choices[name], args)
    return parser


def unrecognized_message(parser: argparse.ArgumentParser,
                         extra: Sequence[str]) -> str:
    """argparse's "unrecognized arguments" with the closest options of
    `parser` for each misspelt one."""
    options = [s for a in parser._actions  # pylint: disable=protected-access
               for s in a.option_strings]
    hints: List[str] = []
    for word in extra:
        if not word.startswith("-"):
            continue
        name = word.split("=", 1)[0]
        close = difflib.get_close_matches(name, options, n=3, cutoff=0.6)
        if close:
            hints.append(f"{name}: did you mean {' or '.join(close)}?")
    text = "unrecognized arguments: " + " ".join(extra)
    return text + ("; " + "; ".join(hints) if hints else "")


#: The exit status after the reader of standard output went away
#: (`jaxlake bench | head`): 128 + SIGPIPE, as a shell reports a program
#: killed by it.
EXIT_BROKEN_PIPE = 141


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command; returns its exit status. When standard output is a
    pipe whose reader has gone, the command stops quietly (no traceback,
    nothing more written) with EXIT_BROKEN_PIPE."""
    try:
        try:
            return _main(argv)
        finally:  # also after --help's SystemExit
            sys.stdout.flush()
    except BrokenPipeError:
        # Python's own advice: point stdout at /dev/null, so that the
        # interpreter's flush at exit does not fail a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        finally:
            os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: Optional[Sequence[str]]) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(attach_values(
        sys.argv[1:] if argv is None else argv))
    if extra:
        # The subcommand's own usage and the closest option names, not the
        # top-level usage argparse would give.
        sub = chosen_parser(parser, args)
        sub.error(unrecognized_message(sub, extra))
    func: Optional[Callable[[argparse.Namespace], int]] = getattr(
        args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)


def _print_options(args: argparse.Namespace) -> int:
    print(format_options())
    return 0
