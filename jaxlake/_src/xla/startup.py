"""The start-up hook: enables the lake from the environment, no code change.

jaxlake.pth (installed beside the package in site-packages) imports the
top-level module _jaxlake_startup at every interpreter start. That module
does nothing unless JAXLAKE is set to a true value, XLA_FLAGS has a
--jaxlake entry or JAXLAKE_FAKE_GPU is set (`jaxlake run --fake-gpu`, with
or without the lake); then it calls run() below, before any JAX plugin can
open the CUDA driver. A jax_plugins entry point would not do: JAX initialises
plugins in an order that changes from run to run, and the CUDA plugin's own
initialisation opens the driver.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

from jaxlake._src.xla import integration as xla
from jaxlake._src.errors import ConfigurationError


def wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when the environment asks for the lake."""
    env = os.environ if environ is None else environ
    if xla.truthy(env.get(xla.ENABLE_ENV)):
        return True
    _, ours = xla.split_xla_flags(env.get("XLA_FLAGS", ""))
    return bool(ours)


def without_lake(asked: str, required: str) -> str:
    """The warning, after the line that says why, for a program that asked
    for the lake (`asked`, e.g. "JAXLAKE=1") and runs without it, with how
    to make that fatal (`required`)."""
    return (f"jaxlake: WARNING: {asked} asked for the lake, but the lake is "
            "NOT active (see above): the program runs with XLA's own "
            f"allocator; {required} makes this an error instead\n")


def reminder(reason: str, limit: int = 100) -> str:
    """The line said again when such a program ends."""
    first = reason.splitlines()[0] if reason else "unknown"
    if len(first) > limit:
        first = first[:limit - 3] + "..."
    return f"jaxlake: WARNING: this program ran WITHOUT the lake: {first}\n"


def _remind_at_exit(reason: str) -> None:
    import atexit

    def remind() -> None:
        try:
            sys.stderr.write(reminder(reason))
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed or gone
            pass
    atexit.register(remind)


def run() -> Optional[xla.Status]:
    """Configures the lake from the environment. A program that asked for
    the lake and does not get it (a bad setting, no driver) is told so on
    stderr when it starts and again when it ends; with JAXLAKE_REQUIRED=1
    it ends at once with exit status 1 instead."""
    if xla.truthy(os.environ.get("JAXLAKE_FAKE_GPU")):
        # The fake GPU, with the lake or without it (--no-lake).
        from jaxlake._src.xla import fakegpu
        note = fakegpu.install_jax_hook()
        if note:
            sys.stderr.write(f"jaxlake: fake GPU: {note}\n")
    if not wanted():
        return None
    required = xla.truthy(os.environ.get(xla.REQUIRED_ENV))
    asked = "JAXLAKE=1" if xla.truthy(os.environ.get(xla.ENABLE_ENV)) \
        else "XLA_FLAGS --jaxlake"
    try:
        status = xla.configure(required=required)
    except ConfigurationError as error:
        if required:
            sys.stderr.write(f"jaxlake: error: {error}\n"
                             f"jaxlake: {xla.REQUIRED_ENV}=1: stopping "
                             "the program\n")
            # Not SystemExit: this runs while site.py reads jaxlake.pth,
            # where an exception prints a traceback of the interpreter's
            # start-up. Nothing else has run yet to need a clean exit.
            sys.stderr.flush()
            os._exit(1)
        sys.stderr.write(f"jaxlake: {error}\n")
        sys.stderr.write(without_lake(asked, f"{xla.REQUIRED_ENV}=1"))
        _remind_at_exit(str(error))
        return None
    if not status.active:
        sys.stderr.write(f"{status}\n")
        sys.stderr.write(without_lake(asked, f"{xla.REQUIRED_ENV}=1"))
        _remind_at_exit(xla.short_reason(status.reason))
    return status
