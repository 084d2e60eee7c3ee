"""jaxlake's start-up hook, imported by jaxlake.pth at interpreter start.

Inert unless JAXLAKE or JAXLAKE_FAKE_GPU is set to a true value
(1/true/on/yes) or XLA_FLAGS has a --jaxlake entry; see
jaxlake/_src/xla/startup.py. It never stops the
interpreter from starting, unless JAXLAKE_REQUIRED=1 asks for that.
"""
import os as _os

_TRUE = ("1", "true", "on", "yes")
if (_os.environ.get("JAXLAKE", "").strip().lower() in _TRUE
        or _os.environ.get("JAXLAKE_FAKE_GPU", "").strip().lower() in _TRUE
        or "--jaxlake" in _os.environ.get("XLA_FLAGS", "")):
    try:
        from jaxlake._src.xla.startup import run as _run
        _run()
    except SystemExit:
        raise
    except Exception as _error:  # pylint: disable=broad-except
        import sys as _sys
        _sys.stderr.write(f"jaxlake: start-up hook failed: {_error!r}\n")
