"""What the recorder reads from XLA: the temporaries of a compiled module as
logical buffers with live ranges (from XLA's *-buffer-assignment.txt and
*-live-range.txt dumps, the per-tensor variant), and the aliases and output
shapes of an HLO module header; the bytes of device 0's shard of an array."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple


# -- XLA dumps (per-tensor variant) ------------------------------------------

_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
_VALUE = re.compile(
    r"^\s*value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")
_RANGE = re.compile(r"^\s*(\S+):(\d+)-(\d+)\s*$")
_MAX = re.compile(r"HloLiveRange \(max (\d+)\)")


@dataclasses.dataclass
class LogicalBuffer:
    """One logical buffer of a compiled module's temp memory."""

    name: str
    size: int
    start: int      # schedule position where it is defined
    end: int        # last position that uses it (inclusive)


def parse_buffer_assignment(assignment: str, live_range: str
                            ) -> List[LogicalBuffer]:
    """The temporaries of one launch as separate tensors, from XLA's
    *-buffer-assignment.txt and *-live-range.txt dumps.

    Every value of the preallocated temp allocation is one tensor; so is
    every value of an output allocation that dies before the end of the
    program (XLA reuses an output's buffer for earlier temporaries).
    Parameters, the outputs themselves, thread-local scratch and tuple
    index tables are left out (the per-execution model covers them)."""
    match = _MAX.search(live_range)
    end_of_program = int(match.group(1)) if match else 0
    ranges: Dict[str, Tuple[int, int]] = {}
    in_ranges = False
    for line in live_range.splitlines():
        if line.strip() == "BufferLiveRange:":
            in_ranges = True
            continue
        if in_ranges:
            m = _RANGE.match(line)
            if not m:
                if line.strip() and not line.startswith("    "):
                    break
                if line.strip().startswith("Live ranges"):
                    break
                continue
            ranges[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    buffers: List[LogicalBuffer] = []
    kind = ""
    for line in assignment.splitlines():
        m = _ALLOCATION.match(line)
        if m:
            attrs = m.group(3)
            if "parameter" in attrs or "thread-local" in attrs \
                    or "constant" in attrs:
                kind = "skip"
            elif "preallocated-temp" in attrs:
                kind = "temp"
            elif "maybe-live-out" in attrs or "output shape" in attrs:
                kind = "out"
            else:
                kind = "temp"
            continue
        v = _VALUE.match(line)
        if not v or kind == "skip":
            continue
        name, size, shape = v.group(1), int(v.group(2)), v.group(4)
        if shape.startswith("(") or size <= 0:
            continue  # a tuple index table
        key = name if name.endswith("}") else name + "{}"
        if key not in ranges:
            continue
        start, end = ranges[key]
        if kind == "out" and end >= end_of_program:
            continue  # the output itself
        buffers.append(LogicalBuffer(name, size, start, end))
    return buffers


# -- compiled executables ----------------------------------------------------

_ALIAS_HEADER = re.compile(r"input_output_alias=\{(.*?)\}, [a-z_]+=")
_ALIAS_ENTRY = re.compile(
    r"\{([\d,\s]*)\}:\s*\((\d+),\s*\{([\d,\s]*)\},\s*(?:may|must)-alias\)")


@dataclasses.dataclass
class Executable:
    """What the recorder knows about one compiled function signature."""

    name: str
    temp: int                       # bytes of the launch's temp buffer
    out_sizes: List[int]            # device-0 bytes of each flat output
    aliases: Dict[int, int]         # flat output index -> flat arg index
    tuple_bytes: int                # the output tuple table (0: none)
    out_info: Any                   # pytree of ShapeDtypeStruct (GPU)
    donated: Tuple[int, ...] = ()   # flat indices of donated arguments
    tensors: Optional[List[LogicalBuffer]] = None  # per-tensor variant
    stats: Optional[Any] = None     # memory_analysis()


def _hlo_aliases(hlo_header: str) -> List[Tuple[int, int]]:
    """(output index, parameter number) pairs of an HLO module header."""
    m = _ALIAS_HEADER.search(hlo_header)
    if not m:
        return []
    pairs = []
    for out, param, param_index in _ALIAS_ENTRY.findall(m.group(1)):
        out_index = [int(x) for x in out.replace(" ", "").split(",") if x]
        index = [int(x) for x in param_index.replace(" ", "").split(",")
                 if x]
        if len(out_index) > 1:
            continue  # nested tuples: jax does not produce them
        number = int(param)
        if index:  # tuple_args: every argument in one tuple parameter
            number = index[0]
        pairs.append((out_index[0] if out_index else 0, number))
    return pairs


_HLO_ARRAY = re.compile(r"\b[a-z]+\d*\[([\d,]*)\]")


def _hlo_output_shapes(hlo_header: str) -> List[Tuple[int, ...]]:
    """Shapes of the entry computation's outputs, from its layout."""
    m = re.search(r"entry_computation_layout=\{\(.*?\)->(.*?)\}, [a-z_]+=",
                  hlo_header)
    if not m:
        return []
    return [tuple(int(d) for d in dims.split(",") if d)
            for dims in _HLO_ARRAY.findall(m.group(1))]


def _align(hlo: List[Tuple[int, ...]], ours: List[Tuple[int, ...]]
           ) -> Dict[int, int]:
    """Executable output index -> jax output index, in order, by shape."""
    if len(hlo) == len(ours):
        return {i: i for i in range(len(hlo))}
    where, j = {}, 0
    for i, shape in enumerate(hlo):
        while j < len(ours) and ours[j] != shape:
            j += 1
        if j == len(ours):
            break
        where[i] = j
        j += 1
    return where


def _itemsize(dtype: Any) -> int:
    import numpy as np
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        return int(getattr(dtype, "itemsize", 4))


def shard_bytes(shape: Sequence[int], dtype: Any, sharding: Any) -> int:
    """Bytes of device 0's shard of an array."""
    shard = tuple(shape)
    if sharding is not None and hasattr(sharding, "shard_shape"):
        try:
            shard = tuple(sharding.shard_shape(tuple(shape)))
        except Exception:  # uneven: XLA pads the last shard
            spec = getattr(sharding, "spec", None)
            mesh = getattr(sharding, "mesh", None)
            if spec is not None and mesh is not None:
                dims = list(shape)
                for i, axes in enumerate(tuple(spec)[:len(dims)]):
                    if axes is None:
                        continue
                    names = axes if isinstance(axes, tuple) else (axes,)
                    parts = 1
                    for a in names:
                        parts *= mesh.shape[a]
                    dims[i] = -(-dims[i] // parts)
                shard = tuple(dims)
    n = 1
    for d in shard:
        n *= int(d)
    return n * _itemsize(dtype)


__all__ = ["Executable", "LogicalBuffer", "parse_buffer_assignment",
           "shard_bytes"]
