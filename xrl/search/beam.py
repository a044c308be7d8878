"""Beam search over rewrites, and its exhaustive limit for small rewrite spaces.

    frontier <- {G0};  best <- G0;  seen <- {hash(G0)}
    repeat while frontier is not empty (and depth, states and time allow):
        children <- every rewrite G' of every G in frontier
                    with hash(G') not in seen and cost(G') < alpha * cost(best)
        seen += their hashes;  best <- the cheapest of best and children
        frontier <- the `width` cheapest children (ties: the order they were generated in)

Where greedy follows one path downhill, the beam keeps `width` paths, and `alpha` > 1 lets them
pass through graphs slightly worse than the best so far: a kernel enlarged so that it can merge
with a sibling, or a transpose moved so that two GEMMs meet. With width 1 and alpha 1 it is greedy
search step for step (each level keeps the cheapest strictly improving candidate).

Exhaustive mode (`exhaustive_search`) is the same walk with an unbounded width and no cost bound: it
visits every graph reachable by the rules, each once (by canonical hash), up to `max_states` graphs.
`details["exhausted"]` says whether the whole space was seen; only then is its best result the
optimum of that space under the cost model.

States are deduplicated by the canonical hash of the candidate's skeleton (structure, types and weight
digests), as in TASO's search, so a queued state's weights are computed only when it is expanded.
"""

from __future__ import annotations

import math
import time

from xrl.cost.base import CostModel
from xrl.errors import ConfigError
from xrl.ir import Graph
from xrl.rewrite import Candidate, RewriteEngine
from xrl.search.greedy import MIN_GAIN
from xrl.search.result import SearchResult

DEFAULT_WIDTH = 8
DEFAULT_ALPHA = 1.1  # climbs a 10% worse step: an enlarged kernel before its merge is a few percent of a cell
DEFAULT_MAX_STATES = 20_000  # exhaustive mode: graphs costed before it gives up on seeing the whole space
# Out of time mid-level: the clock is read once every this many candidates (a candidate costs microseconds)
CLOCK_EVERY = 16


def beam_search(graph: Graph, cost_model: CostModel, engine: RewriteEngine | None = None, *,
                width: int | None = DEFAULT_WIDTH, alpha: float = DEFAULT_ALPHA, max_steps: int | None = None,
                max_states: int | None = None, time_limit: float | None = None,
                method: str = "beam") -> SearchResult:
    """Level-by-level beam search; `width` None keeps every child (breadth-first over the space).

    `max_steps` caps the depth (rewrites in a result), `max_states` the graphs accepted into the
    search, `time_limit` the seconds (checked between states and every CLOCK_EVERY candidates).
    `explored` counts the graphs expanded; `details` says why it stopped and whether the space
    within the bound was exhausted (every accepted graph expanded, no cap or limit reached).
    """
    if width is not None and width < 1:
        raise ConfigError(f"beam width must be at least 1, not {width}")
    if not alpha >= 1.0:
        raise ConfigError(f"beam alpha must be at least 1 (1 = never accept a graph worse than the best), not {alpha}")
    if max_states is not None and max_states < 1:
        raise ConfigError(f"max_states must be at least 1, not {max_states}")
    engine = engine if engine is not None else RewriteEngine.default()
    t0 = time.perf_counter()
    deadline = t0 + time_limit if time_limit is not None else math.inf
    original_nodes = len(graph)
    original_cost = cost_model.cost(graph)

    # A frontier entry: (cost, generation order, graph or candidate, steps); candidates build their graph on expansion.
    frontier: list[tuple[float, int, Graph | Candidate, tuple[str, ...]]] = [(original_cost, 0, graph, ())]
    seen = {graph.canonical_hash}
    best: Graph | Candidate = graph
    best_cost, best_steps = original_cost, ()
    expanded = generated = order = depth = 0
    stop = None
    while frontier:
        if max_steps is not None and depth >= max_steps:
            stop = "depth"
            break
        children: list[tuple[float, int, Graph | Candidate, tuple[str, ...]]] = []
        for cost, _, item, steps in frontier:
            if time.perf_counter() >= deadline:
                stop = "time limit"
                break
            current = item.graph if isinstance(item, Candidate) else item
            expanded += 1
            for cand in engine.candidates(current, original_nodes=original_nodes):
                generated += 1
                if generated % CLOCK_EVERY == 0 and time.perf_counter() >= deadline:
                    stop = "time limit"
                    break
                # Cost first, from the delta: a pruned candidate is never hashed. The bound only falls, so a
                # graph pruned now would be pruned whenever it came back.
                new_cost = cand.delta_cost(cost_model, cost)
                if not new_cost < alpha * best_cost * (1 - MIN_GAIN):
                    continue
                key = cand.skeleton.canonical_hash
                if key in seen:
                    continue
                seen.add(key)
                order += 1
                new_steps = (*steps, cand.step)
                children.append((new_cost, order, cand, new_steps))
                if new_cost < best_cost * (1 - MIN_GAIN):
                    best, best_cost, best_steps = cand, new_cost, new_steps
                if max_states is not None and len(seen) >= max_states:
                    stop = "state cap"
                    break
            if stop is not None:
                break
        if stop is not None:
            break
        children.sort(key=lambda c: (c[0], c[1]))
        frontier = children if width is None else children[:width]
        depth += 1
    exhausted = stop is None and width is None  # every accepted graph was expanded and nothing was cut
    best_graph = best.graph if isinstance(best, Candidate) else best
    final = cost_model.cost(best_graph) if best_steps else original_cost  # exact, free of accumulated rounding
    return SearchResult(graph=best_graph, cost=final, original_cost=original_cost, steps=list(best_steps),
                        explored=expanded, time_s=time.perf_counter() - t0, method=method,
                        details={"width": width, "alpha": alpha, "depth": depth, "states": len(seen),
                                 "generated": generated, "stop_reason": stop or "frontier empty",
                                 "exhausted": exhausted})


def exhaustive_search(graph: Graph, cost_model: CostModel, engine: RewriteEngine | None = None, *,
                      max_states: int = DEFAULT_MAX_STATES, max_steps: int | None = None,
                      time_limit: float | None = None) -> SearchResult:
    """Every graph the rules reach from `graph`, each once, until `max_states` are seen: the optimum of
    the space when `details["exhausted"]` is true."""
    return beam_search(graph, cost_model, engine, width=None, alpha=math.inf, max_steps=max_steps,
                       max_states=max_states, time_limit=time_limit, method="exhaustive")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"beam {name} must be a positive integer, not {value!r}")
    return value


def beam_runner(graph: Graph, cost_model: CostModel, *, seed: int = 0, steps: int | None = None,
                time_limit: float | None = None, width: int = DEFAULT_WIDTH, alpha: float = DEFAULT_ALPHA,
                **options: object) -> SearchResult:
    """`xrl optimize --search beam` (the runner signature of `xrl.search.registry.register_search`): `steps` caps
    the depth; the search is deterministic, so `seed` is unused."""
    if options:
        raise ConfigError(f"beam has no option {', '.join(map(repr, sorted(options)))}; its options: width, alpha")
    return beam_search(graph, cost_model, RewriteEngine.default(), width=_positive_int("width", width),
                       alpha=float(alpha), max_steps=steps, time_limit=time_limit)


def exhaustive_runner(graph: Graph, cost_model: CostModel, *, seed: int = 0, steps: int | None = None,
                      time_limit: float | None = None, max_states: int = DEFAULT_MAX_STATES,
                      **options: object) -> SearchResult:
    """`xrl optimize --search exhaustive`: every reachable graph up to `max_states`; `steps` caps the depth."""
    if options:
        raise ConfigError(f"exhaustive has no option {', '.join(map(repr, sorted(options)))}; its options: max_states")
    return exhaustive_search(graph, cost_model, RewriteEngine.default(),
                             max_states=_positive_int("max_states", max_states), max_steps=steps, time_limit=time_limit)
