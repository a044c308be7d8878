"""Tensat-style search (Yang et al., MLSys 2021): equality saturation over xrl's rules, then extraction.

    graph --encode--> e-graph --saturate (rules, limits)--> e-graph --export + cost--> extraction
          <--decode-- choice of one e-node per e-class <--greedy | ILP (HiGHS)--

Where TASO's search rewrites one graph at a time and must choose which rewrite to follow, an
e-graph keeps every rewritten form at once (shared structure, equal values in one e-class), and
the best graph is extracted at the end. Modules, after egg's five concepts: `language` (terms and
the Graph <-> term translation), `analysis` (types and constants of each e-class), `rewrites`
(xrl's rules as egglog rules), `runner` (saturation under limits), `extract` (greedy and ILP).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from xrl.cost.base import CostModel
from xrl.errors import ConfigError
from xrl.ir import Graph
from xrl.rewrite.lang import Rule
from xrl.search.result import SearchResult
from xrl.search.tensat.analysis import Context, registered
from xrl.search.tensat.extract import greedy_extract, ilp_extract
from xrl.search.tensat.language import analysis_rules, decode, encode, export, extraction_problem
from xrl.search.tensat.rewrites import Coverage, translate
from xrl.search.tensat.runner import TENSAT_ITER_LIMIT, TENSAT_NODE_LIMIT, Limits, saturate

EXTRACTORS = ("ilp", "greedy")


def tensat_search(graph: Graph, cost_model: CostModel, rules: Sequence[Rule] | None = None, *,
                  node_limit: int = Limits.node_limit, iter_limit: int = Limits.iter_limit,
                  time_limit: float | None = Limits.time_limit, multi_iter_limit: int = Limits.multi_iter_limit,
                  extractor: str = "ilp",
                  ilp_time_limit: float = 60.0) -> SearchResult:
    """Saturate `graph` under `rules` (default: the verified built-in rules), extract the cheapest
    graph under `cost_model` (per-op costs).

    `time_limit` bounds saturation; `ilp_time_limit` bounds the ILP solve (greedy is its warm start
    and its fallback). The result's `steps` names the rules whose rewrites the e-graph holds (an
    extracted graph is not a sequence of rewrites); `explored` is the number of e-nodes.
    """
    if extractor not in EXTRACTORS:
        raise ConfigError(f"unknown extractor {extractor!r}; choose one of: {', '.join(EXTRACTORS)}")
    # ILP extraction sums per-op costs. A target's estimate is not a sum (the runtime's fusions couple
    # neighbours): extract with the per-op roofline of its device, then judge the result by the target.
    extraction_model = cost_model.per_op_estimate()
    if extraction_model is None or not extraction_model.per_op:
        raise ConfigError(f"tensat extracts with per-op costs; the {cost_model.name!r} cost model times whole "
                          "graphs. Use the analytic cost model (--cost analytic) for tensat")
    if node_limit < 1 or iter_limit < 0:
        raise ConfigError(f"tensat needs node_limit >= 1 and iter_limit >= 0, got {node_limit} and {iter_limit}")
    if rules is None:
        from xrl.rewrite import load_rules

        rules = tuple(load_rules())
    t0 = time.perf_counter()
    original_cost = cost_model.cost(graph)
    ctx = Context(graph)
    with registered(ctx):
        encoding = encode(_without_trailing_empty_inputs(graph), ctx)
        rewrites, coverage = translate(rules, ctx)
        report = saturate(encoding.egraph, rewrites, analysis_rules(ctx),
                          Limits(node_limit, iter_limit, time_limit, multi_iter_limit))
        t1 = time.perf_counter()
        exp = export(encoding)
        problem = extraction_problem(exp, extraction_model, ctx)
        greedy = greedy_extract(problem)
        chosen = greedy if extractor == "greedy" else ilp_extract(problem, time_limit=ilp_time_limit,
                                                                    warm_start=greedy)
        best = decode(exp, chosen.choice, graph, ctx)
        extract_s = time.perf_counter() - t1
    best_cost = cost_model.cost(best)
    if best_cost > original_cost:  # cannot happen with an exact extraction; never return a worse graph
        best, best_cost = graph, original_cost
    details = {
        "iterations": report.iterations, "stop_reason": report.stop_reason, "saturation_s": report.time_s,
        "enodes_per_iteration": report.enodes_per_iteration, "eclasses": len(problem.classes),
        "enodes": len(problem.nodes), "extractor": extractor, "extraction_status": chosen.status,
        "extraction_cost": chosen.cost, "greedy_extraction_cost": greedy.cost, "extract_s": extract_s,
        "rules_translated": len(coverage.translated), "egglog_rules": coverage.egglog_rules,
        "rules_skipped": dict(coverage.skipped), "extracted_under": extraction_model.describe(),
    }
    return SearchResult(graph=best, cost=best_cost, original_cost=original_cost, steps=_new_ops(graph, best),
                        explored=len(problem.nodes), time_s=time.perf_counter() - t0, method="tensat",
                        details=details)


def tensat_runner(graph: Graph, cost_model: CostModel, *, seed: int = 0, steps: int | None = None,
                  time_limit: float | None = None, **options: Any) -> SearchResult:
    """`xrl optimize --search tensat` (the runner signature of `xrl.search.registry.register_search`).

    `steps` caps the saturation iterations; `time_limit` is split: half for saturation, the rest
    (at least what saturation left) for extraction. Other options are `tensat_search`'s keywords
    (node_limit, iter_limit, multi_iter_limit, extractor, ilp_time_limit). Deterministic: `seed` is unused.
    """
    allowed = {"node_limit", "iter_limit", "multi_iter_limit", "extractor", "ilp_time_limit"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"tensat has no option {', '.join(map(repr, unknown))}; "
                          f"its options: {', '.join(sorted(allowed))}")
    kwargs: dict[str, Any] = dict(options)
    if steps is not None:
        kwargs.setdefault("iter_limit", steps)
    if time_limit is not None:
        kwargs["time_limit"] = time_limit / 2
        kwargs.setdefault("ilp_time_limit", time_limit / 2)
    return tensat_search(graph, cost_model, **kwargs)


def _new_ops(original: Graph, best: Graph) -> list[str]:
    """The ops of `best` that `original` has no op like (same op, attributes and types), as
    "new <op>": an extracted graph is not a sequence of rewrites, so this is what it changed."""
    from collections import Counter

    def key(n, g: Graph) -> tuple:
        return (n.op, n.attr_key(), tuple(str(g.types[v]) if v else "" for v in n.inputs),
                tuple(str(g.types[v]) for v in n.outputs))

    before = Counter(key(n, original) for n in original.nodes.values())
    out = []
    for n in best.topological_order:
        k = key(n, best)
        if before[k] > 0:
            before[k] -= 1
        else:
            out.append(f"new {n.op}")
    return out


def _without_trailing_empty_inputs(graph: Graph) -> Graph:
    """Trailing "" inputs are omitted optional inputs; the rules' argument lists leave them out."""
    from xrl.ir import Node

    changed = [n for n in graph.nodes.values() if n.inputs and not n.inputs[-1]]
    if not changed:
        return graph
    fixed = []
    for n in changed:
        ins = list(n.inputs)
        while ins and not ins[-1]:
            ins.pop()
        fixed.append(Node(n.name, n.op, tuple(ins), n.outputs, n.attrs, n.domain))
    return graph.replace(remove=[n.name for n in changed], add=fixed)


__all__ = ["EXTRACTORS", "TENSAT_ITER_LIMIT", "TENSAT_NODE_LIMIT", "Coverage", "Limits", "tensat_runner",
           "tensat_search"]
