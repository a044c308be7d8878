"""Policy-guided search: a beam over the policy's prior, ranked by its value head, under a time budget.

The argmax rollout reads one action per state; this search reads the policy as AlphaGo-style
searches do, as a prior over which rewrites are worth trying and a value for how much a state has
left to give:

    beam <- {input graph}
    repeat for each depth while the beam is not empty and time is left:
        for each state s in the beam: its `expand` most likely rewrites under pi(. | s)
        children, deduplicated by canonical hash (two orders of commuting rewrites are one graph),
        pruned to cost < alpha * the parent's cost (a step uphill is allowed, a climb is not),
        scored  achieved(s') + V(s')         achieved: the reward collected so far, 100 * (c0 - c) / c0
        beam <- the `width` best scored children
    stop when `patience` depths pass without the beam finding a state cheaper than it had found
    then again, twice as wide and trying twice as many rewrites per state, while the budget lasts;
    once a pass sees no more states than the one before (the space under the prior's top choices
    is exhausted), the next ones allow steeper climbs: alpha's margin doubles (1.1, 1.2, 1.4, ...)
    return the cheapest graph seen, the argmax rollout's included

The argmax rollout runs first, so the search never returns worse than argmax; the children of a
depth are encoded in one batched forward pass. With a prior that has learned which uphill rewrite
pays off (an enlargement before a merge) the beam follows it where greedy and a cost-ranked beam
drop it. Relaxing alpha only once the space is exhausted matters on small graphs whose best sequence
climbs steeply first: merging a decoding-step LoRA adapter, x A B -> x (A B), turns two thin GEMVs into
a full one (about 1.5x the cost of the graph) before x W + x (A B) = x (W + A B) removes it; large graphs
spend their budget widening at the first alpha. Deterministic where the budget does not bind: no
sampling, ties go to the engine's candidate order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from xrl.cost.base import CostModel
from xrl.features.incremental import IncrementalFeatures
from xrl.features.metagraph import FeatureCache
from xrl.ir import Graph
from xrl.nn.policy import GraphPolicy
from xrl.rl.evaluate import PolicyRun, make_env, optimize_with_policy
from xrl.rl.rollout import observe, uphill_paid_off

# Defaults: a beam of 4 states, each trying its 4 likeliest rewrites; 10% uphill per step (as beam search).
WIDTH, EXPAND, ALPHA = 4, 4, 1.1
# Depths without a new best before a pass stops: the beam wanders uphill for at most this long.
PATIENCE = 8
SCORE_BATCH = 32  # states per forward pass when scoring children
MAX_EXPAND = 32  # widening doubles the rewrites tried per state up to this
MAX_ALPHA = 8.0  # relaxing stops here: a climb to 8x the parent's cost is not a step on any useful path


@dataclass
class _Node:
    env: Any  # a GraphRewriteEnv forked at this state
    steps: list[str]
    costs: list[float]  # the cost at every state of the path, the input's first
    score: float = 0.0
    dist: Any = None  # the policy's distribution over this state's actions


def guided_search(policy: GraphPolicy, graph: Graph, cost_model: CostModel, *, engine: Any = None,
                  horizon: int = 50, width: int = WIDTH, expand: int = EXPAND, alpha: float = ALPHA,
                  patience: int = PATIENCE, max_alpha: float = MAX_ALPHA, time_limit: float | None = None,
                  max_candidates: int | None = None,
                  featurize: FeatureCache | IncrementalFeatures | None = None) -> PolicyRun:
    """The cheapest graph the argmax rollout or the policy-guided beam reached within `time_limit` seconds."""
    if width < 1 or expand < 1:
        raise ValueError(f"width and expand must be at least 1, not {width} and {expand}")
    t0 = time.perf_counter()
    deadline = t0 + time_limit if time_limit is not None else float("inf")
    featurize = featurize if featurize is not None else policy.features()
    if engine is None:  # one engine (its rules parsed and verified once) for the argmax rollout and the beam
        from xrl.rewrite import RewriteEngine

        engine = RewriteEngine()
    first = optimize_with_policy(policy, graph, cost_model, engine=engine, horizon=horizon,
                                 max_candidates=max_candidates, time_limit=time_limit, featurize=featurize)
    env_steps, states, last = first.env_steps, 0, 0

    env = make_env(graph, cost_model, engine=engine, horizon=horizon, max_candidates=max_candidates)
    env.reset(options={"graph": graph})
    c0 = env.cost0
    best = _Best(first.cost, first.graph, list(first.steps), first.uphill_paid_off)
    passes = []
    # Widening: one beam pass, then passes twice as wide and deep in the prior, while the budget lasts.
    # A pass that explored no more states than the last one has seen the whole space reachable under
    # the prior's top choices at this alpha: the next passes may climb more steeply.
    while time.perf_counter() < deadline and (width, expand, alpha) not in passes:
        passes.append((width, expand, alpha))
        explored = _beam_pass(env, c0, policy, featurize, best, width=width, expand=expand, alpha=alpha,
                              patience=patience, deadline=deadline)
        env_steps += explored
        states += explored
        if len(passes) > 1 and explored <= last:
            if alpha >= max_alpha:
                break
            alpha = min(max_alpha, 1 + max(2 * (alpha - 1), 0.1))
        last = explored
        width, expand = width * 2, min(expand * 2, MAX_EXPAND)
    return PolicyRun(best.graph, best.cost, c0, best.steps, 1 + states, env_steps, time.perf_counter() - t0,
                     best.uphill, [first.speedup, c0 / best.cost])


@dataclass
class _Best:
    cost: float
    graph: Graph
    steps: list[str]
    uphill: bool


def _beam_pass(env: Any, c0: float, policy: GraphPolicy, featurize: Any, best: _Best, *, width: int, expand: int,
               alpha: float, patience: int, deadline: float) -> int:
    """One beam pass from the input graph; updates `best`; returns the number of states it stepped into."""
    root = _Node(env, [], [c0])
    _score([root], policy, featurize, c0)
    beam, seen, stale, beam_best, stepped = [root], {env.graph.canonical_hash}, 0, c0, 0
    while beam and stale < patience and time.perf_counter() < deadline:
        children: list[_Node] = []
        improved = False
        for node in beam:
            for action in _likeliest(node, expand):
                if time.perf_counter() >= deadline:
                    break
                child = node.env.fork()
                _, _, terminated, truncated, _ = child.step(action)
                stepped += 1
                key = child.graph.canonical_hash
                if key in seen or child.cost >= alpha * node.env.cost:
                    continue
                seen.add(key)
                steps, costs = [*node.steps, child.last_rewrite], [*node.costs, child.cost]
                if child.cost < beam_best:
                    beam_best, improved = child.cost, True
                if child.cost < best.cost:
                    best.cost, best.graph, best.steps, best.uphill = child.cost, child.graph, steps, \
                        uphill_paid_off(costs)
                if not (terminated or truncated):
                    children.append(_Node(child, steps, costs))
        if children and time.perf_counter() < deadline:
            children = _score(children, policy, featurize, c0, deadline)
        else:
            children = []  # out of time: nothing scored to expand
        beam = sorted(children, key=lambda n: -n.score)[:width]  # stable: ties keep the engine's order
        stale = 0 if improved else stale + 1
    return stepped


def _likeliest(node: _Node, k: int) -> list[int]:
    """The state's k most likely rewrites (actions 1..n; the no-op is the beam's own stopping)."""
    logits = node.dist.log_probs[1:]  # one state: its actions in order, the no-op first
    if logits.numel() == 0:
        return []
    order = torch.argsort(-logits, stable=True)[:k]
    return [int(a) + 1 for a in order if torch.isfinite(logits[a])]


def _score(nodes: list[_Node], policy: GraphPolicy, featurize: Any, c0: float,
           deadline: float = float("inf")) -> list[_Node]:
    """Encode `nodes` in batched forward passes of SCORE_BATCH states: each node's distribution, and its
    score achieved + V. Observing and encoding a wide beam's children of a large graph takes seconds: a
    batch not started by `deadline` is dropped, so the search ends within about one batch of its budget.
    Returns the scored nodes."""
    scored: list[_Node] = []
    for lo in range(0, len(nodes), SCORE_BATCH):
        if scored and time.perf_counter() >= deadline:
            break
        batch = nodes[lo:lo + SCORE_BATCH]
        metas = [observe(n.env, featurize) for n in batch]
        with torch.no_grad():
            dist, value = policy(type(metas[0]).collate(metas) if len(metas) > 1 else metas[0])
        for i, n in enumerate(batch):
            start, count = int(dist.start[i]), int(dist.counts[i])
            n.dist = _Slice(dist.log_probs[start:start + count])
            n.score = 100.0 * (c0 - n.env.cost) / c0 + float(value[i])
        scored.extend(batch)
    return scored


@dataclass
class _Slice:
    log_probs: torch.Tensor  # one state's log-probabilities, action order


__all__ = ["ALPHA", "EXPAND", "MAX_ALPHA", "PATIENCE", "WIDTH", "guided_search"]
