"""Random search: `steps` rewrites, each chosen uniformly among the current graph's candidates.

The baseline a learned policy must beat, and the engine of the rewrite property tests: any
sequence of rewrites must leave what the graph computes unchanged. The result is the *final*
graph (the walk does not keep the best graph it passed; `details` records the best cost seen and
after how many steps, so a caller can tell how much a keep-the-best variant would gain).
"""

from __future__ import annotations

import random
import time

from xrl.cost.base import CostModel
from xrl.ir import Graph
from xrl.rewrite import RewriteEngine
from xrl.search.result import SearchResult


def random_search(graph: Graph, cost_model: CostModel, engine: RewriteEngine | None = None, *, steps: int,
                  seed: int) -> SearchResult:
    """Apply up to `steps` uniformly random rewrites (fewer if a graph has no candidate)."""
    engine = engine if engine is not None else RewriteEngine.default()
    rng = random.Random(seed)
    t0 = time.perf_counter()
    original_cost = cost = best_cost = cost_model.cost(graph)
    best_step = 0
    nodes0 = len(graph)
    applied: list[str] = []
    explored = 0
    for _ in range(steps):
        cands = engine.candidates(graph, original_nodes=nodes0)
        explored += len(cands)
        if not cands:
            break
        cand = cands[rng.randrange(len(cands))]
        cost = cand.delta_cost(cost_model, cost)
        graph = cand.graph
        applied.append(cand.step)
        if cost < best_cost:
            best_cost, best_step = cost, len(applied)
    final = cost_model.cost(graph) if applied else original_cost
    return SearchResult(graph=graph, cost=final, original_cost=original_cost, steps=applied, explored=explored,
                        time_s=time.perf_counter() - t0, method="random",
                        details={"seed": seed, "best_cost": min(best_cost, final), "best_step": best_step})
