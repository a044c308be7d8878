"""TASO-style backtracking search: finds an optimum that needs a cost-increasing step, respects its limits."""

from __future__ import annotations

import numpy as np
import pytest

from xrl.cost import get_cost_model
from xrl.errors import ConfigError
from xrl.ir import Graph, Node, TensorType
from xrl.ir.execute import execute
from xrl.rewrite import RewriteEngine, load_rules
from xrl.search.greedy import greedy_search
from xrl.search.taso import taso_runner, taso_search

RULES = ["enlarge_conv_kernel", "merge_conv_2", "concat_conv_shared_input"]


@pytest.fixture(scope="module")
def engine():
    return RewriteEngine(load_rules().select(RULES))


@pytest.fixture(scope="module")
def cost():
    return get_cost_model("analytic", device="h100")


def _inception_branch() -> Graph:
    """Concat(conv1x1(x), conv3x3(x)): TASO's example. Merging needs equal kernels, so the 1x1 conv
    must first grow to a zero-padded 3x3, which alone costs more."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 16, 1, 1)).astype(np.float32)
    w3 = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    nodes = [Node("c1", "Conv", ("x", "w1"), ("y1",), {"kernel_shape": (1, 1)}),
             Node("c3", "Conv", ("x", "w3"), ("y3",), {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}),
             Node("cat", "Concat", ("y1", "y3"), ("y",), {"axis": 1})]
    types = {"x": TensorType((1, 16, 8, 8)), "w1": TensorType.of(w1), "w3": TensorType.of(w3),
             "y1": TensorType((1, 16, 8, 8)), "y3": TensorType((1, 32, 8, 8)), "y": TensorType((1, 48, 8, 8))}
    return Graph(nodes, ["x"], ["y"], types, {"w1": w1, "w3": w3}, name="inception_branch").validate()


def _optimum(g: Graph) -> Graph:
    """The known optimum: one 3x3 conv over the zero-padded 1x1 filters concatenated with the 3x3 ones."""
    w1 = np.pad(g.initializers["w1"], ((0, 0), (0, 0), (1, 1), (1, 1)))
    w = np.concatenate([w1, g.initializers["w3"]], axis=0)
    node = Node("conv", "Conv", ("x", "w"), ("y",), {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)})
    return Graph([node], ["x"], ["y"], {"x": g.types["x"], "w": TensorType.of(w), "y": g.types["y"]}, {"w": w})


def test_alpha_lets_taso_climb_over_a_cost_increasing_step(engine, cost):
    g = _inception_branch()
    enlarge = next(c for c in engine.candidates(g) if c.rule == "enlarge_conv_kernel")
    step_cost = cost.cost(enlarge.graph)
    assert step_cost > cost.cost(g)  # the first step alone is worse: greedy search stops before it
    alpha = 1.3
    assert step_cost < alpha * cost.cost(g)

    res = taso_search(g, cost, engine, alpha=alpha, budget=50)
    optimum = _optimum(g)
    assert res.cost == pytest.approx(cost.cost(optimum))
    assert res.graph.op_histogram() == {"Conv": 1}
    assert [s.split("@")[0] for s in res.steps] == ["enlarge_conv_kernel", "concat_conv_shared_input"]
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 16, 8, 8))}
    np.testing.assert_allclose(execute(res.graph.validate(), feeds)[0], execute(g, feeds)[0], rtol=1e-5, atol=1e-5)
    assert res.details["stop_reason"] == "queue empty" and res.explored <= 50


def test_without_slack_taso_and_greedy_stay_put(engine, cost):
    g = _inception_branch()
    assert taso_search(g, cost, engine, alpha=1.0).cost == pytest.approx(cost.cost(g))
    assert greedy_search(g, cost, engine).cost == pytest.approx(cost.cost(g))


def test_budget_caps_the_expansions(engine, cost):
    res = taso_search(_inception_branch(), cost, engine, alpha=1.3, budget=1)
    assert res.explored == 1 and res.details["stop_reason"] == "budget"
    assert res.details["queued"] >= 1  # the enlarged graph was queued but never expanded
    assert res.cost == pytest.approx(cost.cost(_inception_branch()))


def test_finds_what_greedy_finds_on_a_small_model(cost):
    from xrl.frontends.loader import load_model

    g = load_model("tiny_cnn").graph
    full = RewriteEngine.default()
    taso = taso_search(g, cost, full, budget=30, time_limit=60)
    assert taso.cost <= greedy_search(g, cost, full).cost * (1 + 1e-9)
    assert taso.cost == pytest.approx(cost.cost(taso.graph))


def test_rejects_bad_settings(engine, cost):
    with pytest.raises(ConfigError, match="alpha"):
        taso_search(_inception_branch(), cost, engine, alpha=0.9)
    with pytest.raises(ConfigError, match="budget"):
        taso_search(_inception_branch(), cost, engine, budget=0)
    with pytest.raises(ConfigError, match="no option"):
        taso_runner(_inception_branch(), cost, depth=3)
