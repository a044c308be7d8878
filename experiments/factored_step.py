"""Issue 32.4: what one policy step costs with the flat action and with the factored one (xrl.rl.factored), beside a
greedy step, on research-suite graphs.

Along greedy's path from each graph (its first --states states), per state, interleaved (the order of the three
rotates from state to state): a greedy step (enumerate every rewrite, price each), a flat policy step (the env's
state: every rewrite enumerated and priced for the hints, then the policy's judgement over all of them, its
argmax) and a factored policy step (the same with xrl.rl.factored.FactoredEngine: the matching rules found without
building, only the top rules' rewrites built and priced and judged; its rule prior warmed on the path's earlier
states, as a search's would be). One torch thread, the research policy, the benchmark's cost and elementary rules.
Reported per graph: the median seconds per step and the mean number of candidates built, and whether the factored
step's argmax is among the flat step's candidates.

    .venv/bin/python experiments/factored_step.py --graphs gen_mixed_0,fam_dbb_ts,fam_lora_vit_full_ts,nasrnn
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from xrl.rewrite.rules import use_rules
from xrl.rl.evaluate import make_env
from xrl.rl.factored import TOP_RULES, FactoredEngine
from xrl.rl.priors import make_prior
from xrl.search import suite
from xrl.search.greedy import greedy_search


def key(cand) -> str:
    return cand.step  # rule@location


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="gen_mixed_0,fam_dbb_ts,fam_lora_vit_full_ts,nasrnn")
    ap.add_argument("--states", type=int, default=8)
    ap.add_argument("--top", type=int, default=TOP_RULES)
    ap.add_argument("--policy", default="research")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from xrl.rl.policy_files import existing_policy_path

    policy = existing_policy_path(args.policy)  # a shipped name or a path
    cost = suite.cost_model()
    print("| graph | ops | greedy step s | flat policy step s | factored policy step s | flat / factored | "
          "candidates flat | candidates factored | factored argmax among flat |")
    print("|---|---|---|---|---|---|---|---|---|")
    with use_rules(suite.RULES):
        eng = suite.engine()
        for name in args.graphs.split(","):
            g = suite.suite_graphs(None, [name])[0].build()
            path = [g]
            first = greedy_search(g, cost, eng, max_steps=args.states - 1)
            for step in first.steps:  # the states greedy passes through
                path.append(suite.replay(path[-1], [step], eng))
            flat_prior = make_prior("trained", policy=policy)
            fac_prior = make_prior("trained", policy=policy)
            fac = FactoredEngine(eng, cost, top=args.top)
            times: dict[str, list[float]] = {"greedy": [], "flat": [], "factored": []}
            built = {"flat": [], "factored": []}
            among = []
            for i, s in enumerate(path):
                flat_keys: set = set()
                fac_choice = None
                arms = ["greedy", "flat", "factored"]
                arms = arms[i % 3:] + arms[:i % 3]  # rotate the order
                for arm in arms:
                    t = time.perf_counter()
                    if arm == "greedy":
                        c0 = cost.cost(s)
                        for c in eng.candidates(s):
                            c.delta_cost(cost, c0)
                    else:
                        env = make_env(s, cost, engine=eng if arm == "flat" else fac, horizon=50)
                        env.reset(options={"graph": s})
                        if env.candidates:
                            prior = flat_prior if arm == "flat" else fac_prior
                            a = int(prior.judge([env])[0].log_probs.argmax())
                        built[arm].append(len(env.candidates))
                        if arm == "flat":
                            flat_keys = {key(c) for c in env.candidates}
                        elif env.candidates and a > 0:
                            fac_choice = key(env.candidates[a - 1])
                    times[arm].append(time.perf_counter() - t)
                if fac_choice is not None:
                    among.append(fac_choice in flat_keys)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"| {name} | {len(g)} | {med['greedy']:.3f} | {med['flat']:.3f} | {med['factored']:.3f} | "
                  f"{med['flat'] / med['factored']:.2f} | {statistics.mean(built['flat']):.0f} | "
                  f"{statistics.mean(built['factored']):.0f} | {sum(among)}/{len(among)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
