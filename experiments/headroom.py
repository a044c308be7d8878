"""The headroom table: how much better than greedy search any search does, per built-in graph and target.

For every graph (default: all, the headroom suite included) greedy, beam, TASO and Tensat run through
`xrl.search.compare` (the dispatch of `xrl optimize --search M`; every result recomputed from the
returned graph, exported and checked against the original under onnxruntime), and exhaustive search
where the space is small (graphs of at most --exhaustive-max-ops ops; capped at --max-states graphs).
Then, per graph:

    greedy      greedy's speed-up over the original (the target's estimate)
    best        the best verified speed-up of any method, and which method found it (ties: the first in
                METHODS order, so greedy wins a tie and "headroom" is never credited to a tie)
    headroom    best / greedy: what a search that looks beyond the next step can still gain

Time limits per run (seconds), chosen so that the ort-cpu table of all 21 graphs finishes in about 30
minutes on a 2-core machine; `--target paper` uses the smaller ones (its candidates cost less to
enumerate, and it is the secondary table):

    ort-cpu   greedy 60, beam 15, taso 15, tensat 15, exhaustive 20 (2,000 graphs)
    paper     greedy 30, beam 10, taso 10, tensat 10, exhaustive 10

Where a time limit binds, the result depends on the machine's speed (as in compare_suite.py).

    XRL_NO_CALIBRATION=1 .venv/bin/python experiments/headroom.py --target ort-cpu \
        --out experiments/results/headroom_ort_cpu
    XRL_NO_CALIBRATION=1 .venv/bin/python experiments/headroom.py --target paper \
        --out experiments/results/headroom_paper

Writes results.csv (every run, as compare writes it), headroom.csv and headroom.md (one row per graph)
to --out, and prints the Markdown table. XRL_NO_CALIBRATION=1 makes ort-cpu use the generic cpu profile
(as the tests do), so the table does not depend on this machine's `xrl calibrate`.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from xrl.search.beam import exhaustive_runner
from xrl.search.compare import CompareConfig, RunRecord, resolve_graphs, run_compare, write_results
from xrl.search.registry import register_search

METHODS = ("greedy", "beam", "taso", "tensat", "exhaustive")  # tie order: the first listed is credited
TIME_LIMITS = {
    "ort-cpu": {"greedy": 60.0, "beam": 15.0, "taso": 15.0, "tensat": 15.0, "exhaustive": 20.0},
    "paper": {"greedy": 30.0, "beam": 10.0, "taso": 10.0, "tensat": 10.0, "exhaustive": 10.0},
}
HEADROOM_MIN = 1.10  # the bar: at least 10% above greedy
COLUMNS = ["graph", "ops", "greedy", "best", "best_method", "headroom", "exhausted", "methods_ok"]


def headroom_rows(records: Sequence[RunRecord], exhausted: dict[str, bool]) -> list[dict[str, object]]:
    """One row per graph from compare's records: greedy, the best verified result, and their ratio."""
    rows = []
    for g in dict.fromkeys(r.graph for r in records):
        ok = {r.method: r for r in records if r.graph == g and r.counted}
        greedy = ok["greedy"].speedup if "greedy" in ok else math.nan
        ranked = [m for m in METHODS if m in ok]
        best_method = max(ranked, key=lambda m: (ok[m].speedup, -ranked.index(m))) if ranked else ""
        best = ok[best_method].speedup if best_method else math.nan
        nodes = next(r.original_nodes for r in records if r.graph == g)
        runs = sum(r.graph == g for r in records)
        rows.append({"graph": g, "ops": nodes, "greedy": greedy, "best": best, "best_method": best_method,
                     "headroom": best / greedy if greedy > 0 else math.nan,
                     "exhausted": exhausted.get(g, ""), "methods_ok": f"{len(ok)}/{runs}"})
    return rows


def markdown(rows: Sequence[dict[str, object]], title: str, header: str) -> str:
    lines = [f"# {title}", "", header, "",
             "| graph | ops | greedy | best known | found by | headroom above greedy | space exhausted |",
             "|---|---:|---:|---:|---|---:|---|"]
    for r in rows:
        h = r["headroom"]
        mark = f"**{h:.3f}**" if isinstance(h, float) and h >= HEADROOM_MIN else f"{h:.3f}"
        ex = {True: "yes", False: "no", "": ""}[r["exhausted"]]
        lines.append(f"| {r['graph']} | {r['ops']} | {r['greedy']:.3f} | {r['best']:.3f} | {r['best_method']} | "
                     f"{mark} | {ex} |")
    n = sum(isinstance(r["headroom"], float) and r["headroom"] >= HEADROOM_MIN for r in rows)
    lines += ["", f"Graphs with at least {HEADROOM_MIN - 1:.0%} headroom above greedy: {n} of {len(rows)}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="ort-cpu", choices=sorted(TIME_LIMITS))
    p.add_argument("--graphs", default="all", help="graph names or a suite: xrlflow, taso, small, headroom, all")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--exhaustive-max-ops", type=int, default=60, help="exhaustive search only on graphs this small")
    p.add_argument("--max-states", type=int, default=2000, help="exhaustive search: graphs seen before it gives up")
    p.add_argument("--out", default="experiments/results/headroom")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or "greedy" not in methods:
        print(f"headroom: methods must include greedy and come from {', '.join(METHODS)}", file=sys.stderr)
        return 2

    exhausted: dict[str, bool] = {}

    def exhaustive(graph, cost_model, **kw):  # noqa: ANN001, ANN003, ANN202 - the API's runner signature
        res = exhaustive_runner(graph, cost_model, max_states=args.max_states, **kw)
        exhausted[graph.name] = bool(res.details["exhausted"])
        return res

    # the same search, with this run's cap, recording whether each graph's space was exhausted
    register_search("exhaustive", exhaustive, description="exhaustive search, recording exhaustion")
    names = resolve_graphs(args.graphs)
    limits = TIME_LIMITS[args.target]
    t0 = time.perf_counter()
    records: list[RunRecord] = []
    for name in names:
        from xrl.frontends.loader import load_model

        small = len(load_model(name, seed=args.seed).graph) <= args.exhaustive_max_ops
        mine = tuple(m for m in methods if m != "exhaustive" or small)
        config = CompareConfig(graphs=(name,), methods=mine, target=args.target, seed=args.seed,
                               method_time_limits=limits)
        for rec in run_compare(config):
            records.append(rec)
            what = f"{rec.speedup:.3f}x in {rec.time_s:.1f} s" if rec.status in ("ok", "wrong output") else rec.error
            print(f"[{time.perf_counter() - t0:6.0f} s] {rec.graph} / {rec.method}: {rec.status}: {what}",
                  file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0
    rows = headroom_rows(records, exhausted)
    out = Path(args.out)
    header = (f"Target `{args.target}` (generic profile where XRL_NO_CALIBRATION=1); seed {args.seed}; time limits "
              "per run: " + ", ".join(f"{m} {limits[m]:g} s" for m in methods)
              + f"; exhaustive on graphs of at most {args.exhaustive_max_ops} ops, capped at {args.max_states} "
              f"graphs. Every result verified against the original under onnxruntime. Whole run: {elapsed / 60:.1f} "
              f"min. Regenerate with `XRL_NO_CALIBRATION=1 .venv/bin/python experiments/headroom.py --target "
              f"{args.target} --out {args.out}`.")
    write_results(records, out, title=f"Headroom runs, target {args.target}", header=header)
    with (out / "headroom.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    text = markdown(rows, f"Headroom above greedy, target {args.target}", header)
    (out / "headroom.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
