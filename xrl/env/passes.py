"""The compiler passes of xrl/PassOrdering-v0 (after the XLA pass-ordering work); one action runs one pass.

    cse            common-subexpression elimination (same op, inputs and attributes: keep the first)
    dce            dead-code elimination (operators none of whose outputs is used)
    <family>       one of xrl's rule families (fusion, algebraic, ...) applied to a fixed point: while
                   some rewrite of the family lowers (op count, estimated cost), apply the one that lowers
                   it most. The op count never rises and, at equal count, the cost falls strictly, so a
                   pass ends; `max_rewrites` (default 4 x the op count) is only a safety net

`default_order()` is xrl's default pipeline (every pass once, in PASSES order).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from xrl.errors import ConfigError
from xrl.ir import Graph, Node

FAMILY_ORDER = ("fusion", "algebraic", "distributivity", "associativity", "merge", "transpose", "reshape",
                "concat_split")
PASSES: tuple[str, ...] = ("cse", "dce", *FAMILY_ORDER)
TRANSCENDENTAL = frozenset({"Exp", "Log", "Tanh", "Sigmoid", "Erf", "Sqrt", "Pow", "Softmax", "Gelu", "Softplus"})

def op_vocab() -> tuple[str, ...]:
    """The operator types the observation counts (the featurizer's vocabulary less graph inputs and weights)."""
    from xrl.features.featurize import OP_VOCAB

    return tuple(op for op in OP_VOCAB if op not in ("Input", "Weight"))


# ----- passes --------------------------------------------------------------------------------------
def dce(graph: Graph) -> Graph:
    """Drop operators none of whose outputs is read or a graph output, to a fixed point."""
    while True:
        used = {v for n in graph.topological_order for v in n.inputs} | set(graph.outputs)
        dead = [n.name for n in graph.topological_order if not any(v in used for v in n.outputs)]
        if not dead:
            return graph
        graph = graph.replace(remove=dead)


def cse(graph: Graph) -> Graph:
    """Merge operators that compute the same thing: same op, domain, attributes and (merged) inputs."""
    rename: dict[str, str] = {}
    seen: dict[tuple, Node] = {}
    dup: list[str] = []
    for n in graph.topological_order:
        key = (n.op, n.domain, tuple(rename.get(v, v) for v in n.inputs), n.attr_key(), len(n.outputs))
        first = seen.get(key)
        if first is None:
            seen[key] = n
            continue
        dup.append(n.name)
        rename.update(zip(n.outputs, first.outputs))
    return graph.replace(remove=dup, rename=rename) if dup else graph


@cache
def family_engine(family: str) -> Any:
    from xrl.rewrite import RewriteEngine
    from xrl.rewrite.rules import load_rules

    rules = [r for r in load_rules().rules if r.family == family]
    if not rules:
        raise ConfigError(f"no rule family {family!r}; families: {', '.join(FAMILY_ORDER)}")
    return RewriteEngine(rules)


def run_family(graph: Graph, family: str, cost_model: Any, max_rewrites: int | None = None) -> Graph:
    """Apply the family's rewrites while one lowers (op count, estimated cost); the best one each time."""
    engine = family_engine(family)
    for _ in range(max_rewrites if max_rewrites is not None else 4 * len(graph) + 16):
        best, best_key = None, (0, 0.0)
        for c in engine.candidates(graph):
            new = getattr(c, "cost_graph", None) or c.graph
            d_ops = len(c.added) - len(c.removed)
            d_cost = sum(cost_model.op_cost(n, new) for n in c.added) - sum(cost_model.op_cost(n, graph)
                                                                             for n in c.removed)
            key = (d_ops, d_cost)
            if key < best_key and (d_ops < 0 or d_cost < -1e-12):
                best, best_key = c, key
        if best is None:
            return graph
        graph = best.graph
    return graph


def run_pass(graph: Graph, name: str, cost_model: Any, max_rewrites: int | None = None) -> Graph:
    if name == "cse":
        return cse(graph)
    if name == "dce":
        return dce(graph)
    return run_family(graph, name, cost_model, max_rewrites)


def default_order() -> tuple[int, ...]:
    """xrl's default pipeline: every pass once, in PASSES order."""
    return tuple(range(len(PASSES)))


def transcendentals(graph: Graph) -> int:
    return sum(n.op in TRANSCENDENTAL for n in graph.topological_order)
