"""jaxlake: a GPU memory allocator that stitches free memory together.

Public API; the implementation lives in jaxlake._src and the compiled core
in jaxlake._core (both private).
"""

from typing import Any as _Any

from jaxlake._src.errors import ConfigurationError as ConfigurationError
from jaxlake._src.errors import ConfigurationWarning as ConfigurationWarning
from jaxlake._src.errors import DriverError as DriverError
from jaxlake._src.errors import InvariantError as InvariantError
from jaxlake._src.errors import JaxlakeError as JaxlakeError
from jaxlake._src.errors import OutOfMemoryError as OutOfMemoryError
from jaxlake._src.lake.lake import Lake as Lake
from jaxlake._src.lake.lake import TraceEvent as TraceEvent
from jaxlake._src.options import Option as Option
from jaxlake._src.options import option_table as option_table
from jaxlake._src.options import parse_size as parse_size
from jaxlake._src.options import resolve_options as resolve_options
from jaxlake._src.trace.recorder import Recorder as Recorder
from jaxlake._src.trace.recorder import RecorderError as RecorderError
from jaxlake._src.trace.recorder import (
    enable_per_tensor_dumps as enable_per_tensor_dumps)
from jaxlake._src.lake.stats import Stats as Stats
from jaxlake._src.xla.integration import Status as Status
from jaxlake._src.xla.integration import check as check
from jaxlake._src.xla.integration import configure as configure
from jaxlake._src.xla.integration import empty_cache as empty_cache
from jaxlake._src.xla.integration import hook_counts as hook_counts
from jaxlake._src.xla.integration import memory_report as memory_report
from jaxlake._src.xla.integration import stats as stats
from jaxlake._src.xla.integration import status as status
from jaxlake._src.xla.integration import trace as trace
from jaxlake._src.view.api import view as view

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


#: The public names: those imported above (each `import X as X`, so type
#: checkers see them exported too), and __version__. tests/test_api.py pins
#: the list.
__all__ = sorted([_name for _name in globals() if not _name.startswith("_")]
                 + ["__version__"])
