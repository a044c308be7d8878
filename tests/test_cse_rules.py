"""Common subexpressions (rewrite_rules/cleanup.rules, cse_*): a second op of one input with the same attributes
is the first. NASNet's cells apply one Relu and one pooling to an input in several branches; an e-graph
(Tensat) holds them once by construction, a rewrite search needs these rules (nasnet_a in the paper setting:
greedy 1.205 without them, 1.438 with, Tensat 1.422). onnxruntime eliminates them itself, so its targets'
cost credits nothing for them."""

from __future__ import annotations

import numpy as np
import pytest

from xrl.cost import get_cost_model
from xrl.ir import Graph, Node, TensorType
from xrl.ir.execute import execute
from xrl.rewrite import RewriteEngine, parse_rule_files, verify_rule
from xrl.search.greedy import greedy_search


def _branches() -> Graph:
    """x -> three Relus, two equal AveragePools and a MaxPool of one of the Relus, summed."""
    t = TensorType((1, 8, 10, 10))
    pool = {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}
    nodes = [Node("r1", "Relu", ("x",), ("a",)), Node("r2", "Relu", ("x",), ("b",)), Node("r3", "Relu", ("x",), ("c",)),
             Node("p1", "AveragePool", ("a",), ("d",), pool), Node("p2", "AveragePool", ("b",), ("e",), pool),
             Node("p3", "AveragePool", ("b",), ("f",), {**pool, "count_include_pad": 1}),
             Node("s1", "Add", ("d", "e"), ("g",)), Node("s2", "Add", ("g", "f"), ("h",)),
             Node("s3", "Add", ("h", "c"), ("y",))]
    types = {v: t for v in "xabcdefghy"}
    return Graph(nodes, ["x"], ["y"], types).validate()


def test_every_cse_rule_verifies() -> None:
    rules = [r for r in parse_rule_files() if r.name.startswith("cse_")]
    assert {"cse_Relu", "cse_AveragePool", "cse_MaxPool", "cse_GlobalAveragePool"} <= {r.name for r in rules}
    for rule in rules:
        check = verify_rule(rule, seed=3, trials=20)
        assert check.ok and check.trials == 20, (rule.name, check.detail)


def test_greedy_computes_each_op_of_one_input_once_and_keeps_different_attributes_apart() -> None:
    g = _branches()
    res = greedy_search(g, get_cost_model("analytic"), RewriteEngine.default())
    ops = res.graph.op_histogram()
    assert ops["Relu"] == 1 and ops["AveragePool"] == 2  # count_include_pad differs: p3 stays its own
    x = np.random.default_rng(0).standard_normal((1, 8, 10, 10))
    np.testing.assert_allclose(execute(res.graph, {"x": x})[0], execute(g, {"x": x})[0], rtol=1e-12)


def test_onnxruntime_targets_credit_nothing_for_what_the_runtime_eliminates_itself() -> None:
    g = _branches()
    cand = next(c for c in RewriteEngine.default().candidates(g) if str(c.step).startswith("cse_Relu"))
    ort = get_cost_model("roofline", target="ort-cpu")
    assert ort.cost(cand.graph) == pytest.approx(ort.cost(g), rel=1e-9)
    paper = get_cost_model("analytic")
    assert paper.cost(cand.graph) < paper.cost(g)
