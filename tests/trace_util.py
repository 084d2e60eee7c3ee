"""What the trace file and replay tests share: a hand-written trace file
and its event lines."""

from __future__ import annotations

import json
import pathlib
from typing import List

MIB = 1 << 20


def write(path: pathlib.Path, lines: List[str], header: str = "") -> str:
    head = header or json.dumps({"format": "jaxlake-trace", "version": 1,
                                 "name": "hand", "devices": 1,
                                 "source": "test", "meta": {}})
    path.write_text(head + "\n" + "".join(line + "\n" for line in lines))
    return str(path)


def alloc(i: int, size: int, t: int = 0, **kw: object) -> str:
    return json.dumps({"t": t, "op": "alloc", "id": i, "size": size, **kw})


def free(i: int, t: int = 0, **kw: object) -> str:
    return json.dumps({"t": t, "op": "free", "id": i, **kw})
