"""Greedy search: apply the single best rewrite until none lowers the cost.

    G <- input;  c <- cost(G)
    repeat:  G' <- argmin over candidates of cost(G')      (each re-costed from its delta)
             if cost(G') >= c: stop;  G, c <- G', cost(G')

Ties go to the first candidate in the engine's (deterministic) order. The cost strictly falls at
every step, so the search ends. A per-op cost model costs a candidate from the nodes it removes
and adds, without building its graph; only the chosen candidate's graph is built.

Under a measured whole-graph cost (`measured` True: onnxruntime, end-to-end timing) the cheapest of
many noisy timings is biased low (the winner's curse): a step is taken only when fresh, alternating
timings of the two graphs confirm it beyond their noise (`xrl.cost.speedup`). The best CONFIRM_TRIES
candidates are tried in order; when none is confirmed, the search stops.

Timing every candidate of a large graph end to end is slow (resnet50: 91 candidates of 44 ms,
13 runs each, a session built per candidate). With a `screen` (a cheap per-op estimate, such as the
analytic model of the device being timed), only the `screen_top` candidates it ranks best are
timed: the estimate proposes, the measurement decides.
"""

from __future__ import annotations

import time

from xrl.cost.base import CostModel
from xrl.cost.speedup import measure_speedup
from xrl.ir import Graph
from xrl.rewrite import RewriteEngine
from xrl.search.result import SearchResult

# A candidate must beat the current cost by this fraction: float noise in a delta must not count.
MIN_GAIN = 1e-9
# Under a measured whole-graph cost: candidates re-timed before giving up, and rounds per re-timing.
CONFIRM_TRIES = 3
CONFIRM_ROUNDS = 3


# Re-cost only the kernels near each rewrite where the cost model can (`MeasuredKernelCostModel.local_cost`);
# False costs every candidate's whole graph (the reference the tests compare with)
LOCAL_COSTING = True


def rewrite_seeds(cand) -> list[str]:  # noqa: ANN001 - an xrl.rewrite.Candidate
    """The node names a rewrite touched: its added nodes, its removed ones (names of the parent), and the nodes
    of the rewritten graph next to them (producers of what they read, readers of what they wrote or renamed)."""
    g = cand.skeleton
    producers, consumers = g.producers, g.consumers
    seeds = [n.name for n in (*cand.added, *cand.removed)]
    values = {v for n in (*cand.removed, *cand.added) for v in (*n.inputs, *n.outputs) if v}
    values |= set(cand.rename) | set(cand.rename.values())
    for v in values:
        p = producers.get(v)
        if p is not None:
            seeds.append(p[0].name)
        seeds.extend(u.name for u in consumers.get(v, ()))
    return seeds


def greedy_search(graph: Graph, cost_model: CostModel, engine: RewriteEngine | None = None, *,
                  max_steps: int | None = None, time_limit: float | None = None,
                  screen: CostModel | None = None, screen_top: int = 8) -> SearchResult:
    """Apply the best improving rewrite until none improves, `max_steps` are taken or `time_limit`
    seconds pass (checked between steps). `explored` counts the candidates costed by `cost_model`.
    `screen` (a per-op model; used only when `cost_model` times whole graphs) limits each step to the
    `screen_top` candidates it estimates cheapest."""
    if screen is not None and (not screen.per_op or screen_top < 1):
        raise ValueError("a screen must be a per-op cost model, with screen_top >= 1")
    screening = screen is not None and cost_model.measured
    local = (not cost_model.per_op and not cost_model.measured and cost_model.local_costing
             and LOCAL_COSTING)
    engine = engine if engine is not None else RewriteEngine.default()
    t0 = time.perf_counter()
    original_cost = cost = cost_model.cost(graph)
    nodes0 = len(graph)
    steps: list[str] = []
    explored = confirmations = 0
    stopped = "the step limit"  # why the search ended: said in its details (a converged greedy has finished)
    while max_steps is None or len(steps) < max_steps:
        if time_limit is not None and time.perf_counter() - t0 >= time_limit:
            stopped = "the time limit"
            break
        improving = []
        cands = list(enumerate(engine.candidates(graph, original_nodes=nodes0)))
        if screening and len(cands) > screen_top:
            base = screen.cost(graph)
            estimate = {i: cand.delta_cost(screen, base) for i, cand in cands}
            cands = sorted(cands, key=lambda ic: (estimate[ic[0]], ic[0]))[:screen_top]
        # a model that prices kernels (measured kernel costs) re-costs only what a rewrite changed: the graph's
        # kernels are planned once a step, each candidate's near its rewrite (`local_cost`)
        parent_plan = cost_model.plan_costs(graph) if local else None
        for i, cand in cands:
            if time_limit is not None and explored % 16 == 0 and time.perf_counter() - t0 >= time_limit:
                stopped = "the time limit"
                break  # out of time mid-step: take the best improvement costed so far
            explored += 1
            c = None
            if parent_plan is not None:
                c = cost_model.local_cost(parent_plan, cand.skeleton, rewrite_seeds(cand))
                if c is not None:
                    c += cost - parent_plan.total  # the step's cost as the search holds it
            if c is None:
                c = cand.delta_cost(cost_model, cost)
            if c < cost * (1 - MIN_GAIN):
                improving.append((c, i, cand))
        improving.sort(key=lambda t: (t[0], t[1]))  # cheapest first; ties to the engine's order
        if cost_model.measured:  # noisy timings: keep the first improvement that re-timing confirms
            confirmed = []
            for c, i, cand in improving[:CONFIRM_TRIES]:
                confirmations += 1
                if measure_speedup(cost_model, graph, cand.graph, rounds=CONFIRM_ROUNDS).faster:
                    confirmed = [(c, i, cand)]
                    break
            improving = confirmed
        if not improving:
            if stopped != "the time limit":
                stopped = "converged"  # no rewrite improves
            break
        best_cost, _, best = improving[0]
        graph, cost = best.graph, best_cost
        steps.append(best.step)
    final = cost_model.cost(graph) if steps else original_cost  # exact, free of accumulated rounding
    return SearchResult(graph=graph, cost=final, original_cost=original_cost, steps=steps, explored=explored,
                        time_s=time.perf_counter() - t0, method="greedy",
                        details={"stopped": stopped, **({"confirmations": confirmations,
                                                         "screen": screen.describe() if screening else None,
                                                         "screen_top": screen_top if screening else None}
                                                        if cost_model.measured else {})})
