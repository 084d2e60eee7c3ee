"""The markdown table of docs/benchmarks.md from table.sh's JSON reports.

    python benchmarks/fit/table.py [OUT]      (default: ./jaxlake-fit)

One row per (row, GPU): each policy's largest batch, with "s" (shortage)
or "f" (fragmentation) for why the next value fails; then whether jaxlake's
is at least every peer's, and, where fragmentation limits BFC, jaxlake's
over BFC's.
"""

from __future__ import annotations

import glob
import json
import os
import sys

ORDER = ("jaxlake", "bfc", "bfc-growth", "xla-vmm", "torch",
         "torch-expandable", "gmlake")


def cell(p: dict) -> str:
    largest = "none" if p["largest"] is None else str(p["largest"])
    nf = p.get("next_failure")
    if nf is None:
        return largest + " (end)"
    return f"{largest} {nf['reason'][0]}"


def main(folder: str) -> int:
    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not files:
        print(f"no reports in {folder}", file=sys.stderr)
        return 1
    print("| row | GPU | " + " | ".join(ORDER)
          + " | jaxlake >= all | vs BFC (BFC frag.) |")
    print("|" + "---|" * (len(ORDER) + 4))
    for path in files:
        data = json.load(open(path, encoding="utf-8"))
        name = os.path.basename(path)[:-len(".json")]
        row, gpu = name.rsplit("-", 1)
        pol = data["policies"]
        lake = pol["jaxlake"]["largest"] or 0
        peers = [pol[n]["largest"] or 0 for n in ORDER[1:] if n in pol]
        ok = "yes" if all(lake >= p for p in peers) else "**no**"
        bfc = pol.get("bfc", {})
        nf = bfc.get("next_failure") or {}
        ratio = "-"
        if nf.get("reason") == "fragmentation" and bfc.get("largest"):
            r = lake / bfc["largest"]
            ratio = f"{r:.2f}x" + ("" if r >= 1.15 else " (<1.15)")
        print(f"| {row} | {gpu} | "
              + " | ".join(cell(pol[n]) if n in pol else "-" for n in ORDER)
              + f" | {ok} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "jaxlake-fit"))
