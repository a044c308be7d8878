"""Rewrite-engine benchmark: candidate enumeration speed, the deep-copy baseline, and greedy search.

For every built-in graph: candidates under the full verified rule set; the time to enumerate them all
(median of --repeats, after one warm-up call and the graph's first canonical hash, which digests the
weights once); candidates per second; the time to also build every candidate's graph (`.graph`,
structure-shared, new weights computed); the X-RLflow-style baseline of a deep copy of the graph per
candidate with the rewrite then applied to the copy (timed on --sample candidates, scaled to all),
and the speed ratio; then greedy search to convergence under the analytic cost model.

    .venv/bin/python experiments/bench_rewrite.py [--graphs bert,inception_v3] [--repeats 5]
                                                  [--sample 10] [--device h100] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

from xrl import graphs
from xrl.cost import get_cost_model
from xrl.frontends.onnx_io import from_onnx
from xrl.rewrite import Candidate, RewriteEngine, load_rules
from xrl.rewrite.candidate import WEIGHT_CACHE
from xrl.rewrite.rules import parse_rule_files
from xrl.search.greedy import greedy_search

HEADERS = ["graph", "ops", "candidates", "enumerate ms", "cand/s", "+ build all ms", "deep-copy ms (est.)",
           "speed-up vs copy", "greedy s", "greedy steps", "greedy speedup"]


def deep_copy_apply(cand: Candidate):
    """The baseline: a whole new graph per candidate (deep copy), then the rewrite applied to it."""
    g = copy.deepcopy(cand.parent)
    return g.replace(remove=[n.name for n in cand.removed], add=cand.added, rename=cand.rename,
                     new_types=cand.new_types, new_weights=cand.weight_arrays(),
                     new_digests={w: cand.digests[w] for w in cand.weights})


def bench_graph(name: str, engine: RewriteEngine, cost_model, repeats: int, sample: int) -> list:
    graph = from_onnx(graphs.build(name), name=name)
    _ = graph.canonical_hash  # digests every weight once, as any search's first hash does
    engine.candidates(graph)  # warm-up: shape-inference memo, lazy indexes
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        cands = engine.candidates(graph)
        times.append(time.perf_counter() - t0)
    t_enum = statistics.median(times)
    WEIGHT_CACHE.clear()  # greedy computes the weights of the rewrites it applies from scratch
    res = greedy_search(graph, cost_model, engine)
    t0 = time.perf_counter()
    for c in engine.candidates(graph):
        _ = c.graph  # building is what is timed
    t_build = time.perf_counter() - t0
    picked = cands[:: max(1, len(cands) // sample)][:sample] if cands else []
    t0 = time.perf_counter()
    for c in picked:
        deep_copy_apply(c)
    t_copy = (time.perf_counter() - t0) / max(1, len(picked)) * len(cands) + t_enum
    return [name, len(graph), len(cands), t_enum * 1e3, len(cands) / t_enum if t_enum else 0.0, t_build * 1e3,
            t_copy * 1e3, t_copy / t_enum if t_enum else 0.0, res.time_s, len(res.steps), res.speedup]


def markdown(headers: list[str], rows: list[list]) -> str:
    fmt = lambda v: f"{v:,.0f}" if isinstance(v, float) and v >= 100 else f"{v:.3g}" if isinstance(v, float) else str(v)
    out = "| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n"
    return out + "".join("| " + " | ".join(fmt(v) for v in r) + " |\n" for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", help="comma-separated names (default: every built-in graph)")
    ap.add_argument("--repeats", type=int, default=5, help="timed enumerations per graph (median reported)")
    ap.add_argument("--sample", type=int, default=10, help="candidates timed with the deep-copy baseline")
    ap.add_argument("--device", default="h100", help="analytic cost model device")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    names = args.graphs.split(",") if args.graphs else graphs.names()

    t0 = time.perf_counter()
    rules = parse_rule_files()
    t_parse = time.perf_counter() - t0
    t0 = time.perf_counter()
    ruleset = load_rules()
    t_verify = time.perf_counter() - t0
    engine = RewriteEngine(ruleset)
    cost_model = get_cost_model("analytic", device=args.device)
    header = (f"{len(ruleset)} rules ({sum(r.is_multi_output for r in ruleset)} multi-output) in "
              f"{len(ruleset.families())} families; parse {t_parse * 1e3:.0f} ms, parse + verify "
              f"{t_verify:.2f} s ({len(rules) - len(ruleset)} rejected)")
    print(header, flush=True)
    rows = []
    for name in names:
        rows.append(bench_graph(name, engine, cost_model, args.repeats, args.sample))
        print(f"  {name}: done", flush=True)
    table = markdown(HEADERS, rows)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"{header}\n\n{table}")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
