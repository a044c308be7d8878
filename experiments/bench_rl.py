"""Speed of the RL loop per built-in graph: env steps/s, meta-graph build and policy forward per state.

    .venv/bin/python experiments/bench_rl.py [--graphs bert,squeezenet] [--steps 20] [-o bench_rl.md]

An env step is what `GraphRewriteEnv.step` does (apply a rewrite, re-cost it from its delta,
enumerate the next candidates and their hints); actions are uniformly random rewrites (seeded).
Per state the agent then builds the meta-graph (featurise current + every candidate, batch) and
runs the policy once: those columns are timed separately, on the states the env steps visited.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from xrl import graphs
from xrl.cli.output import format_table
from xrl.cost import get_cost_model
from xrl.env import GraphRewriteEnv, resolve_graph
from xrl.features.metagraph import FeatureCache
from xrl.rewrite import RewriteEngine
from xrl.rl.checkpoint import default_policy_path, load_policy
from xrl.search.rl_search import candidate_cap


def bench_graph(name: str, engine: RewriteEngine, policy: torch.nn.Module, steps: int, horizon: int,
                max_candidates: int | None, seed: int) -> list:
    graph = resolve_graph(name)
    env = GraphRewriteEnv(graph, get_cost_model("analytic"), engine=engine, horizon=horizon,
                          max_candidates=max_candidates)
    rng = np.random.default_rng(seed)
    env.reset()
    states, cands, step_s = [], [], 0.0
    for _ in range(steps):
        states.append(env.candidates)
        cands.append(env.num_actions - 1)
        action = 1 + int(rng.integers(env.num_actions - 1)) if env.num_actions > 1 else 0
        t0 = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        step_s += time.perf_counter() - t0
        if terminated or truncated:
            t0 = time.perf_counter()
            env.reset()
            step_s += time.perf_counter() - t0
    # The agent's side, on fresh states: featurise + batch, then one forward pass.
    env.reset()
    meta_s = fwd_s = 0.0
    nodes = []
    n_states = min(steps, 5)
    for _ in range(n_states):
        t0 = time.perf_counter()
        meta = env.meta_graph(FeatureCache(0))
        t1 = time.perf_counter()
        with torch.no_grad():
            dist, _ = policy(meta)
        t2 = time.perf_counter()
        meta_s += t1 - t0
        fwd_s += t2 - t1
        nodes.append(meta.num_nodes)
        _, _, terminated, truncated, _ = env.step(int(dist.mode()) or (1 if env.num_actions > 1 else 0))
        if terminated or truncated:
            env.reset()
    return [name, len(graph), f"{np.mean(cands):.0f}", f"{steps / step_s:.1f}", f"{1e3 * meta_s / n_states:.1f}",
            f"{1e3 * fwd_s / n_states:.1f}", f"{np.mean(nodes):.0f}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", help="comma-separated built-in graphs (default: all)")
    ap.add_argument("--steps", type=int, default=20, help="env steps timed per graph")
    ap.add_argument("--horizon", type=int, default=50)
    ap.add_argument("--max-candidates", type=int,
                    help="cap on candidates per step (default: the policy's training cap; 0: none)")
    ap.add_argument("--policy", help="checkpoint (default: the shipped policy, else a fresh default network)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", help="also write the table to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.graphs.split(",") if args.graphs else graphs.names()
    path = Path(args.policy) if args.policy else default_policy_path()
    cap = args.max_candidates or None
    if path.exists():
        policy, ckpt = load_policy(path)
        which = str(path)
        cap = candidate_cap(ckpt, args.max_candidates)
    else:
        from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
        from xrl.nn import GraphPolicy, PolicyConfig

        policy, which = GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM)).eval(), "fresh default network"
    engine = RewriteEngine()
    rows = []
    for name in names:
        rows.append(bench_graph(name, engine, policy, args.steps, args.horizon, cap, args.seed))
        print(f"\r{len(rows)}/{len(names)} graphs", end="", file=sys.stderr, flush=True)
    print("\r", end="", file=sys.stderr)
    table = format_table(["graph", "ops", "candidates", "env steps/s", "meta-graph ms/state", "forward ms/state",
                          "meta-graph nodes"], rows)
    text = (f"analytic cost model (h100), policy: {which}, at most {cap or 'all'} candidates per step, "
            f"torch threads {args.threads}\n{table}")
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
