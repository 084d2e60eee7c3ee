"""Keeps JAX's CUDA plugin quiet about the driver it does not find.

On a machine without an NVIDIA driver, each library of JAX's CUDA plugin
logs "Could not find cuda drivers on your machine" (with absl's preamble)
from a C++ static initialiser when it loads: at `import jax`, when the
backends start, and when the recorder loads the plugin for its device-less
compile. JAX_PLATFORMS and TF_CPP_MIN_LOG_LEVEL do not silence it (measured
with jax 0.10.2 and jax-cuda12-plugin 0.10.2), so the recorder runs those
loads under quiet_cuda_stub(), which filters the lines out of file
descriptor 2. examples/_lm.py has the same filter for the examples, which
do not import jaxlake's private modules.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

#: The lines dropped; everything else written to stderr comes through.
CUDA_STUB_NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called "
    r"are written to STDERR$|cudart_stub\.cc:\d+\] Could not find cuda "
    r"drivers on your machine")


@contextlib.contextmanager
def quiet_cuda_stub() -> Iterator[None]:
    """Runs its body with file descriptor 2 sent to a temporary file, then
    writes what it holds back to stderr, in order, less CUDA_STUB_NOISE."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter
        yield
        return
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            text = log.read().decode("utf-8", errors="replace")
            sys.stderr.write("".join(
                line for line in text.splitlines(keepends=True)
                if not CUDA_STUB_NOISE.search(line.rstrip("\n"))))
            sys.stderr.flush()
