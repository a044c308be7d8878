"""Does a cost rank what the machine measures? The roofline and the measured kernel cost against end-to-end timing.

For each graph and several states of it (the graph as given, and after 1 and 3 greedy steps under the
roofline), every graph one rewrite away (at most `--max-candidates`, a seeded sample that always keeps
both costs' top picks) is timed end to end with the state itself and an A/A copy of the state, in
alternating rounds, a fresh onnxruntime session per graph per round (`xrl.cost.guard.measure_guard`: one
thread, the calling thread's CPU time). Each candidate's measured speed-up over the state is the
geometric mean of its per-round ratios, with a 95% interval. Then, side by side for the two costs:

- Kendall tau over the candidate pairs whose measured difference is beyond the noise (their 95%
  intervals do not overlap): +1 for a pair the cost orders as measured, -1 against, 0 for a tie;
- top-1 slowdown (the TpuGraphs metric): the measured speed-up of the best candidate (the state itself
  included: a search may stop) over that of the cost's pick, minus one; as the measurement vouches for it
  (the best's 95% lower bound over the pick's upper bound, 0 where they overlap), and raw in the CSV;
- the estimate gap of written models: `xrl optimize` (greedy, no pre-pass, no guard) under each cost,
  the written model timed against the original (`xrl.cost.speedup.measure_speedup`, A/A control), and
  |estimated / measured - 1|; the median over graphs.

    .venv/bin/python experiments/validate_cost.py [--graphs headroom,small,families] [--rounds 6]
        [--max-candidates 12] [--out experiments/results/validate_cost]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from xrl.api import measure_model
from xrl.cost import get_cost_model
from xrl.cost.guard import GuardCandidate, measure_guard
from xrl.cost.speedup import measure_speedup
from xrl.frontends.loader import load_model
from xrl.rewrite import RewriteEngine
from xrl.search.compare import resolve_graphs
from xrl.search.greedy import greedy_search

COSTS = ("roofline", "target")  # "target": the measured kernel cost
LABEL = {"roofline": "roofline", "target": "measured kernels"}


def states(graph, roofline, steps=(0, 1, 3)):  # noqa: ANN001, ANN201 - Graph, CostModel
    """The graph after k greedy steps under the roofline, for each k that reaches a new graph."""
    out, seen = [], set()
    for k in steps:
        g = graph if k == 0 else greedy_search(graph, roofline, RewriteEngine.default(), max_steps=k).graph
        if g.canonical_hash not in seen:
            seen.add(g.canonical_hash)
            out.append((k, g))
    return out


def pick_candidates(state, costs, limit: int, rng) -> list:  # noqa: ANN001
    """Distinct candidates of `state`: each cost's best three, then a seeded sample, at most `limit`."""
    cands, seen = [], {state.canonical_hash}
    for c in RewriteEngine.default().candidates(state):
        h = c.graph.canonical_hash
        if h not in seen:
            seen.add(h)
            cands.append(c)
    if len(cands) <= limit:
        return cands
    keep: list[int] = []
    for cost in costs.values():
        base = cost.cost(state)
        ranked = sorted(range(len(cands)), key=lambda i: cands[i].delta_cost(cost, base))
        keep += [i for i in ranked[:3] if i not in keep]
    rest = [i for i in range(len(cands)) if i not in keep]
    keep += list(rng.choice(rest, size=min(limit - len(keep), len(rest)), replace=False))
    return [cands[i] for i in sorted(keep)]


def kendall(est: list[float], meas: list[float], lows: list[float], highs: list[float]) -> tuple[float, int]:
    """Kendall tau of `est` against `meas` over the pairs whose measured intervals do not overlap."""
    score = n = 0
    for i in range(len(meas)):
        for j in range(i + 1, len(meas)):
            if lows[i] <= highs[j] and lows[j] <= highs[i]:
                continue  # within each other's noise: the machine cannot order them
            n += 1
            d = (est[i] - est[j]) * (meas[i] - meas[j])
            score += 1 if d > 0 else -1 if d < 0 else 0
    return (score / n if n else float("nan")), n


def validate_state(name: str, k: int, state, costs, timer, args, rng) -> dict:  # noqa: ANN001
    cands = pick_candidates(state, costs, args.max_candidates, rng)
    if not cands:
        return {}
    guard = measure_guard(timer, state, [GuardCandidate(f"c{i}", c.graph) for i, c in enumerate(cands)],
                          rounds=args.rounds, max_rounds=args.rounds, budget_s=args.budget)
    labels = [f"c{i}" for i in range(len(cands))]
    meas = [1.0] + [guard.measured[lab].speedup for lab in labels]  # the state itself first
    ints = [(1.0, 1.0)] + [guard.measured[lab].interval for lab in labels]
    row = {"graph": name, "state": k, "candidates": len(cands), "aa_noise": guard.measured[labels[0]].noise}
    for key, cost in costs.items():
        base = cost.cost(state)
        est = [1.0] + [base / cost.cost(c.graph) for c in cands]
        tau, pairs = kendall(est, meas, [lo for lo, _ in ints], [hi for _, hi in ints])
        pick = max(range(len(est)), key=lambda i: (est[i], -i))
        row[f"tau_{key}"], row["pairs"] = tau, pairs
        best = max(range(len(meas)), key=lambda i: meas[i])
        row[f"top1_raw_{key}"] = meas[best] / meas[pick] - 1
        # what the measurement vouches for: the best's lower bound over the pick's upper bound (0 if they overlap)
        row[f"top1_slowdown_{key}"] = max(ints[best][0] / ints[pick][1] - 1, 0.0)
        row[f"pick_{key}"] = "stop" if pick == 0 else cands[pick - 1].step
    row["best_measured"] = max(meas)
    return row


def written_gap(name: str, graph, costs, timer, args) -> dict:  # noqa: ANN001
    """Greedy under each cost, its written model measured against the original: estimate vs measured."""
    row = {"graph": name}
    for key, cost in costs.items():
        res = greedy_search(graph, cost, RewriteEngine.default(), time_limit=args.time_limit)
        est = cost.cost(graph) / cost.cost(res.graph)
        if res.graph.canonical_hash == graph.canonical_hash:
            row[f"est_{key}"], row[f"meas_{key}"], row[f"gap_{key}"] = est, 1.0, abs(est - 1)
            continue
        m = measure_speedup(timer, graph, res.graph, rounds=args.rounds, control=True)
        row[f"est_{key}"], row[f"meas_{key}"] = est, m.speedup
        row[f"gap_{key}"] = abs(est / m.speedup - 1)
        row[f"verdict_{key}"] = m.verdict
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default="headroom,small,families")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per graph per round")
    p.add_argument("--max-candidates", type=int, default=12)
    p.add_argument("--budget", type=float, default=120.0, help="seconds of timing per state at most")
    p.add_argument("--time-limit", type=float, default=30.0, help="greedy's time limit per graph (written models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", default="ort-cpu", choices=("ort-cpu", "ort-cuda"),
                   help="ort-cuda: the CUDA provider's kernels, timed on this machine's GPU")
    p.add_argument("--out", default="experiments/results/validate_cost")
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    provider = "cuda" if args.target == "ort-cuda" else "cpu"
    costs = {k: get_cost_model(k, device="auto", target=args.target) for k in COSTS}
    timer = measure_model("ort", provider, repeats=args.repeats, warmup=2, threads=1)
    names = resolve_graphs(args.graphs)
    graphs = [(n, load_model(n).graph) for n in dict.fromkeys(names)]
    state_rows, gap_rows = [], []
    t0 = time.perf_counter()
    for name, graph in graphs:
        for k, state in states(graph, costs["roofline"]):
            row = validate_state(name, k, state, costs, timer, args, rng)
            if row:
                state_rows.append(row)
                print(f"{name} state {k}: {row['candidates']} candidates, {row['pairs']} pairs beyond noise; tau "
                      f"roofline {row['tau_roofline']:.2f} measured {row['tau_target']:.2f}; top-1 slowdown "
                      f"{row['top1_slowdown_roofline']:.1%} / {row['top1_slowdown_target']:.1%} "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        gap_rows.append(written_gap(name, graph, costs, timer, args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for rows, fname in ((state_rows, "states.csv"), (gap_rows, "written.csv")):
        if rows:
            keys = list(dict.fromkeys(k for r in rows for k in r))
            with open(out / fname, "w", newline="") as f:
                w = csv.DictWriter(f, keys)
                w.writeheader()
                w.writerows(rows)
    report = render(state_rows, gap_rows, args, time.perf_counter() - t0)
    (out / "validate_cost.md").write_text(report)
    print(report)
    return 0


def pooled_tau(rows: list[dict], key: str) -> float:
    num = sum(r[f"tau_{key}"] * r["pairs"] for r in rows if r["pairs"])
    den = sum(r["pairs"] for r in rows)
    return num / den if den else float("nan")


def render(states_: list[dict], gaps: list[dict], args, seconds: float) -> str:  # noqa: ANN001
    lines = [f"# Roofline against measured kernel cost, judged by end-to-end timing (onnxruntime, {args.target})",
             "", f"`experiments/validate_cost.py --target {args.target} --graphs {args.graphs} --rounds {args.rounds} "
             f"--max-candidates "
             f"{args.max_candidates}` ({seconds / 60:.1f} min)", "",
             "| graph | state | candidates | pairs beyond noise | tau roofline | tau measured "
             "| top-1 slowdown roofline | top-1 slowdown measured |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in states_:
        lines.append(f"| {r['graph']} | {r['state']} | {r['candidates']} | {r['pairs']} | {r['tau_roofline']:.2f} | "
                     f"{r['tau_target']:.2f} | {r['top1_slowdown_roofline']:.1%} | {r['top1_slowdown_target']:.1%} |")
    lines += ["", "| written by greedy | estimate roofline | measured | estimate measured-kernels | measured |",
              "|---|---:|---:|---:|---:|"]
    for r in gaps:
        lines.append(f"| {r['graph']} | {r['est_roofline']:.3f} | {r['meas_roofline']:.3f} | {r['est_target']:.3f} | "
                     f"{r['meas_target']:.3f} |")

    def summary(key: str) -> list[str]:
        slow = [r[f"top1_slowdown_{key}"] for r in states_]
        gap = [r[f"gap_{key}"] for r in gaps]
        within = sum(s <= 0.03 for s in slow)
        return [f"{pooled_tau(states_, key):.2f}", f"{max(slow):.1%}" if slow else "-",
                f"{within}/{len(slow)}", f"{statistics.median(gap):.1%}" if gap else "-"]

    lines += ["", "| cost | Kendall tau (pooled) | worst top-1 slowdown | states with top-1 within 3% | "
              "median estimate gap of written models |", "|---|---:|---:|---:|---:|"]
    for key in COSTS:
        lines.append(f"| {LABEL[key]} | " + " | ".join(summary(key)) + " |")
    lines.append("")
    lines.append("Goals (issue \"Measured truth\"): tau >= 0.8; top-1 within 3% on every state; median gap <= 3%.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
