"""The arms of the learning-against-search ablation at equal budget, shared by experiments/rl_ablation.py and
experiments/rl_vs_search.py (`--arms`): the guided search under each prior, the argmax rollout alone and the
searches, per graph, in one process and interleaved (so machine load hits every arm alike); and their tables,
with the learning gain.

    guided search (xrl.rl.guided, `--search rl`, stop rule and greedy anchor off so it runs to its budget
    under the prior alone), one run of the largest budget per prior, its trace of (seconds, best cost) read
    at every budget:
        trained        the policy checkpoint (`args.policy`; None: the shipped xrl/policies/default.pt); with
                       several (comma-separated: training seeds) one arm each, trained-0, trained-1, ...
        shipped        (`args.shipped`) the shipped policy beside them
        untrained-S    the same network shape initialised from seed S (`args.untrained_seeds`)
        uniform        equal over the candidates
        cost           softmax over each candidate's one-step estimated gain
    argmax             the (first) trained policy's argmax rollout alone (`--rl-mode argmax`), run per budget
    greedy, beam, taso, tensat   `xrl optimize --search M` (`args.searches`), run per budget with that time limit

Every speed-up is the cost model's estimate of the returned graph, recomputed here (the guided arms'
intermediate points are the search's own costs, checked against the recomputed cost of its final graph).
Learning gain, per budget and split = geomean(trained) / geomean(best non-learned prior), the non-learned
priors being uniform, cost and the untrained network (the mean over its seeds), all under the same search
and budget; with several trained seeds, trained is their mean (each graph's geomean over the seeds) and the
table gives each seed's gain too.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

from xrl.stats import geomean

SEARCHES = ("greedy", "beam", "taso", "tensat")
NON_LEARNED = ("uniform", "cost", "untrained")
FIELDS = ["graph", "split", "arm", "budget", "speedup", "time_s", "note"]


def at_budget(trace: Sequence[Sequence[float]], budget: float) -> float:
    """The best cost the trace had reached by `budget` seconds."""
    return min(c for t, c in trace if t <= budget)


def run_graph(name: str, split: str, args: argparse.Namespace, cost, engine, budgets: list[float]) -> list[dict]:  # noqa: ANN001
    from xrl.api import run_search
    from xrl.frontends.loader import load_model
    from xrl.rl.rl_search import rl_search

    graph = load_model(name, seed=0).graph
    c0 = cost.cost(graph)
    rows: list[dict] = []
    # untimed warm-up: the cost model's per-kernel caches fill here, not in whichever arm runs first
    run_search("greedy", graph, cost, seed=0, steps=None, time_limit=max(budgets), options={})

    def row(arm: str, budget: float, c: float, took: float, note: str = "") -> None:
        rows.append({"graph": name, "split": split, "arm": arm, "budget": budget, "speedup": c0 / c,
                     "time_s": round(took, 3), "note": note})

    top = max(budgets)
    policies = policy_arms(args)
    priors = [*((arm, "trained", path, 0) for arm, path in policies),
              *((f"untrained-{s}", "untrained", policies[0][1], s) for s in args.untrained_seeds),
              ("uniform", "uniform", policies[0][1], 0), ("cost", "cost", policies[0][1], 0)]
    for arm, prior, path, seed in priors:
        trace: list[tuple[float, float]] = []
        t0 = time.perf_counter()
        run = rl_search(graph, cost, policy=path, prior=prior, seed=seed, budget=top, stop=False, trace=trace,
                        engine=engine, **guided_only())
        took = time.perf_counter() - t0
        final = cost.cost(run.graph)
        drift = abs(final - run.cost) / final
        for b in budgets:
            row(arm, b, final if b >= top else at_budget(trace, b), min(took, b),
                f"search cost vs recomputed {drift:.1e}" if b >= top else "")
        print(f"  {name} {arm}: {c0 / final:.3f}x ({len(trace) - 1} finds, {took:.1f} s)", file=sys.stderr, flush=True)
    for b in budgets:
        t0 = time.perf_counter()
        run = rl_search(graph, cost, policy=policies[0][1], mode="argmax", time_limit=b, engine=engine)
        row("argmax", b, cost.cost(run.graph), time.perf_counter() - t0)
        for method in [m for m in args.searches.split(",") if m]:
            t0 = time.perf_counter()
            try:
                out = run_search(method, graph, cost, seed=0, steps=None, time_limit=b, options={})
                row(method, b, cost.cost(out.graph), time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - one search's failure is a row, not the end of the table
                rows.append({"graph": name, "split": split, "arm": method, "budget": b, "speedup": math.nan,
                             "time_s": round(time.perf_counter() - t0, 3), "note": f"{type(e).__name__}: {e}"[:120]})
        print(f"  {name} budget {b:g}: " + ", ".join(f"{r['arm']} {r['speedup']:.3f}" for r in rows
                                                     if r["budget"] == b and r["arm"] not in {a[0] for a in priors}),
              file=sys.stderr, flush=True)
    return rows


def policy_arms(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(arm, checkpoint) per trained policy: `trained` for one, trained-0, trained-1, ... for several; and the
    shipped policy as `shipped` with --shipped."""
    paths = [p for p in (args.policy or "").split(",") if p] or [None]
    arms = [("trained" if len(paths) == 1 else f"trained-{i}", p) for i, p in enumerate(paths)]
    if args.shipped:
        from xrl.rl.checkpoint import default_policy_path

        arms.append(("shipped", str(default_policy_path())))
    return arms


def guided_only() -> dict:
    """rl_search's options for the guided search alone (no greedy anchor), where this xrl has the option."""
    import inspect

    from xrl.rl.rl_search import rl_search

    return {"anchor": False} if "anchor" in inspect.signature(rl_search).parameters else {}


def arms_of(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["arm"] for r in rows))


def per_arm(rows: list[dict], arm: str, budget: float, graphs: Sequence[str]) -> float:
    """The arm's geomean over `graphs`; `untrained` and `trained`: each graph's mean over the seeds first."""
    vals = []
    for g in graphs:
        xs = [float(r["speedup"]) for r in rows if r["graph"] == g and float(r["budget"]) == budget
              and (r["arm"] == arm or (arm in ("untrained", "trained") and r["arm"].startswith(arm + "-")))]
        vals.append(geomean(xs))
    return geomean(vals)


def summarise(rows: list[dict], header: str) -> str:
    budgets = sorted({float(r["budget"]) for r in rows})
    arms = arms_of(rows)
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    split = {r["graph"]: r["split"] for r in rows}
    lines = [header, ""]
    for b in budgets:
        lines += [f"### Budget {b:g} s", "", "| graph | split | " + " | ".join(arms) + " |",
                  "|---|---|" + "---:|" * len(arms)]
        for g in graphs:
            cells = []
            for a in arms:
                x = next((float(r["speedup"]) for r in rows if r["graph"] == g and r["arm"] == a
                          and float(r["budget"]) == b), math.nan)
                cells.append(f"{x:.3f}")
            lines.append(f"| {g} | {split[g]} | " + " | ".join(cells) + " |")
        for s in ("train", "val", "held-out"):
            gs = [g for g in graphs if split[g] == s]
            if gs:
                lines.append(f"| **geomean {s}** ({len(gs)}) | | " + " | ".join(f"{per_arm(rows, a, b, gs):.3f}"
                                                                              for a in arms) + " |")
        lines.append("")
    seeds = [a for a in arms if a.startswith("trained-")]
    shipped = "shipped" in arms
    lines += ["### Learning gain (trained / best non-learned prior, same guided search and budget)", "",
              "| split | budget (s) | trained" + (f" (mean of {len(seeds)} seeds)" if seeds else "")
              + " | uniform | cost | untrained (seed mean) | best non-learned | learning gain"
              + (" | gain per seed" if seeds else "") + " | trained / greedy" + (" | shipped | trained / shipped"
                                                                                if shipped else "") + " |",
              "|---|---:|---:|---:|---:|---:|---|---:|" + ("---|" if seeds else "") + "---:|"
              + ("---:|---:|" if shipped else "")]
    for s in ("train", "val", "held-out"):
        gs = [g for g in graphs if split[g] == s]
        for b in budgets if gs else []:
            gm = {a: per_arm(rows, a, b, gs) for a in ("trained", *NON_LEARNED, "greedy", *seeds,
                                                        *(["shipped"] if shipped else []))}
            best = max(NON_LEARNED, key=lambda a: gm[a])
            per_seed = " / ".join(f"{gm[a] / gm[best]:.3f}" for a in seeds)
            lines.append(f"| {s} | {b:g} | {gm['trained']:.3f} | {gm['uniform']:.3f} | {gm['cost']:.3f} | "
                         f"{gm['untrained']:.3f} | {best} | {gm['trained'] / gm[best]:.3f} | "
                         + (f"{per_seed} | " if seeds else "") + f"{gm['trained'] / gm['greedy']:.3f} |"
                         + (f" {gm['shipped']:.3f} | {gm['trained'] / gm['shipped']:.3f} |" if shipped else ""))
    return "\n".join(lines)
