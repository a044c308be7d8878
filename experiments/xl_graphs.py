"""Graphs search cannot exhaust (issue 24, item 2): the families' "xl" members, what one state offers and
how far greedy and the guided search get.

Per graph (suite `families_xl`, target ort-cpu, estimated cost): nodes; candidates in the first state;
greedy's rewrites, time and speed-up (run to completion, or to `--greedy-limit`); and the guided search at
10 and 30 s, read off one 30 s run's anytime trace: `--search rl` with its defaults (anchored on greedy,
which runs first inside the budget) and, unanchored (`anchor=false`), under the shipped policy and the cost
prior, run to the budget (`stop=false`). One engine (the rules loaded once) for every run.

    XRL_NO_CALIBRATION=1 .venv/bin/python experiments/xl_graphs.py --out experiments/results/families_xl

Writes xl.csv and xl.md to --out (xl.csv after every graph) and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

FIELDS = ["graph", "nodes", "candidates", "enumerate_s", "greedy_speedup", "greedy_rewrites", "greedy_s",
          "greedy_done", "rl_10", "rl_30", "trained_10", "trained_30", "cost_10", "cost_30"]
DEFAULT = "fam_lora_encoder_xl_ts,fam_lora_decoder_xl_ts,fam_llama_xl_ts,fam_repvgg_xl_ts,fam_acnet_xl_ts"
RUNS = {"rl": {}, "trained": {"prior": "trained", "anchor": False, "stop": False},
        "cost": {"prior": "cost", "anchor": False, "stop": False}}


def at(trace: list[tuple[float, float]], c0: float, t: float) -> float:
    """The speed-up of the best found by `t` seconds."""
    return round(c0 / min(c for s, c in trace if s <= t), 4)


def measure(name: str, cost, engine, greedy_limit: float) -> dict:  # noqa: ANN001
    from xrl.frontends.loader import load_model
    from xrl.rl.rl_search import rl_search
    from xrl.search.greedy import greedy_search

    graph = load_model(name, seed=0).graph
    c0 = cost.cost(graph)
    t0 = time.perf_counter()
    cands = engine.candidates(graph, original_nodes=len(graph))
    row = {"graph": name, "nodes": len(graph), "candidates": len(cands),
           "enumerate_s": round(time.perf_counter() - t0, 2)}
    g = greedy_search(graph, cost, engine, time_limit=greedy_limit)
    row.update(greedy_speedup=round(c0 / g.cost, 4), greedy_rewrites=len(g.steps), greedy_s=round(g.time_s, 1),
               greedy_done=g.time_s < greedy_limit)
    print(row, file=sys.stderr, flush=True)
    for arm, options in RUNS.items():
        trace: list[tuple[float, float]] = []
        rl_search(graph, cost, engine=engine, budget=30.0, trace=trace,
                  **{k: v for k, v in options.items()})
        row[f"{arm}_10"], row[f"{arm}_30"] = at(trace, c0, 10.0), at(trace, c0, 30.0)
        print(arm, row[f"{arm}_10"], row[f"{arm}_30"], file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default=DEFAULT, help="built-in graphs, or the suite families_xl")
    p.add_argument("--greedy-limit", type=float, default=900.0)
    p.add_argument("--out", default="experiments/results/families_xl")
    args = p.parse_args(argv)
    from xrl import graphs as registry

    names = registry.names("families_xl") if args.graphs == "families_xl" else args.graphs.split(",")
    bad = [n for n in names if n not in registry.BUILTIN_GRAPHS]
    if bad:
        print(f"error: unknown graph {', '.join(bad)}", file=sys.stderr)
        return 2
    from xrl.cost import get_cost_model
    from xrl.rewrite import RewriteEngine

    cost, engine = get_cost_model("target", target="ort-cpu"), RewriteEngine.default()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        rows.append(measure(name, cost, engine, args.greedy_limit))
        with (out / "xl.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
    command = "XRL_NO_CALIBRATION=1 .venv/bin/python experiments/xl_graphs.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    lines = [f"Command: `{command}`. Target ort-cpu, estimated cost (speed-ups are estimates), a shared 2-core "
             "machine (wall-clock budgets bind earlier under load).", "",
             "| graph | nodes | candidates (first state) | enumeration (s) | greedy | greedy rewrites | greedy (s) | "
             "rl defaults 10 s | 30 s | shipped policy, unanchored 10 s | 30 s | cost prior, unanchored 10 s | 30 s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['graph']} | {r['nodes']} | {r['candidates']} | {r['enumerate_s']} | {r['greedy_speedup']:.3f} | "
              f"{r['greedy_rewrites']} | {r['greedy_s']}{'' if r['greedy_done'] else ' (cut)'} | {r['rl_10']:.3f} | "
              f"{r['rl_30']:.3f} | {r['trained_10']:.3f} | {r['trained_30']:.3f} | {r['cost_10']:.3f} | "
              f"{r['cost_30']:.3f} |" for r in rows]
    text = "\n".join(lines)
    (out / "xl.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
