"""Greedy and random search over the verified rules: costs fall, results verify, runs repeat exactly."""

from __future__ import annotations

import json

import pytest
import xrl.graphs

from xrl.cost import get_cost_model
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.frontends.verify import compare_models
from xrl.rewrite import RewriteEngine, load_rules
from xrl.search.greedy import greedy_search
from xrl.search.random_search import random_search


@pytest.fixture(scope="module")
def engine() -> RewriteEngine:
    return RewriteEngine(load_rules())


@pytest.fixture(scope="module")
def model():
    return get_cost_model("analytic", device="h100")


def check_greedy(name: str, engine: RewriteEngine, model) -> None:
    onnx_model = xrl.graphs.build(name)
    graph = from_onnx(onnx_model)
    res = greedy_search(graph, model, engine)
    assert res.method == "greedy" and res.steps and res.explored >= len(res.steps)
    assert res.cost < res.original_cost == pytest.approx(model.cost(graph))
    assert res.cost == pytest.approx(model.cost(res.graph), rel=1e-9)
    # Converged, and says so: no candidate of the result is cheaper.
    assert res.details["stopped"] == "converged"
    assert all(c.delta_cost(model, res.cost) >= res.cost * (1 - 1e-9) for c in engine.candidates(res.graph))
    verdict = compare_models(onnx_model, to_onnx(res.graph.validate()), trials=1)
    assert verdict.ok, verdict.detail


def test_greedy_says_why_it_stopped(engine: RewriteEngine, model) -> None:
    graph = from_onnx(xrl.graphs.build("tiny_cnn"))
    assert greedy_search(graph, model, engine, max_steps=1).details["stopped"] == "the step limit"
    assert greedy_search(graph, model, engine, time_limit=0.0).details["stopped"] == "the time limit"


@pytest.mark.parametrize("name", ["mlp", "tiny_cnn"])
def test_greedy_improves_small_graphs(name: str, engine: RewriteEngine, model) -> None:
    check_greedy(name, engine, model)


@pytest.mark.slow
# inception_v3 and resnext50 (40 and 20 s on two quiet cores) are greedy's benchmark graphs: their runs are
# experiments/compare_suite.py's, and the search code they exercise is the one these graphs exercise
@pytest.mark.parametrize("name", ["bert", "vit", "dalle", "tt", "squeezenet"])
def test_greedy_improves_builtin_graphs(name: str, engine: RewriteEngine, model) -> None:
    check_greedy(name, engine, model)


def test_greedy_is_deterministic_and_bounded(engine: RewriteEngine, model) -> None:
    graph = from_onnx(xrl.graphs.build("tiny_cnn"))
    a, b = greedy_search(graph, model, engine), greedy_search(graph, model, engine)
    assert a.steps == b.steps and a.graph.canonical_hash == b.graph.canonical_hash
    two = greedy_search(graph, model, engine, max_steps=2)
    assert two.steps == a.steps[:2]
    assert greedy_search(graph, model, engine, time_limit=0).steps == []
    json.dumps(a.to_json())
    assert a.to_json()["speedup"] == pytest.approx(a.original_cost / a.cost)


def test_random_search_repeats_with_its_seed(engine: RewriteEngine, model) -> None:
    graph = from_onnx(xrl.graphs.build("tiny_cnn"))
    a = random_search(graph, model, engine, steps=8, seed=5)
    b = random_search(graph, model, engine, steps=8, seed=5)
    c = random_search(graph, model, engine, steps=8, seed=6)
    assert a.steps == b.steps and len(a.steps) == 8 and a.steps != c.steps
    assert a.method == "random" and a.explored > 8
    assert a.cost == pytest.approx(model.cost(a.graph), rel=1e-9)
    assert a.details["best_cost"] <= min(a.cost, a.original_cost)
