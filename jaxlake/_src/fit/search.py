"""`jaxlake fit`'s search: the largest value of one program parameter (a
batch, a sequence length) whose allocation trace each policy replays under
a GPU's capacity.

The expensive step is making a trace (a compile and a short run of the
program), so traces are made once per value and shared by every policy's
search. Each policy searches the grid of candidate values the same way: an
exponential search from the smallest value (grid indices 0, 1, 3, 7, ...)
until one fails or the grid ends, then a binary search between the last
value that fits and the first that fails. Policies probe mostly the same
values, so a search over P policies makes few more traces than one.

Fitting is taken to be monotone in the value (a larger batch never needs
less memory); the report names the next value's failure, so a result that
contradicts it shows.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from jaxlake._src.errors import JaxlakeError
from jaxlake._src.options import format_size


class FitError(JaxlakeError, ValueError):
    """Bad input to `jaxlake fit` (--vary, --gpu, the command), or a
    command that failed."""


# -- the varied parameter ----------------------------------------------------

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


@dataclasses.dataclass(frozen=True)
class Vary:
    """`--vary NAME=LO..HI`: the placeholder {NAME} takes integer values
    from LO to HI."""

    name: str
    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str) -> "Vary":
        example = "e.g. --vary batch=1..256"
        name, sep, span = text.partition("=")
        name = name.strip()
        if not sep or not name:
            raise FitError(f"--vary {text!r}: expected NAME=LO..HI, "
                           f"{example}")
        if not _NAME_RE.match(name):
            raise FitError(f"--vary {text!r}: the name {name!r} must be "
                           "letters, digits, '_' or '-', starting with a "
                           f"letter; {example}")
        lo_text, dots, hi_text = span.partition("..")
        if not dots:
            raise FitError(f"--vary {text!r}: expected a range LO..HI after "
                           f"'=', {example}")
        try:
            lo, hi = int(lo_text.strip()), int(hi_text.strip())
        except ValueError:
            raise FitError(f"--vary {text!r}: LO and HI must be whole "
                           f"numbers, {example}") from None
        if lo < 1:
            raise FitError(f"--vary {text!r}: LO must be at least 1, "
                           f"got {lo}")
        if hi < lo:
            raise FitError(f"--vary {text!r}: HI ({hi}) is below LO ({lo})")
        return cls(name, lo, hi)

    @property
    def placeholder(self) -> str:
        return "{" + self.name + "}"


def parse_step(text: str) -> Tuple[str, int]:
    """`--step`: "pow2", "linear" (1) or a whole number N (LO, LO+N, ...).
    Returns (kind, increment)."""
    value = text.strip().lower()
    if value == "pow2":
        return "pow2", 0
    if value == "linear":
        return "linear", 1
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise FitError(f"--step {text!r}: expected pow2, linear or a whole "
                       "number of at least 1 (the increment)")
    return "linear", n


def grid(vary: Vary, step: str = "pow2", increment: int = 1) -> List[int]:
    """The candidate values, ascending. pow2: the powers of two from LO to
    HI, with LO and HI themselves when they are not powers of two;
    linear: LO, LO+increment, ... and HI."""
    if step == "pow2":
        found = {vary.lo, vary.hi}
        p = 1
        while p <= vary.hi:
            if p >= vary.lo:
                found.add(p)
            p *= 2
        return sorted(found)
    if step != "linear" or increment < 1:
        raise FitError(f"unknown step {step!r} (increment {increment})")
    values = list(range(vary.lo, vary.hi + 1, increment))
    if values[-1] != vary.hi:
        values.append(vary.hi)
    return values


def substitute(argv: Sequence[str], vary: Vary, value: int) -> List[str]:
    """The command with every {NAME} replaced by `value`. FitError when no
    argument holds {NAME}."""
    if not any(vary.placeholder in a for a in argv):
        raise FitError(
            f"the command has no {vary.placeholder}: write it where the "
            f"value goes, e.g. `jaxlake fit --vary {vary.name}=1..64 -- "
            f"python train.py --{vary.name} {vary.placeholder}`")
    return [a.replace(vary.placeholder, str(value)) for a in argv]


# -- one policy at one value -------------------------------------------------

SHORTAGE = "shortage"
FRAGMENTATION = "fragmentation"
#: A real run's verdict: XLA's own allocator ran out of memory (whether
#: for a shortage or for fragmentation, a real run does not say).
OUT_OF_MEMORY = "out of memory"
#: `jaxlake fit --beside`: the first job failed (a model: it does not fit
#: its capacity alone; a real run: it failed while the candidate ran);
#: `message` says how.
FIRST_JOB = "first job"


@dataclasses.dataclass
class Probe:
    """One policy's replay of one value's trace under the capacity."""

    value: int
    fits: bool
    capacity: int           # bytes per device the policy had
    peak_live: int          # the trace's (largest device's)
    peak_reserved: int      # the policy's under the capacity
    # Why it failed (None when it fits): SHORTAGE when the trace's peak
    # live bytes alone exceed the capacity, FRAGMENTATION when they fit but
    # the policy could not serve a request; then the request.
    reason: Optional[str] = None
    request_size: Optional[int] = None
    request_kind: Optional[str] = None
    live_at_failure: Optional[int] = None
    reserved_at_failure: Optional[int] = None
    # Set when the value's recording itself ran out of memory, on a fake
    # device of this many bytes (several times the GPU's): its peak live
    # bytes are unknown and above every capacity (peak_live is then 0).
    beyond: Optional[int] = None
    # A real run of the program (real.py), not a replay: its verdict is the
    # program's own; peak_live and peak_reserved are unknown (0), and
    # `message` is XLA's out-of-memory line when it failed.
    real: bool = False
    message: Optional[str] = None

    @property
    def utilisation(self) -> float:
        return self.peak_live / self.peak_reserved if self.peak_reserved \
            else 0.0

    @property
    def headroom(self) -> int:
        return self.capacity - self.peak_reserved

    def describe_failure(self) -> str:
        if self.fits:
            return ""
        if self.reason == FIRST_JOB:
            return f"the first job failed: {self.message or '?'}"
        if self.reason == OUT_OF_MEMORY:
            request = (f" (a request of {format_size(self.request_size)})"
                       if self.request_size else "")
            return f"out of memory in a real run{request}"
        if self.reason == SHORTAGE and self.beyond is not None:
            request = (f" (a request of {format_size(self.request_size)})"
                       if self.request_size else "")
            return (f"shortage: the program ran out of a "
                    f"{format_size(self.beyond)} fake device{request}, so "
                    f"its peak live > capacity {format_size(self.capacity)}")
        if self.reason == SHORTAGE:
            return (f"shortage: peak live {format_size(self.peak_live)} > "
                    f"capacity {format_size(self.capacity)}")
        kind = f" {self.request_kind}" if self.request_kind else ""
        return (f"fragmentation: a{kind} request of "
                f"{format_size(self.request_size or 0)} failed with "
                f"{format_size(self.live_at_failure or 0)} live, "
                f"{format_size(self.reserved_at_failure or 0)} reserved")

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "value": self.value, "fits": self.fits,
            "capacity": self.capacity, "peak_live": self.peak_live,
            "peak_reserved": self.peak_reserved,
            "utilisation": self.utilisation, "headroom": self.headroom}
        if self.real:
            out.update(peak_live=None, peak_reserved=None, utilisation=None,
                       headroom=None, real_run=True)
            if self.reason == OUT_OF_MEMORY:
                out["request"] = {"size": self.request_size}
                out["message"] = self.message
        if self.reason == FIRST_JOB:
            out["message"] = self.message
        if self.beyond is not None:
            out["peak_live"] = None
            out["utilisation"] = None
            out["ran_out_of_fake_device"] = self.beyond
            out["request"] = {"size": self.request_size}
        if not self.fits:
            out["reason"] = self.reason
            if self.reason == FRAGMENTATION:
                out["request"] = {"size": self.request_size,
                                  "kind": self.request_kind,
                                  "live": self.live_at_failure,
                                  "reserved": self.reserved_at_failure}
        return out


def classify(peak_live: int, capacity: int) -> str:
    """SHORTAGE when the live bytes alone exceed the capacity, else
    FRAGMENTATION (the live bytes fit; the policy's layout did not)."""
    return SHORTAGE if peak_live > capacity else FRAGMENTATION


# -- the search --------------------------------------------------------------


@dataclasses.dataclass
class PolicyFit:
    """One policy's answer."""

    policy: str
    capacity: int
    largest: Optional[int]            # None: not even the smallest value
    at_largest: Optional[Probe]
    next_value: Optional[int]         # the next grid value (None: grid end)
    next_failure: Optional[Probe]     # its failing probe
    probed: List[int]                 # values this policy replayed, in order


def search_policy(values: Sequence[int], probe: Callable[[int], Probe],
                  policy: str, capacity: int) -> PolicyFit:
    """The largest of `values` (ascending) for which probe(value).fits:
    exponential search over grid indices 0, 1, 3, 7, ... then binary
    search. Probes values only through `probe` (which caches traces)."""
    probed: List[int] = []
    results: Dict[int, Probe] = {}

    def fits(index: int) -> bool:
        value = values[index]
        if value not in results:
            results[value] = probe(value)
            probed.append(value)
        return results[value].fits

    n = len(values)
    good = -1     # largest index known to fit
    bad = n       # smallest index known to fail (n: none)
    step = 1
    index = 0
    while index < n:
        if fits(index):
            good = index
            index = good + step
            step *= 2
        else:
            bad = index
            break
    else:
        if good < n - 1 and not fits(n - 1):  # the exponent jumped past
            bad = n - 1                      # the end: try the last value
        elif good < n - 1:
            good = n - 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    largest = values[good] if good >= 0 else None
    at_largest = results[values[good]] if good >= 0 else None
    next_value = values[bad] if bad < n else None
    next_failure = results[values[bad]] if bad < n else None
    return PolicyFit(policy, capacity, largest, at_largest, next_value,
                     next_failure, probed)


def gain(jaxlake: Optional[int], peer: Optional[int]) -> Optional[float]:
    """jaxlake's largest value over a peer's, as a percentage gain (None
    when the peer fits nothing)."""
    if jaxlake is None or not peer:
        return None if not peer else -100.0
    return 100.0 * (jaxlake - peer) / peer
