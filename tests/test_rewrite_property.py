"""Any sequence of rewrites leaves what a graph computes unchanged: random walks of rewrites on the
built-in graphs and HLO fixtures, exported to ONNX and compared with the original under onnxruntime."""

from __future__ import annotations

from pathlib import Path

import pytest
import xrl.graphs

from xrl.cost import get_cost_model
from xrl.frontends.hlo import load_hlo
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.frontends.verify import compare_models
from xrl.ir import Graph
from xrl.rewrite import RewriteEngine, load_rules
from xrl.search.random_search import random_search

HLO = sorted((Path(xrl.graphs.__file__).parent / "hlo").glob("*.hlo"))
SMALL = ["mlp", "tiny_cnn"]
LARGE = [n for n in xrl.graphs.names() if n not in SMALL]


@pytest.fixture(scope="module")
def engine() -> RewriteEngine:
    return RewriteEngine(load_rules())


def check_walks(graph: Graph, engine: RewriteEngine, seeds: tuple[int, ...], steps: int = 30) -> None:
    reference = to_onnx(graph)
    model = get_cost_model("analytic", device="h100")
    for seed in seeds:
        res = random_search(graph, model, engine, steps=steps, seed=seed)
        res.graph.validate()
        assert res.steps, "no rewrite applied: the walk checks nothing"
        verdict = compare_models(reference, to_onnx(res.graph), seed=seed, trials=1)
        assert verdict.ok, f"seed {seed}: {verdict.detail} after {res.steps}"


@pytest.mark.parametrize("name", SMALL)
def test_random_rewrites_preserve_small_graphs(name: str, engine: RewriteEngine) -> None:
    check_walks(from_onnx(xrl.graphs.build(name)), engine, seeds=(0, 1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_random_rewrites_preserve_builtin_graphs(name: str, engine: RewriteEngine) -> None:
    check_walks(from_onnx(xrl.graphs.build(name)), engine, seeds=(0, 1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("path", HLO, ids=[p.stem for p in HLO])
def test_random_rewrites_preserve_hlo_fixtures(path: Path, engine: RewriteEngine) -> None:
    graph = load_hlo(path)
    if not engine.candidates(graph):
        pytest.skip(f"no rule applies to {path.name}")
    check_walks(graph, engine, seeds=(0, 1, 2))
