"""Tensat-style search: extraction (greedy vs ILP), the egglog translation, saturation limits, round trips."""

from __future__ import annotations

import numpy as np
import pytest

from xrl.cost import get_cost_model
from xrl.errors import ConfigError
from xrl.ir import Graph, Node, TensorType
from xrl.ir.execute import execute
from xrl.rewrite import load_rules
from xrl.search.tensat import tensat_search
from xrl.search.tensat.extract import (
    ENode,
    ExtractionError,
    ExtractionProblem,
    chosen_nodes,
    greedy_extract,
    ilp_extract,
)


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def _problem(rows, roots):
    return ExtractionProblem({r[0]: ENode(*r) for r in rows}, roots)


# ----- extraction on hand-made e-graphs ------------------------------------------------------------
def test_ilp_shares_the_merged_node_that_greedy_double_counts():
    # Two outputs A, B: each alone (cost 3) or as one output of a shared merged op (4) + split (0.5).
    p = _problem([
        ("x", "X", "input", (), 0.0), ("w1", "W1", "weight", (), 0.0), ("w2", "W2", "weight", (), 0.0),
        ("wc", "WC", "concat", ("W1", "W2"), 0.0),
        ("m1", "A", "matmul", ("X", "W1"), 3.0), ("m2", "B", "matmul", ("X", "W2"), 3.0),
        ("mm", "M", "matmul", ("X", "WC"), 4.0), ("sp", "S", "split", ("M",), 0.5),
        ("g0", "A", "out0", ("S",), 0.0), ("g1", "B", "out1", ("S",), 0.0),
    ], ("A", "B"))
    greedy, ilp = greedy_extract(p), ilp_extract(p)
    assert greedy.cost == 6.0 and greedy.choice["A"] == "m1"
    assert ilp.cost == 4.5 and ilp.choice["A"] == "g0" and ilp.choice["B"] == "g1"
    assert ilp.status.startswith("optimal")


def test_ilp_never_returns_a_cycle():
    # A is free through B and B through A (an Identity pair after a union): a cycle, which the
    # order constraints must forbid; the only real way to compute A costs 5.
    p = _problem([
        ("x", "X", "input", (), 0.0), ("a_real", "A", "relu", ("X",), 5.0), ("a_loop", "A", "id", ("B",), 0.0),
        ("b_loop", "B", "id", ("A",), 0.0), ("self", "A", "id", ("A",), 0.0),
    ], ("B",))
    ilp = ilp_extract(p)
    order = chosen_nodes(p, ilp.choice)  # raises on a cycle
    assert ilp.cost == 5.0 and [n.id for n in order] == ["x", "a_real", "b_loop"]
    assert greedy_extract(p).cost == 5.0


def test_extraction_reports_an_uncomputable_root():
    p = _problem([("x", "X", "input", (), 0.0), ("loop", "A", "id", ("A",), 0.0)], ("A",))
    with pytest.raises(ExtractionError):
        greedy_extract(p)


# ----- the search on graphs -------------------------------------------------------------------------
def _shared_input_matmuls() -> Graph:
    """x @ w1 and x @ w2 as two outputs: one MatMul on concatenated weights + Split does both."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((256, 256)).astype(np.float32)
    w2 = rng.standard_normal((256, 256)).astype(np.float32)
    t = TensorType((1, 64, 256))
    nodes = [Node("m1", "MatMul", ("x", "w1"), ("y1",)), Node("m2", "MatMul", ("x", "w2"), ("y2",))]
    types = {"x": t, "y1": t, "y2": t, "w1": TensorType.of(w1), "w2": TensorType.of(w2)}
    return Graph(nodes, ["x"], ["y1", "y2"], types, {"w1": w1, "w2": w2}, name="two_matmuls").validate()


def _same_outputs(a: Graph, b: Graph, seed: int = 0) -> bool:
    feeds = {v: np.random.default_rng(seed).standard_normal(a.types[v].shape) for v in a.inputs}
    return all(np.allclose(x, y, rtol=1e-9, atol=1e-9) for x, y in zip(execute(a, feeds), execute(b, feeds)))


def test_ilp_extraction_picks_the_merged_matmul_that_greedy_misses(rules):
    g = _shared_input_matmuls()
    cost = get_cost_model("analytic", device="h100")
    merge = rules.select(["merge_matmul_2"])
    ilp = tensat_search(g, cost, merge, extractor="ilp")
    greedy = tensat_search(g, cost, merge, extractor="greedy")
    assert greedy.graph.op_histogram() == {"MatMul": 2}  # each output costed alone: the merged form looks dearer
    assert ilp.graph.op_histogram() == {"MatMul": 1, "Split": 1}
    assert ilp.cost < greedy.cost == pytest.approx(cost.cost(g))
    assert ilp.details["greedy_extraction_cost"] == pytest.approx(greedy.cost)
    assert _same_outputs(g, ilp.graph.validate())


def test_no_iterations_gives_back_the_input_graph(rules):
    g = _shared_input_matmuls()
    res = tensat_search(g, get_cost_model("analytic"), rules, iter_limit=0)
    assert res.graph.canonical_hash == g.canonical_hash and res.steps == []


def test_every_builtin_rule_translates(rules):
    res = tensat_search(_shared_input_matmuls(), get_cost_model("analytic"), rules, iter_limit=0)
    assert res.details["rules_skipped"] == {}
    assert res.details["rules_translated"] == len(rules)
    assert res.details["egglog_rules"] >= len(rules)  # opt(...) inputs make one rule per variant


def test_tiny_cnn_is_optimised_and_computes_the_same(rules):
    from xrl.frontends.loader import load_model

    g = load_model("tiny_cnn").graph
    res = tensat_search(g, get_cost_model("analytic"), rules, ilp_time_limit=20)
    assert res.cost < res.original_cost
    assert res.cost == pytest.approx(get_cost_model("analytic").cost(res.graph))
    assert "BatchNormalization" not in res.graph.op_histogram()  # folded into the convolutions
    feeds = {v: np.random.default_rng(1).standard_normal(g.types[v].shape) for v in g.inputs}
    for a, b in zip(execute(g, feeds), execute(res.graph.validate(), feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)  # folds are float64, weights stored float32


def test_node_limit_stops_saturation(rules):
    from xrl.frontends.loader import load_model

    res = tensat_search(load_model("tiny_cnn").graph, get_cost_model("analytic"), rules, node_limit=50)
    assert res.details["stop_reason"] == "node limit" and res.details["iterations"] == 0


def test_rejects_a_whole_graph_cost_model_and_unknown_options(rules):
    cost = get_cost_model("ort", device="cpu")
    with pytest.raises(ConfigError, match="per-op"):
        tensat_search(_shared_input_matmuls(), cost, rules)
    with pytest.raises(ConfigError, match="extractor"):
        tensat_search(_shared_input_matmuls(), get_cost_model("analytic"), rules, extractor="best")


def test_an_iteration_predicted_to_overrun_the_time_limit_is_not_started(monkeypatch):
    """Iterations of 1, 2 and 4 s that each double the e-graph, under a 10 s limit: the fourth (8 s
    predicted, starting at 7 s) would end at 15 s, so saturation stops after three."""
    from types import SimpleNamespace

    import xrl.search.tensat.runner as runner

    clock = [0.0]
    durations = [1.0, 2.0, 4.0, 8.0]
    sizes = iter([100, 200, 400, 800, 1600])

    class FakeEGraph:
        def run(self, schedule):
            if schedule == "search":
                clock[0] += durations.pop(0)
            return SimpleNamespace(updated=True)

    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(runner, "run", lambda ruleset: ruleset)
    monkeypatch.setattr(runner, "count_enodes", lambda egraph: next(sizes))
    rewrites = SimpleNamespace(search="search", search_multi="search_multi", apply="apply", apply_multi="apply_multi")
    analysis = SimpleNamespace(saturate=lambda: "analysis")
    report = runner.saturate(FakeEGraph(), rewrites, analysis, runner.Limits(node_limit=10**6, iter_limit=10,
                                                                             time_limit=10.0))
    assert report.iterations == 3 and report.stop_reason == "time limit (predicted)"
    assert clock[0] == 7.0 and report.enodes_per_iteration == [200, 400, 800]
