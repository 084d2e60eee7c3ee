"""The `jaxlake` command (also `python -m jaxlake`)."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import Callable, List, Optional, Sequence

from jaxlake._src.bench import cli as bench_cli
from jaxlake._src.view import cli as view_cli
from jaxlake._src.core import demo
from jaxlake._src.xla import cli as xla_cli
from jaxlake._src.options import OPTIONS, Option, format_size


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
        "variables (keyword arguments win; sizes take KiB/MiB/GiB or "
        "KB/MB/GB, booleans 1/0/true/false/on/off/yes/no).", ""]
    for option in OPTIONS:
        current = os.environ.get(option.env)
        now = f"  [set: {current}]" if current is not None else ""
        lines.append(f"{option.name}  ({option.env})  default "
                     f"{_default(option)}{now}")
        lines.extend(textwrap.wrap(option.doc, 76, initial_indent="    ",
                                   subsequent_indent="    "))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command; returns its exit status."""
    parser = argparse.ArgumentParser(
        prog="jaxlake",
        description="jaxlake: a GPU memory allocator that stitches free "
                    "memory together (GMLake-style virtual memory stitching).")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Each module adds its subcommands with a handler: args -> exit status.
    bench_cli.register(commands)
    view_cli.register(commands)
    commands.add_parser(
        "demo", help="show stitching with real bytes on the host backend"
    ).set_defaults(func=lambda args: demo.run(sys.stdout))
    commands.add_parser(
        "options", help="list the options, their environment variables, "
                        "defaults and docs"
    ).set_defaults(func=_print_options)
    xla_cli.register(commands)
    args = parser.parse_args(argv)
    func: Optional[Callable[[argparse.Namespace], int]] = getattr(
        args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)


def _print_options(args: argparse.Namespace) -> int:
    print(format_options())
    return 0
