"""Any sequence of rewrites leaves what a graph computes unchanged: random walks of rewrites on the
built-in graphs and HLO fixtures, exported to ONNX and compared with the original under onnxruntime."""

from __future__ import annotations

from pathlib import Path

import pytest
import xrl.graphs

from xrl.cost import get_cost_model
from xrl.frontends.hlo import load_hlo
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.frontends.verify import compare_arrays, random_feeds, run_onnx
from xrl.ir import Graph
from xrl.rewrite import RewriteEngine, load_rules
from xrl.search.random_search import random_search

HLO = sorted((Path(xrl.graphs.__file__).parent / "hlo").glob("*.hlo"))
SMALL = ["mlp", "tiny_cnn"]
# (the deployment families, torch exports, are tested in tests/test_families.py)
# vgg19 and resnet50 are left out: their ops and patterns are a subset of resnext50's and inception_v3's
# (plain and grouped conv stacks, BN, residual adds), and a session of vgg19's 144M weights alone takes
# seconds; together they were 30 s of the suite
LARGE = [n for n in xrl.graphs.names()
         if n not in SMALL and n not in ("vgg19", "resnet50")
         and not xrl.graphs.BUILTIN_GRAPHS[n].suite.startswith("families")]


@pytest.fixture(scope="module")
def engine() -> RewriteEngine:
    return RewriteEngine(load_rules())


def check_walks(graph: Graph, engine: RewriteEngine, seeds: tuple[int, ...], steps: int = 30) -> None:
    # One onnxruntime session for the reference, reused by every walk: sessions of the big graphs
    # (vgg19 has 144M weights) take seconds to build.
    reference = to_onnx(graph)
    feeds = random_feeds(reference, seed=0)
    expected = run_onnx(reference, feeds)
    model = get_cost_model("analytic", device="h100")
    for seed in seeds:
        res = random_search(graph, model, engine, steps=steps, seed=seed)
        res.graph.validate()
        assert res.steps, "no rewrite applied: the walk checks nothing"
        got = run_onnx(to_onnx(res.graph), feeds)
        assert len(got) == len(expected)
        for i, (ref, out) in enumerate(zip(expected, got)):
            problem, max_abs, _ = compare_arrays(ref, out, rtol=1e-3, atol=1e-4)
            assert not problem, f"seed {seed}, output {i}: {problem} (max |diff| {max_abs:.3g}) after {res.steps}"


@pytest.mark.parametrize("name", SMALL)
def test_random_rewrites_preserve_small_graphs(name: str, engine: RewriteEngine) -> None:
    check_walks(from_onnx(xrl.graphs.build(name)), engine, seeds=(0, 1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_random_rewrites_preserve_builtin_graphs(name: str, engine: RewriteEngine) -> None:
    # one walk per large graph, each graph its own seed: an onnxruntime session of a large graph takes
    # seconds, and the small graphs above take three walks each
    check_walks(from_onnx(xrl.graphs.build(name)), engine, seeds=(LARGE.index(name),))


@pytest.mark.slow
@pytest.mark.parametrize("path", HLO, ids=[p.stem for p in HLO])
def test_random_rewrites_preserve_hlo_fixtures(path: Path, engine: RewriteEngine) -> None:
    graph = load_hlo(path)
    if not engine.candidates(graph):
        pytest.skip(f"no rule applies to {path.name}")
    check_walks(graph, engine, seeds=(0, 1, 2))
