"""The installed jaxlake's version (jaxlake.__version__)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def version() -> str:
    """The version in the installed package's metadata, read once.
    importlib.metadata is imported here, when first asked: it costs a
    noticeable share of every interpreter start under JAXLAKE=1 (the
    start-up hook imports the package)."""
    from importlib import metadata
    return metadata.version("jaxlake")
