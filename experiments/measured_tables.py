"""The searches and the RL agent under the roofline and under the measured kernel cost, every result timed.

For each graph, each search (greedy, beam, TASO, Tensat, and the shipped policy's guided search) runs
under each cost (`roofline`: the estimate of the kernels onnxruntime runs; `target`: the same kernels
timed on this machine, the default), with no pre-pass and no guard, within `--time-limit` seconds.
Every distinct result is then timed end to end against the original and an A/A copy of it, in
alternating rounds with fresh onnxruntime sessions (`xrl.cost.guard.measure_guard`: one thread, the
calling thread's CPU time), so every speed-up in the table is measured; the search's own estimate is
shown beside it, labelled.

Headroom: a graph keeps measured headroom when the best measured result beats greedy's (under the
default, measured cost) by 10% or more, beyond both intervals.

    .venv/bin/python experiments/measured_tables.py [--graphs headroom] [--methods greedy,beam,taso,tensat,rl]
        [--costs roofline,target] [--time-limit 10] [--rounds 8] [--out experiments/results/measured_tables]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

from xrl.api import measure_model
from xrl.cost import get_cost_model
from xrl.cost.guard import GuardCandidate, measure_guard
from xrl.frontends.loader import load_model
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.frontends.verify import compare_models
from xrl.search.compare import resolve_graphs
from xrl.search.registry import run_search
from xrl.stats import geomean

METHODS = ("greedy", "beam", "taso", "tensat", "rl")
LABEL = {"roofline": "roofline", "target": "measured"}
HEADROOM = 1.10


def run_graph(name: str, args, timer) -> list[dict]:  # noqa: ANN001
    loaded = load_model(name)
    graph = loaded.graph
    rows, cands = [], []
    for cost_name in args.costs:
        cost = get_cost_model(cost_name, device="cpu", target="ort-cpu")
        for method in args.methods:
            t0 = time.perf_counter()
            options = {"mode": "guided"} if method == "rl" else {}
            out = run_search(method, graph, cost, seed=args.seed, steps=None, time_limit=args.time_limit,
                             options=options)
            # the file as it would be written: exported, verified, read back
            exported = to_onnx(out.graph.validate())
            ok = compare_models(loaded.reference, exported, seed=args.seed, trials=1).ok
            written = from_onnx(exported, name=graph.name)
            label = f"{method}/{cost_name}"
            rows.append({"graph": name, "method": method, "cost": cost_name, "verified": ok,
                         "estimate": cost.cost(graph) / cost.cost(written), "rewrites": len(out.steps),
                         "search_s": time.perf_counter() - t0, "label": label, "hash": written.canonical_hash})
            if ok:
                cands.append(GuardCandidate(label, written))
    res = measure_guard(timer, graph, cands, rounds=args.rounds, max_rounds=args.rounds, budget_s=args.budget)
    by_hash: dict[str, str] = {}
    for c in cands:  # the guard times each distinct graph once, under the first label that reached it
        by_hash.setdefault(c.graph.canonical_hash, c.label)
    for r in rows:
        timed = res.measured.get(by_hash.get(r["hash"], ""))  # identical results share one timing
        if r["hash"] == graph.canonical_hash:
            r.update(measured=1.0, low=1.0, high=1.0, verdict="unchanged")
        elif timed is not None:
            low, high = timed.interval
            r.update(measured=timed.speedup, low=low, high=high, verdict=timed.verdict, aa_noise=timed.noise)
        else:
            r.update(measured=float("nan"), low=float("nan"), high=float("nan"), verdict="not verified")
    return rows


def render(rows: list[dict], args, seconds: float) -> str:
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    cell = {(r["graph"], r["method"], r["cost"]): r for r in rows}
    head = [f"{m} ({LABEL[c]})" for c in args.costs for m in args.methods]
    lines = ["# Every search under the roofline and under the measured kernel cost; every result timed",
             "", f"`experiments/measured_tables.py --graphs {args.graphs} --methods {','.join(args.methods)} "
             f"--time-limit {args.time_limit} --rounds {args.rounds}` ({seconds / 60:.1f} min). Each cell: the "
             "measured speed-up over the original (onnxruntime, CPU, 1 thread, interleaved fresh sessions, A/A "
             "control), the search's own estimate in brackets; * marks a result measured slower than the original.",
             "", "| graph | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for g in graphs:
        out = []
        for c in args.costs:
            for m in args.methods:
                r = cell.get((g, m, c))
                if r is None:
                    out.append("-")
                    continue
                slow = "*" if r["verdict"] == "slower" else ""
                out.append(f"{r['measured']:.3f}{slow} ({r['estimate']:.2f})")
        lines.append(f"| {g} | " + " | ".join(out) + " |")
    lines += ["", "| method | cost | geomean measured | geomean estimate | measured slower than the original | "
              "best measured on |", "|---|---|---:|---:|---:|---:|"]
    best = {g: max((r["measured"] for r in rows if r["graph"] == g and math.isfinite(r["measured"])), default=1.0)
            for g in graphs}
    for c in args.costs:
        for m in args.methods:
            rs = [cell[(g, m, c)] for g in graphs if (g, m, c) in cell]
            slower = sum(r["verdict"] == "slower" for r in rs)
            on_best = sum(r["measured"] >= best[r["graph"]] / 1.02 for r in rs)  # within 2% of the best measured
            lines.append(f"| {m} | {LABEL[c]} | {geomean([r['measured'] for r in rs]):.3f} | "
                         f"{geomean([r['estimate'] for r in rs]):.3f} | {slower}/{len(rs)} | {on_best}/{len(rs)} |")
    base = "target" if "target" in args.costs else args.costs[0]
    kept = []
    for g in graphs:
        greedy = cell.get((g, "greedy", base))
        top = max((r for r in rows if r["graph"] == g and math.isfinite(r["measured"])), key=lambda r: r["measured"],
                  default=None)
        if greedy and top and top["measured"] >= greedy["measured"] * HEADROOM and top["low"] > greedy["high"]:
            kept.append(f"{g} ({top['label']}: {top['measured'] / greedy['measured']:.2f}x greedy's)")
    lines += ["", f"Measured headroom (best measured result >= {HEADROOM:.2f}x greedy's under the {LABEL[base]} cost, "
              f"beyond both intervals): {len(kept)} of {len(graphs)} graphs" + (": " + "; ".join(kept) if kept else ""),
              ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default="headroom")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--costs", default="roofline,target")
    p.add_argument("--time-limit", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="experiments/results/measured_tables")
    args = p.parse_args(argv)
    args.methods, args.costs = args.methods.split(","), args.costs.split(",")
    names = resolve_graphs(args.graphs)
    timer = measure_model("ort", "cpu", repeats=args.repeats, warmup=2, threads=1)
    rows: list[dict] = []
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in dict.fromkeys(names):
        rows += run_graph(name, args, timer)
        print(f"{name} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        with open(out / "results.csv", "w", newline="") as f:  # after every graph: a long run keeps its rows
            keys = list(dict.fromkeys(k for r in rows for k in r))
            w = csv.DictWriter(f, keys)
            w.writeheader()
            w.writerows(rows)
    report = render(rows, args, time.perf_counter() - t0)
    (out / "measured_tables.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
