"""Building small IR graphs by hand in tests."""

from __future__ import annotations

import numpy as np

from xrl.ir import Graph, Node, TensorType
from xrl.ir.ops import infer_types, is_known


def build(inputs: dict[str, tuple[int, ...]], weights: dict[str, np.ndarray], nodes: list[Node],
          outputs: list[str], extra_types: dict[str, TensorType] | None = None) -> Graph:
    """A validated graph from nodes in topological order; types inferred (opaque ops take `extra_types`)."""
    types = {k: TensorType(s) for k, s in inputs.items()}
    types.update({k: TensorType.of(w) for k, w in weights.items()})
    types.update(extra_types or {})
    for n in nodes:
        if not is_known(n.op, n.domain):
            continue  # opaque: its recorded type comes from extra_types
        outs = infer_types(n, [types[v] if v else None for v in n.inputs], [weights.get(v) for v in n.inputs])
        types.update(zip(n.outputs, outs))
    return Graph(nodes, list(inputs), outputs, types, weights).validate()


def chain(name: str, n: int) -> Graph:
    """A graph of n Relus in a row over a 4-element input, named `name` (the guard's tests tell candidates apart by
    their graphs' names)."""
    t = TensorType((4,), "float32")
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(Node(f"r{i}", "Relu", (prev,), (f"v{i}",)))
        prev = f"v{i}"
    return Graph(nodes, ["x"], [prev], {"x": t, **{f"v{i}": t for i in range(n)}}, name=name)
