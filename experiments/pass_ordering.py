"""Pass ordering (xrl/PassOrdering-v0): PPO against xrl's default pass order, and the ceiling any order can reach.

    .venv/bin/python experiments/pass_ordering.py [--updates 150] [--out experiments/results/pass_ordering.md]

For each horizon (10 passes, the default order's length; and a budget of 3 passes):
  1. ceiling: the fewest ops any sequence of at most `horizon` passes reaches, by breadth-first search over the
     distinct graphs the passes produce (passes are deterministic, so this is exhaustive), per graph;
  2. `xrl train env=pass_ordering env.horizon=H updates=N` (PPO, the default graph split: trained on
     mlp, tiny_cnn, squeezenet, nasrnn, bert; the other built-in graphs held out), run as a subprocess;
  3. `xrl eval --env pass_ordering --policy <run>/best.pt --json` on every built-in graph and the HLO
     fixtures, and the same without --policy (the one-step lookahead agent).
Writes one markdown file with the commands, the tables and the wall times. With --reuse, a run folder that
already holds best.pt is evaluated without training again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
XRL = str(Path(sys.executable).with_name("xrl"))


def ceiling(graphs: list[tuple[str, object]], horizon: int) -> dict[str, int]:
    """label -> fewest ops reachable in at most `horizon` passes (breadth-first over distinct graphs)."""
    from xrl.env.pass_order import PASSES, PassOrderingEnv

    env = PassOrderingEnv(graphs[0][1])
    out = {}
    for label, g in graphs:
        frontier, seen, best = {g.canonical_hash: g}, {g.canonical_hash}, len(g)
        for _ in range(horizon):
            nxt = {}
            for s in frontier.values():
                for p in PASSES:
                    r = env.apply_pass(s, p)
                    best = min(best, len(r))
                    if r.canonical_hash not in seen:
                        seen.add(r.canonical_hash)
                        nxt[r.canonical_hash] = r
            frontier = nxt
        out[label] = best
    return out


def run(cmd: list[str]) -> tuple[str, float]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr[-2000:]}")
    return res.stdout, time.perf_counter() - t0


def shown(cmd: list[str]) -> str:
    return " ".join([".venv/bin/xrl", *cmd[1:]])


def table(report: dict, lookahead: dict, ceil: dict[str, int]) -> list[str]:
    from xrl.env.pass_order import geomean

    look = {r["graph"]: r for r in lookahead["graphs"]}
    lines = ["| graph | split | ops | default order | lookahead | PPO | best any order | PPO vs default "
             "| PPO's passes |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["graphs"]:
        g = r["graph"]
        lines.append(f"| {g} | {r['split']} | {r['ops']} | {r['default_ops']} | {look[g]['agent_ops']} | "
                     f"{r['agent_ops']} | {ceil[g]} | {r['ratio']:.3f} | {' '.join(r['passes'])} |")
    gm = {k: geomean([r["ops"] / max(v, 1) for r, v in zip(report["graphs"], vals)]) for k, vals in (
        ("default", [r["default_ops"] for r in report["graphs"]]),
        ("lookahead", [look[r["graph"]]["agent_ops"] for r in report["graphs"]]),
        ("ppo", [r["agent_ops"] for r in report["graphs"]]),
        ("ceiling", [ceil[r["graph"]] for r in report["graphs"]]))}
    lines.append(f"| geomean ops before / after | | | {gm['default']:.3f}x | {gm['lookahead']:.3f}x | "
                 f"{gm['ppo']:.3f}x | {gm['ceiling']:.3f}x | {report['geomean_ratio']:.3f} | |")
    return lines


def main() -> None:
    from xrl.rl.train_passes import suite_graphs

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=150)
    p.add_argument("--lr", type=float, default=3e-3, help="algo.lr (the GNN's 5e-4 is slow for this small MLP)")
    p.add_argument("--horizons", default="10,3")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default="out/pass_ordering", help="training run folders go under here")
    p.add_argument("--reuse", action="store_true", help="keep a run folder's training where it has best.pt")
    p.add_argument("--train", help="graphs.train, comma-separated (default: conf/graphs/default.yaml's)")
    p.add_argument("--heldout", help="graphs.eval, comma-separated (default: conf/graphs/default.yaml's)")
    p.add_argument("--out", default="experiments/results/pass_ordering.md")
    args = p.parse_args()

    md = ["# Pass ordering: PPO against xrl's default pass order", "",
          f"Produced by `.venv/bin/python experiments/pass_ordering.py {' '.join(sys.argv[1:])}` (2-core CPU). "
          "Op counts after the passes; the default "
          "order is cse dce fusion algebraic distributivity associativity merge transpose reshape concat_split, cut to "
          "the horizon (each pass once at horizon 10). *lookahead*: at each step the pass that removes the most ops "
          "now. *best any order*: exhaustive breadth-first search over every sequence of at most `horizon` passes. "
          "*PPO vs default*: default ops / PPO ops (> 1: PPO's order removes more).", ""]
    for horizon in [int(h) for h in args.horizons.split(",")]:
        run_dir = f"{args.runs}/h{horizon}"
        train_cmd = [XRL, "train", "env=pass_ordering", f"env.horizon={horizon}", f"updates={args.updates}",
                     f"algo.lr={args.lr}", f"seed={args.seed}", "logger=none", "progress=false",
                     f"hydra.run.dir={run_dir}"]
        train_cmd += [f"graphs.train=[{args.train}]"] if args.train else []
        train_cmd += [f"graphs.eval=[{args.heldout}]"] if args.heldout else []
        if not (args.reuse and Path(run_dir, "best.pt").exists()):
            run(train_cmd)
        last = json.loads(Path(run_dir, "metrics.jsonl").read_text().splitlines()[-1])
        eval_cmd = [XRL, "eval", "--env", "pass_ordering", "--policy", f"{run_dir}/best.pt", "--json"]
        report = json.loads(run(eval_cmd)[0])
        look_cmd = [XRL, "eval", "--env", "pass_ordering", "--horizon", str(horizon), "--json"]
        lookahead = json.loads(run(look_cmd)[0])
        # the ceiling on exactly the graphs `xrl eval` reported (every built-in graph and the HLO fixtures)
        names = [r["graph"] for r in report["graphs"] if not r["graph"].startswith("hlo/")]
        t0 = time.perf_counter()
        ceil = ceiling(suite_graphs(names, hlo=True), horizon)
        ceil_s = time.perf_counter() - t0
        md += [f"## Horizon {horizon} passes", "", "```", shown(train_cmd), shown(eval_cmd), shown(look_cmd), "```",
               "", f"Training: {last['update']} updates, {int(last['env_steps'])} env steps in {last['time_s']:.0f} s; "
               f"best.pt is the update with the best greedy eval on the training graphs; the exhaustive ceiling took "
               f"{ceil_s:.0f} s.", "",
               *table(report, lookahead, ceil), ""]
        print("\n".join(md[-len(report['graphs']) - 4:]), flush=True)
    Path(args.out).write_text("\n".join(md) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
