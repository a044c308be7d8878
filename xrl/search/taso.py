"""TASO's cost-based backtracking search (Jia et al., SOSP 2019, Algorithm 2).

    queue <- {G0};  best <- G0;  seen <- {hash(G0)}
    repeat `budget` times while queue is not empty:
        G <- the cheapest graph in queue
        for every rewrite G' of G (every rule at every match):
            if hash(G') not in seen and cost(G') < alpha * cost(best):
                seen += hash(G');  queue += G'
                if cost(G') < cost(best): best <- G'

alpha > 1 lets the search keep graphs slightly worse than the best so far, so it can climb over a
cost-increasing step to reach a cheaper graph behind it (TASO enlarges a 1x1 convolution to 3x3,
which costs more on its own, so it can then merge with a sibling 3x3 convolution). alpha = 1 is a
best-first search that never accepts a worse graph.

Candidates are costed from their delta (`CostModel.delta_cost`): an exact sum update for per-op
models, so expanding a graph costs only the nodes each rewrite touched.
"""

from __future__ import annotations

import heapq
import itertools
import time

from xrl.cost.base import CostModel
from xrl.errors import ConfigError
from xrl.ir import Graph
from xrl.rewrite import Candidate, RewriteEngine
from xrl.search.result import SearchResult


def taso_search(graph: Graph, cost_model: CostModel, engine: RewriteEngine | None = None, *, alpha: float = 1.05,
                budget: int = 1000, time_limit: float | None = None) -> SearchResult:
    """Backtracking search over rewrites, best graph first; `budget` caps the graphs expanded.

    `explored` counts the graphs expanded (popped from the queue); `details` has how many candidates
    were generated and how many new graphs queued, and why the search stopped.
    """
    if alpha < 1.0:
        raise ConfigError(f"TASO's alpha must be at least 1 (1 = never accept a worse graph), not {alpha}")
    if budget < 1:
        raise ConfigError(f"TASO's budget must be at least one expansion, not {budget}")
    engine = engine if engine is not None else RewriteEngine.default()
    t0 = time.perf_counter()
    deadline = t0 + time_limit if time_limit is not None else float("inf")
    original_nodes = len(graph)
    original_cost = cost_model.cost(graph)

    tie = itertools.count()  # equal costs pop in the order they were queued: deterministic
    # The queue holds candidates, not graphs: a candidate's new weights (folded, concatenated) are
    # computed only when it is expanded, so the queue's memory is its structure, not its weights.
    queue: list[tuple[float, int, Graph | Candidate, tuple[str, ...]]] = [(original_cost, next(tie), graph, ())]
    seen = {graph.canonical_hash}
    best: Graph | Candidate = graph
    best_cost, best_steps = original_cost, ()
    expanded = generated = queued = 0
    while queue and expanded < budget and time.perf_counter() < deadline:
        cost, _, item, steps = heapq.heappop(queue)
        current = item.graph if isinstance(item, Candidate) else item
        expanded += 1
        for cand in engine.candidates(current, original_nodes=original_nodes):
            generated += 1
            # Cost first, from the delta: a pruned candidate's graph is never built or hashed. The bound
            # alpha * best only falls, so a graph pruned now would be pruned whenever it came back.
            new_cost = cand.delta_cost(cost_model, cost)
            if new_cost >= alpha * best_cost:
                continue
            key = cand.skeleton.canonical_hash  # the hash needs weight digests, not weights
            if key in seen:
                continue
            seen.add(key)
            queued += 1
            new_steps = (*steps, cand.step)
            heapq.heappush(queue, (new_cost, next(tie), cand, new_steps))
            if new_cost < best_cost:
                best, best_cost, best_steps = cand, new_cost, new_steps
            if time.perf_counter() >= deadline:
                break
    stop = "queue empty" if not queue else "budget" if expanded >= budget else "time limit"
    best_graph = best.graph if isinstance(best, Candidate) else best
    final = cost_model.cost(best_graph) if best_steps else original_cost  # exact, free of accumulated rounding
    return SearchResult(graph=best_graph, cost=final, original_cost=original_cost, steps=list(best_steps),
                        explored=expanded, time_s=time.perf_counter() - t0, method="taso",
                        details={"generated": generated, "queued": queued, "stop_reason": stop, "alpha": alpha})


def taso_runner(graph: Graph, cost_model: CostModel, *, seed: int = 0, steps: int | None = None,
                time_limit: float | None = None, alpha: float = 1.05, budget: int | None = None,
                **options: object) -> SearchResult:
    """`xrl optimize --search taso` (the runner signature of `xrl.search.registry.register_search`).

    `steps` (or `budget`) caps the graphs expanded (default 1000, TASO's); the search is
    deterministic, so `seed` is unused. The result has the `graph`, `steps` and `details` the API reads.
    """
    if options:
        raise ConfigError(f"taso has no option {', '.join(map(repr, sorted(options)))}; its options: alpha, budget")
    return taso_search(graph, cost_model, RewriteEngine.default(), alpha=alpha, budget=budget or steps or 1000,
                       time_limit=time_limit)
