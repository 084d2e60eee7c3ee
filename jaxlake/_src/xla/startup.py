"""The start-up hook: enables the lake from the environment, no code change.

jaxlake.pth (installed beside the package in site-packages) imports the
top-level module _jaxlake_startup at every interpreter start. That module
does nothing unless JAXLAKE is set to a true value or XLA_FLAGS has a
--jaxlake entry; then it calls run() below, before any JAX plugin can open
the CUDA driver. A jax_plugins entry point would not do: JAX initialises
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


def run() -> Optional[xla.Status]:
    """Configures the lake from the environment. Reports an inactive lake
    on stderr; with JAXLAKE_REQUIRED=1 an inactive lake or a bad setting
    ends the process with exit status 1."""
    if not wanted():
        return None
    required = xla.truthy(os.environ.get(xla.REQUIRED_ENV))
    try:
        status = xla.configure(required=required)
    except ConfigurationError as error:
        sys.stderr.write(f"jaxlake: {error}\n")
        if required:
            raise SystemExit(1) from None
        return None
    if not status.active:
        sys.stderr.write(f"{status}\n")
    return status
