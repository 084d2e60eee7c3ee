"""The option table: every setting of a lake, declared once.

Each row of OPTIONS gives an option's name, kind, default and documentation.
From that row come the keyword argument of jaxlake.Lake, the environment
variable JAXLAKE_<NAME>, the parsing and checking of values and the
`jaxlake options` listing.

Rules:
  * an explicit keyword argument (not None) wins over the environment, the
    environment over the default;
  * a misspelt option name raises ConfigurationError (a ValueError) listing
    the valid names, with a "did you mean" when one is close;
  * a bad value raises ConfigurationError naming the option, the value and
    what was expected;
  * a JAXLAKE_* environment variable that no option reads gives a
    ConfigurationWarning (not an error: the variable may be meant for
    another version of jaxlake), with a "did you mean".

Environment values are forgiving: booleans accept 1/true/on/yes and
0/false/off/no (any case); sizes accept a number of bytes or a number with a
unit, in any case: K, M, G, T, KiB, MiB, GiB, TiB (powers of 1024) or KB,
MB, GB, TB (powers of 1000), as GNU coreutils read them; the number may
have a decimal point or an exponent, as long as it makes whole bytes, e.g.
"4GiB", "16G", "512 MiB", "1.5GiB", "1e9", "2.5e3KB".

Sizes have one parser, parse_size() below; the shim (cc/shim/options.cc)
reads only plain decimal digits. Every path that starts the shim (configure(),
the start-up hook, `jaxlake run`) resolves the options here first and hands
the shim their normalised values (xla.shim_environment), so no spelling can
mean one size in Python and another in C++: a spelling the shim was never
given by Python makes it inactive with a message naming the variable, it is
never read differently. One parser in Python, rather than one in C++ called
from Python, keeps the forgiving spellings, the error messages and the
"did you mean" in one place, and keeps the shim's start-up path (which runs
inside the CUDA driver's first call) free of anything but digits.
tests/test_options.py checks that both sides agree on every spelling.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import mmap
import os
import re
import warnings
from typing import Dict, Mapping, Optional, Tuple, Union

from jaxlake._src.errors import ConfigurationError, ConfigurationWarning

ENV_PREFIX = "JAXLAKE_"

#: A resolved option value.
OptionValue = Union[int, float, bool, None]

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

# Kinds of option, with what a value of that kind must be.
_EXPECTED = {
    "size": "a size in bytes >= 0: an int, or a string such as '512MiB'",
    "positive_size": "a size in bytes > 0: an int, or a string such as '4GiB'",
    "count": "an int >= 0",
    "bool": "a bool (environment: 1/true/on/yes or 0/false/off/no)",
    "capacity": ("a size in bytes > 0 (an int, or a string such as '4GiB'), "
                 "or a float in (0, 1] meaning that fraction of the device "
                 "memory, or None for the whole device"),
}
# What an environment variable of that kind must hold: a string, which can
# be neither an int nor None.
_EXPECTED_ENV = {
    "size": "a size in bytes >= 0, such as 512MiB, 16G, 1e9 or 4096",
    "positive_size": "a size in bytes > 0, such as 4GiB, 16G, 1e9 or 4096",
    "count": "a whole number >= 0",
    "bool": "1/true/on/yes or 0/false/off/no",
    "capacity": ("a size in bytes > 0 (such as 4GiB, 16G or 1e9) or a "
                 "fraction in (0, 1] of the device memory (such as 0.9); "
                 "unset the variable for the whole device"),
}


@dataclasses.dataclass(frozen=True)
class Option:
    """One row of the option table."""

    name: str
    kind: str            # a key of _EXPECTED
    default: OptionValue
    doc: str
    lake: bool = True    # a field of the C++ LakeOptions (else a driver one)
    power_of_two: bool = False

    @property
    def env(self) -> str:
        """The environment variable that sets this option."""
        return ENV_PREFIX + self.name.upper()

    @property
    def expected(self) -> str:
        """What a value of this option must be, in words."""
        return self.expected_for(env=False)

    def expected_for(self, env: bool) -> str:
        """What a keyword argument (env=False) or the environment variable
        (env=True) of this option must hold, in words."""
        text = (_EXPECTED_ENV if env else _EXPECTED)[self.kind]
        if self.power_of_two:
            text = "a power of two: " + text
        return text


OPTIONS: Tuple[Option, ...] = (
    Option("capacity", "capacity", None,
           "Physical bytes the lake may hold: bytes, a size string, or a "
           "fraction in (0, 1] of device_memory; None: the whole device."),
    Option("granularity", "positive_size", None,
           "Chunk size of the host/sim driver, a power of two multiple of "
           "the page size; None: the backend's (2 MiB).", lake=False,
           power_of_two=True),
    Option("device_memory", "positive_size", None,
           "Device size of the host/sim driver; None: the backend's "
           "(host 4 GiB, only what is touched is committed; sim 80 GiB).",
           lake=False),
    Option("small_limit", "size", 0,
           "Requests of at most this many bytes use a small-request pool of "
           "per-stream slabs (at most one small slab); 0: none does, every "
           "request is carved at the alignment from the shared blocks."),
    Option("small_slab", "size", 0,
           "Bytes of one small-pool slab, a multiple of the granularity; "
           "0: one granule."),
    Option("alignment", "positive_size", 256,
           "Alignment of every returned address: a power of two between "
           "256 and the granularity.", power_of_two=True),
    Option("stitch", "bool", True,
           "Serve large requests by stitching free blocks into one new "
           "virtual range."),
    Option("stitch_min", "size", 0,
           "Requests below this size never stitch (GMLake's frag_limit); "
           "0: any size may."),
    Option("stitch_grow", "bool", True,
           "Let a stitch create only the missing bytes as a new segment."),
    Option("max_pieces", "count", 0,
           "Most pieces (map calls) in one stitched range; 0: no limit."),
    Option("stitch_cache", "count", 64,
           "Freed stitched ranges kept mapped for reuse."),
    Option("grow_min", "size", 0,
           "Least bytes of a segment made to grow the lake (cut to the "
           "capacity left); 0: the request's chunks, and, while nothing "
           "was freed since the last growth, at least 1/16 of what the "
           "lake holds."),
    Option("preallocate", "bool", False,
           "Take the whole capacity as one segment at the first allocation "
           "(as JAX preallocates), for a device the program has to itself: "
           "the fewest driver calls and the highest fit capacity, but the "
           "memory is held from the start; a creation refused for lack of "
           "memory falls back to growth on demand."),
    Option("record_trace", "bool", False,
           "Keep an in-memory trace of allocate/free events (Lake.trace())."),
)

#: JAXLAKE_* environment variables that other parts of jaxlake read (they
#: are not lake options); resolve_options does not warn about these.
OTHER_VARIABLES: Tuple[str, ...] = (
    "JAXLAKE_REAL_LIBCUDA",       # the real CUDA driver's path (the shim)
    "JAXLAKE_TRACE_FILE",         # write the allocation trace there
    "JAXLAKE_SHIM_HOOKS",         # 0: the shim forwards every call
    "JAXLAKE_SHIM_PEER_ACCESS",   # 0: lake memory for its own device only
    "JAXLAKE_CAPACITY_FRACTION",  # set from a fractional capacity
    "JAXLAKE_REQUIRED",           # start-up hook: fail if inactive
    "JAXLAKE_TRACE_FLUSH",        # trace events between two file flushes
    "JAXLAKE_EXIT_REPORT",        # 1: the shim reports per device at exit
    "JAXLAKE_FAKE_GPU",           # `jaxlake run --fake-gpu` (fakegpu.py)
    "JAXLAKE_FAKEGPU_MODEL",      # the fake GPU's own (cc/fakegpu/README.md)
    "JAXLAKE_FAKEGPU_COUNT",
    "JAXLAKE_FAKEGPU_MEMORY",
    "JAXLAKE_FAKEGPU_CUDA",
    "JAXLAKE_FAKEGPU_FAIL",
    "JAXLAKE_FAKEGPU_LOG",
    "JAXLAKE_FAKEGPU_STATS",
    "JAXLAKE_FAKEGPU_SHARED",
    "JAXLAKE_FAKEGPU_NO_VMM",
    "JAXLAKE_FAKEGPU_DRIVER_VERSION",
    "JAXLAKE_FAKEGPU_LOOP_LIMIT",
    "JAXLAKE_FAKEGPU_LIBS",       # the fake's loader guard (fakegpu.py)
    "JAXLAKE_FAKEGPU_LOADS",
)

_BY_NAME: Dict[str, Option] = {o.name: o for o in OPTIONS}
_ENV_NAMES: Dict[str, Option] = {o.env: o for o in OPTIONS}

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
    "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_SIZE_RE = re.compile(
    r"^\s*([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([a-z]*)\s*$",
    re.IGNORECASE)
_SIZE_FORMS = ("bytes, or a number with a unit: K/M/G/T or KiB/MiB/GiB/TiB "
               "(powers of 1024), KB/MB/GB/TB (powers of 1000), e.g. '16G', "
               "'512MiB', '1.5GiB', '1e9'")
_TRUE = {"1", "true", "on", "yes", "y"}
_FALSE = {"0", "false", "off", "no", "n"}


def option_table() -> Tuple[Option, ...]:
    """Every option, in table order."""
    return OPTIONS


def _did_you_mean(word: str, choices: Mapping[str, object]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_option_error(name: str) -> ConfigurationError:
    """The error for an option name that is not in the table."""
    return ConfigurationError(
        f"unknown option {name!r}{_did_you_mean(name, _BY_NAME)}; valid "
        f"options: {', '.join(_BY_NAME)}")


def parse_size(text: str) -> int:
    """Bytes in a size string such as "4GiB", "16G", "512 MiB", "1.5GB",
    "1e9" or "4096" (the forms are in this module's docstring).

    Raises ValueError, saying why, when the text is not a size: an unknown
    unit, a negative number, or a number that is not whole bytes.
    """
    match = _SIZE_RE.match(text)
    unit = match.group(4).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r}; expected {_SIZE_FORMS}")
    sign, number, exponent = match.group(1), match.group(2), match.group(3)
    if sign == "-" and number.strip("0.") != "":
        raise ValueError(f"not a size: {text!r} is negative")
    whole, _, frac = number.partition(".")
    numerator = int((whole or "0") + frac)  # the digits without the point
    scale = len(frac) - int(exponent or "0")  # value = numerator / 10**scale
    if scale > 30 or scale < -30:
        raise ValueError(f"not a size: {text!r} is out of range")
    numerator *= _UNITS[unit]
    power = int(10 ** abs(scale))
    if scale <= 0:
        total, rest = numerator * power, 0
    else:
        total, rest = divmod(numerator, power)
    if rest:
        raise ValueError(f"not a whole number of bytes: {text!r}")
    if total >= 1 << 64:
        raise ValueError(f"not a size: {text!r} is 2**64 bytes or more")
    return total


def format_size(nbytes: int) -> str:
    """A short readable size: 8 MiB, 1.5 GiB, 300 B."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if value == int(value) \
                else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


#: Binary units by magnitude, for figures read by people.
BYTE_UNITS: Tuple[Tuple[str, int], ...] = (
    ("B", 1), ("KiB", KIB), ("MiB", MIB), ("GiB", GIB), ("TiB", 1 << 40))


def byte_unit(nbytes: float) -> Tuple[str, int]:
    """The unit (name, bytes) in which `nbytes` reads as 1 to 1023.9: the
    largest binary unit not above it (bytes for anything below 1 KiB)."""
    chosen = BYTE_UNITS[0]
    for unit in BYTE_UNITS:
        if abs(nbytes) >= unit[1]:
            chosen = unit
    return chosen


def format_bytes(nbytes: float, digits: int = 3) -> str:
    """A size for tables and reports, in the unit its magnitude calls for
    and `digits` significant digits: "1.50 GiB", "12.3 MiB", "512 KiB",
    "0 B". Unlike format_size it never shows more digits than are useful."""
    name, scale = byte_unit(nbytes)
    value = nbytes / scale
    if scale == 1:
        return f"{nbytes:.0f} B"
    if round(abs(value), max(0, digits - 4)) >= 1024 and name != "TiB":
        # rounding reached the next unit (1023.99 MiB -> 1.00 GiB)
        return format_bytes(1024 * scale, digits)
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(value))))) \
        if value else 0
    return f"{value:.{decimals}f} {name}"


def _where(option: Option, env: str) -> str:
    """How an error names the option: the keyword, or the environment
    variable / XLA_FLAGS entry (`env` starting with "--") it came from, or
    the --lake-option flag of `jaxlake bench` and `replay`."""
    if not env:
        return option.name
    if env.startswith("--lake-option"):  # jaxlake bench/replay's flag
        return env
    if env.startswith("--"):
        return f"{option.name}: XLA_FLAGS entry {env}"
    return f"{option.name}: environment variable {env}"


def _bad(option: Option, value: object, env: str,
         why: str = "") -> ConfigurationError:
    where = _where(option, env)
    why = f" ({why})" if why else ""
    return ConfigurationError(
        f"option {where}={value!r} is invalid{why}; "
        f"expected {_expected(option, env)}")


def _expected(option: Option, env: str) -> str:
    text = option.expected_for(env=bool(env))
    if env.startswith("--"):
        text = text.replace("unset the variable", "leave the entry out")
    return text


def _parse(option: Option, value: object, env: str = "") -> OptionValue:
    """A checked value for `option`: a keyword argument, or the string of
    the environment variable `env`."""
    kind = option.kind
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if env and isinstance(value, str):
            text = value.strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
        raise _bad(option, value, env)

    if kind == "capacity":
        if isinstance(value, float) or (
                isinstance(value, str) and _looks_like_fraction(value)):
            try:
                fraction = float(value)
            except ValueError:
                raise _bad(option, value, env) from None
            if not 0.0 < fraction <= 1.0:
                raise _bad(option, value, env,
                           "a fraction must lie in (0, 1]")
            return fraction
        number = _integer(option, value, env, sizes=True)
        if number < 0:
            raise _bad(option, value, env, "negative")
        if number == 0:
            whole = (f"leave out {env}" if env.startswith("--") else
                     f"leave {env} unset") if env else \
                "leave it unset or pass None"
            raise _bad(option, value, env,
                       "0 bytes would leave the lake no memory; for the "
                       f"whole device {whole}")
        return number

    number = _integer(option, value, env, sizes=(kind != "count"))
    if number < 0 or (kind == "positive_size" and number == 0):
        raise _bad(option, value, env)
    if option.power_of_two and number & (number - 1):
        raise _bad(option, value, env, "not a power of two")
    if option.name == "granularity" and number % mmap.PAGESIZE:
        raise _bad(option, value, env,
                   f"not a multiple of the page size {mmap.PAGESIZE}")
    return number


def _looks_like_fraction(text: str) -> bool:
    return "." in text and re.fullmatch(r"\s*[\d.]+\s*", text) is not None


def _integer(option: Option, value: object, env: str, sizes: bool) -> int:
    if isinstance(value, bool):  # bool is an int, but never a size
        raise _bad(option, value, env)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return parse_size(value) if sizes else int(value.strip())
        except ValueError as e:
            # parse_size says why when it is more than "not a size"
            why = str(e) if sizes and "expected" not in str(e) else ""
            raise _bad(option, value, env, why) from None
    raise _bad(option, value, env)


def parse_text(name: str, text: str, source: str) -> OptionValue:
    """The checked value of option `name` written as text, the way an
    environment variable holds it; `source` names where the text came from
    in errors (an environment variable, or an XLA_FLAGS entry such as
    "--jaxlake_capacity"). Raises ConfigurationError."""
    option = _BY_NAME.get(name)
    if option is None:
        raise unknown_option_error(name)
    return _parse(option, text, source)


def resolve_options(options: Optional[Mapping[str, object]] = None,
                    environ: Optional[Mapping[str, str]] = None
                    ) -> Dict[str, OptionValue]:
    """Every option's value: `options` (keyword arguments), then the
    environment, then the table's default.

    `environ` defaults to os.environ. A value of None counts as not given. Raises ConfigurationError for an unknown name or a bad value;
    warns (ConfigurationWarning) about unknown JAXLAKE_* variables.
    """
    options = {} if options is None else options
    environment = os.environ if environ is None else environ
    for name in options:
        if name not in _BY_NAME:
            raise unknown_option_error(name)
    for var in environment:
        if var.startswith(ENV_PREFIX) and var not in _ENV_NAMES \
                and var not in OTHER_VARIABLES:
            warnings.warn(
                f"environment variable {var} is not a jaxlake option and is "
                f"ignored{_did_you_mean(var, _ENV_NAMES)}; valid variables: "
                f"{', '.join(_ENV_NAMES)}", ConfigurationWarning, stacklevel=3)
    resolved: Dict[str, OptionValue] = {}
    for option in OPTIONS:
        given = options.get(option.name)
        if given is not None:
            resolved[option.name] = _parse(option, given)
        elif option.env in environment:
            resolved[option.name] = _parse(option, environment[option.env],
                                          option.env)
        else:
            resolved[option.name] = option.default
    return resolved
