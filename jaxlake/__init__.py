"""jaxlake: a GPU memory allocator that stitches free memory together.

Public API; the implementation lives in jaxlake._src and the compiled core
in jaxlake._core (both private).
"""

from typing import Any as _Any

from jaxlake._src.errors import ConfigurationError
from jaxlake._src.errors import ConfigurationWarning
from jaxlake._src.errors import DriverError
from jaxlake._src.errors import InvariantError
from jaxlake._src.errors import JaxlakeError
from jaxlake._src.errors import OutOfMemoryError
from jaxlake._src.lake.lake import Lake
from jaxlake._src.lake.lake import TraceEvent
from jaxlake._src.options import Option
from jaxlake._src.options import option_table
from jaxlake._src.options import parse_size
from jaxlake._src.options import resolve_options
from jaxlake._src.trace.recorder import Recorder
from jaxlake._src.trace.recorder import RecorderError
from jaxlake._src.trace.recorder import enable_per_tensor_dumps
from jaxlake._src.lake.stats import Stats
from jaxlake._src.xla.integration import Status
from jaxlake._src.xla.integration import check
from jaxlake._src.xla.integration import configure
from jaxlake._src.xla.integration import empty_cache
from jaxlake._src.xla.integration import hook_counts
from jaxlake._src.xla.integration import memory_report
from jaxlake._src.xla.integration import stats
from jaxlake._src.xla.integration import status
from jaxlake._src.xla.integration import trace
from jaxlake._src.view.api import view

# The public classes say where users find them: tracebacks and reprs print
# `jaxlake.ConfigurationError`, not the private module it is defined in, and
# pickle finds each class under that name (tests/test_api.py checks both).
for _cls in (ConfigurationError, ConfigurationWarning, DriverError,
             InvariantError, JaxlakeError, OutOfMemoryError, Lake, TraceEvent,
             Option, Recorder, RecorderError, Stats, Status):
    _cls.__module__ = __name__
del _cls


def __getattr__(name: str) -> _Any:
    # __version__ is looked up when first asked for (jaxlake/_src/version.py
    # says why).
    if name == "__version__":
        from jaxlake._src.version import version
        globals()["__version__"] = version()
        return version()
    raise AttributeError(f"module 'jaxlake' has no attribute {name!r}")


__all__ = [
    "ConfigurationError",
    "ConfigurationWarning",
    "DriverError",
    "InvariantError",
    "JaxlakeError",
    "Lake",
    "Option",
    "OutOfMemoryError",
    "Recorder",
    "RecorderError",
    "Stats",
    "Status",
    "TraceEvent",
    "__version__",
    "check",
    "configure",
    "empty_cache",
    "enable_per_tensor_dumps",
    "hook_counts",
    "memory_report",
    "option_table",
    "parse_size",
    "resolve_options",
    "stats",
    "status",
    "trace",
    "view",
]
