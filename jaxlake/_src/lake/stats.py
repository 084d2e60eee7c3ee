"""Stats: a snapshot of a lake's statistics.

The fields mirror the C++ declaration lists (JAXLAKE_GAUGES and
JAXLAKE_COUNTERS in cc/stats/stats.h): each gauge `name` gives `name` (its
current value) and `name_peak`, each counter gives `name`. They are written
out here so that the type is visible to readers and type checkers; a test
pins them to jaxlake._core.gauge_names() and counter_names().
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Dict, Mapping, Tuple


@dataclasses.dataclass(frozen=True)
class Stats:
    """A snapshot of a lake's statistics (Lake.stats())."""

    # Gauges: current value, peak.
    bytes_in_use: int
    bytes_in_use_peak: int
    bytes_in_use_rounded: int
    bytes_in_use_rounded_peak: int
    bytes_reserved: int
    bytes_reserved_peak: int
    bytes_small_reserved: int
    bytes_small_reserved_peak: int
    stitched_bytes: int
    stitched_bytes_peak: int
    segments: int
    segments_peak: int
    live_allocations: int
    live_allocations_peak: int
    unreleased: int
    unreleased_peak: int
    bytes_unreleased: int
    bytes_unreleased_peak: int
    # Counters.
    allocs: int
    frees: int
    alloc_small: int
    alloc_fit: int
    alloc_split: int
    alloc_stitch_reuse: int
    alloc_stitch: int
    alloc_stitch_grow: int
    alloc_grow: int
    stitched_bytes_total: int
    stitch_pieces: int
    stitch_evictions: int
    segments_released: int
    reclaims: int
    event_waits: int
    ooms: int
    driver_errors: int
    # Driver calls made so far, by kind (see jaxlake._core.call_names()).
    driver_calls: Mapping[str, int]

    @classmethod
    def from_core(cls, raw: Mapping[str, Any]) -> "Stats":
        """Builds a Stats from jaxlake._core.Lake.stats()."""
        fields: Dict[str, Any] = {}
        for name, (current, peak) in raw["gauges"].items():
            fields[name] = current
            fields[name + "_peak"] = peak
        fields.update(raw["counters"])
        fields["driver_calls"] = types.MappingProxyType(
            dict(raw["driver_calls"]))
        return cls(**fields)

    @property
    def utilisation(self) -> float:
        """Peak bytes in use / peak physical bytes reserved (1.0 before
        anything was reserved)."""
        if self.bytes_reserved_peak == 0:
            return 1.0
        return self.bytes_in_use_peak / self.bytes_reserved_peak

    @property
    def fragmentation(self) -> float:
        """1 - utilisation: the share of the peak reservation never used."""
        return 1.0 - self.utilisation

    @property
    def waste(self) -> int:
        """Peak physical bytes reserved - peak bytes in use."""
        return self.bytes_reserved_peak - self.bytes_in_use_peak

    def as_dict(self) -> Dict[str, Any]:
        """The fields as a plain dict (JSON-ready)."""
        out = {f.name: getattr(self, f.name)
               for f in dataclasses.fields(self)}
        out["driver_calls"] = dict(self.driver_calls)
        return out

    def __reduce__(self) -> Tuple[Any, ...]:
        # The read-only driver_calls view does not pickle; a plain copy does.
        return (_stats_from_dict, (self.as_dict(),))


def _stats_from_dict(fields: Dict[str, Any]) -> Stats:
    """Stats.__reduce__'s inverse."""
    fields = dict(fields)
    fields["driver_calls"] = types.MappingProxyType(
        dict(fields["driver_calls"]))
    return Stats(**fields)
