"""The comparison table of docs/results.md: results.csv of `xrl compare` / compare_suite.py as one row per graph.

    .venv/bin/python experiments/pivot_compare.py experiments/results/compare_suite/results.csv
"""

from __future__ import annotations

import csv
import sys

from xrl.search.compare import METHODS
from xrl.stats import geomean


def main(path: str) -> None:
    rows = [r for r in csv.DictReader(open(path)) if r["status"] == "ok"]
    by = {(r["graph"], r["method"]): r for r in rows}
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    methods = [m for m in METHODS if any((g, m) in by for g in graphs)]
    print("| graph | original (us) | " + " | ".join(methods) + " |")
    print("|---|---:|" + "---:|" * len(methods))
    for g in graphs:
        speedups = {m: float(by[(g, m)]["speedup"]) for m in methods if (g, m) in by}
        best = max(speedups.values())
        orig = float(next(by[(g, m)] for m in methods if (g, m) in by)["original_cost"]) * 1e6
        cells = [(f"**{speedups[m]:.3f}**" if speedups[m] == best else f"{speedups[m]:.3f}") if m in speedups
                 else "failed" for m in methods]
        print(f"| {g} | {orig:.0f} | " + " | ".join(cells) + " |")
    geo = [geomean(float(by[(g, m)]["speedup"]) for g in graphs if (g, m) in by) for m in methods]
    print("| **geomean speedup** | | " + " | ".join(f"**{x:.3f}**" for x in geo) + " |")
    times = [sum(float(by[(g, m)]["time_s"]) for g in graphs if (g, m) in by) / len(graphs) for m in methods]
    print("| mean optimisation time (s) | | " + " | ".join(f"{t:.1f}" for t in times) + " |")
    verified = [f"{sum(by.get((g, m), {}).get('verified') == 'True' for g in graphs)}/{len(graphs)}" for m in methods]
    print("| outputs verified | | " + " | ".join(verified) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "experiments/results/compare_suite/results.csv")
