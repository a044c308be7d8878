"""A composite rewrite as a sequence of elementary ones (issue 32, item 1).

A `kind=composite` rule does in one step what a sequence of `kind=elementary` rules does (a LoRA merge is
fold the scale, move the bias, reassociate, factor). `elementary_route` finds that sequence for one applied
composite: a breadth-first search over the elementary engine's rewrites inside the composite's region
(the nodes it removed, and the nodes each step adds), until a graph with the composite's structure is
reached. Structure, not the canonical hash: the hash keys new weights by how they were computed, and
W + (A C) s and W + A (C s) are the same weight reached two ways. Callers check the values (the tests run
both graphs with the reference executor; the benchmark's references are verified like every result).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xrl.ir import Graph
from xrl.rewrite.candidate import Candidate
from xrl.rewrite.engine import RewriteEngine


def structure(graph: Graph) -> Counter:
    """The graph's ops as a multiset of (op, domain, attributes, input and output types), weights by shape:
    equal for graphs that compute the same ops on the same shapes, whatever their names or weight values."""
    out: Counter = Counter()
    for n in graph.nodes.values():
        attrs = tuple(sorted((k, repr(np.asarray(v).tolist()) if isinstance(v, np.ndarray) else repr(v))
                             for k, v in n.attrs.items()))
        ins = tuple(("w" if graph.is_weight(v) else "v", str(graph.types[v])) if v else None for v in n.inputs)
        outs = tuple(str(graph.types[v]) for v in n.outputs)
        out[(n.op, n.domain, attrs, ins, outs)] += 1
    return out


@dataclass
class Route:
    """Elementary steps from a graph to a composite's result (`steps`: `rule@nodes`, as search results record)."""

    steps: list[str]
    graph: Graph
    states: int  # distinct graphs the search visited


def elementary_route(graph: Graph, composite: Candidate, engine: RewriteEngine, *, max_depth: int = 6,
                     max_states: int = 400) -> Route | None:
    """Elementary rewrites of `graph` (by `engine`, whose rules should be the elementary set) that reach a graph
    with the structure of `composite.graph`, each removing only nodes of the composite's region (the nodes it
removed and those the steps before added); None if none within
    `max_depth` steps and `max_states` graphs."""
    goal = structure(composite.graph)
    start_region = frozenset(n.name for n in composite.removed)
    frontier: list[tuple[Graph, frozenset[str], list[str]]] = [(graph, start_region, [])]
    seen = {graph.canonical_hash}
    for _ in range(max_depth):
        nxt: list[tuple[Graph, frozenset[str], list[str]]] = []
        for g, region, steps in frontier:
            for c in engine.candidates(g):
                if not all(n.name in region for n in c.removed):
                    continue
                h = c.skeleton.canonical_hash
                if h in seen:
                    continue
                seen.add(h)
                child = c.graph
                path = [*steps, c.step]
                if structure(child) == goal:
                    return Route(path, child, len(seen))
                if len(seen) >= max_states:
                    return None
                nxt.append((child, region | {n.name for n in c.added}, path))
        frontier = nxt
        if not frontier:
            break
    return None


def composite_candidates(graph: Graph, engine: RewriteEngine, rules: Sequence[str] | None = None) -> list[Candidate]:
    """The rewrites of `graph` by the engine's composite rules (or those named in `rules`)."""
    kinds = {r.name: r.kind for r in engine.rules}
    return [c for c in engine.candidates(graph)
            if (kinds.get(c.rule) == "composite" if rules is None else c.rule in rules)]
