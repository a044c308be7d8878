"""Using a trained policy: optimise one graph, and the baselines it is compared with.

`optimize_with_policy` plays the policy greedily (argmax at every step) and, with `samples = k`,
k sampled rollouts besides; it returns the cheapest graph any rollout passed through (a rollout
may climb over a cost-increasing step and stop later, so the best graph is not always the last).
`random_rollouts` is the random policy: a uniformly random rewrite every step for the whole
horizon, the best graph kept, likewise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from xrl.cost.base import CostModel
from xrl.env import GraphRewriteEnv
from xrl.features.incremental import IncrementalFeatures
from xrl.features.metagraph import FeatureCache
from xrl.ir import Graph
from xrl.nn.policy import GraphPolicy
from xrl.rl.policy_run import PolicyRun  # defined there, without torch (xrl.rl.rl_search)
from xrl.rl.rollout import observe, uphill_paid_off


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """The policy's forward passes on one thread: its tensors are small, and on a busy machine torch's
    thread pool spin-waits (a BERT state's forward pass: 0.15 s on one thread, 3.5 s on two, measured
    here under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)

@dataclass
class _Trajectory:
    best_graph: Graph
    best_cost: float
    best_steps: list[str]
    costs: list[float]
    steps: int


def _rollout(env: GraphRewriteEnv, graph: Graph, choose: Callable[[GraphRewriteEnv], int],
             deadline: float) -> _Trajectory:
    env.reset(options={"graph": graph})
    best = _Trajectory(graph, env.cost, [], [env.cost], 0)
    done = False
    while not done and time.perf_counter() < deadline:
        _, _, terminated, truncated, _ = env.step(choose(env))
        done = terminated or truncated
        best.costs.append(env.cost)
        best.steps += 1
        if env.cost < best.best_cost:
            best.best_graph, best.best_cost, best.best_steps = env.graph, env.cost, list(env.rewrites)
    return best


def _summarise(trajs: list[_Trajectory], original_cost: float, t0: float) -> PolicyRun:
    top = min(trajs, key=lambda t: t.best_cost)  # first on ties: the greedy rollout
    return PolicyRun(top.best_graph, top.best_cost, original_cost, top.best_steps, len(trajs),
                     sum(t.steps for t in trajs), time.perf_counter() - t0, uphill_paid_off(top.costs),
                     [original_cost / t.best_cost for t in trajs])


def make_env(graph: Graph, cost_model: CostModel, *, engine: Any = None, horizon: int = 50,
             max_candidates: int | None = None) -> GraphRewriteEnv:
    # xrl's own policy reads the env's candidates, not the padded observation external libraries need
    return GraphRewriteEnv(graph, cost_model, engine=engine, horizon=horizon, max_candidates=max_candidates,
                           observation="summary")


def optimize_with_policy(policy: GraphPolicy, graph: Graph, cost_model: CostModel, *, engine: Any = None,
                         horizon: int = 50, samples: int = 0, seed: int = 0, max_candidates: int | None = None,
                         time_limit: float | None = None,
                         featurize: FeatureCache | IncrementalFeatures | None = None) -> PolicyRun:
    """Greedy rollout of `policy` plus `samples` sampled ones; the cheapest graph any of them reached."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit if time_limit is not None else float("inf")
    env = make_env(graph, cost_model, engine=engine, horizon=horizon, max_candidates=max_candidates)
    featurize = featurize if featurize is not None else policy.features()
    policy.eval()
    gen = torch.Generator().manual_seed(seed)

    def choose(greedy: bool) -> Callable[[GraphRewriteEnv], int]:
        def pick(e: GraphRewriteEnv) -> int:
            with torch.no_grad():
                dist, _ = policy(observe(e, featurize))
            return int(dist.mode() if greedy else dist.sample(gen))

        return pick

    trajs = [_rollout(env, graph, choose(True), deadline)]
    for _ in range(samples):
        if time.perf_counter() >= deadline:
            break
        trajs.append(_rollout(env, graph, choose(False), deadline))
    return _summarise(trajs, env.cost0, t0)


def random_rollouts(graph: Graph, cost_model: CostModel, *, engine: Any = None, horizon: int = 50, rollouts: int = 1,
                    seed: int = 0, max_candidates: int | None = None) -> PolicyRun:
    """The random policy: a uniformly random rewrite at every step (never the no-op) until the horizon."""
    t0 = time.perf_counter()
    env = make_env(graph, cost_model, engine=engine, horizon=horizon, max_candidates=max_candidates)
    rng = np.random.default_rng(seed)

    def pick(e: GraphRewriteEnv) -> int:
        return 1 + int(rng.integers(e.num_actions - 1)) if e.num_actions > 1 else 0

    trajs = [_rollout(env, graph, pick, float("inf")) for _ in range(rollouts)]
    return _summarise(trajs, env.cost0, t0)


def describe_steps(steps: list[str]) -> dict[str, int]:
    """Rewrites by rule, most used first."""
    counts: dict[str, int] = {}
    for s in steps:
        counts[s] = counts.get(s, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


__all__ = ["PolicyRun", "describe_steps", "make_env", "optimize_with_policy", "random_rollouts"]
