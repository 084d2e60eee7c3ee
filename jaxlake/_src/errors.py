"""The exceptions of jaxlake, and the one mapping from driver statuses."""

from __future__ import annotations

from typing import Any, Tuple


class JaxlakeError(Exception):
    """Base class of the errors raised by jaxlake itself."""


class ConfigurationError(JaxlakeError, ValueError):
    """An option, environment variable or backend name is invalid.

    A misspelt option name raises this error too (it is a ValueError).
    """


class ConfigurationWarning(UserWarning):
    """A JAXLAKE_* environment variable that no option reads."""


class OutOfMemoryError(JaxlakeError, MemoryError):
    """The lake cannot serve a request, even after reclaiming memory.

    The message carries the request and the lake's figures.
    """

    def __init__(self, message: str, nbytes: int, stream: int) -> None:
        super().__init__(message)
        self.nbytes = nbytes
        self.stream = stream

    def __reduce__(self) -> Tuple[Any, ...]:
        # Exception pickles only its args (the message); the figures too.
        return (type(self), (str(self), self.nbytes, self.stream))


class DriverError(JaxlakeError, RuntimeError):
    """A driver call failed; the lake rolled back and stays usable."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (str(self), self.status))


class InvariantError(JaxlakeError, AssertionError):
    """Lake.check(), or a replay's periodic check, found a broken invariant
    (a bug in jaxlake or in a replayed policy's model)."""


def status_error(status: str, message: str, nbytes: int = 0,
                 stream: int = 0) -> Exception:
    """The exception for a failure status name (any but "ok").

    This is the only place where statuses become exceptions. Every status
    but "out_of_memory" is a DriverError, "invalid_value" too: jaxlake
    checks its own arguments before calling the lake, so that status comes
    from a driver call (a bad argument to free() is refused by Lake.free
    itself, as a ValueError).
    """
    assert status != "ok", "status_error needs a failure status"
    if status == "out_of_memory":
        return OutOfMemoryError(message, nbytes, stream)
    return DriverError(message, status)
