"""Issue 32 Goals: the learning ablation on the research benchmark's held-out split.

The SAME guided search (xrl.rl.guided, stop rule and greedy anchor off, so it runs to its budget under the prior
alone) under four priors: the trained policy, the cost prior, uniform, and the untrained network (one per seed;
the guided search itself is deterministic, so the seeds vary the untrained network's initialisation). Budgets:

    seconds       one run of --seconds (default 10) per prior; its anytime trace read at 1, 3, 10 (30) s
    cost calls    one run whose clock is the cost model's call count (xrl.search.budget.CallBudget as the
                  search's `timer`, capped there too), read at 100 and 1000 calls

Beside them: the policy's argmax rollout alone against greedy at equal cost-model calls, and the value head's
explained variance on held-out states (the states along each reference sequence, labelled with the reference
gain left from there, in the env's reward unit: percent of the starting cost).

Reported per budget: the geomean over graphs of the share of the reference gain (suite.gain_share, floored at
0.01 for the geomean) and learning gain = trained / best non-learned prior (cost, uniform, untrained mean).

    .venv/bin/python experiments/learning_ablation.py --seconds 1 --calls 100 --seeds 0 --no-value   # quick check
    .venv/bin/python experiments/learning_ablation.py --seconds 10 --calls 100,1000 --seeds 0,1,2 --wall-cap 20 \
        --graphs gen_branch_trap_0,gen_branch_trap_1,gen_branch_trap_4,fam_repvgg_ts,fam_lora_vit_ts
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from xrl.rl.guided import guided_search
from xrl.rl.priors import CostPrior, PolicyPrior, UniformPrior, load_network, untrained_like
from xrl.search import suite
from xrl.search.budget import CallBudget
from xrl.search.greedy import greedy_search

SECONDS = (1.0, 3.0, 10.0, 30.0)
CALLS = (100, 1000)
ROOT = Path(__file__).resolve().parents[1]
WALL_CAP_S = 60.0  # a calls run's wall-clock cap (its clock is the call count)


def default_policy() -> Path:
    """The research policy (issue 32.5) where it has been shipped, else the default one."""
    research = ROOT / "xrl" / "policies" / "research.pt"
    return research if research.exists() else ROOT / "xrl" / "policies" / "default.pt"


def at(trace: list[tuple[float, float]], budget: float) -> float:
    """The best cost an anytime trace had reached by `budget`."""
    return min((c for t, c in trace if t <= budget), default=trace[0][1])


def share_floor(x: float) -> float:
    return max(x, 0.01)


def geomean(xs: list[float]) -> float:
    return float(math.exp(np.mean([math.log(share_floor(x)) for x in xs]))) if xs else math.nan


def argmax_rollout(prior: PolicyPrior, graph, cost, eng, max_calls: int, horizon: int = 50) -> float:
    """The policy's argmax alone, at most `max_calls` cost-model calls: the best real cost it passed."""
    from xrl.env import GraphRewriteEnv

    budget = CallBudget(cost, max_calls)
    env = GraphRewriteEnv(graph, budget.model, engine=eng, horizon=horizon, observation="summary")
    env.reset(options={"graph": graph})
    best = cost.cost(graph)
    for _ in range(horizon):
        if budget.exhausted or not env.candidates:
            break
        a = int(prior.judge([env])[0].log_probs.argmax())
        if a == 0:
            break
        env.step(a)
        if math.isfinite(env.cost):
            best = min(best, cost.cost(env.graph))
    return best


def value_ev(net, graphs, refs, cost, eng) -> tuple[float, int]:
    """Explained variance of V(s) against the reference gain left from s (percent of the start), on the states
    along each graph's reference sequence."""
    from xrl.env import GraphRewriteEnv

    prior = PolicyPrior(net)
    ys, vs = [], []
    for name, g in graphs.items():
        ref = refs[name]
        c0, cref = ref.original_cost, ref.cost
        env = GraphRewriteEnv(g, cost, engine=eng, horizon=max(len(ref.steps), 1) + 1, observation="summary")
        state = g
        for k in range(len(ref.steps) + 1):
            env.reset(options={"graph": state})
            ys.append(100.0 * (cost.cost(state) - cref) / c0)
            vs.append(prior.judge([env])[0].value)
            if k < len(ref.steps):
                state = suite.replay(state, [ref.steps[k]], eng)
    y, v = np.array(ys), np.array(vs)
    return (float(1 - np.var(y - v) / np.var(y)) if np.var(y) > 0 else math.nan), len(ys)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default=None, help="trained checkpoint (default: xrl/policies/research.pt if it "
                                                   "exists, else default.pt)")
    ap.add_argument("--graphs", default=None, help="held-out graphs (comma-separated; default: the whole split)")
    ap.add_argument("--seconds", type=float, default=10.0, help="the seconds run's budget (trace read at 1,3,10,30)")
    ap.add_argument("--calls", default="100,1000", help="cost-model call budgets (the calls run: the largest)")
    ap.add_argument("--seeds", default="0,1,2", help="untrained networks' seeds")
    ap.add_argument("--wall-cap", type=float, default=WALL_CAP_S, help="seconds cap on each calls run (default 60)")
    ap.add_argument("--no-value", action="store_true", help="skip the value head's explained variance")
    ap.add_argument("--out", default="experiments/results/learning_ablation",
                    help="folder for ablation.md, ablation.json and the anytime plot ablation.png")
    args = ap.parse_args(argv)
    calls = tuple(int(c) for c in args.calls.split(","))
    args.policy = args.policy or str(default_policy())
    torch.set_num_threads(1)
    cost, eng = suite.cost_model(), suite.engine()
    refs = suite.load_references()
    names = args.graphs.split(",") if args.graphs else None
    sgs = suite.suite_graphs(split="held-out", names=names)
    graphs = {sg.name: sg.build() for sg in sgs}
    net = load_network(args.policy)
    seeds = [int(s) for s in args.seeds.split(",")]
    priors = {"trained": PolicyPrior(net), "cost": CostPrior(), "uniform": UniformPrior()}
    for s in seeds:
        priors[f"untrained-{s}"] = PolicyPrior(untrained_like(net, s), f"untrained-{s}")
    secs = [b for b in SECONDS if b <= args.seconds]
    rows: list[dict] = []
    for name, g in graphs.items():
        ref = refs[name]
        for pname, prior in priors.items():
            tr: list[tuple[float, float]] = []
            guided_search(prior, g, cost, engine=eng, time_limit=args.seconds, trace=tr, restarts=0)
            budget = CallBudget(cost, max(calls))
            trc: list[tuple[float, float]] = []
            w0 = time.perf_counter()

            def by_calls(b: CallBudget = budget, w0: float = w0) -> float:
                # the calls run's clock is the call count; past the wall cap it is over
                return float(b.calls + b.refused) if time.perf_counter() - w0 < args.wall_cap else math.inf

            guided_search(prior, g, budget.model, engine=eng, time_limit=float(max(calls)), trace=trc, restarts=0,
                          timer=by_calls)
            trc = [(t, c) for t, c in trc if math.isfinite(c) and math.isfinite(t)]
            for b in secs:
                rows.append(dict(graph=name, prior=pname, budget=f"{b:g}s", x=b,
                                 share=suite.gain_share(ref, at(tr, b))))
            for b in calls:
                rows.append(dict(graph=name, prior=pname, budget=f"{b} calls", x=b,
                                 share=suite.gain_share(ref, at(trc, b)), curve=None))
            rows[-1]["curve_s"], rows[-1]["curve_calls"] = tr, trc
            print(f"{name} {pname}: " + " ".join(f"{r['budget']} {r['share']:.3f}" for r in rows
                                                  if r["graph"] == name and r["prior"] == pname), flush=True)
        for b in calls:
            am = argmax_rollout(priors["trained"], g, cost, eng, b)
            gb = CallBudget(cost, b)
            gr = greedy_search(g, gb.model, eng)
            rows.append(dict(graph=name, prior="argmax", budget=f"{b} calls", x=b, share=suite.gain_share(ref, am)))
            rows.append(dict(graph=name, prior="greedy", budget=f"{b} calls", x=b,
                             share=suite.gain_share(ref, cost.cost(gr.graph))))
            print(f"{name} @{b} calls: argmax {rows[-2]['share']:.3f} greedy {rows[-1]['share']:.3f}", flush=True)
    ev, n_states = (math.nan, 0) if args.no_value else value_ev(net, graphs, refs, cost, eng)

    budgets = [f"{b:g}s" for b in secs] + [f"{b} calls" for b in calls]
    table = ["| budget | trained | cost | uniform | untrained (mean of seeds) | learning gain | argmax | greedy |",
             "|---|---|---|---|---|---|---|---|"]
    for b in budgets:
        def gm(p: str, b: str = b) -> float:
            return geomean([r["share"] for r in rows if r["budget"] == b and r["prior"] == p])
        unt = float(np.mean([gm(f"untrained-{s}") for s in seeds]))
        best = max(gm("cost"), gm("uniform"), unt)
        gain = gm("trained") / best if best > 0 else math.nan
        table.append(f"| {b} | {gm('trained'):.3f} | {gm('cost'):.3f} | {gm('uniform'):.3f} | {unt:.3f} | {gain:.3f} | "
                     + (f"{gm('argmax'):.3f} | {gm('greedy'):.3f} |" if "calls" in b else "- | - |"))
    table.append("")
    table.append(f"value head explained variance on {n_states} held-out states (reference sequences): {ev:.3f}")
    text = "\n".join(table)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policy = Path(args.policy).resolve()
    shown = policy.relative_to(ROOT) if policy.is_relative_to(ROOT) else policy  # the repository's path where it is
    out = out / "ablation"
    out.with_suffix(".md").write_text(f"graphs: {', '.join(graphs)}; policy: {shown}; seconds run: "
                                      f"{args.seconds}; seeds {seeds}\n\n{text}\n")
    out.with_suffix(".json").write_text(json.dumps(dict(rows=[{k: v for k, v in r.items()} for r in rows],
                                                        value_ev=ev, n_states=n_states), default=str))
    plot(rows, graphs, refs, out, args.seconds, max(calls))
    return 0


def plot(rows: list[dict], graphs: dict, refs: dict, out: Path, seconds: float, calls: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    priors = sorted({r["prior"] for r in rows if "curve_s" in r})
    for ax, key, label in ((axes[0], "curve_s", "seconds"), (axes[1], "curve_calls", "cost-model calls")):
        grid = np.geomspace(0.05, seconds, 60) if key == "curve_s" else np.geomspace(1, max(calls, 2), 60)
        for p in priors:
            curves = [(r["graph"], r[key]) for r in rows if r["prior"] == p and key in r]
            ys = [geomean([suite.gain_share(refs[gname], at(c, x)) for gname, c in curves]) for x in grid]
            ax.plot(grid, ys, label=p, ls="--" if p.startswith("untrained") else "-")
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("geomean share of reference gain")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"held-out anytime (guided search, {len(graphs)} graphs)")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    sys.exit(main())
