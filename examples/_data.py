"""Training text read at run time from the Python standard library, at
byte level: its source (pre-training) or its docstrings (fine-tuning).
Nothing is downloaded."""

from __future__ import annotations

import glob
import os
import re
import sysconfig
from typing import List, Optional, Sequence

import numpy as np


def _stdlib_files() -> List[str]:
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"),
                                 recursive=True)):
        rel = os.path.relpath(path, root)
        if rel.startswith(("site-packages", "test" + os.sep, "idlelib")):
            continue
        files.append(path)
    if not files:
        raise SystemExit(f"no Python source found under {root} to train on")
    return files


_TRIPLE = re.compile(rb'"""(.*?)"""', re.S)


def corpus(kind: str = "source", max_bytes: int = 4 << 20) -> np.ndarray:
    """Bytes of the standard library's source ("source") or of its
    docstrings ("docstrings"), as uint8, in a fixed order."""
    chunks: List[bytes] = []
    total = 0
    for path in _stdlib_files():
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if kind == "docstrings":
            # Triple-quoted strings: the docstrings, near enough, found far
            # faster than by parsing every module.
            data = b"\n\n".join(m.strip() for m in _TRIPLE.findall(data))
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return np.frombuffer(b"\n".join(chunks)[:max_bytes], dtype=np.uint8)


class Batches:
    """Deterministic batches: batch (step, micro) is a function of the seed,
    so a resumed run sees exactly the batches the first run would have."""

    def __init__(self, data: np.ndarray, batch: int, seq_lens: Sequence[int],
                 seed: int) -> None:
        self.data = data
        self.batch = batch
        self.seq_lens = list(seq_lens)
        self.seed = seed

    def seq_len(self, step: int) -> int:
        if len(self.seq_lens) == 1:
            return self.seq_lens[0]
        rng = np.random.default_rng([self.seed, step, 7])
        return self.seq_lens[int(rng.integers(len(self.seq_lens)))]

    def get(self, step: int, micro: int = 0, rows: Optional[int] = None
            ) -> np.ndarray:
        length = self.seq_len(step)
        rows = rows or self.batch
        rng = np.random.default_rng([self.seed, step, micro])
        starts = rng.integers(0, len(self.data) - length - 1, size=rows)
        return np.stack([self.data[s:s + length + 1] for s in starts]
                        ).astype(np.int32)
