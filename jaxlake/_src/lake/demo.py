"""`jaxlake demo`: stitching shown with real bytes on the host backend.

A 64 MiB lake of 2 MiB chunks is filled with eight 8 MiB blocks, each
holding its own byte; every other block is freed, so 32 MiB is free but no
free block is larger than 8 MiB. A 24 MiB request is then served by
stitching: freed blocks are mapped, in order, into one new virtual range,
without reserving one more physical byte. Bytes written through the
stitched address are read back through the freed blocks' own (primary)
addresses, and the live blocks keep their bytes. Any fact that fails makes
the command exit with status 1.
"""

from __future__ import annotations

import ctypes
from typing import Dict, List, TextIO, Tuple

from jaxlake._src.errors import InvariantError, JaxlakeError
from jaxlake._src.lake.lake import Lake
from jaxlake._src.options import MIB, format_size

CHUNK = 2 * MIB
BLOCK = 8 * MIB
BLOCKS = 8
CAPACITY = BLOCKS * BLOCK
REQUEST = 24 * MIB
STITCH_BYTE = 0xA0  # chunk k of the stitched range holds STITCH_BYTE + k


def _block_byte(i: int) -> int:
    return 0x10 + i


def _filled_with(address: int, size: int, byte: int) -> bool:
    return ctypes.string_at(address, size) == bytes([byte]) * size


def run(out: TextIO) -> int:
    """Runs the demo, printing to `out`; returns the exit status."""
    # Every option the demo relies on is given, so that JAXLAKE_*
    # environment variables cannot change its course.
    lake = Lake("host", capacity=CAPACITY, granularity=CHUNK,
                device_memory=4 * CAPACITY, small_limit=MIB, stitch=True,
                stitch_min=0, max_pieces=0)

    blocks = [lake.allocate(BLOCK) for _ in range(BLOCKS)]
    for i, address in enumerate(blocks):
        ctypes.memset(address, _block_byte(i), BLOCK)
    freed = list(range(1, BLOCKS, 2))
    live = list(range(0, BLOCKS, 2))
    for i in freed:
        lake.free(blocks[i])
    before = lake.stats()
    largest_free = BLOCK  # the freed blocks lie in separate segments

    try:
        address, state = lake.allocate_with_state(REQUEST)
    except JaxlakeError as e:
        print(f"FAILED: the {format_size(REQUEST)} request was refused: {e}",
              file=out)
        return 1
    after = lake.stats()

    # Write through the stitched address, one distinct byte per chunk ...
    nchunks = REQUEST // CHUNK
    for k in range(nchunks):
        ctypes.memset(address + k * CHUNK, STITCH_BYTE + k, CHUNK)
    # ... and find every chunk again through the freed blocks' addresses
    # (still mapped there, unless the lake gave a segment back).
    found: Dict[int, Tuple[int, int]] = {}  # stitched chunk -> (block, chunk)
    kept = after.segments == before.segments
    for i in freed if kept else []:
        for j in range(BLOCK // CHUNK):
            where = blocks[i] + j * CHUNK
            first = ctypes.string_at(where, 1)[0]
            k = first - STITCH_BYTE
            if 0 <= k < nchunks and _filled_with(where, CHUNK, first):
                found[k] = (i, j)
    intact = [i for i in live if _filled_with(blocks[i], BLOCK, _block_byte(i))]
    try:
        lake.check()
        checked = "passed"
    except InvariantError as e:
        checked = f"FAILED: {e}"

    calls = {name: after.driver_calls[name] - before.driver_calls[name]
             for name in after.driver_calls}
    used_blocks = sorted({i for i, _ in found.values()})
    rows: List[Tuple[str, str, str]] = [
        ("reserved before the request", format_size(before.bytes_reserved),
         ""),
        ("reserved after the request", format_size(after.bytes_reserved),
         _ok(after.bytes_reserved == before.bytes_reserved, "no growth")),
        ("largest free block", format_size(largest_free), ""),
        ("request", format_size(REQUEST),
         _ok(REQUEST > largest_free, "larger than any free block")),
        ("served as", state, _ok(state == "stitch", "a new stitch")),
        ("new physical handles (create)", str(calls["create"]),
         _ok(calls["create"] == 0, "none")),
        ("driver calls of the stitch", ", ".join(
            f"{name} {n}" for name, n in calls.items() if n), ""),
        ("stitched chunks read back", f"{len(found)} of {nchunks}",
         _ok(len(found) == nchunks and len(set(found.values())) == nchunks,
             "through blocks " + ", ".join(map(str, used_blocks)))),
        ("live blocks intact", f"{len(intact)} of {len(live)}",
         _ok(len(intact) == len(live), "blocks " + ", ".join(map(str, live)))),
        ("check()", checked, _ok(checked == "passed", "invariants hold")),
    ]

    lake.free(address)
    for i in live:
        lake.free(blocks[i])
    lake.check()

    print("jaxlake demo: virtual memory stitching on the host backend "
          "(real memory)\n", file=out)
    print(f"  lake: capacity {format_size(CAPACITY)}, chunks of "
          f"{format_size(CHUNK)}", file=out)
    print(f"  1. allocate {BLOCKS} blocks of {format_size(BLOCK)}, each "
          "filled with its own byte (the lake is full)", file=out)
    print(f"  2. free blocks {', '.join(map(str, freed))}: "
          f"{format_size(len(freed) * BLOCK)} free, in blocks of "
          f"{format_size(BLOCK)}", file=out)
    print(f"  3. allocate {format_size(REQUEST)}, more than any free block",
          file=out)
    print("  4. write through the new address, read back through the freed "
          "blocks' own addresses\n", file=out)
    width = max(len(r[0]) for r in rows) + 2
    value_width = max(len(r[1]) for r in rows) + 2
    for name, value, verdict in rows:
        print(f"  {name:<{width}}{value:<{value_width}}{verdict}".rstrip(),
              file=out)
    failed = [r[0] for r in rows if r[2].startswith("FAIL")]
    print("", file=out)
    if failed:
        print("FAILED: " + "; ".join(failed), file=out)
        return 1
    print("all facts hold: the request was served from scattered free "
          "memory, without new physical memory", file=out)
    return 0


def _ok(good: bool, what: str) -> str:
    return ("ok   " if good else "FAIL ") + what
