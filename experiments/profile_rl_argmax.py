"""Where the argmax policy's search time goes, against greedy's, on one graph.

    .venv/bin/python experiments/profile_rl_argmax.py [bert] [--rounds 2] [--profile]

Times greedy and the shipped policy's argmax rollout (`--search rl --rl-mode argmax`) in alternating
rounds on one torch thread, under the analytic h100 model, and prints (seconds, speedup, rewrites) per
run; `--profile` adds a cProfile of one more rollout, by cumulative time. `bench_rl.py --compare` gives
the ratio per graph; this is for finding what to make cheaper.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch
from bench_rl import search_graph

from xrl.cost import get_cost_model
from xrl.rewrite import RewriteEngine
from xrl.rl.rl_search import rl_search
from xrl.search.greedy import greedy_search


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graph", nargs="?", default="bert", help="a built-in graph, or bert_base")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="cProfile one more argmax rollout")
    args = ap.parse_args()
    torch.set_num_threads(1)
    graph, cost, engine = search_graph(args.graph), get_cost_model("analytic", device="h100"), RewriteEngine.default()

    def argmax() -> tuple[float, float, int, int]:  # what `--search rl --rl-mode argmax` runs; time_s: the rollout's
        run = rl_search(graph, cost, mode="argmax", engine=engine)
        return run.time_s, run.speedup, len(run.steps), run.env_steps

    for r in range(args.rounds):
        g = greedy_search(graph, cost, engine)
        print(f"round {r}: greedy {g.time_s:.2f} s, {g.original_cost / g.cost:.3f}x, {len(g.steps)} rewrites")
        t, s, n, e = argmax()
        print(f"round {r}: argmax {t:.2f} s, {s:.3f}x, {n} rewrites, {e} env steps ({t / g.time_s:.2f}x greedy's time)")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(argmax)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
