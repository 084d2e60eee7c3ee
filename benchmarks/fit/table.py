"""The markdown table of docs/results/fit.md from table.sh's JSON reports.

    python benchmarks/fit/table.py [OUT]      (default: ./jaxlake-fit)
    python benchmarks/fit/table.py --compare RECORDER_OUT FAKE_GPU_OUT


One row per (row, GPU): each policy's largest batch, with "s" (shortage)
or "f" (fragmentation) for why the next value fails; the largest batch of
JAX's default run for real (real:jax-default, "oom": its own out-of-memory
error at the next value; from OUT/real/, table.sh with REAL=1; "not run"
where there is none); then whether jaxlake's is at least every peer's,
jaxlake's over JAX's default (its model, bfc-prealloc; "not run" where
the report has no bfc-prealloc), and, where fragmentation limits it,
jaxlake's over BFC with preallocation off (bfc).

--compare puts two engines' reports of the same rows side by side: each
policy's largest batch as "recorder / fake-gpu", whether they agree on
every policy, and the memory outside XLA's pool the fake GPU's traces
reported.
"""

from __future__ import annotations

import glob
import json
import os
import sys

ORDER = ("jaxlake", "bfc-prealloc", "bfc", "bfc-growth", "xla-vmm", "torch",
         "torch-expandable", "gmlake")
#: Column headers that say which policy is JAX's default.
HEADERS = {"bfc-prealloc": "bfc-prealloc (JAX's default, model)",
           "bfc": "bfc (prealloc. off)"}


def ratio_cell(lake: int, other: dict) -> str:
    """jaxlake's largest over `other`'s, where fragmentation limits it."""
    nf = other.get("next_failure") or {}
    if nf.get("reason") != "fragmentation" or not other.get("largest"):
        return "-"
    r = lake / other["largest"]
    return f"{r:.2f}x" + ("" if r >= 1.15 else " (<1.15)")


def cell(p: dict) -> str:
    largest = "none" if p["largest"] is None else str(p["largest"])
    nf = p.get("next_failure")
    if nf is None:
        return largest + " (end)"
    if nf["reason"] == "out of memory":
        return f"{largest} oom"
    return f"{largest} {nf['reason'][0]}"


def real_cell(folder: str, name: str) -> str:
    """JAX's default run for real, from OUT/real/<name>.json."""
    path = os.path.join(folder, "real", name + ".json")
    if not os.path.isfile(path):
        return "not run"
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    p = data["policies"].get("real:jax-default")
    return "not run" if p is None else cell(p)


def main(folder: str) -> int:
    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not files:
        print(f"no reports in {folder}", file=sys.stderr)
        return 1
    print("| row | GPU | " + " | ".join(HEADERS.get(n, n) for n in ORDER)
          + " | real:jax-default (JAX's default, real run) "
          "| jaxlake >= all | vs JAX's default (model) "
          "| vs bfc, prealloc. off (where it fragments) |")
    print("|" + "---|" * (len(ORDER) + 6))
    for path in files:
        data = json.load(open(path, encoding="utf-8"))
        name = os.path.basename(path)[:-len(".json")]
        row, gpu = name.rsplit("-", 1)
        pol = data["policies"]
        lake = pol["jaxlake"]["largest"] or 0
        peers = [pol[n]["largest"] or 0 for n in ORDER[1:] if n in pol]
        ok = "yes" if all(lake >= p for p in peers) else "**no**"
        pre = pol.get("bfc-prealloc", {})
        default = "not run" if not pre else \
            f"{lake / pre['largest']:.2f}x" if pre.get("largest") else "-"
        print(f"| {row} | {gpu} | "
              + " | ".join(cell(pol[n]) if n in pol else "-" for n in ORDER)
              + f" | {real_cell(folder, name)} | {ok} | {default} | "
              f"{ratio_cell(lake, pol.get('bfc', {}))} |")
    return 0


def _reports(folder: str) -> dict:
    return {os.path.basename(p)[:-len(".json")]:
            json.load(open(p, encoding="utf-8"))
            for p in sorted(glob.glob(os.path.join(folder, "*.json")))}


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def compare(first: str, second: str) -> int:
    a, b = _reports(first), _reports(second)
    both = [k for k in a if k in b]
    if not both:
        print(f"no row has a report in both {first} and {second}",
              file=sys.stderr)
        return 1
    e1 = a[both[0]]["engine"]
    e2 = b[both[0]]["engine"]
    print(f"| row | GPU | " + " | ".join(ORDER)
          + f" | agree | outside pool ({e2}) |")
    print("|" + "---|" * (len(ORDER) + 4))
    for key in both:
        row, gpu = key.rsplit("-", 1)
        pa, pb = a[key]["policies"], b[key]["policies"]
        cells, agree = [], True
        for n in ORDER:
            if n not in pa or n not in pb:
                cells.append("-")
                continue
            cells.append(f"{cell(pa[n])} / {cell(pb[n])}")
            agree &= pa[n]["largest"] == pb[n]["largest"]
        outs = [t.get("outside_pool") for t in b[key]["traces"]]
        known = [o for o in outs if o is not None]
        outside = ("not reported" if not known else
                   _mib(max(known)) if min(known) == max(known) else
                   f"{_mib(min(known))} to {_mib(max(known))}")
        print(f"| {row} | {gpu} | " + " | ".join(cells)
              + f" | {'yes' if agree else '**no**'} | {outside} |")
    print(f"\n(each cell: {e1} / {e2})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "jaxlake-fit"))
